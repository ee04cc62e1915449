"""Job discovery: cgroup v2-shaped trees, the real v1 cpuset hierarchy, registered
process trees, labels, and new processes through the process-events connector."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from support.waiting import wait_for
from noded.jobs import CgroupSource, JobDiscovery, JobMeta, LabelFile, ProcessEvents, cgroup_version
from noded.jobs.proctree import descendants, read_ppids

def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


@pytest.fixture
def v2_tree(tmp_path, sleeper):
    """A cgroup v2-shaped tree (the kernel here gives v1): Slurm, Kubernetes, systemd."""
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    a, b, c, d = sleeper(), sleeper(), sleeper(), sleeper()
    write(root / "system.slice/slurmstepd.scope/job_4242/step_0/user/task_0/cgroup.procs", f"{a.pid}\n{b.pid}\n")
    write(root / "system.slice/slurmstepd.scope/job_4242/step_batch/cgroup.procs", f"{c.pid}\n")
    write(root / "system.slice/slurmstepd.scope/job_17/cgroup.procs", "")  # no processes: no job
    write(root / "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1c2d3e_4f50_6172_8394_a5b6c7d8e9f0.slice/cri-x.scope/cgroup.procs",
          f"{d.pid}\n")
    write(root / "system.slice/train.service/cgroup.procs", f"{d.pid}\n")
    return str(root), (a, b, c, d)


def test_v2_layouts_are_found_with_their_processes(v2_tree):
    root, (a, b, c, d) = v2_tree
    assert cgroup_version(root) == 2
    sources = [CgroupSource.create("slurm", root), CgroupSource.create("kubernetes", root),
               CgroupSource.create("systemd", root, ["system.slice/*.service"])]
    jobs = JobDiscovery(sources).discover()
    assert set(jobs) == {"slurm:4242", "k8s:0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0", "systemd:train.service"}
    assert jobs["slurm:4242"].pids == {a.pid, b.pid, c.pid} and jobs["slurm:4242"].source == "slurm"
    assert jobs["k8s:0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"].pids == {d.pid}
    # Identity is stable across ticks.
    assert JobDiscovery(sources).discover()["slurm:4242"] == jobs["slurm:4242"]


def test_a_job_whose_subtree_cannot_be_read_in_part_is_what_the_rest_holds_and_blinds_no_other_job(
        v2_tree, sleeper):
    # Whoever owns a delegated subtree shapes it: one job's unreadable cgroup (here a
    # cgroup.procs that is a directory: EISDIR from the kernel) must not make every job
    # unknown, nor make that job look ended, nor freeze it: the part that can be read is
    # read every tick (before, the whole job was held as last seen, and a new process in
    # a readable part went unseen), and the part that cannot is said.
    root, (a, b, c, d) = v2_tree
    discovery = JobDiscovery([CgroupSource.create("slurm", root), CgroupSource.create("kubernetes", root)])
    before = discovery.discover()
    assert before["slurm:4242"].pids == {a.pid, b.pid, c.pid} and discovery.unreadable == {}
    bad = os.path.join(root, "system.slice/slurmstepd.scope/job_4242/step_0/user/task_0/bad")
    os.makedirs(os.path.join(bad, "cgroup.procs"))
    new = os.path.join(root, "system.slice/slurmstepd.scope/job_5")  # a new job, unreadable from the start
    os.makedirs(os.path.join(new, "cgroup.procs"))
    jobs = discovery.discover()
    assert jobs["slurm:4242"] is before["slurm:4242"]  # what it holds is what it held
    assert jobs["k8s:0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"].pids == {d.pid}  # the others as they are now
    assert "slurm:5" not in jobs  # never seen, its own cgroup unreadable: nothing to hold
    assert set(discovery.unreadable) == {"slurm:5"} and set(discovery.partial) == {"slurm:4242"}
    assert "Is a directory" in discovery.partial["slurm:4242"] and bad in discovery.partial["slurm:4242"]
    e = sleeper()
    with open(os.path.join(root, "system.slice/slurmstepd.scope/job_4242/step_batch/cgroup.procs"), "a") as f:
        f.write(f"{e.pid}\n")
    assert discovery.discover()["slurm:4242"].pids == {a.pid, b.pid, c.pid, e.pid}  # seen at the next tick
    os.rmdir(os.path.join(bad, "cgroup.procs"))
    assert discovery.discover()["slurm:4242"].pids == {a.pid, b.pid, c.pid, e.pid}
    assert discovery.partial == {} and discovery.unreadable == {"slurm:5": discovery.unreadable["slurm:5"]}


HELD_SCRIPT = """
import json, os, sys
from noded.jobs import CgroupSource, JobDiscovery
from noded.samplers.cpus import CpuPlacementSampler
base, job, step, pid = sys.argv[1:]
d = JobDiscovery([CgroupSource.create("slurm", base)])
first = d.discover()
os.chmod(step, 0)  # the subtree's owner shuts noded out: chmod 000 (CAP_FOWNER is kept here to do it)
second = d.discover()
with open(os.path.join(job, "cgroup.procs"), "w") as f:  # a new process in the part noded can read
    f.write(pid)
