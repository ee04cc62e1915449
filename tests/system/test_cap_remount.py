"""A capped job's holder on a resctrl that goes away and comes back (issue #27, item 3):
started again on the new mount, not left on a dead group until its cap ends."""

import shutil
import subprocess

import pytest

from support.waiting import wait_for
from support.bandwidth import rate_bounds_over, within
from support.clocks import WallClock
from support.eliminator import NLP_AND_HOG, Harness

from noded.loop.overrides import Override, OverrideStore
from nodesim.resctrl_emulator import MountedEmulator


def steered(r):
    return r.caps.get("sim:hog") is not None and r.caps["sim:hog"].mode == "noded"


@pytest.mark.fuse
def test_a_holder_is_started_again_on_resctrl_mounted_again(tmp_path, caplog):
    h = Harness(tmp_path, NLP_AND_HOG, profile="intel-quantised", peak=1000)
    old_workdir = None
    try:
        clock = WallClock()
        h.daemon.control.overrides = store = OverrideStore(h.config.state_dir, clock)

        def hog(r):
            return r.sample.jobs.get("sim:hog") and r.sample.jobs["sim:hog"].bandwidth_bps or 0

        free = hog(h.until(lambda r: sum(hog(x) > 0 for x in h.results) >= 3, 15, "the hog running"))
        cap = 0.7 * free
        store.set(Override("sim:hog", 0, 0, "test", clock(), None, cap))
        h.until(steered, 5, "a holder steering the hog")
        first = h.daemon.parts.caps.holders["sim:hog"]
        # resctrl goes away under the daemon (its server stops, the mount is lazily detached) ...
        emu = h.sim.emu
        emu.proc.terminate()
        emu.proc.wait(timeout=10)
        subprocess.run(["fusermount3", "-u", "-z", emu.root], check=False)
        wait_for(lambda: not first.alive, timeout=5, what="the first holder to stop steering")
        h.daemon.tick()
        # ... and is mounted again, empty, as after a reboot of resctrl
        old_workdir = emu.workdir
        h.sim.emu = MountedEmulator("intel-quantised", workdir=emu.workdir, extra_args=["--peak-gbps", "1000"]).start()
        h.sim._set_demand("hog", h.sim.demand_gbps["hog"])
        h.sim._set_demand("bert", h.sim.demand_gbps["bert"])
        h.until(lambda r: steered(r) and h.daemon.parts.caps.holders["sim:hog"] is not first
             and h.daemon.parts.caps.holders["sim:hog"].alive, 15, "a new holder on the new mount")
        assert "cap sim:hog: its holder stopped steering" in caplog.text
        group = h.daemon.parts.throttle.cap_name("sim:hog")
        rc = h.rc()
        assert group in [g.name for g in rc.list_ctrl_groups()]
        wait_for(lambda: within(rate_bounds_over(rc, group, 1.0), cap, 0.05), timeout=10,
                 what=f"the hog within 5 % of its cap {cap / 1e9:.2f} GB/s on the new mount (free: {free / 1e9:.2f})")
    finally:
        h.stop()
        if old_workdir is not None:
            shutil.rmtree(old_workdir, ignore_errors=True)
