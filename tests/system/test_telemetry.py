"""Telemetry on the emulated node: monitoring groups per job, races, RMID scarcity,
churn without leaks, new processes placed at once, sticky GPU classification."""

import logging
import os
import signal
import subprocess
import sys
import time
import tracemalloc

import pytest

from support.waiting import wait_for
from noded.jobs import Job, JobDiscovery
from noded.samplers.mongroups import JobMonitor
from noded.samplers.nvml import NvmlSampler
from noded.samplers.resctrl import ResctrlSession, read_groups
from nodesim.gpus import SimGpus, SimProcess, make_gpus
from noded.samplers.telemetry import Telemetry

pytestmark = pytest.mark.fuse


def job(jid, *pids):
    return Job(jid, "registered", frozenset(pids))


@pytest.fixture
def node(emulator, open_resctrl):
    def make(*emulator_args, profile="intel"):
        emu = emulator(profile, *emulator_args)
        rc = open_resctrl(emu)
        monitor = JobMonitor(ResctrlSession.of(rc), clock=time.monotonic, retry_s=3600)
        return emu, rc, monitor

    return make


def sync(monitor, jobs):
    """One sync as a tick runs it: from the kernel's listing of noded's groups now."""
    return monitor.sync(jobs, read_groups(monitor.session.rc))


def mon_groups(rc):
    return sorted(os.listdir(os.path.join(rc.root, "mon_groups")))


def test_each_job_gets_a_group_holding_all_its_threads(node, sleeper):
    emu, rc, monitor = node()
    a, b = sleeper(), sleeper()
    report = sync(monitor, {"j1": job("j1", a.pid, b.pid)})
    group = monitor.groups()["j1"]
    assert report.monitoring == {"j1": "own"} and sorted(group.read_tasks()) == sorted([a.pid, b.pid])
    sync(monitor, {})
    assert mon_groups(rc) == []


def test_a_process_exiting_between_listing_and_moving_is_reported(node, sleeper):
    emu, rc, monitor = node()
    live = sleeper()
    dead = subprocess.Popen(["true"])
    dead.wait()  # listed by discovery a moment ago, gone now
    report = sync(monitor, {"j": job("j", live.pid, dead.pid)})
    assert report.vanished == (dead.pid,) and monitor.groups()["j"].read_tasks() == [live.pid]


def test_out_of_rmids_falls_back_to_shared_monitoring_without_a_retry_storm(node, sleeper, caplog):
    emu, rc, monitor = node("--num-rmids", "3", "--limbo-ms", "0")  # two groups besides the root
    p = [sleeper() for _ in range(3)]
    jobs = {f"j{i}": job(f"j{i}", p[i].pid) for i in range(3)}
    with caplog.at_level(logging.WARNING, logger="noded.samplers.mongroups"):
        for _ in range(5):
            report = sync(monitor, jobs)
    assert sorted(report.monitoring.values()) == ["own", "own", "shared"] and report.rmids_exhausted
    assert sum("rmids=exhausted" in r.message for r in caplog.records) == 1
    shared = next(j for j, m in report.monitoring.items() if m == "shared")
    ended = next(j for j, m in report.monitoring.items() if m == "own")
    del jobs[ended]
    report = sync(monitor, jobs)  # a freed group is retried at once, not after retry_s
    assert report.monitoring[shared] == "own" and not report.rmids_exhausted


def test_a_group_removed_behind_our_back_is_recreated(node, sleeper):
    emu, rc, monitor = node()
    p = sleeper()
    jobs = {"j": job("j", p.pid)}
    sync(monitor, jobs)
    os.rmdir(monitor.groups()["j"].path)  # an operator's rmdir
    sync(monitor, {"j": job("j", p.pid, sleeper().pid)})
    report = sync(monitor, {"j": job("j", p.pid)})
    assert report.monitoring == {"j": "own"} and p.pid in monitor.groups()["j"].read_tasks()


def telemetry_for(rc, discovery, monitor, **kw):
    return Telemetry(discovery, monitor.session, monitor, NvmlSampler(), **kw)


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_200_short_lived_jobs_leak_no_groups_fds_or_memory(node):
    emu, rc, monitor = node()
    gpus = SimGpus(os.path.join(emu.workdir, "nvml.shm"), make_gpus(2))
    gpus.install()
    discovery = JobDiscovery([])
    telemetry = telemetry_for(rc, discovery, monitor, process_events=False)
    try:
        def churn(n):
            for _ in range(n):
                p = subprocess.Popen(["sleep", "300"])
                discovery.register(p.pid)
                telemetry.sample()
                p.kill()
                p.wait()
                telemetry.sample()

        churn(20)  # warm up caches and lazily created objects
        fds = open_fds()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        churn(200)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
        assert mon_groups(rc) == []
        assert open_fds() <= fds
        assert grown < 512 * 1024, f"memory grew by {grown} bytes over 200 jobs"
        assert telemetry.bandwidth.reader.open_files == 0  # nothing kept open in resctrl between ticks
    finally:
        telemetry.close()
        gpus.close()


