"""Observe, don't believe (issue #11, items 1 and 8): a tick that cannot read the node
changes nothing and forgets nothing; what noded did is read back from the kernel, so
a failed write, a stray task or a remount is put right; resctrl can be unmounted
while noded runs."""

import os
import resource
import shutil
import subprocess
from contextlib import contextmanager

import pytest

from support.waiting import wait_for
from noded.samplers.mongroups import group_name
from noded.samplers.resctrl import read_groups
from nodesim.resctrl_emulator import MountedEmulator
from support.eliminator import NLP_AND_HOG

pytestmark = pytest.mark.fuse


@contextmanager
def descriptors_exhausted():
    """EMFILE for every new descriptor of this process (as ~1000 slow clients once caused)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = max(int(n) for n in os.listdir("/proc/self/fd")) + 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use, hard))
    fillers = []
    try:
        while True:  # the free numbers below the limit, too
            try:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def listing(h):
    """noded's groups as the kernel lists them: control group -> task ids, and monitoring groups."""
    view = read_groups(h.rc())
    return {n: set(t) for n, t in view.ctrl_tasks.items()}, dict(view.mon_parent)


@pytest.fixture
def throttled(harness):
    h = harness(NLP_AND_HOG)
    h.until(lambda r: r.levels.get("sim:hog", 0) >= 1, 20, "the hog throttled")
    return h


def hog_pid(h):
    return next(iter(h.results[-1].sample.jobs["sim:hog"].pids))


def test_a_tick_out_of_descriptors_holds_everything_and_forgets_nothing(throttled):
    h = throttled
    level = h.results[-1].levels["sim:hog"]
    before = listing(h)
    assert hog_pid(h) in before[0][f"noded-mba-{level}"]
    with descriptors_exhausted():
        results = [h.daemon.tick() for _ in range(3)]
    for r in results:
        # Either the jobs are unknown (held), or every job still there: never "no jobs".
        assert not r.sample.jobs_known or "sim:hog" in r.sample.jobs
        assert r.decision.levels.get("sim:hog") == level
        assert not any(a.job == "sim:hog" for a in r.decision.actions)
    assert any(not r.sample.jobs_known for r in results)
    assert listing(h) == before  # no group removed, no task moved
    r = h.tick()
    # The level in force is read back from the kernel, and the policy goes on from it.
    assert r.sample.jobs_known and h.daemon.parts.throttle.levels_in_force(r.sample)["sim:hog"] == level
    assert all(a.from_level == level for a in r.decision.actions if a.job == "sim:hog")


def test_a_group_whose_rmdir_failed_is_removed_later(throttled):
    h = throttled
    monitor = h.daemon.parts.telemetry.monitor
    view = read_groups(h.rc())
    hog = group_name("noded-", "sim:hog")
    jobs = {j: job for j, job in h.sim.discovery.discover().items() if j != "sim:hog"}  # as if the hog ended
    with descriptors_exhausted():
        monitor.sync(jobs, view)  # rmdir cannot even take resctrl's lock: EMFILE
    assert hog in listing(h)[1]
    monitor.sync(jobs, read_groups(h.rc()))
    assert hog not in listing(h)[1]


def test_tasks_found_in_a_level_no_one_wants_are_put_back_and_stop_removes_every_group(throttled):
    h = throttled
    rc = h.rc()
    pid = hog_pid(h)
    # The hog's tasks turn up in a level noded did not pick (a failed write, an earlier run):
    stray = rc.ensure_ctrl_group("noded-mba-5")
    hog_group = next(g for ctrl in rc.list_ctrl_groups() for g in ctrl.list_mon_groups()
                     if g.name == group_name("noded-", "sim:hog"))
    hog_group.move_to(stray)
    r = h.daemon.tick()
    assert r.sample.jobs["sim:hog"].ctrl_groups == {"noded-mba-5"}
    r = h.daemon.tick()  # read back: level 5 in force, the policy's level wanted: moved there
    wanted = h.daemon.state.throttles["sim:hog"].level
    assert r.levels["sim:hog"] == wanted and pid in listing(h)[0][f"noded-mba-{wanted}"]
    h.daemon.tick()
    assert "noded-mba-5" not in listing(h)[0]  # unwanted and empty of job groups: removed
    # A task of no job left in one of our groups (and a group noded has no memory of):
    other = subprocess.Popen(["sleep", "300"])
    try:
        rc.ensure_ctrl_group("noded-mba-4").add_process(other.pid)
        h.daemon.shutdown()
        assert listing(h) == ({}, {})  # every group of ours gone: the kernel put the tasks back in the root
        assert pid in rc.root_group().read_tasks() and other.pid in rc.root_group().read_tasks()
    finally:
        other.kill()
        other.wait()


def test_resctrl_can_be_unmounted_and_remounted_with_mba_mbps_while_noded_runs(throttled):
    h = throttled
    emu = h.sim.emu
    # No descriptor of noded's is open in resctrl between ticks, so a plain umount works.
    p = subprocess.run(["fusermount3", "-u", emu.root], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    emu.proc.wait(timeout=10)
    r = h.daemon.tick()
    assert any(m.startswith("resctrl: ") for m in r.sample.missing) and r.levels == {}
    # The operator mounts it again, now with mba_MBps (MB values in MiB/s).
    h.sim.emu = MountedEmulator("intel-mbps", workdir=emu.workdir, extra_args=["--peak-gbps", "8"]).start()
    try:
        for job, gbps in h.sim.demand_gbps.items():
            h.sim._set_demand(job, gbps)
        r = h.until(lambda r: r.levels.get("sim:hog", 0) >= 1, 20, "the hog throttled on the new mount")
        level = r.levels["sim:hog"]
        share = h.config.contention.mba_levels[level - 1]
        mb = read_groups(h.rc()).ctrl_mb[f"noded-mba-{level}"]
        assert set(mb.values()) == {int(share * 8e9 / (1 << 20))}  # MiB/s, not a percentage
    finally:
        h.stop()
        shutil.rmtree(emu.workdir, ignore_errors=True)


def test_a_task_of_a_job_stranded_in_a_level_is_brought_back(throttled):
    h = throttled
    rc = h.rc()
    spare = next(f"noded-mba-{n}" for n in range(5, 0, -1) if n != h.results[-1].levels["sim:hog"])
    # A job of two processes; one of them sits in one of our levels (moved there while the
    # job had no monitoring group of its own, say), where no job is wanted.
    tree = subprocess.Popen(["sh", "-c", "sleep 300 & exec sleep 300"])
    try:
        child = int(wait_for(lambda: open(f"/proc/{tree.pid}/task/{tree.pid}/children").read().split(),
                             what="the child")[0])
        rc.ensure_ctrl_group(spare).add_process(child)
        h.sim.discovery.register(tree.pid, "stranded")
        r = h.daemon.tick()
        assert r.sample.jobs["stranded"].ctrl_groups == {spare}
        assert h.daemon.parts.throttle.levels_in_force(r.sample)["stranded"] == -1  # unsettled: put right
        h.daemon.tick()
        assert child in rc.root_group().read_tasks() and spare not in listing(h)[0]
        # Back in the root, it joins its job's monitoring group (counted as the job's again).
        group = h.daemon.parts.telemetry.monitor.groups()["stranded"]
        assert child in group.read_tasks()
    finally:
        tree.kill()
        tree.wait()
