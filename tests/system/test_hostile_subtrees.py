"""A tenant's delegated job subtree shaped to freeze noded's view of the job, on the real
cgroup v1 cpuset hierarchy: names nested past PATH_MAX, more cgroups than the bound. The
job must stay what noded can read of it, every tick (noded.jobs.cgroupwalk); a directory
shut to noded is in test_jobs.py (it needs the unit's capabilities dropped)."""

import os
import subprocess
import sys
import tempfile
import time

import pytest

from support.cgtree import make_chain, remove_tree, write_at, read_at
from noded.jobs import CgroupSource, JobDiscovery
from noded.samplers.cpus import CpuPlacementSampler
from noded.samplers.mongroups import JobMonitor
from noded.samplers.resctrl import ResctrlSession
from noded.samplers.telemetry import Telemetry

NAME = "n" * 250  # the longest a name may be: 17 of them nest past PATH_MAX (4096)


def put(cgroup: str, pid: int) -> None:
    with open(f"{cgroup}/cgroup.procs", "w") as f:
        f.write(str(pid))


def cpuset_fill(pid_at: int | None = None, pid: int = 0):
    """Each new v1 cpuset cgroup gets its parent's CPUs and memory nodes (a task may join
    only then), and the one at depth ``pid_at`` the process ``pid``."""
    def fill(parent_fd, fd, depth):
        for f in ("cpuset.cpus", "cpuset.mems"):
            write_at(fd, f, read_at(parent_fd, f))
        if depth == pid_at:
            write_at(fd, "cgroup.procs", str(pid))
    return fill


def test_a_job_whose_cgroups_nest_past_path_max_is_read_to_the_bottom(v1_cpuset, sleeper):
    # Before: open() of the deepest cgroup.procs failed with ENAMETOOLONG, and the job
    # was held as last seen (here never seen: no job at all), its processes unattributed.
    base, mkcg = v1_cpuset
    job = mkcg("slurm/uid_0/job_31")
    a, deep = sleeper(), sleeper()
    put(job, a.pid)
    depth = 18
    try:
        make_chain(job, [NAME] * depth, cpuset_fill(depth, deep.pid))
        assert len(job) + depth * (len(NAME) + 1) > 4096
        discovery = JobDiscovery([CgroupSource.create("slurm", base)])
        jobs = discovery.discover()
        assert jobs["slurm:31"].pids == {a.pid, deep.pid}
        assert discovery.unreadable == {} and discovery.partial == {}
        # its cpusets, which noded writes by path: those within PATH_MAX, the rest said
        cpus = CpuPlacementSampler()
        placed = cpus.sample(jobs)["slurm:31"]
        within = [job + f"/{NAME}" * k for k in range(depth + 1)
                  if len(job) + k * (len(NAME) + 1) + len("/cpuset.cpus.effective") < 4096]
        assert [d for d, _ in placed.cpusets] == within and len(within) < depth + 1
        assert "PATH_MAX" in cpus.partial["slurm:31"]
    finally:
        for name in os.listdir(job):
            if name == NAME:
                remove_tree(f"{job}/{NAME}", cgroupfs=True)


def over_the_bound(mkcg):
    """A job whose cgroups pass a bound of 16: its own, three steps, and 30 cgroups below
    the first step (read breadth first, the job's own and its steps are read every tick)."""
    job = mkcg("slurm/uid_0/job_32")
    steps = [mkcg(f"slurm/uid_0/job_32/step_{i}") for i in range(3)]
    for i in range(30):
        mkcg(f"slurm/uid_0/job_32/step_0/t{i:02d}")
    return job, steps


