"""The emulator's MBA against the hardware's and the kernel's own rules (issue #27, item 1).

Each test names the source of the rule it checks (see sim/nodesim/resctrl_emulator/mba.py): the
kernel's resctrl documentation, the thread_throttle_mode patches, fs/resctrl/monitor.c
update_mba_bw, and what intel-cmt-cat's users measured. The kernel model is driven in
process with a clock of the test's own, so seconds of the kernel's controller pass at once;
the tasks are real processes (the model reads /proc for them)."""

import errno
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodesim.resctrl_emulator.kernel import MIB, ResctrlKernel
from nodesim.resctrl_emulator.mba import kernel_mbps_step
from nodesim.resctrl_emulator.profiles import PROFILES

GB = 1e9


class Node:
    """One in-process emulator kernel with a clock the test moves."""

    def __init__(self, profile: str, **changes):
        self.now = 0.0
        self.kernel = ResctrlKernel(PROFILES[profile].replace(**changes), clock=lambda: self.now)

    def group(self, name: str, mb: int | None = None, *pids: int) -> None:
        self.kernel.mkdir([name])
        for pid in pids:
            self.kernel.write([name, "tasks"], f"{pid}\n".encode(), os.getpid(), 0)
        if mb is not None:
            self.write(name, "schemata", f"MB:0={mb}\n")

    def write(self, group: str, name: str, text: str) -> None:
        self.kernel.write([group, name], text.encode(), os.getpid(), 0)

    def rate(self, group: str, domain: int = 0) -> float:
        self.kernel.advance(self.now)
        rates = self.kernel.rates_now(domain)
        return sum(rates.get(r, 0.0) for r in self.kernel.groups[group].rmids())

    def read_bytes(self, group: str, event: str = "mbm_total_bytes") -> int:
        return int(self.kernel.read([group, "mon_data", "mon_L3_00", event]))

    def at(self, t: float) -> "Node":
        self.now = t
        self.kernel.advance(t)
        return self


@pytest.fixture
def two(sleeper):
    return sleeper(), sleeper()


# ------------------------------------------------- a limit on each core's requests

def test_one_percentage_gives_bandwidth_in_proportion_to_busy_threads(two):
    # resctrl.rst: "a 'single thread, with 10% b/w' and '4 thread, with 10% b/w' can consume
    # upto 10GBps and 40GBps although they have same percentage b/w of 10%".
    one, four = two
    node = Node("intel-linear", core_peak_bytes_per_s=100 * GB, peak_bytes_per_s=200 * GB)
    node.group("one", 10, one.pid)
    node.group("four", 10, four.pid)
    node.kernel.set_demand(one.pid, 60 * GB, 0, threads=1)
    node.kernel.set_demand(four.pid, 60 * GB, 0, threads=4)
    assert node.rate("one") == pytest.approx(10 * GB)
    assert node.rate("four") == pytest.approx(40 * GB)


def test_the_idealised_profile_keeps_its_whole_group_cap(two):
    # "intel" stays the idealised model the simulated node is written against: value/100 x
    # the domain's peak for the whole group, however many threads are busy.
    one, four = two
    node = Node("intel", peak_bytes_per_s=20 * GB)
    node.group("one", 20, one.pid)
    node.group("four", 20, four.pid)
    node.kernel.set_demand(one.pid, 15 * GB, 0, threads=1)
    node.kernel.set_demand(four.pid, 15 * GB, 0, threads=4)
    assert node.rate("one") == pytest.approx(4 * GB) and node.rate("four") == pytest.approx(4 * GB)


def test_the_domain_peak_is_shared_after_each_thread_is_limited(sleeper):
    # The L2-external limit per core, then L3-external bandwidth shared (resctrl.rst: 20
    # threads at 50 % each wanting 5 GB/s fill a 100 GB/s L3 whatever the percentage).
    a = sleeper()
    node = Node("intel-linear", core_peak_bytes_per_s=10 * GB, peak_bytes_per_s=100 * GB)
    node.group("a", 50, a.pid)
    node.kernel.set_demand(a.pid, 20 * 5 * GB, 0, threads=20)
    assert node.rate("a") == pytest.approx(100 * GB)
    node.write("a", "schemata", "MB:0=100\n")
    assert node.rate("a") == pytest.approx(100 * GB)  # more percentage, no more bandwidth


