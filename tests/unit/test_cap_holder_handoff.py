"""A cap holder's state is its own thread's: the daemon's thread only hands it a new cap
(``set_cap``), which the holder takes at the start of its next period, and reads what the
holder last made of its job as one whole (``steering``), never a field of one period beside
a field of the next.

Each test drives the holder's ``step`` itself (as the holder's thread does once a period),
on a clock it holds, against a group whose counter is a file under ``tmp_path``."""

import os
import types

import pytest

from noded.capping.controller import Hold
from noded.capping.holder import KERNEL_MBPS, MIB, NODED, CapHolder, Steering
from noded.capping.plan import OVERRIDE, Cap
from noded.capping.service import CapService
from noded.util.halving import kept_cpus
from resctrl.schemata import MbFlavour, MbLimits

GB = 1e9
PERIOD_S = 0.1


class Group:
    """A control group as the holder uses one: its counter a file, its MB values recorded."""

    def __init__(self, root: str):
        self.path = root
        self.name = os.path.basename(root)
        self.bytes = 0
        self.values: list[int] = []
        self.refuse: OSError | None = None  # set: the next writes fail so
        os.makedirs(f"{root}/mon_data/mon_L3_00")
        self._count()

    def _count(self) -> None:
        with open(f"{self.path}/mon_data/mon_L3_00/mbm_total_bytes", "w") as f:
            f.write(f"{self.bytes}\n")

    def moved(self, n: float) -> None:
        self.bytes += int(n)
        self._count()

    def add_process(self, pid: int) -> None:
        pass

    def set_mb(self, value: int) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.values.append(value)

    def remove(self) -> None:
        pass


class Node:
    """A clock the test moves, a group and a holder on it."""

    def __init__(self, tmp_path, cap: float, flavour: MbFlavour = MbFlavour.PERCENT, threads=lambda: 4):
        self.t = 100.0
        self.group = Group(str(tmp_path / "noded-cap-j1"))
        limits = MbLimits(flavour, 10, 10, 100) if flavour is not MbFlavour.MBPS else MbLimits(flavour, 1, 1, 100000)
        rc = types.SimpleNamespace(caps=types.SimpleNamespace(mb=types.SimpleNamespace(limits=limits)),
                                   prefix="noded-", ensure_ctrl_group=lambda name: self.group, proc="/proc")
        self.holder = CapHolder(rc, "j1", [], cap, busy_threads=threads, period_s=PERIOD_S, clock=self.clock)

    def clock(self) -> float:
        return self.t

    def period(self, bps: float):
        """One period in which the group moved ``bps``, then the holder's step."""
        self.t += PERIOD_S
        self.group.moved(bps * PERIOD_S)
        return self.holder.step()


def over_cap(tmp_path) -> Node:
    """A holder some periods into holding a job that moves more than its cap: its account owes."""
    node = Node(tmp_path, 10 * GB)
    for _ in range(4):
        node.period(14 * GB)
    assert node.holder.account.balance > 0 and node.holder.controller.cap == 10 * GB
    return node


def state(holder: CapHolder):
    c, a = holder.controller, holder.account
    return c.cap, c.integral, c.limit, dict(c.curves), a.cap, a.balance


def test_set_cap_leaves_the_holders_controller_and_account_alone_until_its_next_period(tmp_path):
    node = over_cap(tmp_path)
    holder = node.holder
    before = state(holder)
    holder.set_cap(6 * GB)
    assert holder.cap == 6 * GB  # what the daemon asked for, at once
    # before: the daemon's thread wrote the controller's cap and a new account while the
    # holder's thread could be in the middle of a step on them
    assert state(holder) == before
    node.period(14 * GB)
    assert holder.controller.cap == 6 * GB and holder.controller.limit == pytest.approx(before[2] * 0.6)
    # a fresh account: the period that ended was held for the old cap, nothing of it is owed
    # against the new one
    assert holder.account.cap == 6 * GB and holder.account.balance == 0
    node.period(8 * GB)
    assert holder.account.balance > 0  # against the new cap from here on


def test_of_two_caps_set_before_the_holders_next_period_the_last_is_held(tmp_path):
    node = over_cap(tmp_path)
    holder = node.holder
    holder.set_cap(6 * GB)
    holder.set_cap(7 * GB)
    node.period(14 * GB)
    assert (holder.controller.cap, holder.account.cap, holder.account.balance) == (7 * GB, 7 * GB, 0)
    assert holder.cap == 7 * GB


