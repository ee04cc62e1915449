"""A cap holder starved of CPU (its wake-ups and writes late, in phase with its period) holds
its group at the cap, neither 10-20 % below it nor over it: on a clock the test holds,
against jobs whose bandwidth follows the MB value in force the moment each write lands
(the emulator's MBA rules for a quantised Skylake part), the holder's own loop reading its
counter from a real file.

Found under a CPU quota of 20 % of a core: the job held 10-20 % below its cap (the
controller learned from the plan, while late wake-ups and writes held the higher value for
less). A first fix made up the time late switches took (from the write times) and went
5-12 % over the cap of a group two capped jobs shared, beside stress-ng; so these tests
bound the over side as tightly as the under side, a shared group with two caps included.
The starved host is helper D2's model (its tests were reverted with its fix)."""

import os
import random
import types

import pytest

from nodesim.resctrl_emulator.mba import applied_percent, thread_limit
from nodesim.resctrl_emulator.profiles import PROFILES
from noded.capping.holder import CapHolder
from resctrl.schemata import MbFlavour, MbLimits
from support.waiting import wait_for

GB = 1e9
PERIOD_S = 0.1
SKYLAKE = PROFILES["intel-quantised"]
#: the CPU quota's period (cpu.cfs_period_us): as long as the holder's, so the two lock in phase
CFS_PERIOD_S = 0.1
#: today's tolerance over a cap (what the FUSE and system tests allow): over it is the worse error
OVER = 1.05


class StarvedHost:
    """A clock, a control group and its counter for one holder, starved as a CPU quota
    starves it: in each quota period the holder's group runs until its tasks have spent the
    quota (``runs_s``: a range, as the others' work varies), then nothing of it runs until
    the quota refills; whatever the holder does (its own work, a wake-up, a write, which
    lands part-way through and returns later) waits for that. The group's jobs (``jobs``:
    busy threads and what each asks, GB/s) move at the value in force from the moment its
    write landed; their bytes are written to the group's counter whenever the holder reads
    the clock (it reads its counter next)."""

    def __init__(self, root: str, seed: int, jobs: list[tuple[int, float]], *, runs_s: tuple[float, float],
                 until_s: float):
        self.rng = random.Random(seed)
        self.jobs = list(jobs)
        self.runs, self.until = runs_s, until_s
        self.phase = self.rng.uniform(0.0, CFS_PERIOD_S)
        self._quota_runs: dict[int, float] = {}
        self.t = 0.0
        self.value = 100
        self.bytes = 0.0
        self.events: list[tuple[float, object]] = []  # (when, what to do to the host then)
        self.marks: list[tuple[float, float]] = []  # (t, bytes) every ~10 ms of the clock
        self.path = root
        os.makedirs(f"{root}/mon_data/mon_L3_00")
        self.counter = f"{root}/mon_data/mon_L3_00/mbm_total_bytes"
        self._count()
        self.limits = MbLimits(MbFlavour.PERCENT, 10, 10, 100)
        self.rc = types.SimpleNamespace(caps=types.SimpleNamespace(mb=types.SimpleNamespace(limits=self.limits)),
                                        prefix="noded-", ensure_ctrl_group=lambda name: self, proc="/proc")

    def bps(self, value: int) -> float:
        limit = thread_limit(SKYLAKE, applied_percent(SKYLAKE, value))
        return sum(threads * min(demand * GB, limit) for threads, demand in self.jobs)

    def threads(self) -> int:
        return sum(threads for threads, _ in self.jobs)

    def _runs_at(self, t: float) -> float:
        """The first moment from ``t`` on when the holder's group may run."""
        n, into = divmod(t - self.phase, CFS_PERIOD_S)
        runs = self._quota_runs.setdefault(int(n), self.rng.uniform(*self.runs))
        return t if into < runs else self.phase + (n + 1) * CFS_PERIOD_S

    def _advance(self, until: float) -> None:
        while self.t < until:  # in steps of at most 10 ms, so the marks can be windowed
            step = min(until, self.t + 0.01)
            while self.events and self.events[0][0] <= step:
                _, event = self.events.pop(0)
                event(self)
            self.bytes += self.bps(self.value) * (step - self.t)
            self.t = step
            self.marks.append((self.t, self.bytes))

    def _work(self, seconds: float) -> None:
        """``seconds`` of the holder's (its work or its sleep), then until it runs again."""
        self._advance(self._runs_at(self.t + seconds))

    def _count(self) -> None:
        with open(self.counter, "w") as f:
            f.write(f"{int(self.bytes)}\n")

    def clock(self) -> float:
        self._work(self.rng.uniform(0.0, 0.001))  # the holder's own work
        self._count()  # the holder reads its counter after reading its clock
        return self.t

    def wait(self, seconds: float) -> bool:
        self._work(seconds)
        return self.t >= self.until

    # the control group's side
    def add_process(self, pid: int) -> None:
        pass

    def set_mb(self, value: int) -> None:
        self._work(self.rng.uniform(0.0, 0.002))  # the write on its way
        self.value = value  # landed
        self._work(self.rng.uniform(0.0, 0.002))  # and back

    def remove(self) -> None:
        pass

    def rates(self, window_s: float, since_s: float) -> list[float]:
        """The group's mean bandwidth over each window of ``window_s`` from ``since_s`` on,
        every 10 ms (sliding)."""
        marks = [(t, b) for t, b in self.marks if t >= since_s]
        out, j = [], 0
        for i, (t0, b0) in enumerate(marks):
            while j < len(marks) and marks[j][0] < t0 + window_s - 1e-9:
                j += 1
            if j == len(marks):
                break
            t1, b1 = marks[j]
            out.append((b1 - b0) / (t1 - t0))
        return out


