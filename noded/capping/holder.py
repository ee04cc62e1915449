"""One job held at a cap on a mounted resctrl: its own control group, its counters read on
their own schedule (every ``period_s``, not at the daemon's tick), the controller's two
values written within each period.

The job gets a control group of its own (``<prefix>cap-<job>``), because a cap is per job
and an MB value is per CLOSID. Where CLOSIDs run out (8 to 16 on common parts, one is the
root's) a capped job cannot have one: ``OutOfClosidsError`` reaches the caller. The daemon's
throttle then puts the job in a group it shares (noded.actuators.mba): jobs that share a
CLOSID share one MB value, so one holder steers their sum, to the strictest of their caps.

Where resctrl is mounted with ``mba_MBps`` the kernel's own controller steers each group
toward a MiB/s target: two controllers on one knob would fight, so the holder writes the
cap as that target and leaves the steering to the kernel (``mode`` says which; the kernel's
is the slow one: one 10 % step a second, by local traffic unless the group's
``mba_MBps_event`` says total, so the holder sets that to total where it can).

The MB value is the same on every domain; the cap is on the job's traffic summed over
them (MBM counts each domain's L3; a job's threads may run on several).

A holder starved of CPU (a quota, a loaded host) wakes late and writes late: the plan is
not what was held. So each counter read and each write is timed: a period is measured
from the middle of one read to the middle of the next, the controller learns from the
time each value was really in force (``noded.capping.in_force``; a period whose reads and
writes took too much of it is not learned from), and what the group moved against its cap
is kept in bytes from the counters (``noded.capping.account``): an overrun is paid back
(over by a tenth of a period's bytes, the next period holds the lower value alone), a
shortfall made up by at most half a period's bytes at the cap, and not at all within 2 %
of the cap or from a stalled period. So a holder that can only switch when its quota
refills averages to the cap, by whole periods at one value or the other, and one starved
at random sits a little below it rather than over it.

Two threads: the holder's own steps its job once a period, and the daemon's sets its cap,
tells it the job's CPUs changed and reads what it measured. Everything the holder steers
with (its controller, account, record of writes, meter) is its own thread's alone: the
daemon's hands it a new cap (``set_cap``) or a reset (``cores_changed``), which it takes at
the start of its next period, and reads what it made of its job as one object that each
period publishes whole (``steering``), never one field of a period beside another's of the
next.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from resctrl import CtrlGroup, GroupNotFoundError, MbFlavour, Resctrl, ResctrlError
from resctrl.mbm import MBM_TOTAL, BandwidthMeter, read_mbm

from noded.capping.account import ByteAccount
from noded.capping.controller import AMD_UNIT_BYTES, DEFAULT_PERIOD_S, CapController, Hold
from noded.capping.in_force import WriteRecord
from noded.capping.threads import BusyThreads
from noded.samplers.mongroups import group_name as cap_group_name
from noded.util.journal import log_change, word  # a job named in a message: one word, one to one

log = logging.getLogger(__name__)
MIB = 1 << 20
KERNEL_MBPS = "kernel mba_MBps"
NODED = "noded"
#: a period whose reads and writes took more than this share of it (a starved holder: the
#: times its values changed are that uncertain) is not learned from (its bytes are counted)
UNCERTAIN_SHARE = 0.2


@dataclass(frozen=True)
class Steering:
    """What a holder's thread last made of its job, published whole after each period (a
    reader in another thread reads this once and has one period's, all of it)."""

    #: the MB values held this period (None where the kernel steers: no thread, no values)
    held: Hold | None
    #: the job's bandwidth over the last period; None: nothing measured yet
    last_rate: float | None = None
    #: the busy threads the last period was steered for
    threads: int = 0
    #: at most what the lowest MB value lets the job move at its busy threads now, from what
    #: was measured since its CPUs last changed (the curve is monotone: no value below the
    #: least measured passes more); None: nothing measured yet
    lowest_bound: float | None = None
    #: since when (the holder's clock) the lowest MB value has passed more than the cap;
    #: None: it has not
    unreachable_since: float | None = None