def test_a_cap_set_and_set_back_before_the_next_period_changes_nothing(tmp_path):
    node = over_cap(tmp_path)
    holder = node.holder
    balance = holder.account.balance
    holder.set_cap(6 * GB)
    holder.set_cap(10 * GB)
    node.period(10 * GB)  # at the cap: nothing more owed, nothing paid back
    # what it owed against the cap it kept is still owed
    assert holder.controller.cap == holder.account.cap == 10 * GB
    assert holder.account.balance == pytest.approx(balance) and balance > 0


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_cap_that_is_no_bandwidth_is_refused_in_the_callers_thread_with_nothing_changed(tmp_path, bad):
    node = over_cap(tmp_path)
    holder = node.holder
    before = state(holder)
    with pytest.raises(ValueError, match="positive bandwidth"):
        holder.set_cap(bad)
    # before: the holder's cap was changed, then the controller refused it
    assert holder.cap == 10 * GB and state(holder) == before
    node.period(10 * GB)
    assert holder.controller.cap == 10 * GB


def test_where_the_kernel_steers_set_cap_writes_its_target_at_once(tmp_path):
    node = Node(tmp_path, 6 * GB, flavour=MbFlavour.MBPS)
    holder = node.holder
    assert holder.mode == KERNEL_MBPS and holder.controller is None
    holder.start()
    assert node.group.values == [int(6 * GB / MIB)]
    holder.set_cap(4 * GB)
    assert node.group.values[-1] == int(4 * GB / MIB) and holder.cap == 4 * GB
    # a write the kernel refused: the cap is not taken as set, so the daemon sets it again
    node.group.refuse = OSError(22, "Invalid argument")
    with pytest.raises(OSError):
        holder.set_cap(3 * GB)
    assert holder.cap == 4 * GB
    holder.stop()


def test_what_the_daemon_reads_of_a_holder_is_one_periods_whole(tmp_path):
    # the daemon's thread reads a holder at any moment of its step: here, each time the step
    # counts the job's busy threads (in its middle), what it reads is all of one period
    seen = []
    node = Node(tmp_path, 10 * GB, threads=lambda: seen.append(read(node.holder)) or 4)

    def read(h: CapHolder):
        return h.last_rate, h.held, h.threads, h.lowest_bound, h.unreachable_since

    after = [read(node.holder)]
    for bps in (14, 14, 12, 11, 9, 10, 10):
        node.period(bps * GB)
        after.append(read(node.holder))
    assert node.holder.mode == NODED and len(seen) >= 5
    # a read in the middle of a step is what the last step left, whole (before: the rate
    # measured in this step beside the MB values chosen in the last)
    for mid in seen:
        assert mid in after, mid
    # what the daemon reads as a pair it reads from one object the step publishes whole
    s = node.holder.steering
    assert (s.last_rate, s.held, s.threads, s.lowest_bound, s.unreachable_since) == after[-1]
    assert s.last_rate == pytest.approx(10 * GB, rel=0.01) and s.held is node.holder.held


class Publishing:
    """A holder whose thread publishes its next period while the daemon reads it: the last
    period's lowest value passed the cap since 1.0 (its clock), the next one's does not."""

    mode, alive = NODED, True

    def __init__(self):
        self.steering = Steering(Hold(10, 10, unreachable=True), 9 * GB, 4, lowest_bound=6 * GB,
                                 unreachable_since=1.0)
        self.reads = 0

    def clock(self) -> float:
        return 3.0

    def _publish_next(self) -> None:
        self.reads += 1
        if self.reads == 2:
            self.steering = Steering(Hold(10, 20, 0.5), 3 * GB, 4, lowest_bound=2 * GB, unreachable_since=None)

    @property
    def unreachable_since(self):
        self._publish_next()
        return self.steering.unreachable_since

    @property
    def lowest_bound(self):
        self._publish_next()
        return self.steering.lowest_bound


def test_the_daemon_decides_a_jobs_cores_from_one_period_of_its_holder_whatever_it_publishes_meanwhile():
    # before: cpu_wishes read unreachable_since twice (set, then None: TypeError in the tick)
    # and lowest_bound beside it, each of whichever period was published when it was read
    service = CapService(lambda: None, lambda job: f"noded-cap-{job}")
    service.caps["j1"] = Cap(4 * GB, OVERRIDE, "an operator's")
    service.holders["j1"] = Publishing()
    owner = types.SimpleNamespace(view=lambda job, js: types.SimpleNamespace(original=list(range(8))))
    wishes = service.cpu_wishes(types.SimpleNamespace(jobs={"j1": object()}), owner, {})
    # the period it read: the lowest value over the cap for 2 s of the holder's clock, so halved
    assert wishes["j1"] == kept_cpus(list(range(8)), 1)
    assert service.core_levels["j1"] == (1, 8)