def hold(tmp_path, seed: int, cap: float, jobs, *, runs_s, until_s: float = 20.0, events=()) -> StarvedHost:
    """A starved holder holding ``jobs`` at ``cap`` for ``until_s`` of the host's clock."""
    host = StarvedHost(str(tmp_path / f"group{seed}"), seed, jobs, runs_s=runs_s, until_s=until_s)
    holder = CapHolder(host.rc, "j1", [], cap, busy_threads=host.threads, period_s=PERIOD_S, clock=host.clock,
                       wait=host.wait)
    host.events = sorted([(at, lambda h, f=f: f(h, holder)) for at, f in events], key=lambda e: e[0])
    holder.start()
    wait_for(lambda: not holder.alive, timeout=60, what=f"{until_s} s of the holder's clock")
    holder.stop()
    return host


def mean(host: StarvedHost, since_s: float) -> float:
    (t0, b0), (t1, b1) = next((t, b) for t, b in host.marks if t >= since_s), host.marks[-1]
    return (b1 - b0) / (t1 - t0)


FOUR_HOGS = [(4, 14.0)]  # 4 busy threads asking 14 GB/s each: 16 GB/s at 10 %, 21.2 at 20 %, 56 free


# runs_s: the holder's group runs 20-60 ms of each 100; and 10-30 ms, where the holder can
# only switch when the quota refills
@pytest.mark.parametrize("runs_s, seed", [((0.02, 0.06), 0), ((0.02, 0.06), 1), ((0.01, 0.03), 2),
                                          ((0.01, 0.03), 3)])
def test_a_holder_starved_in_phase_with_its_period_averages_to_its_cap_and_never_over_it(tmp_path, runs_s, seed):
    cap = 20 * GB  # between what 10 % (16 GB/s) and 20 % (21.2) give: held by mixing the two
    host = hold(tmp_path, seed, cap, FOUR_HOGS, runs_s=runs_s)
    rate = mean(host, 5.0)
    worst = max(host.rates(1.0, 5.0))
    # before: 16.2-18.7 GB/s (the higher value's time cut short and learned from the plan)
    assert 0.97 * cap <= rate <= 1.01 * cap, f"held at {rate / GB:.2f} GB/s against a cap of {cap / GB:g}"
    assert worst <= OVER * cap, f"a second at {worst / GB:.2f} GB/s against a cap of {cap / GB:g}"


def test_an_unstarved_holder_is_held_at_the_cap(tmp_path):
    cap = 20 * GB
    host = hold(tmp_path, 0, cap, FOUR_HOGS, runs_s=(CFS_PERIOD_S, CFS_PERIOD_S))
    rate = mean(host, 5.0)
    assert 0.98 * cap <= rate <= 1.01 * cap, f"held at {rate / GB:.2f} GB/s against a cap of {cap / GB:g}"
    assert max(host.rates(1.0, 5.0)) <= 1.03 * cap


@pytest.mark.parametrize("runs_s, seed", [((0.02, 0.06), 4), ((0.01, 0.03), 5), ((CFS_PERIOD_S, CFS_PERIOD_S), 6)])
def test_a_group_two_caps_share_is_held_to_the_stricter_starved_or_not(tmp_path, runs_s, seed):
    # test_cap_closids' shared CLOSID on a clock the test holds: a is held at 0.8 of its free
    # rate in its own group; at 6 s c (the same hog) joins it, capped at 0.6 of its free rate,
    # and the group's holder steers the sum to the stricter cap from then on (the service's
    # set_cap; the busy threads double)
    free = 56 * GB
    cap_a, cap_c = 0.8 * free, 0.6 * free

    def c_joins(host, holder):
        host.jobs.append((4, 14.0))
        holder.set_cap(cap_c)

    host = hold(tmp_path, seed, cap_a, list(FOUR_HOGS), runs_s=runs_s, until_s=24.0, events=[(6.0, c_joins)])
    before = mean_between(host, 2.0, 6.0)
    assert before <= OVER * cap_a, f"a alone at {before / GB:.2f} GB/s against {cap_a / GB:g}"
    rate = mean(host, 10.0)
    worst = max(host.rates(1.0, 10.0))
    assert 0.95 * cap_c <= rate <= 1.01 * cap_c, f"the sum at {rate / GB:.2f} GB/s against {cap_c / GB:g}"
    assert worst <= OVER * cap_c, f"a second of the sum at {worst / GB:.2f} GB/s against {cap_c / GB:g}"


def mean_between(host: StarvedHost, t0: float, t1: float) -> float:
    marks = [(t, b) for t, b in host.marks if t0 <= t <= t1]
    return (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])
