"""The emulator's bytes moved per domain since the mount, whatever group counted them: what
the simulated node averages its GPUs' utilisation over (NVML's utilisation is an average
over its sample period, so a cap held by alternating MB values reads as its mean)."""

import os

import pytest

from nodesim.resctrl_emulator.kernel import ResctrlKernel
from nodesim.resctrl_emulator.profiles import PROFILES

GB = 1e9


def one_hog_in_group_g(sleeper):
    """A kernel on a clock the test moves (``now[0]``), a task asking 15 GB/s of a 20 GB/s
    domain in group ``g``."""
    a = sleeper()
    now = [0.0]
    kernel = ResctrlKernel(PROFILES["intel"].replace(peak_bytes_per_s=20 * GB), clock=lambda: now[0])
    kernel.mkdir(["g"])
    kernel.write(["g", "tasks"], f"{a.pid}\n".encode(), os.getpid(), 0)
    kernel.set_demand(a.pid, 15 * GB, 0)
    return kernel, now


def test_moved_bytes_integrate_every_group_and_outlive_a_removed_one(sleeper):
    kernel, now = one_hog_in_group_g(sleeper)
    kernel.write(["g", "schemata"], b"MB:0=20\n", os.getpid(), 0)  # 20 % of 20 GB/s: 4 GB/s
    now[0] = 1.0
    kernel.write(["g", "schemata"], b"MB:0=50\n", os.getpid(), 0)  # 10 GB/s from here
    now[0] = 2.0
    kernel.rmdir(["g"])  # its count goes with it; its task moves to the default group, uncapped
    now[0] = 3.0
    kernel.advance(now[0])
    # 4 GB in the first second, 10 in the second, 15 in the third
    assert kernel.moved[0] == pytest.approx(29 * GB)
    assert kernel.moved[1] == 0.0


def test_a_cap_alternating_between_two_values_moves_its_mean(sleeper):
    kernel, now = one_hog_in_group_g(sleeper)
    for period in range(10):  # 30 ms at 10 % (2 GB/s), 70 ms at 50 % (10 GB/s)
        now[0] = period * 0.1
        kernel.write(["g", "schemata"], b"MB:0=10\n", os.getpid(), 0)
        now[0] = period * 0.1 + 0.03
        kernel.write(["g", "schemata"], b"MB:0=50\n", os.getpid(), 0)
    now[0] = 1.0
    kernel.advance(now[0])
    assert kernel.moved[0] / 1.0 == pytest.approx(0.3 * 2 * GB + 0.7 * 10 * GB)