# ------------------------------------------------------------------- SMT siblings

@pytest.mark.parametrize("profile, mode", [("intel-linear", "max"), ("intel-per-thread", "per-thread")])
def test_thread_throttle_mode_file(profile, mode):
    assert Node(profile).kernel.read(["info", "MB", "thread_throttle_mode"]) == f"{mode}\n"


@pytest.mark.parametrize("profile, cpus, fast_share", [
    ("intel-linear", (0, 1), 0.1),  # siblings: both at the lower setting
    ("intel-linear", (0, 2), 1.0),  # two cores: each its own
    ("intel-per-thread", (0, 1), 1.0),  # per-thread MBA: each thread its own
])
def test_siblings_share_the_lower_setting_where_the_mode_is_max(two, profile, cpus, fast_share):
    # 29b6bd41ee24: per-core MBA applies "the higher throttling value (lower bandwidth) to both".
    slow, fast = two
    node = Node(profile, core_peak_bytes_per_s=10 * GB, peak_bytes_per_s=100 * GB)
    node.group("slow", 10, slow.pid)
    node.group("fast", 100, fast.pid)
    node.kernel.set_demand(slow.pid, 20 * GB, 0, cpus=(cpus[0],))
    node.kernel.set_demand(fast.pid, 20 * GB, 0, cpus=(cpus[1],))
    assert node.rate("slow") == pytest.approx(1 * GB)
    assert node.rate("fast") == pytest.approx(fast_share * 10 * GB)


# ------------------------------------------------- quantisation and a non-linear scale