third = d.discover()
cpus = CpuPlacementSampler()
placed = cpus.sample(third)
print(json.dumps({"first": sorted(first["slurm:8"].pids), "second": sorted(second["slurm:8"].pids),
                  "third": sorted(third["slurm:8"].pids), "unreadable": d.unreadable, "partial": d.partial,
                  "cpusets": [p for p, _ in placed["slurm:8"].cpusets], "cpus_partial": cpus.partial}))
"""


def test_eacces_below_a_real_job_cgroup_leaves_the_rest_of_that_job_read_as_the_unit_runs_noded(v1_cpuset, sleeper):
    # noded's unit runs it as root without CAP_DAC_OVERRIDE nor CAP_DAC_READ_SEARCH
    # (systemd/noded.service): a subtree's owner (a delegated user) can make their cgroups
    # unreadable to it; setpriv drops the same capabilities here, and the kernel answers
    # EACCES for real. The job is what noded can read (before: held as last seen, frozen,
    # and a new process in its own cgroup unseen), its processes and its cpusets, with the
    # processes of the part shut taken from /proc/PID/cgroup (before this: left out), and
    # the part shut is said.
    base, mkcg = v1_cpuset
    job, step = mkcg("slurm/uid_0/job_8"), mkcg("slurm/uid_0/job_8/step_0")
    a, b, c = sleeper(), sleeper(), sleeper()
    write(f"{job}/cgroup.procs", str(a.pid))
    write(f"{step}/cgroup.procs", str(b.pid))
    os.chown(step, 65534, 65534)
    try:
        out = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
                              sys.executable, "-c", HELD_SCRIPT, base, job, step, str(c.pid)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    finally:
        os.chmod(step, 0o755)
        os.chown(step, 0, 0)
    got = json.loads(out)
    assert got["first"] == sorted({a.pid, b.pid})
    assert got["second"] == sorted({a.pid, b.pid}) and got["third"] == sorted({a.pid, b.pid, c.pid})
    assert got["unreadable"] == {} and "Permission denied" in got["partial"]["slurm:8"]
    assert step in got["partial"]["slurm:8"]
    assert got["cpusets"] == [job] and "Permission denied" in got["cpus_partial"]["slurm:8"]


def _end_and_reopen(script: subprocess.Popen, shut: str) -> None:
    """A shut-directory test's end: its script stopped where it still runs, and the
    directory it shut given back to root, open as before."""
    if script.poll() is None:
        script.kill()
        script.wait()
    os.chmod(shut, 0o755)
    os.chown(shut, 0, 0)


OWN_SHUT_SCRIPT = """
import json, logging, os, sys
from noded.jobs import CgroupSource, JobDiscovery
from noded.samplers.cpus import CpuPlacementSampler
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
base, job = sys.argv[1:]
d = JobDiscovery([CgroupSource.create("slurm", base)], max_polled=16)
first = sorted(d.discover()["slurm:9"].pids)
os.chmod(job, 0)  # the job's owner shuts noded out of the job's own directory
print("shut", flush=True)
sys.stdin.readline()  # a new process was put in the shut directory meanwhile
new = int(sys.stdin.readline())
seen = {n for n in os.listdir("/proc") if n.isdigit()}
ticks, jobs = 0, {}
while ticks < 2000:
    ticks += 1
    jobs = {j: sorted(x.pids) for j, x in d.discover().items()}
    seen |= {n for n in os.listdir("/proc") if n.isdigit()}  # others' processes made meanwhile are read first
    if new in jobs.get("slurm:9", []):
        break