def test_a_job_over_the_bound_is_what_its_first_cgroups_hold_and_a_new_process_there_counts_next_tick(
        v1_cpuset, sleeper, caplog):
    # Before: SubtreeTooLarge, the job held as last seen (here: never seen, no job), and a
    # new process (a new step, kubectl exec) neither counted nor throttled.
    base, mkcg = v1_cpuset
    job, steps = over_the_bound(mkcg)
    a, b, c = sleeper(), sleeper(), sleeper()
    put(job, a.pid)
    discovery = JobDiscovery([CgroupSource.create("slurm", base)], max_polled=16)
    jobs = discovery.discover()
    assert jobs["slurm:32"].pids == {a.pid} and discovery.unreadable == {}
    assert "more than 16 cgroups" in discovery.partial["slurm:32"] and job in discovery.partial["slurm:32"]
    assert any("job=slurm:32 cgroup partly read" in r.getMessage() and "more than 16" in r.getMessage()
               and "jobs.max_polled_per_source" in r.getMessage() for r in caplog.records)
    put(steps[2], b.pid)  # a new step's process
    put(job, c.pid)
    assert discovery.discover()["slurm:32"].pids == {a.pid, b.pid, c.pid}  # at the next tick
    cpus = CpuPlacementSampler(most=16)
    placed = cpus.sample(discovery.discover())["slurm:32"]
    assert placed.cpusets[0][0] == job and {d for d, _ in placed.cpusets[1:4]} == set(steps)  # breadth first
    assert len(placed.cpusets) == 16 and "more than 16 cgroups" in cpus.partial["slurm:32"]


def test_a_process_beyond_the_bound_is_found_within_a_round_of_ticks_each_bounded(v1_cpuset, sleeper):
    # Before: over the bound the job was what its first 16 cgroups held, the same 16 every
    # tick, so a process in the 30th (a step's task nested below the others) was never
    # seen. Now the rest of its processes come from /proc/PID/cgroup, read 16 a tick in
    # turn: each tick reads at most 16 cgroups and 16 files, and the process is found
    # within a round of the host's processes.
    base, mkcg = v1_cpuset
    job, steps = over_the_bound(mkcg)
    a, far = sleeper(), sleeper()
    put(job, a.pid)
    put(f"{job}/step_0/t29", far.pid)
    discovery = JobDiscovery([CgroupSource.create("slurm", base)], max_polled=16)
    listed = len([n for n in os.listdir("/proc") if n.isdigit()])
    ticks, pids = 0, frozenset()
    while far.pid not in pids and ticks < 2000:
        ticks += 1
        pids = discovery.discover()["slurm:32"].pids
        assert discovery.rotation.read_last <= 16
    listed = max(listed, len([n for n in os.listdir("/proc") if n.isdigit()]))  # the processes a round reads
    assert pids == {a.pid, far.pid} and ticks <= listed // 16 + 3
    assert "more than 16 cgroups" in discovery.partial["slurm:32"]
    assert "/proc/PID/cgroup" in discovery.partial["slurm:32"]
    far.kill()
    far.wait()
    assert discovery.discover()["slurm:32"].pids == {a.pid}  # gone from /proc: gone from the job at once


@pytest.mark.fuse
def test_a_new_process_in_an_over_the_bound_job_joins_its_monitoring_group_at_the_next_sample(
        v1_cpuset, sleeper, emulator, open_resctrl):
    base, mkcg = v1_cpuset
    job, steps = over_the_bound(mkcg)
    a, b = sleeper(), sleeper()
    put(job, a.pid)
    rc = open_resctrl(emulator("intel"))
    monitor = JobMonitor(ResctrlSession.of(rc), clock=time.monotonic, retry_s=3600)
    discovery = JobDiscovery([CgroupSource.create("slurm", base)], max_polled=16)
    telemetry = Telemetry(discovery, monitor.session, monitor, None, process_events=False)
    try:
        sample = telemetry.sample()
        group = monitor.groups()["slurm:32"]
        assert sorted(group.read_tasks()) == [a.pid]
        assert any(m.startswith("job slurm:32: cgroup partly read") for m in sample.missing)
        put(steps[1], b.pid)
        sample = telemetry.sample()
        assert sorted(group.read_tasks()) == sorted([a.pid, b.pid])
        assert sample.jobs["slurm:32"].pids == {a.pid, b.pid}
    finally:
        telemetry.close()


