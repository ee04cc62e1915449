"""noded.jobs.procscan.ProcRotation on a /proc laid out under tmp_path: at most ``most``
files a tick, new processes first, the rest in turn; a process is the job's by its last
reading, and unknown (never "not the job's") until read."""

import os

from noded.jobs.procscan import CgroupPlace, ProcRotation

JOB = "/slurm/uid_0/job_1"


def lay(proc, pid, path):
    os.makedirs(proc / str(pid), exist_ok=True)
    (proc / str(pid) / "cgroup").write_bytes(b"3:cpuset:" + path.encode() + b"\n")


def placer(paths):
    where = paths.get("cpuset", "")
    return (JOB,) if CgroupPlace("cpuset", JOB).holds(where) else ()


def test_each_tick_reads_at_most_most_files_new_first_then_in_turn(tmp_path):
    proc = tmp_path / "proc"
    lay(proc, "self", "/")
    for pid in range(100, 140):
        lay(proc, pid, JOB + "/deep/t" if pid % 10 == 0 else "/other")
    rot = ProcRotation(placer, 16, str(proc))
    rot.step()
    assert rot.read_last == 16 and rot.unread == 24 and rot.pids_in(JOB) == {100, 110}
    assert rot.not_read_yet(130) and not rot.not_read_yet(100)
    rot.step()
    rot.step()
    assert rot.unread == 0 and rot.pids_in(JOB) == {100, 110, 120, 130}
    lay(proc, 105, JOB)  # moved into the job without an exec
    lay(proc, 200, JOB)  # new: read at the next tick, before any reading again
    rot.step()
    assert 200 in rot.pids_in(JOB) and 105 not in rot.pids_in(JOB)
    for _ in range(3):  # a round of 41 at 16 a tick
        rot.step()
    assert rot.pids_in(JOB) == {100, 105, 110, 120, 130, 200}
    (proc / "110" / "cgroup").unlink()
    os.rmdir(proc / "110")  # it ended: gone at the next listing
    rot.step()
    assert 110 not in rot.pids_in(JOB) and rot.read_last == 16


def test_a_forged_record_puts_a_process_in_no_job(tmp_path):
    proc = tmp_path / "proc"
    lay(proc, "self", "/")
    os.makedirs(proc / "7")
    (proc / "7" / "cgroup").write_bytes(b"3:cpuset:/x\n3:cpuset:" + JOB.encode() + b"\n")
    rot = ProcRotation(placer, 16, str(proc))
    rot.step()
    assert rot.pids_in(JOB) == frozenset() and rot.refused == 1 and not rot.not_read_yet(7)
    rot.reset()
    assert rot.not_read_yet(7) is False and rot.pids_in(JOB) == frozenset()


def test_a_place_holds_its_cgroup_and_those_below_only():
    place = CgroupPlace("cpuset", JOB)
    assert place.holds(JOB) and place.holds(JOB + "/step_0") and not place.holds(JOB + "0")
    assert not place.holds(None) and CgroupPlace("", "/").holds("/a")


def test_a_v1_hierarchy_of_several_controllers_is_keyed_as_the_parser_keys_it():
    # /proc/PID/cgroup's "4:cpu,cpuacct:/x" is parsed into one path per controller; a
    # source on /sys/fs/cgroup/cpu,cpuacct looked its processes up as "cpu,cpuacct", found
    # none, and neither an exec event nor /proc placed any process in its jobs.
    from noded.jobs.cgroups import v1_hierarchy_key
    from noded.jobs.proccgroup import parse_hierarchies, parse_proc_cgroup

    data = b"4:cpu,cpuacct:/x\n1:name=systemd:/y\n"
    paths = parse_proc_cgroup(data, parse_hierarchies(data, "t"), "t").paths
    assert paths[v1_hierarchy_key("/sys/fs/cgroup/cpu,cpuacct")] == "/x"
    assert paths[v1_hierarchy_key("/sys/fs/cgroup/systemd")] == "/y"
    assert v1_hierarchy_key("/sys/fs/cgroup/cpuset") == "cpuset"