listed = len(seen)  # the processes a round reads: every one listed at some tick
cpus = CpuPlacementSampler()
placed = cpus.sample(d.discover())
print(json.dumps({"first": first, "found": jobs.get("slurm:9"), "ticks": ticks, "listed": listed,
                  "partial": d.partial.get("slurm:9"), "unreadable": d.unreadable,
                  "placed": "slurm:9" in placed, "cpus_unreadable": cpus.unreadable.get("slurm:9")}), flush=True)
sys.stdin.readline()  # every process of the job ended
ticks, seen = 0, {n for n in os.listdir("/proc") if n.isdigit()}
while ticks < 2000:
    ticks += 1
    gone = "slurm:9" not in d.discover()
    seen |= {n for n in os.listdir("/proc") if n.isdigit()}
    if gone:
        break
print(json.dumps({"ticks": ticks, "listed": len(seen), "unreadable": d.unreadable.get("slurm:9"),
                  "partial": d.partial}), flush=True)
"""


def test_a_job_whose_own_directory_is_shut_is_read_from_proc_and_a_new_process_there_is_found(v1_cpuset, sleeper):
    # The job's owner shuts its own directory (chmod 000) to noded as its unit runs it
    # (setpriv drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH). Before: the job was held as
    # last seen for as long as the directory stayed shut, and a process started in it
    # meanwhile was neither counted, monitored nor throttled. Now its processes are those
    # /proc/PID/cgroup puts in it (16 files a tick here, new processes first), said in
    # ``partial``; and once they have all ended it is no job, said in ``unreadable``
    # (never "no processes" before /proc said so: until a process is read, it is held).
    # Its CPUs are unknown, and said (before: its cpuset taken for none, its CPUs read as
    # its processes' affinities).
    base, mkcg = v1_cpuset
    job = mkcg("slurm/uid_0/job_9")
    a = sleeper()
    write(f"{job}/cgroup.procs", str(a.pid))
    os.chown(job, 65534, 65534)
    script = subprocess.Popen(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
                               sys.executable, "-c", OWN_SHUT_SCRIPT, base, job],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert script.stdout.readline().strip() == "shut"
        c = sleeper()
        write(f"{job}/cgroup.procs", str(c.pid))  # as root here, with every capability
        script.stdin.write(f"\n{c.pid}\n")
        script.stdin.flush()
        got = json.loads(script.stdout.readline())
        a.kill(), c.kill(), a.wait(), c.wait()
        script.stdin.write("\n")
        script.stdin.flush()
        ended = json.loads(script.stdout.readline())
        _, err = script.communicate(timeout=60)
    finally:
        _end_and_reopen(script, job)
    assert got["first"] == [a.pid]
    assert got["found"] == sorted({a.pid, c.pid}), got
    assert got["ticks"] <= got["listed"] // 16 + 3  # within a round of /proc at 16 a tick
    assert "Permission denied" in got["partial"] and "/proc/PID/cgroup" in got["partial"] and job in got["partial"]
    assert got["unreadable"] == {}
    # its CPUs cannot be read: unknown, never taken for a job without a cpuset (whose CPUs
    # core halving would then set by its processes' affinities)
    assert not got["placed"] and "Permission denied" in got["cpus_unreadable"]
    assert "job=slurm:9 cgroup partly read" in err and "Permission denied" in err
    assert ended["ticks"] <= ended["listed"] // 16 + 3 and ended["partial"] == {}
    # said either way: no process left in it (a round of /proc read whole), or none found in
    # the part of a round read so far (where the host makes processes all the time, as beside
    # stress-ng and a looping make demo, a round is rarely whole at the tick the job goes)
    assert "Permission denied" in ended["unreadable"] and (
        "puts no process in it" in ended["unreadable"]
        or "no process of it found in /proc/PID/cgroup yet" in ended["unreadable"]), ended["unreadable"]


SHUT_LISTING_SCRIPT = """
import json, os, sys
from noded.jobs import CgroupSource, JobDiscovery
base, shut = sys.argv[1:]
d = JobDiscovery([CgroupSource.create("slurm", base)])
first = {j: sorted(x.pids) for j, x in d.discover().items()}
os.chmod(shut, 0)  # the owner of a user's directory of jobs shuts noded out of it (CAP_FOWNER kept here)
try:
    second = {j: sorted(x.pids) for j, x in d.discover().items()}
    error = None
except OSError as e:
    second, error = None, str(e)
