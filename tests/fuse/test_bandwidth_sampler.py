"""noded's bandwidth sampler on the mounted emulator, where a control group's counter sums
its monitoring groups' as the kernel does, leaving out each whose read fails: while a job's
counter fails the node's bandwidth is unknown, never a total short of that job, and the
tick it reads again is no spike of its whole count."""

import time
from types import SimpleNamespace

from noded.samplers.bandwidth import BandwidthSampler

GB = 1e9


def test_a_job_whose_counter_fails_leaves_the_node_unknown_not_short_of_it(emulator, open_resctrl, sleeper):
    emu = emulator("intel")
    rc = open_resctrl(emu)
    root = rc.root_group()
    groups = {}
    for name, gbps in (("a", 2), ("b", 1)):
        p = sleeper()
        groups[name] = g = root.create_mon_group(f"noded-{name}")
        with open(f"{g.path}/tasks", "w") as f:
            f.write(f"{p.pid}\n")
        emu.control.set_demand(p.pid, gbps * GB, domain=0)
    sampler = BandwidthSampler(SimpleNamespace(created_at=lambda job: None))

    def tick():
        time.sleep(0.5)  # a measurement window, not a synchronisation
        s = sampler.sample(rc, 1, groups)
        return s.node_bps[0]

    for _ in range(3):
        node = tick()
    assert node is not None and 2 * GB < node < 4 * GB
    emu.control.set_counter_state("Error", group="/mon_groups/noded-a")
    failing = [tick() for _ in range(3)]
    emu.control.set_counter_state(None, group="/mon_groups/noded-a")
    back = [tick() for _ in range(3)]
    assert failing == [None] * 3, [v and v / GB for v in failing]  # never b's alone (1 GB/s)
    assert all(v is None or v < 4 * GB for v in back), [v and v / GB for v in back]  # never a's whole count
    assert back[-1] is not None and 2 * GB < back[-1] < 4 * GB


def test_a_job_group_removed_after_thin_ticks_leaves_the_node_rate_whole(emulator, open_resctrl, sleeper):
    # noded's monitoring sync removes an ended job's group, reading its counters first; the
    # kernel drops the group's count from the root's total, and the sampler adds it back:
    # the node's rate on that tick is its last window's, though the node was read thin
    from noded.samplers.bandwidth import QuietRead
    from noded.samplers.mongroups import JobMonitor
    from noded.samplers.resctrl import ResctrlSession, read_groups
    from noded.jobs.model import Job

    emu = emulator("intel")
    rc = open_resctrl(emu)
    monitor = JobMonitor(ResctrlSession.of(rc), clock=time.monotonic, retry_s=3600)
    pids = {}
    for name, gbps in (("a", 2), ("b", 1), ("c", 0.5), ("d", 0.5)):
        pids[name] = p = sleeper()
        emu.control.set_demand(p.pid, gbps * GB, domain=0)
    sampler = BandwidthSampler(monitor)
    quiet = QuietRead(below_bps=50 * GB, every=4)

    def tick(names):
        time.sleep(0.5)  # a measurement window, not a synchronisation
        report = monitor.sync({n: Job(n, "registered", frozenset({pids[n].pid})) for n in names},
                              read_groups(rc))
        return report, sampler.sample(rc, 1, report.groups, quiet, report.removed)

    for _ in range(6):  # groups made, then read thin
        _, s = tick("abcd")
    assert not s.jobs_current  # thin
    report, s = tick("bcd")  # a's job ended: its group removed (its process runs on, in the root's RMID)
    ((path, parent, last),) = report.removed
    assert path.endswith("/mon_groups/" + monitor_name(rc, "a")) and parent == rc.root and last[0]
    assert 3.5 * GB < s.node_bps[0] < 4.5 * GB, s.node_bps[0] / GB  # 2 + 1 + 0.5 + 0.5, the last window's


def monitor_name(rc, job):
    from noded.samplers.mongroups import group_name

    return group_name(rc.prefix, job)


def test_a_job_group_named_as_before_2026_11_is_replaced_whole_and_the_first_rate_is_the_jobs(
        emulator, open_resctrl, sleeper):
    # noded before 2026-11 named a job's group with SHA-1's first 32 bits; a group it left
    # (a stop whose rmdir failed, a dry run's) is no job's under the new names: sync reads
    # its counters, removes it and makes the job's new group with the job's threads in it,
    # in one tick, leaving nothing of noded's behind; the job's first rate is its own (over
    # the time the new group counted), not the old group's count since its mkdir
    import hashlib
    import re

    from noded.jobs.model import Job
    from noded.samplers.mongroups import JobMonitor
    from noded.samplers.resctrl import ResctrlSession, read_groups

    emu = emulator("intel")
    rc = open_resctrl(emu)
    job = "cgroup:/tenant/train.scope"
    old_name = "noded-job-" + re.sub(r"[^A-Za-z0-9_.-]", "_", job)[:40] + "-" + hashlib.sha1(job.encode()).hexdigest()[:8]
    p = sleeper()
    emu.control.set_demand(p.pid, 2 * GB, domain=0)
    old = rc.root_group().create_mon_group(old_name)
    old.add_process(p.pid)
    time.sleep(1.0)  # a measurement window: the old group counts about 2 GB
    monitor = JobMonitor(ResctrlSession.of(rc), clock=time.monotonic, retry_s=3600)
    sampler = BandwidthSampler(monitor)
    report = monitor.sync({job: Job(job, "registered", frozenset({p.pid}))}, read_groups(rc))
    ((path, parent, last),) = report.removed
    assert path == old.path and parent == rc.root and last[0]["mbm_total_bytes"].value > 1.5 * GB  # read before rmdir
    new = report.groups[job]
    assert new.name == monitor_name(rc, job) != old_name and report.monitoring[job] == "own"
    assert [g.path for g in rc.owned_groups()] == [new.path]  # nothing of noded's orphaned
    with open(f"{new.path}/tasks") as f:
        assert str(p.pid) in f.read().split()
    sampler.sample(rc, 1, report.groups, None, report.removed)
    time.sleep(0.5)  # a measurement window, not a synchronisation
    report = monitor.sync({job: Job(job, "registered", frozenset({p.pid}))}, read_groups(rc))
    assert not report.removed and report.groups[job].path == new.path
    rate = sampler.sample(rc, 1, report.groups, None, report.removed).job_bps[job][0]
    assert rate is not None and 1.5 * GB < rate < 2.5 * GB, rate / GB  # its 2 GB/s, not 2 GB in one window