DEEP_SCRIPT = """
import resource, sys
from noded.jobs.cgroups import read_subtree_procs
resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))  # fewer than the walk's own bound on directories held
got = read_subtree_procs(sys.argv[1])
print(len(got.pids), min(got.pids), max(got.pids), got.partial)
"""


def test_a_5000_deep_chain_is_read_whole_within_a_few_descriptors():
    # EMFILE is a real fault (every job's reading fails alike): a chain of any depth must
    # cost a bounded number of descriptors, here read under a limit of 32 open files. 5000
    # levels of one-letter names: a path of 10 000 bytes (past PATH_MAX) and 78 times the
    # walk's WALK_FDS, the bound the walk keeps whatever the depth (50 000, which it reads
    # as well, cost the suite 3 CPU seconds more for nothing more checked). On tmpfs
    # (/dev/shm): made and removed in a fraction of a second, not a disk's seconds.
    top = tempfile.mkdtemp(dir="/dev/shm", prefix="noded-test-deep-")
    try:
        with open(os.path.join(top, "cgroup.procs"), "w") as f:
            f.write("1\n")
        depth = 5_000
        make_chain(top, ["d"] * depth, lambda _p, fd, d: write_at(fd, "cgroup.procs", f"{d + 1}\n", create=True))
        out = subprocess.run([sys.executable, "-c", DEEP_SCRIPT, top], capture_output=True, text=True,
                             timeout=120, check=True).stdout.split()
        assert out == [str(depth + 1), "1", str(depth + 1), "None"]
    finally:
        subprocess.run(["rm", "-rf", top], check=True, timeout=120)  # fts: any depth


PIDS_V1 = "/sys/fs/cgroup/pids"