print(json.dumps({"first": first, "second": second, "error": error, "unlisted": getattr(d, "unlisted", None)}), flush=True)
"""


def test_a_directory_of_jobs_shut_by_its_owner_blinds_noded_to_no_other_job(v1_cpuset, sleeper):
    # A source's pattern walks directories between its root and the jobs (Slurm's uid_N): one
    # whose owner shuts it to noded (chmod 000; the unit keeps no CAP_DAC_*) must cost noded
    # only what is below it. Before: the scan raised EACCES and every job on the node was
    # unknown that tick, and every tick after, while it stayed shut.
    base, mkcg = v1_cpuset
    mine, theirs = mkcg("slurm/uid_0/job_31"), mkcg("slurm/uid_65534/job_32")
    a, b = sleeper(), sleeper()
    write(f"{mine}/cgroup.procs", str(a.pid))
    write(f"{theirs}/cgroup.procs", str(b.pid))
    user_dir = os.path.dirname(theirs)
    os.chown(user_dir, 65534, 65534)
    try:
        out = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
                              sys.executable, "-c", SHUT_LISTING_SCRIPT, base, user_dir],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    finally:
        os.chmod(user_dir, 0o755)
        os.chown(user_dir, 0, 0)
    got = json.loads(out)
    assert got["first"] == {"slurm:31": [a.pid], "slurm:32": [b.pid]}
    assert got["error"] is None, got["error"]
    # the other user's job is read as before; the shut one's processes are found through /proc
    assert got["second"]["slurm:31"] == [a.pid] and got["second"]["slurm:32"] == [b.pid]
    assert list(got["unlisted"]) == [user_dir] and "Permission denied" in got["unlisted"][user_dir]


def test_source_configuration_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="job source 'systemd' at .* needs explicit patterns"):
        CgroupSource.create("systemd", str(tmp_path))
    with pytest.raises(ValueError, match="kind must be one of"):
        CgroupSource.create("lsf", str(tmp_path))
    with pytest.raises(ValueError, match="must be relative"):
        CgroupSource.create("cgroup", str(tmp_path), ["../etc/*"])


def test_process_cgroup_paths_match_their_job():
    src = CgroupSource("slurm", "/sys/fs/cgroup", ("system.slice/slurmstepd.scope/job_*",), 2)
    assert src.match("/system.slice/slurmstepd.scope/job_9/step_0/user/task_0") == "system.slice/slurmstepd.scope/job_9"
    assert src.match("/system.slice/sshd.service") is None
    assert src.match("/") is None


def test_real_v1_cpuset_hierarchy(v1_cpuset, sleeper):
    base, mkcg = v1_cpuset
    job = mkcg("slurm/uid_0/job_42")
    p = sleeper()
    write(f"{job}/cgroup.procs", str(p.pid))
    src = CgroupSource.create("slurm", base)
    assert src.version == 1 and src.hierarchy == "cpuset"
    jobs = JobDiscovery([src]).discover()
    assert set(jobs) == {"slurm:42"} and jobs["slurm:42"].pids == {p.pid}
    with open(f"/proc/{p.pid}/cgroup") as f:
        assert src.match(next(l for l in f.read().splitlines() if ":cpuset:" in l).split(":", 2)[2]) \
            == "slurm/uid_0/job_42"


def test_processes_in_child_cgroups_on_the_real_hierarchy_count_from_the_tick_their_cgroup_appears(
        v1_cpuset, sleeper):
    # read_subtree_procs lists a cgroup only where its link count says it has children: the
    # kernel's count must be what makes a new step's processes part of the job.
    base, mkcg = v1_cpuset
    job = mkcg("slurm/uid_0/job_7")
    a, b, c = sleeper(), sleeper(), sleeper()
    write(f"{job}/cgroup.procs", str(a.pid))
    discovery = JobDiscovery([CgroupSource.create("slurm", base)])
    assert discovery.discover()["slurm:7"].pids == {a.pid}
    step = mkcg("slurm/uid_0/job_7/step_0")
    write(f"{step}/cgroup.procs", str(b.pid))
    assert discovery.discover()["slurm:7"].pids == {a.pid, b.pid}
    task = mkcg("slurm/uid_0/job_7/step_0/task_0")
    write(f"{task}/cgroup.procs", str(c.pid))
    assert discovery.discover()["slurm:7"].pids == {a.pid, b.pid, c.pid}


def test_a_held_job_on_the_real_v1_hierarchy_sees_each_move_at_the_next_read_without_a_walk(v1_cpuset, sleeper):
    # A job's small subtree is held open between ticks (noded.jobs.heldsubtrees). On v1 a
    # cgroup.procs descriptor read again within a second gives the process list its last
    # read loaded (the kernel's pidlists), so v1's are opened afresh from the held
    # directories: a process moved in is seen at once (held open, it was not: the system
    # test of exec placement timed out on it).
    base, mkcg = v1_cpuset
    job, step = mkcg("slurm/uid_0/job_11"), mkcg("slurm/uid_0/job_11/step_0")
    a, b, c = sleeper(), sleeper(), sleeper()
    write(f"{job}/cgroup.procs", str(a.pid))
    discovery = JobDiscovery([CgroupSource.create("slurm", base)])
    assert discovery.discover()["slurm:11"].pids == {a.pid}
    assert (discovery.held.held, discovery.held.walked) == (1, 1)
    for p in (b, c):
        write(f"{step}/cgroup.procs", str(p.pid))
        assert p.pid in discovery.discover()["slurm:11"].pids
    write(f"{job}/cgroup.procs", str(b.pid))  # moved back up
    assert discovery.discover()["slurm:11"].pids == {a.pid, b.pid, c.pid}
    assert discovery.held.walked == 1  # every read since the first through the held directories
    write(f"{base}/cgroup.procs", str(c.pid))  # out of the job, then its step removed
    os.rmdir(step)
    assert discovery.discover()["slurm:11"].pids == {a.pid, b.pid}
    assert discovery.held.walked == 2


def test_a_cgroup_listing_longer_than_a_page_is_read_whole_on_the_real_hierarchy(v1_cpuset):
    # A cgroup.procs read that comes back under 2048 bytes is taken as the whole file: the
    # kernel's seq_file stops a read short of the buffer at a page's end too, so a longer
    # listing must be read on to its end (1100 processes: over 4 KB whatever their pids, each
    # record at least 4 bytes, a pid at least 300; 800 were 4000 bytes where the pids had 4 digits).
    base, mkcg = v1_cpuset
    job = mkcg("slurm/uid_0/job_12")
    # 1100 processes by fork alone (no exec each: a loaded machine once took over 60 s to exec 800 sleeps)
    shell = subprocess.Popen([sys.executable, "-c", f"import os, signal; open({job + '/cgroup.procs'!r}, 'w').write(str(os.getpid()))\n"
                              "for _ in range(1099):\n    if os.fork() == 0:\n        break\nsignal.pause()"])
    try:
        wait_for(lambda: len(open(f"{job}/cgroup.procs").read().split()) == 1100, 120, what="1100 processes")
        with open(f"{job}/cgroup.procs", "rb") as f:
            listed = f.read()
        assert len(listed) > 4096
        discovery = JobDiscovery([CgroupSource.create("slurm", base)])
        for _ in range(2):  # walked, then held
            assert discovery.discover()["slurm:12"].pids == {int(p) for p in listed.split()}
        assert discovery.held.held == 1
    finally:
        shell.kill()


def test_a_held_job_whose_directory_is_replaced_by_renames_is_read_at_its_path_at_the_next_tick(v1_cpuset, sleeper):
    # The job's owner (who may write its parent: a Slurm uid_N directory is the user's)
    # renames the job's directory away and another one to its name. On v1 neither rename
    # moves the parent's link count, mtime or ctime (checked on this host), so the scanner
    # lists nothing again for relist_s. Held by descriptor, the job read the directory
    # renamed away (its processes taken for the job's, those at the job's path missed)
    # until then; a walk by path reads the one at the path at once.
    base, mkcg = v1_cpuset
    job = mkcg("slurm/uid_0/job_21")
    spare = mkcg("slurm/uid_0/spare")  # not a job: the pattern is job_*
    old = f"{base}/slurm/uid_0/old"
    a, c = sleeper(), sleeper()
    write(f"{job}/cgroup.procs", str(a.pid))
    write(f"{spare}/cgroup.procs", str(c.pid))
    discovery = JobDiscovery([CgroupSource.create("slurm", base)], relist_s=3600)
    for _ in range(2):  # walked, then held
        assert discovery.discover()["slurm:21"].pids == {a.pid}
    assert discovery.held.held == 1
    try:
        os.rename(job, old)
        os.rename(spare, job)
        assert discovery.discover()["slurm:21"].pids == {c.pid}
    finally:
        if os.path.isdir(old):
            write(f"{base}/cgroup.procs", str(a.pid))
            os.rmdir(old)


def test_a_held_job_on_the_real_v2_hierarchy_sees_each_change_at_the_next_read(v2_unified, sleeper):
    # On v2 a held cgroup.procs is read again with a pread from 0, which the kernel lists
    # afresh (v1's pidlists keep the first read's list: see the v1 test above), and a held
    # job is not checked against its path at each read: v2 refuses to rename a cgroup, and
    # a removed one fails its held cgroup.procs' read. All of it on this host's real v2
    # hierarchy (the unit tests' v2 trees are tmpfs): a process moved in, a cgroup removed and
    # made again under the same name, one made threaded (its processes listed by its domain).
    base, mkcg = v2_unified
    job = mkcg("job_1")
    a, b, c = sleeper(), sleeper(), sleeper()
    write(f"{job}/cgroup.procs", str(a.pid))
    src = CgroupSource.create("cgroup", base, ["job_*"])
    assert src.version == 2
    discovery = JobDiscovery([src])
    for _ in range(2):
        assert discovery.discover()["cgroup:job_1"].pids == {a.pid}
    assert (discovery.held.held, discovery.held.descriptors, discovery.held.walked) == (1, 2, 1)
    write(f"{job}/cgroup.procs", str(b.pid))
    assert discovery.discover()["cgroup:job_1"].pids == {a.pid, b.pid}
    assert discovery.held.walked == 1  # read afresh through the held cgroup.procs
    with pytest.raises(PermissionError):
        os.rename(job, f"{base}/job_2")  # what lets v2's held reads go without a path stat
    step = mkcg("job_1/step")
    write(f"{step}/cgroup.procs", str(c.pid))
    for _ in range(2):  # walked, held again, then read held (a change before that would walk it a while)
        assert discovery.discover()["cgroup:job_1"].pids == {a.pid, b.pid, c.pid}
    assert (discovery.held.held, discovery.held.walked) == (1, 2)
    write(f"{base}/cgroup.procs", str(c.pid))  # out, the step removed and made again, c in the new one
    os.rmdir(step)
    os.mkdir(step)
    write(f"{step}/cgroup.procs", str(c.pid))
    for _ in range(2):
        assert discovery.discover()["cgroup:job_1"].pids == {a.pid, b.pid, c.pid}
    assert (discovery.held.held, discovery.held.walked) == (1, 3)
    write(f"{base}/cgroup.procs", str(c.pid))  # a cgroup with processes may not be made threaded
    write(f"{step}/cgroup.type", "threaded")  # no link count moves: its held cgroup.procs fails (EOPNOTSUPP)
    write(f"{step}/cgroup.procs", str(c.pid))
    assert discovery.discover()["cgroup:job_1"].pids == {a.pid, b.pid, c.pid}
    assert discovery.held.walked == 4 and discovery.partial == {} and discovery.unreadable == {}
    write(f"{base}/cgroup.procs", str(b.pid))
    assert discovery.discover()["cgroup:job_1"].pids == {a.pid, c.pid}


ANCESTOR_SHUT_SCRIPT = """
import json, sys
from noded.jobs import CgroupSource, JobDiscovery
base, job_id = sys.argv[1:]
d = JobDiscovery([CgroupSource.create("cgroup", base, ["u/job_*"])])
for _ in range(2):  # walked, then held
    first = d.discover()
