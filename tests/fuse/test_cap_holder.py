"""A job held at a cap on a mounted resctrl (the emulator, MBA as hardware applies it):
its own control group, counters read every 100 ms on their own schedule, and, where the
kernel's mba_MBps is mounted, the kernel's controller left to steer (issue #27, item 3)."""

import logging
import time

import pytest

from support.waiting import wait_for
from noded.capping.holder import KERNEL_MBPS, NODED, CapHolder
from noded.util.journal import NOTICE

pytestmark = pytest.mark.fuse
GB = 1e9


def bandwidth_over(rc, group: str, seconds: float) -> float:
    """The group's bytes/s over ``seconds``, from its counters as any reader sees them."""
    def total() -> int:
        return sum(int(open(f"{rc.root}/{group}/mon_data/{d}/mbm_total_bytes").read())
                   for d in ("mon_L3_00", "mon_L3_01"))
    t0, b0 = time.monotonic(), total()
    time.sleep(seconds)  # a measurement window, not a synchronisation
    return (total() - b0) / (time.monotonic() - t0)


@pytest.mark.parametrize("profile", ["intel-quantised", "amd"])
def test_a_job_is_held_at_its_cap_within_a_second_or_two(emulator, open_resctrl, sleeper, profile):
    emu = emulator(profile, "--peak-gbps", "1000")
    rc = open_resctrl(emu)
    job = sleeper()
    emu.control.set_demand(job.pid, 4 * 14 * GB, domain=0, threads=4)  # 4 busy threads of 14 GB/s
    cap = 20 * GB
    holder = CapHolder(rc, "j1", [job.pid], cap, busy_threads=lambda: 4).start()
    try:
        assert holder.mode == NODED
        group = f"{rc.prefix}cap-j1"
        # Real time on a shared 2-core box: the emulator's FUSE round trips are milliseconds.
        wait_for(lambda: abs(bandwidth_over(rc, group, 1.0) / cap - 1) <= 0.05, timeout=10,
                 what=f"{profile}: the job within 5 % of its cap over a second")
    finally:
        holder.stop()
    assert f"{rc.prefix}cap-j1" not in [g.name for g in rc.list_ctrl_groups()]


def test_where_the_kernels_mba_mbps_is_mounted_it_steers_and_noded_only_sets_the_target(
        emulator, open_resctrl, sleeper, caplog):
    emu = emulator("intel-mbps", "--peak-gbps", "1000")
    rc = open_resctrl(emu)
    job = sleeper()
    with caplog.at_level(logging.DEBUG, logger="noded.changes"):
        holder = CapHolder(rc, "j2", [job.pid], 6 * GB).start()
    try:
        assert holder.mode == KERNEL_MBPS and holder.controller is None
        # and says so in the journal, at notice as a change (issue #27: "use it and say so")
        said = [r for r in caplog.records if getattr(r, "noded_action", None) == "cap-kernel"]
        assert len(said) == 1 and said[0].levelno == NOTICE and said[0].noded_job == "j2", caplog.text
        assert said[0].noded_event == "mbm_total_bytes" and "the kernel's controller owns the MB value" in \
            said[0].getMessage()
        path = f"{rc.root}/{rc.prefix}cap-j2"
        assert open(f"{path}/schemata").read().splitlines()[-1] == f"MB:0={int(6e9 / 2**20)};1={int(6e9 / 2**20)}"
        assert open(f"{path}/mba_MBps_event").read() == "mbm_total_bytes\n"  # its total, not local only
    finally:
        holder.stop()


def test_a_group_removed_under_the_holder_stops_it_without_a_traceback(emulator, open_resctrl, sleeper, caplog):
    emu = emulator("intel-linear", "--peak-gbps", "1000")
    rc = open_resctrl(emu)
    job = sleeper()
    emu.control.set_demand(job.pid, 20 * GB, domain=0)
    holder = CapHolder(rc, "j3", [job.pid], 5 * GB).start()
    rc.ctrl_group(f"{rc.prefix}cap-j3").remove()  # an operator's rmdir
    wait_for(lambda: not holder._thread.is_alive(), timeout=5, what="the holder's thread to stop")
    assert "cap j3: stopped steering" in caplog.text
    holder.stop()  # and stop() still returns cleanly


def test_an_error_of_nodeds_own_in_the_holder_is_logged_with_its_traceback_and_the_holder_reads_not_alive(
        emulator, open_resctrl, sleeper, caplog):
    # a fault in noded's steering (not the kernel's): the thread must not die with its traceback
    # on stderr only; the service restarts a holder that is not alive at the next tick
    emu = emulator("intel-linear", "--peak-gbps", "1000")
    rc = open_resctrl(emu)
    job = sleeper()

    def broken_count() -> int:
        raise RuntimeError("a bug in counting threads")

    with caplog.at_level(logging.WARNING, logger="noded"):
        holder = CapHolder(rc, "j4", [job.pid], 5 * GB, busy_threads=broken_count).start()
        try:
            wait_for(lambda: not holder.alive, timeout=5, what="the holder to stop steering")
            wait_for(lambda: "cap j4: stopped steering on an error of noded's" in caplog.text, timeout=5,
                     what="the error said")
            said = [r for r in caplog.records if "stopped steering on an error" in r.getMessage()]
            assert said[0].levelno == logging.ERROR and said[0].exc_info is not None
        finally:
            holder.stop()
    assert f"{rc.prefix}cap-j4" not in [g.name for g in rc.list_ctrl_groups()]