RESTORE_SCRIPT = """
import json, os, sys
from noded.actuators.cpurecords import WrittenValues
from noded.actuators.cpurestore import CpuRestore
from noded.stores.originals import OriginalValues
state, shut, pids = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]
os.chmod(shut, 0)  # the subtree's owner shuts noded out (CAP_FOWNER is kept here to do it)
originals = OriginalValues(state)
done = CpuRestore(originals, WrittenValues(originals.dir), most=16).restore()
print(json.dumps({"done": done, "cpus": [sorted(os.sched_getaffinity(p)) for p in pids],
                  "left": [k for k, _ in originals.items()]}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="halving needs two CPUs")
def test_restoring_a_jobs_affinities_reaches_every_process_of_a_shut_or_oversized_subtree(tmp_path, sleeper):
    # A job without a cpuset (its CPUs set by affinity) whose owner made 40 cgroups below
    # it (over a restore's walk of 16) and shut one with chmod 000, as noded's unit runs
    # it (no CAP_DAC_OVERRIDE nor CAP_DAC_READ_SEARCH: setpriv drops them here). Before:
    # the restore read the subtree whole with no bound, and the shut part failed it, so
    # no process forked while its CPUs were halved got them back, and the record stayed.
    # Now the walk stops at its bound and the job's processes are taken from
    # /proc/PID/cgroup: every one gets its original back.
    if not os.access(PIDS_V1, os.W_OK):
        pytest.skip(f"{PIDS_V1} is not writable here")
    import uuid
    from noded.actuators.cpurecords import affinity_job_key
    from noded.stores.originals import OriginalValues
    from noded.util.procstat import STARTTIME, stat_fields
    job = f"{PIDS_V1}/noded-test-{uuid.uuid4().hex[:8]}"
    made = [job] + [f"{job}/c{i:02d}" for i in range(40)]
    shut = f"{job}/c00"
    procs = [sleeper(), sleeper(), sleeper()]
    try:
        for d in made:
            os.mkdir(d)
        for p, where in zip(procs, (job, shut, made[-1])):  # the job's own, the shut one, the 40th
            put(where, p.pid)
        original = sorted(os.sched_getaffinity(0))
        for p in procs:
            os.sched_setaffinity(p.pid, original[: len(original) // 2])  # what core halving left
        originals = OriginalValues(str(tmp_path / "state"))
        start = stat_fields("/proc", procs[0].pid)[STARTTIME].decode()
        originals.record(affinity_job_key("cgroup:t"), {"original": original, "cgroup": job,
                                                        "root": [procs[0].pid, start]})
        os.chown(shut, 65534, 65534)
        out = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
                              sys.executable, "-c", RESTORE_SCRIPT, str(tmp_path / "state"), shut,
                              *[str(p.pid) for p in procs]],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    finally:
        if os.path.isdir(shut):
            os.chmod(shut, 0o755)
        for p in procs:
            p.kill()
            p.wait()
        for d in reversed(made):
            if os.path.isdir(d):
                os.rmdir(d)
    import json
    got = json.loads(out)
    assert got["done"] == {"affinity_job:cgroup:t": True} and got["left"] == []
    assert got["cpus"] == [original] * 3


SHUT_CPUSET_SCRIPT = """
import json, os, sys
from types import SimpleNamespace
from noded.actuators.cpusets import CpuSetOwner
from noded.stores.originals import OriginalValues
state, shut = sys.argv[1], sys.argv[2]
os.chmod(shut, 0)  # the subtree's owner shuts noded out (CAP_FOWNER is kept here to do it)
owner = CpuSetOwner(OriginalValues(state))
prepared = owner.prepare(SimpleNamespace(jobs={}), {})  # a tick's first step: records of what is gone go
after_tick = sorted(k for k, _ in OriginalValues(state).items())
left = owner.release_all()  # at stop: every record put back
print(json.dumps({"prepared": prepared, "after_tick": after_tick, "left": left,
                  "after_stop": sorted(k for k, _ in OriginalValues(state).items())}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="halving needs two CPUs")
def test_a_cpuset_below_a_directory_shut_to_noded_keeps_its_record_until_it_can_be_put_back(
        v1_cpuset, tmp_path):
    # A job's cgroup below a directory its owner shut (chmod 000), as noded's unit runs it
    # (no CAP_DAC_OVERRIDE nor CAP_DAC_READ_SEARCH: setpriv drops them here), holding the
    # CPUs noded halved. Before: os.path.isdir answered False for EACCES, so a tick took
    # the cgroup for gone and forgot its original (and a stop took it as restored): its
    # CPUs stayed halved for good. Now the record stays, and the stop after the owner
    # opens it again puts the CPUs back.
    from noded.actuators.cpurecords import cpuset_key
    from noded.actuators.cpusets import CpuSetOwner
    from noded.stores.originals import OriginalValues

    base, mkcg = v1_cpuset
    job = mkcg("slurm/uid_0/job_41")
    inner = mkcg("slurm/uid_0/job_41/step_0")
    with open(f"{inner}/cpuset.cpus") as f:
        original = f.read().strip()
    halved = original.split(",")[0].split("-")[0]  # the first CPU alone
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    OriginalValues(str(state)).record(cpuset_key(inner), original)
    with open(f"{inner}/cpuset.cpus", "w") as f:
        f.write(halved)
    try:
        out = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
                              sys.executable, "-c", SHUT_CPUSET_SCRIPT, str(state), job],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    finally:
        os.chmod(job, 0o755)
    import json
    got = json.loads(out)
    key = cpuset_key(inner)
    assert got["prepared"] == [] and got["after_tick"] == [key]  # not taken for gone
    assert got["left"] == [key] and got["after_stop"] == [key]  # not taken for restored
    with open(f"{inner}/cpuset.cpus") as f:
        assert f.read().strip() == halved
    assert CpuSetOwner(OriginalValues(str(state))).release_all() == []  # open again: put back
    with open(f"{inner}/cpuset.cpus") as f:
        assert f.read().strip() == original
    assert list(OriginalValues(str(state)).items()) == []