print(json.dumps({"first": sorted(first[job_id].pids), "held": d.held.held}), flush=True)
sys.stdin.readline()  # its parent shut to noded
got = d.discover()
print(json.dumps({"pids": sorted(got[job_id].pids) if job_id in got else None, "held": d.held.held,
                  "partial": d.partial.get(job_id), "unreadable": d.unreadable.get(job_id)}), flush=True)
"""


@pytest.mark.parametrize("version", [1, 2])
def test_a_held_job_whose_parent_is_shut_to_noded_is_read_as_a_path_reaches_it(version, v1_cpuset, v2_unified,
                                                                                sleeper):
    # The job's parent is its owner's (a Slurm uid_N directory, a delegated user slice), who
    # takes noded's search permission away (others r--: it can still be listed) as the unit
    # runs noded (no CAP_DAC_OVERRIDE nor CAP_DAC_READ_SEARCH). The held descriptors reach the
    # job's cgroup.procs without the parent's search permission; a path does not. The next
    # tick reads the job as a path reaches it: its own directory refused, its processes from
    # /proc/PID/cgroup, said in ``partial`` (v1: the path's stat at each read; v2: the parent's
    # ctime moved, so it is listed again, and the job's path checked).
    base, mkcg = v1_cpuset if version == 1 else v2_unified
    parent, job = mkcg("u"), mkcg("u/job_1")
    a = sleeper()
    write(f"{job}/cgroup.procs", str(a.pid))
    os.chown(parent, 65534, 65534)
    script = subprocess.Popen(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
                               sys.executable, "-c", ANCESTOR_SHUT_SCRIPT, base, "cgroup:u/job_1"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(script.stdout.readline()) == {"first": [a.pid], "held": 1}
        os.chmod(parent, 0o704)
        script.stdin.write("\n")
        script.stdin.flush()
        got = json.loads(script.stdout.readline())
        script.communicate(timeout=60)
    finally:
        _end_and_reopen(script, parent)
    assert got["held"] == 0 and got["pids"] == [a.pid], got
    assert "Permission denied" in got["partial"] and "/proc/PID/cgroup" in got["partial"], got


def test_registered_process_tree_follows_forks_and_ends_with_the_tree():
    code = "import os,time\nfor _ in range(2):\n  if os.fork()==0: time.sleep(300)\nprint('up',flush=True)\ntime.sleep(300)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "up\n"
        d = JobDiscovery([])
        jid = d.register(p.pid, "train-1", JobMeta(category="NLP"))
        job = d.discover()["train-1"]
        assert p.pid in job.pids and len(job.pids) == 3 and job.meta.category == "NLP"
    finally:
        for pid in job.pids:
            os.kill(pid, 9)
        p.wait()
    wait_for(lambda: "train-1" not in d.discover(), what="the job to end with its tree")
    with pytest.raises(ValueError, match="no such process"):
        d.register(p.pid)


TREE = """
import os, subprocess, sys, threading
kept = threading.Event()
by_thread = []
def fork_and_stay():  # its child is listed by this thread's children file, not the main one's
    by_thread.append(subprocess.Popen(["sleep", "300"]).pid)
    kept.wait()