def scale_of(rc: Resctrl) -> list[int]:
    """The MB values this host takes, ascending (Intel percent steps, AMD's 1/8 GB/s units)."""
    mb = rc.caps.mb
    if mb is None:
        raise ValueError(f"{rc.root}: this host has no memory bandwidth allocation: nothing can hold a cap")
    limits = mb.limits
    return list(range(limits.min_bandwidth, limits.max_bandwidth + 1, max(1, limits.bandwidth_gran)))


class CapHolder:
    """Holds the processes ``pids`` of ``job`` at ``cap_bps`` until ``stop()``."""

    def __init__(self, rc: Resctrl, job: str, pids: list[int], cap_bps: float, *,
                 busy_threads: Callable[[], int] | None = None, period_s: float = DEFAULT_PERIOD_S,
                 clock: Callable[[], float] = time.monotonic, group_name: str | None = None,
                 wait: Callable[[float], bool] | None = None):
        self.rc = rc
        self.job = job
        self.cap = cap_bps
        self.period = period_s
        self.clock = clock
        flavour = rc.caps.mb.limits.flavour if rc.caps.mb else None
        self.mode = KERNEL_MBPS if flavour is MbFlavour.MBPS else NODED
        self.scale = scale_of(rc) if self.mode == NODED else []
        # group_name: where its caller moved the job already (the daemon's throttle: one
        # writer of where a job is); else the holder makes the group and moves ``pids``
        # (else named as noded names a capped job's group: a job id holds a tenant's cgroup
        # path, and as it is its '/' was no group name: no group, no cap)
        self.group: CtrlGroup = rc.ensure_ctrl_group(group_name or cap_group_name(f"{rc.prefix}cap-", job))
        for pid in pids:
            self.group.add_process(pid)
        # the job's busy threads, read from its group's tasks (noded.capping.threads)
        self.busy_threads = busy_threads or BusyThreads(f"{self.group.path}/tasks", proc=rc.proc)
        self.controller = CapController(
            self.scale, cap_bps, absolute_unit_bytes=AMD_UNIT_BYTES if flavour is MbFlavour.AMD_UNITS else None
        ) if self.mode == NODED else None
        self.meter = BandwidthMeter(MBM_TOTAL)
        #: what the holder's thread made of its job, published whole after each period: the
        #: one thing of the holder's state another thread reads (its fields are also
        #: properties of the holder, for a reader of one)
        self.steering = Steering(Hold(self.scale[-1], self.scale[-1]) if self.scale else None)
        #: the MB values written and when (noded.capping.in_force): what each period really held
        self.written = WriteRecord(self.steering.held.low if self.steering.held else 0)
        #: the group's bytes against its cap (noded.capping.account): made up or paid back
        self.account = ByteAccount(cap_bps, period_s)
        self._last_read: tuple[float, float] | None = None  # (clock before, after) the last counter read
        #: periods not learned from: a read or a write took too much of them (a starved holder)
        self.uncertain_periods = 0
        self._steered = False  # whether a period held a value the controller chose
        self._reset = threading.Event()  # the job's CPUs changed: what was learned is of other cores
        self._stop = threading.Event()
        # waits up to so many seconds of ``clock``'s; True where the holder was stopped meanwhile
        self._wait = wait or self._stop.wait
        self._thread: threading.Thread | None = None

    def start(self) -> "CapHolder":
        if self.mode == KERNEL_MBPS:
            self._hand_to_kernel()
            return self
        self._thread = threading.Thread(target=self._loop, name=f"cap-{self.job}", daemon=True)
        self._thread.start()
        return self

    def _hand_to_kernel(self) -> None:
        event, why_local = "mbm_total_bytes", None
        try:
            with open(f"{self.group.path}/mba_MBps_event", "w") as f:
                f.write("mbm_total_bytes\n")
        except OSError as e:
            event, why_local = "mbm_local_bytes", e.strerror or str(e)
        self.group.set_mb(max(1, int(self.cap / MIB)))
        # Said as a change (at notice, whatever the verbosity): who steers this job's MB value
        # is not noded here, and the kernel's rule is slower (one step a second) and coarser.
        log_change("cap-kernel", self.job, cap_bps=round(self.cap), event=event,
                   reason="resctrl is mounted with mba_MBps: the kernel's controller owns the MB value and steers "
                          "it one step a second toward the cap; noded only writes the cap as its target"
                          + (f" (by local traffic only: mba_MBps_event refused total: {why_local})" if why_local
                             else ""))

    def set_cap(self, cap_bps: float) -> None:
        """Hold ``cap_bps`` from now on. Where noded steers, the holder's thread takes it at
        the start of its next period (a new cap set before then replaces it: the last one
        set is held); where the kernel does, its target is written at once. ``cap`` says the
        cap set once it is (a write the kernel refused leaves it as it was)."""
        if not cap_bps > 0:
            raise ValueError(f"cap {word(self.job)}: a cap must be a positive bandwidth, got {cap_bps!r} bytes/s")
        if self.controller is None:
            self.group.set_mb(max(1, int(cap_bps / MIB)))
        # one attribute, written by this thread alone: the holder's thread reads it once a period
        self.cap = cap_bps

    # One period's whole, for a reader of one field (a reader of two reads ``steering`` once).
    @property
    def held(self) -> Hold | None:
        return self.steering.held

    @property
    def last_rate(self) -> float | None:
        return self.steering.last_rate

    @property
    def threads(self) -> int:
        return self.steering.threads

    @property
    def lowest_bound(self) -> float | None:
        return self.steering.lowest_bound

    @property
    def unreachable_since(self) -> float | None:
        return self.steering.unreachable_since

    @property
    def alive(self) -> bool:
        """Whether it still steers (its thread ended where the group or the mount went)."""
        if self._stop.is_set():
            return False
        return self.mode == KERNEL_MBPS or (self._thread is not None and self._thread.is_alive())

    def cores_changed(self) -> None:
        """The job's CPUs were changed (noded.capping.cores): its curves are forgotten and
        the period that spans the change is not learned from."""
        self._reset.set()

    def _take_cap(self) -> None:
        """The cap set since the last period (``set_cap``, another thread's): the controller
        steers to it from this period on, and a new account starts (what was owed was
        against the old cap; so is the period that ends now, which was held for it)."""
        cap = self.cap  # read once: the last set
        if cap != self.controller.cap:
            self.controller.set_cap(cap)
            self.account.set_cap(cap)
            self._steered = False

    def step(self) -> Hold | None:
        """One period: measure what the job moved under the last hold, write the next."""
        assert self.controller is not None and self.steering.held is not None
        self._take_cap()
        now = self.clock()
        if self._reset.is_set():
            self._reset.clear()
            self.controller.curves.clear()
            self.controller.integral = 0.0
            self.steering = replace(self.steering, unreachable_since=None, lowest_bound=None)
            self.meter = BandwidthMeter(MBM_TOTAL)  # the next period is measured from now
            self._last_read = None
        sample = read_mbm(self.group.path, (MBM_TOTAL,))
        read = (now, self.clock())
        last_read, self._last_read = self._last_read, read
        # The counters were read somewhere within each read's span: a period is measured
        # from the middle of one read to the middle of the next, so that the periods' seconds
        # add up to the time between their ends, off by half of two spans at most.
        rates = self.meter.update(sample, sum(read) / 2)
        if not rates or any(r is None for r in rates.values()) or last_read is None:
            self.written.over(read[0], read[0])  # what is in force from here on
            return None  # a first reading or a reset: the next period measures
        start, end = sum(last_read) / 2, sum(read) / 2
        if end - start <= 0:
            return None
        # what this period made of the job, in locals until it is published whole at its end
        last_rate = sum(r for r in rates.values() if r is not None)
        in_force = self.written.over(start, end)
        threads = self.busy_threads()
        if self._steered:  # (the first period held what was there before the cap: nothing owed for it)
            self.account.add(last_rate * (end - start), end - start,
                             held_back=any(v < self.scale[-1] for v in in_force.seconds))
        self._steered = True
        # starved in a read or a write: when the values changed is too little known to
        # learn from; its bytes are in the account all the same
        # (a period that held one value throughout is learned from all the same: which value
        # was in force is certain, and a curve must have a first point)
        uncertain = in_force.uncertain_s + (last_read[1] - last_read[0] + read[1] - read[0]) / 2
        learn = uncertain <= UNCERTAIN_SHARE * in_force.span or len(in_force.seconds) == 1
        if not learn:
            self.uncertain_periods += 1
        held = self.controller.update(last_rate, threads, self.steering.held, in_force.shares(), learn=learn,
                                      makeup_bps=self.account.makeup_bps)
        if self.account.over and held.high_share > 0:
            # over the cap: no higher value until it is paid back (a starved holder may hold
            # any share of one for the whole period)
            held = Hold(held.low, held.low, unreachable=held.unreachable)
        curve = self.controller.curves.get(self.controller.threads)
        since = self.steering.unreachable_since
        self.steering = Steering(
            held, last_rate, threads,
            lowest_bound=min(curve.points.values()) if curve is not None and curve.points else None,
            unreachable_since=None if not held.unreachable else now if since is None else since)
        return held

    def _loop(self) -> None:
        try:
            self._steer()
        except (ResctrlError, OSError) as e:
            # the group or the mount went away under us (an operator, an unmount): nothing to steer
            log.warning("cap %s: stopped steering: %s", word(self.job), e)
        except Exception:
            # a fault of noded's own: said once, with where, in the journal rather than on a
            # thread's stderr; the service sees the holder not alive and starts it anew
            log.exception("cap %s: stopped steering on an error of noded's", word(self.job))

    def _write(self, value: int) -> tuple[float, float]:
        """Write ``value``; (clock before, after): it took effect somewhere between."""
        began = self.clock()
        self.group.set_mb(value)
        returned = self.clock()
        self.written.wrote(value, began, returned)
        return began, returned

    def _wait_until(self, when: float) -> bool:
        """True where the holder was stopped meanwhile."""
        return self._wait(max(0.0, when - self.clock()))

    def _steer(self) -> None:
        start = self.clock()
        k = 0
        while not self._stop.is_set():
            if self.clock() >= start + (k + 1) * self.period:
                # a whole period behind (starved): the schedule starts again from now, or
                # every period to come would end before its higher value was held
                start, k = self.clock(), 0
            hold = self.step()
            if self._hold(hold.values if hold is not None else [(self.steering.held.low, 1.0)],
                          start + (k + 1) * self.period):
                return
            k += 1
            # the next period starts on the schedule, not after this one's work
            if self._wait_until(start + k * self.period):
                return

    def _hold(self, parts: list[tuple[int, float]], period_end: float) -> bool:
        """Hold one period's values (the higher first); True where stopped meanwhile."""
        if len(parts) == 1:
            self._write(parts[0][0])
            return False
        (high, share), (low, _) = parts
        # the higher value's time counted from when its write returned, not from the
        # schedule (a late wake-up or write would take it out of the period's share), never
        # past the period's end; what a late switch back adds is paid back by the account
        high_from = self._write(high)[1]
        if self._wait_until(min(period_end, high_from + share * self.period)):
            return True
        self._write(low)
        return False

    def stop(self, *, remove: bool = True) -> None:
        """Stop steering and remove the group: the kernel puts the job's tasks back in the root.
        ``remove=False``: the group is its caller's to empty and remove (the daemon moves the
        job to its level first, so its monitoring group is not freed with the group)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not remove:
            return
        try:
            self.group.remove()
        except GroupNotFoundError:
            pass  # removed already: what stop() is for
