"""Below MBA's lowest value a capped job gets fewer cores (issue #27, item 3): the one
owner of every job's CPUs writes them, recorded before it touches them, and puts them
back when the cap ends or the job's demand falls; on the simulated node through the
daemon, with the emulator's MBA."""

import os

import pytest

from support.waiting import wait_for
from support.bandwidth import rate_bounds_over
from support.clocks import WallClock
from support.eliminator import Harness

from noded.actuators.cpurecords import affinity_key
from noded.loop.overrides import Override, OverrideStore
from noded.capping.cores import RELEASE_SHARE, UNREACHABLE_S, CoreStep, next_level
from noded.util.procstat import STARTTIME, stat_fields

REAL = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(REAL) < 2, reason="halving needs two CPUs or more")
GB = 1e9


# ------------------------------------------------------------------ the decision, pure

def test_halved_only_once_the_lowest_value_has_missed_the_cap_for_a_while_and_the_last_change_settled():
    assert next_level(0, 8, 8 * GB, unreachable_for_s=UNREACHABLE_S / 2, lowest_bound_bps=10 * GB,
                      since_change_s=None) == CoreStep(0)
    step = next_level(0, 8, 8 * GB, unreachable_for_s=UNREACHABLE_S, lowest_bound_bps=10 * GB, since_change_s=None)
    assert step.level == 1 and "4 of them" in step.why
    assert next_level(1, 8, 8 * GB, unreachable_for_s=5.0, lowest_bound_bps=10 * GB, since_change_s=0.2).level == 1
    assert next_level(3, 8, 8 * GB, unreachable_for_s=5.0, lowest_bound_bps=10 * GB, since_change_s=5).level == 3


def test_a_halving_is_undone_only_where_mba_alone_would_hold_the_cap_with_room():
    cap = 8 * GB
    # on 4 of 8 CPUs the lowest value passes 3.2 GB/s at most: on 8, 6.4 = 80 % of the cap
    assert next_level(1, 8, cap, unreachable_for_s=None, lowest_bound_bps=RELEASE_SHARE * cap / 2,
                      since_change_s=2).level == 0
    assert next_level(1, 8, cap, unreachable_for_s=None, lowest_bound_bps=0.45 * cap,
                      since_change_s=2).level == 1  # 90 %: too near the cap to undo
    assert next_level(1, 8, cap, unreachable_for_s=None, lowest_bound_bps=None, since_change_s=2).level == 1
    # three CPUs halve to one: undoing gives three back, not two
    assert next_level(1, 3, cap, unreachable_for_s=None, lowest_bound_bps=0.3 * cap, since_change_s=2).level == 1


# ------------------------------------------------------------ through the daemon

def affinity(pid):
    return sorted(os.sched_getaffinity(pid))


@pytest.mark.fuse
@needs_two_cpus
def test_a_cap_below_the_lowest_mba_value_is_met_on_fewer_cores_and_the_cores_come_back(tmp_path):
    # "intel": the whole group held at value/100 x peak: 10 % of 50 GB/s is 5 GB/s a domain,
    # and the hog asks 7 a domain on all its CPUs (3.5 on half of them: the node follows them)
    h = Harness(tmp_path, "  - {at: 0, start: {id: hog, cpu_gbps: 14}}\n  - {at: 0, start: {id: quiet, cpu_gbps: 0.1}}\n",
                profile="intel", peak=50)
    try:
        clock = WallClock()
        h.daemon.control.overrides = store = OverrideStore(h.config.state_dir, clock)
        h.until(lambda r: sum((x.sample.jobs.get("sim:hog") and x.sample.jobs["sim:hog"].bandwidth_bps or 0) > 0
                              for x in h.results) >= 3, 15, "the hog running")
        pid = h.sim.procs["hog"].pid
        half = REAL[: len(REAL) // 2]
        cap = 8 * GB  # below the 10 GB/s the lowest MB value passes on every CPU
        store.set(Override("sim:hog", 0, 0, "test", clock(), None, cap))
        r = h.until(lambda r: affinity(pid) == half, 20, f"the hog on {len(half)} of its {len(REAL)} CPUs")
        start = stat_fields("/proc", pid)[STARTTIME].decode()
        # recorded before the first write, as every change of a job's CPUs is
        assert h.daemon.parts.cpu_owner.originals.get(affinity_key(pid, start)) == REAL
        r = h.until(lambda r: r.caps["sim:hog"].cpus == f"{len(half)} of {len(REAL)} CPUs", 2, "the cores explained")
        # only caps change CPUs on this host: the capped job's are read, not every job's
        assert r.sample.jobs["sim:hog"].cpus is not None and r.sample.jobs["sim:quiet"].cpus is None
        assert r.sample.job_errors == ()  # not asked for is not "could not be read"
        group = h.daemon.parts.throttle.cap_name("sim:hog")
        wait_for(lambda: rate_bounds_over(h.rc(), group, 1.0)[1] <= 1.05 * cap, timeout=10,
                 what="the hog at its cap or under on fewer cores")
        # the cap ends: its own CPUs back, the record gone
        store.clear("sim:hog", 0)
        h.until(lambda r: affinity(pid) == REAL and "sim:hog" not in r.caps, 10, "the hog's CPUs back")
        assert h.daemon.parts.cpu_owner.originals.get(affinity_key(pid, start)) is None
        # capped again, then its demand falls: MBA alone holds the cap, the CPUs come back
        store.set(Override("sim:hog", 0, 0, "again", clock(), None, cap))
        h.until(lambda r: affinity(pid) == half, 20, "the hog on fewer CPUs again")
        h.sim._set_demand("hog", 4)  # 2 GB/s a domain on all its CPUs
        h.until(lambda r: affinity(pid) == REAL, 20, "the hog's CPUs back once its demand fell")
        assert "sim:hog" in h.results[-1].caps and h.results[-1].caps["sim:hog"].cpus is None
        # and none are left changed at stop
        store.set(Override("sim:hog", 0, 0, "third", clock(), None, 1 * GB))
        h.sim._set_demand("hog", 14)
        h.until(lambda r: len(affinity(pid)) < len(REAL), 20, "fewer CPUs a third time")
        h.daemon.shutdown()
        assert affinity(pid) == REAL
    finally:
        h.stop()