threading.Thread(target=fork_and_stay, daemon=True).start()
while not by_thread:
    threading.Event().wait(0.01)
sh = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])  # a grandchild below it
orphan = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
print(by_thread[0], sh.pid, orphan.stdout.strip(), flush=True)  # the orphan's parent exited: not the job's
sys.stdin.read()
"""


def test_a_registered_tree_is_read_from_its_processes_not_from_every_process_on_the_host(sleeper):
    # Before: every /proc/PID/stat of the host read at each discovery (here the 200 others;
    # 66 ms a tick at 2156 processes, bench.registered_trees); now its processes' task
    # listings and children files (tree_reads did not exist: AttributeError; the pids were
    # the same).
    others = [sleeper() for _ in range(200)]
    p = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    orphan = None
    try:
        by_thread, sh, orphan = map(int, p.stdout.readline().split())
        d = JobDiscovery([])
        d.register(p.pid, "tree")
        sh_child = wait_for(lambda: next(iter(descendants(sh, read_ppids("/proc")) - {sh}), None),
                            what="sh's sleep")
        job = d.discover()["tree"]
        assert job.pids == {p.pid, by_thread, sh, sh_child} == descendants(p.pid, read_ppids("/proc"))
        assert orphan not in job.pids and others[0].pid not in job.pids
        threads = len(os.listdir(f"/proc/{p.pid}/task"))
        assert d.tree_reads == 1 + (1 + threads) + 3 * (1 + 1), d.tree_reads  # its status, then the tree
        assert len(os.listdir("/proc")) > 200 > d.tree_reads
    finally:
        for pid in [orphan] + sorted(descendants(p.pid, read_ppids("/proc")) - {p.pid}):
            if pid:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        p.kill()
        p.wait()


def test_label_file_applies_and_a_broken_one_keeps_the_last_good(tmp_path, sleeper):
    labels = tmp_path / "labels.yaml"
    p = sleeper()
    labels.write_text(f"'pid:{p.pid}': {{category: NLP, exempt: true, requested_cores: 4}}\n")
    lf = LabelFile(str(labels))
    d = JobDiscovery([], labels=lf)
    d.register(p.pid)
    assert d.discover()[f"pid:{p.pid}"].meta == JobMeta(category="NLP", requested_cores=4, exempt=True)
    labels.write_text(f"'pid:{p.pid}': {{category: NLP, exmept: true}}\n")
    os.utime(labels, (time.time() + 5, time.time() + 5))
    assert d.discover()[f"pid:{p.pid}"].meta.exempt  # kept
    assert "unknown label key(s) ['exmept']" in lf.error


def test_new_process_lands_in_its_job_through_the_connector(v1_cpuset):
    base, mkcg = v1_cpuset
    job_dir = mkcg("slurm/uid_0/job_7")
    d = JobDiscovery([CgroupSource.create("slurm", base)])
    seen = []
    events = ProcessEvents(lambda pid: seen.append(d.job_of_new_process(pid, {})))
    if not events.start():
        pytest.skip(f"connector unavailable here: {events.unavailable}")
    try:
        p = subprocess.Popen(["sh", "-c", f"echo $$ > {job_dir}/cgroup.procs; exec sleep 300"])
        job = wait_for(lambda: next((j for j in seen if j and p.pid in j.pids), None), what="the exec event")
        assert job.id == "slurm:7" and job.cgroup == job_dir
    finally:
        events.stop()
        p.kill()
        p.wait()


def test_connector_unavailable_outside_the_initial_network_namespace():
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root")
    code = ("from noded.jobs import ProcessEvents\n"
            "e = ProcessEvents(lambda pid: None)\n"
            "print(e.start(timeout=5), e.unavailable)")
    out = subprocess.run(["unshare", "--net", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False ") and "polling only" in out.stderr


def test_right_sizing_hints_are_labels_and_reach_the_allocator_as_it_reads_them(tmp_path):
    from noded.rightsize.sizing import JobSpec

    meta = JobMeta.from_mapping({"category": "CV", "pipelined": True, "heavy_preprocessing": True}, "labels.yaml:3")
    assert meta.hints() == {"pipelined": True, "heavy_preprocessing": True}
    spec = JobSpec("slurm:1", max_cores=8, category=meta.category, labels=meta.hints())
    assert spec.hint_delta() == 0  # -1 + 1
    assert JobSpec("slurm:2", max_cores=8, labels=JobMeta(many_weights=True).hints()).hint_delta() == -1
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="labels.yaml:3: "):
            JobMeta.from_mapping({"pipelined": bad}, "labels.yaml:3")


POD = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"


def two_pod_directories(root, live_in):
    """One pod's directory under two QoS classes (a stale one kubelet has not removed, as
    after a restart with another cgroup driver or QoS): the job id both give is one."""
    dirs = {qos: root / f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{POD.replace('-', '_')}.slice"
            for qos in ("besteffort", "burstable")}
    for qos, path in dirs.items():
        write(path / "cri-x.scope/cgroup.procs", "".join(f"{p.pid}\n" for p in live_in.get(qos, ())))
    return {qos: str(path) for qos, path in dirs.items()}


@pytest.mark.parametrize("live", ["besteffort", "burstable"])
def test_a_jobs_stale_second_directory_does_not_hide_the_live_one(tmp_path, sleeper, live):
    # Before: the directory scanned last won, whatever was in it: with the stale one last
    # the running pod was no job at all (no processes there), and nothing said so.
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    p = sleeper()
    dirs = two_pod_directories(root, {live: [p]})
    discovery = JobDiscovery([CgroupSource.create("kubernetes", str(root))])
    jobs = discovery.discover()
    assert jobs[f"k8s:{POD}"].pids == {p.pid} and jobs[f"k8s:{POD}"].cgroup == dirs[live]
    assert discovery.unreadable == {}


def test_a_job_id_two_live_directories_give_is_no_job_and_said(tmp_path, sleeper):
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    a, b = sleeper(), sleeper()
    dirs = two_pod_directories(root, {"besteffort": [a], "burstable": [b]})
    discovery = JobDiscovery([CgroupSource.create("kubernetes", str(root))])
    jobs = discovery.discover()
    # which is the job cannot be told: noded acts on neither, and says why
    assert f"k8s:{POD}" not in jobs
    why = discovery.unreadable[f"k8s:{POD}"]
    assert "2 directories" in why and dirs["besteffort"] in why and dirs["burstable"] in why