@pytest.mark.parametrize("events", [True, False], ids=["connector", "polling"])
def test_a_new_process_lands_in_its_jobs_group(node, sleeper, events):
    emu, rc, monitor = node()
    discovery = JobDiscovery([])
    telemetry = telemetry_for(rc, discovery, monitor, process_events=events)
    parent = child = None
    try:
        if events and telemetry.events is None:
            pytest.skip("process-events connector unavailable here")
        code = ("import signal,subprocess,time\n"
                "signal.signal(signal.SIGUSR1, lambda *a: print(subprocess.Popen(['sleep','300']).pid, flush=True))\n"
                "print('up', flush=True)\n"
                "while True: time.sleep(1)")
        parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert parent.stdout.readline() == "up\n"
        discovery.register(parent.pid, "tree")
        telemetry.sample()
        group = monitor.groups()["tree"]
        # A child of a registered job is in its group: via the connector at once,
        # via inheritance or the next tick's reconciliation otherwise.
        parent.send_signal(signal.SIGUSR1)
        child = int(parent.stdout.readline())
        if not events:
            telemetry.sample()
        # no sample() after this one: the deadline only ends a wait for what the connector's
        # thread (or the kernel's inheritance) must do, a wait a starved thread may make long
        wait_for(lambda: child in group.read_tasks(), timeout=30, what="the child in the job's group")
    finally:
        telemetry.close()
        if parent is not None:
            parent.kill()
            parent.wait()
        if child is not None:
            os.kill(child, signal.SIGKILL)


def test_a_gpu_job_stays_a_gpu_job_while_its_gpu_is_lost(node, sleeper):
    emu, rc, monitor = node()
    gpus = SimGpus(os.path.join(emu.workdir, "nvml.shm"), make_gpus(2))
    gpus.install()
    discovery = JobDiscovery([])
    telemetry = telemetry_for(rc, discovery, monitor, process_events=False)
    try:
        p = sleeper()
        gpus[1].processes[p.pid] = SimProcess(p.pid, sm_util=50)
        gpus.publish()
        discovery.register(p.pid, "train")
        assert telemetry.sample().jobs["train"].kind == "gpu"
        gpus[1].lost = True
        gpus.publish()
        s = telemetry.sample()
        assert s.jobs["train"].kind == "gpu" and s.jobs["train"].gpu_util is None
        assert "gpu 1: GpuIsLost" in s.missing
    finally:
        telemetry.close()
        gpus.close()


def test_a_process_exec_in_a_job_cgroup_is_placed_without_waiting_for_a_tick(node, v1_cpuset):
    from noded.jobs import CgroupSource

    emu, rc, monitor = node()
    base, mkcg = v1_cpuset
    job_dir = mkcg("slurm/uid_0/job_9")
    discovery = JobDiscovery([CgroupSource.create("slurm", base)])
    telemetry = Telemetry(discovery, monitor.session, monitor, None, process_events=True)
    try:
        if telemetry.events is None:
            pytest.skip("process-events connector unavailable here")
        subprocess.Popen(["sh", "-c", f"echo $$ > {job_dir}/cgroup.procs; exec sleep 300"])  # ended with the cgroup
        wait_for(lambda: telemetry.sample() and monitor.groups(), what="the job's group")
        group = monitor.groups()["slurm:9"]
        p = subprocess.Popen(["sh", "-c", f"echo $$ > {job_dir}/cgroup.procs; exec sleep 300"])
        # No sample() from here on: only the connector can place it (its thread, starved on a
        # loaded host, may take seconds; what proves the connector is that nothing else runs)
        wait_for(lambda: p.pid in group.read_tasks(), timeout=30, what="the new process in its job's group")
    finally:
        telemetry.close()


def test_a_task_in_someone_elses_control_group_is_left_there(node, sleeper):
    emu, rc, monitor = node()
    p = sleeper()
    os.mkdir(f"{emu.root}/their-group")  # another tool's allocation
    with open(f"{emu.root}/their-group/tasks", "w") as f:
        f.write(str(p.pid))
    sync(monitor, {"j": job("j", p.pid)})
    with open(f"{emu.root}/their-group/tasks") as f:
        assert f.read().split() == [str(p.pid)]
    assert monitor.groups()["j"].read_tasks() == []


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_an_input_missing_is_logged_once_when_it_goes_and_once_when_it_is_back(node, sleeper, caplog):
    # Issue #26, item 5's class: NodedBlind sees an input missing for 5 minutes and sends the
    # operator to the journal, where a lost GPU said nothing at all (a failing sampler said
    # itself every tick). Now: one line when it goes, none while it stays, one when it has
    # been back for the grace period.
    emu, rc, monitor = node()
    gpus = SimGpus(os.path.join(emu.workdir, "nvml.shm"), make_gpus(2))
    gpus.install()
    clock = Clock()
    telemetry = telemetry_for(rc, JobDiscovery([]), monitor, process_events=False, clock=clock)

    def states():
        return [(r.noded_state_change, r.getMessage()) for r in caplog.records
                if getattr(r, "noded_state", None) == "input_missing"]

    def sample_for(seconds):
        for _ in range(int(seconds)):
            clock.t += 1.0
            telemetry.sample()

    try:
        with caplog.at_level(logging.DEBUG, logger="noded.changes"):
            sample_for(3)
            assert states() == []
            gpus[1].lost = True
            gpus.publish()
            sample_for(telemetry.missing.grace_s - 1)  # not yet: one missing a moment is not said
            assert states() == []
            sample_for(20)
            assert [(c, m.split(": ", 1)[1]) for c, m in states()] == [("entered", "gpu 1: GpuIsLost (for 10s)")]
            gpus[1].lost = False
            gpus.publish()
            sample_for(telemetry.missing.grace_s - 1)  # back, but not yet for the grace period
            assert len(states()) == 1
            sample_for(2)
            changes = states()
            assert [c for c, _ in changes] == ["entered", "ended"], changes
            assert "gpu 1 measured again" in changes[1][1] and "GpuIsLost" in changes[1][1]
            sample_for(10)
            assert len(states()) == 2
    finally:
        telemetry.close()
        gpus.close()