def pqos_rounding(percent: int, gran: int = 10) -> int:
    # pqos (MSR interface) rounds a request to the nearest step of the granularity.
    return max(gran, min(100, (percent + gran // 2) // gran * gran))


def test_skylake_applies_every_value_from_65_to_94_as_90(sleeper):
    # intel-cmt-cat #69, #115: on Skylake every value from 65 to 94 % behaved as 90 %.
    p = sleeper()
    node = Node("intel-quantised", peak_bytes_per_s=100 * GB)
    node.group("g", None, p.pid)
    node.kernel.set_demand(p.pid, 100 * GB, 0)
    node.write("g", "schemata", "MB:0=90\n")
    at_90 = node.rate("g")
    for requested in range(65, 95):
        node.write("g", "schemata", f"MB:0={pqos_rounding(requested)}\n")
        assert node.rate("g") == pytest.approx(at_90), requested
    node.write("g", "schemata", "MB:0=60\n")
    assert node.rate("g") < 0.8 * at_90
    # Through resctrl, which rounds up to the granularity, that is every value from 61 to 90.
    node.write("g", "schemata", "MB:0=61\n")
    assert node.kernel.read(["g", "schemata"]).splitlines()[-1].startswith("MB:0=70")
    assert node.rate("g") == pytest.approx(at_90)


def test_one_core_at_ten_percent_still_passes_four_of_its_seventeen_gb(sleeper):
    # intel-cmt-cat #183: 100 % -> 10 % cut one core only from 17.7 to 4 GB/s.
    p = sleeper()
    node = Node("intel-quantised", peak_bytes_per_s=100 * GB)
    node.group("g", 100, p.pid)
    node.kernel.set_demand(p.pid, 30 * GB, 0)
    assert node.rate("g") == pytest.approx(17.7 * GB)
    node.write("g", "schemata", "MB:0=10\n")
    assert node.rate("g") == pytest.approx(4 * GB)


# ------------------------------------------------------------------------- AMD

def test_amd_limits_each_thread_in_eighths_of_a_gb(two):
    # resctrl.rst: AMD's MB value is in 1/8 GB/s units, [0, 2048]; allocation is per thread.
    a, b = two
    node = Node("amd", peak_bytes_per_s=100 * GB)
    node.group("a", 8, a.pid)
    node.group("b", 8, b.pid)
    node.kernel.set_demand(a.pid, 20 * GB, 0, threads=1)
    node.kernel.set_demand(b.pid, 20 * GB, 0, threads=4)
    assert node.rate("a") == pytest.approx(1 * GB)
    assert node.rate("b") == pytest.approx(4 * GB)
    assert node.kernel.read(["info", "MB", "min_bandwidth"]) == "0\n"


# ------------------------------------------------------- mba_MBps: the kernel's controller

def test_update_mba_bw_steps_one_granule_down_and_up_with_its_hysteresis():
    # fs/resctrl/monitor.c update_mba_bw, rule by rule.
    assert kernel_mbps_step(100, 500, 1000, 10, 10) == 90  # above target: one step down
    assert kernel_mbps_step(10, 500, 1000, 10, 10) == 10  # never below min_bandwidth
    assert kernel_mbps_step(30, 1000, 700, 10, 10) == 40  # 1000 > 700 * (30+10)/30 = 933: up
    assert kernel_mbps_step(30, 900, 700, 10, 10) == 30  # 900 < 933: stays, a step below
    assert kernel_mbps_step(100, 5000, 100, 10, 10) == 100  # never above 100


def test_mbps_mode_moves_one_step_a_second_nine_seconds_from_100_to_10(sleeper):
    p = sleeper()
    node = Node("intel-mbps", peak_bytes_per_s=100 * GB)
    node.group("g", 1, p.pid)  # a target of 1 MiB/s
    node.kernel.set_demand(p.pid, 15 * GB, 0)
    closid = node.kernel.groups["g"].closid
    assert node.rate("g") == pytest.approx(15 * GB)  # the target is not applied at once
    seen = [node.at(t + 0.5).kernel.mb_percent(closid, 0) for t in range(0, 11)]
    assert seen == [100, 90, 80, 70, 60, 50, 40, 30, 20, 10, 10]
    assert node.kernel.read(["g", "schemata"]).splitlines()[-1] == "MB:0=1;1=4294967295"


def test_mbps_mode_steers_by_local_traffic_unless_told_total(two):
    # The default event is mbm_local_bytes: a group whose traffic is 10 % remote settles
    # with its total above the target; with mba_MBps_event = mbm_total_bytes it settles on
    # the total, up to a step below the target (the up-step's hysteresis).
    target_mib = 8000
    results = {}
    for event, p in zip(("mbm_local_bytes", "mbm_total_bytes"), two):
        node = Node("intel-mbps", peak_bytes_per_s=100 * GB)
        node.group("g", target_mib, p.pid)
        node.write("g", "mba_MBps_event", event + "\n")
        assert node.kernel.read(["g", "mba_MBps_event"]) == event + "\n"
        node.kernel.set_demand(p.pid, 15 * GB, 0)
        before = node.at(29).read_bytes("g", event)
        results[event] = (node.at(30).read_bytes("g", event) - before) / MIB
        results[event + " total"] = node.rate("g") / MIB
    assert results["mbm_local_bytes"] <= target_mib < results["mbm_local_bytes total"]
    assert 0.75 * target_mib < results["mbm_total_bytes"] <= target_mib


def test_mba_mbps_event_must_be_an_mbm_event():
    node = Node("intel-mbps")
    node.group("g")
    with pytest.raises(OSError):
        node.write("g", "mba_MBps_event", "llc_occupancy\n")


# ------------------------------------------------------------- what is written, as bytes

@given(st.binary(max_size=40))
@settings(deadline=None)
def test_mba_mbps_event_writes_take_an_mbm_event_or_fail_with_einval(data):
    # rdtgroup_mba_mbps_event_write: the name of an enabled MBM event, else EINVAL, unchanged.
    node = Node("intel-mbps")
    node.group("g")
    try:
        node.kernel.write(["g", "mba_MBps_event"], data, os.getpid(), 0)
    except OSError as e:
        assert e.errno == errno.EINVAL
        assert node.kernel.read(["g", "mba_MBps_event"]) == "mbm_local_bytes\n"
    else:
        assert data.decode(errors="replace").strip() in ("mbm_local_bytes", "mbm_total_bytes")
