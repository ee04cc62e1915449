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
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from resctrl import CtrlGroup, GroupNotFoundError, MbFlavour, Resctrl, ResctrlError
from resctrl.mbm import MBM_TOTAL, BandwidthMeter, read_mbm

from noded.capping.controller import AMD_UNIT_BYTES, DEFAULT_PERIOD_S, CapController, Hold
from noded.capping.threads import BusyThreads
from noded.samplers.mongroups import group_name as cap_group_name
from noded.util.journal import log_change, word  # a job named in a message: one word, one to one

log = logging.getLogger(__name__)
MIB = 1 << 20
KERNEL_MBPS = "kernel mba_MBps"
NODED = "noded"


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
                 clock: Callable[[], float] = time.monotonic, group_name: str | None = None):
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
        self.threads = 0  # the busy threads the last period was steered for
        self.controller = CapController(
            self.scale, cap_bps, absolute_unit_bytes=AMD_UNIT_BYTES if flavour is MbFlavour.AMD_UNITS else None
        ) if self.mode == NODED else None
        self.meter = BandwidthMeter(MBM_TOTAL)
        self.held = Hold(self.scale[-1], self.scale[-1]) if self.scale else None
        self.last_rate: float | None = None
        #: since when (clock) the lowest MB value has passed more than the cap; None: it has not
        self.unreachable_since: float | None = None
        #: at most what the lowest MB value lets the job move at its busy threads now, from what
        #: was measured since its CPUs last changed (the curve is monotone: no value below the
        #: least measured passes more); None: nothing measured yet. Written by the holder's
        #: thread after each period, read by the daemon's.
        self.lowest_bound: float | None = None
        self._reset = threading.Event()  # the job's CPUs changed: what was learned is of other cores
        self._stop = threading.Event()
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
        self.cap = cap_bps
        if self.controller is not None:
            self.controller.set_cap(cap_bps)
        else:
            self.group.set_mb(max(1, int(cap_bps / MIB)))

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

    def step(self) -> Hold | None:
        """One period: measure what the job moved under the last hold, write the next."""
        assert self.controller is not None and self.held is not None
        now = self.clock()
        if self._reset.is_set():
            self._reset.clear()
            self.controller.curves.clear()
            self.controller.integral = 0.0
            self.unreachable_since = self.lowest_bound = None
            self.meter = BandwidthMeter(MBM_TOTAL)  # the next period is measured from now
        rates = self.meter.update(read_mbm(self.group.path, (MBM_TOTAL,)), now)
        if not rates or any(r is None for r in rates.values()):
            return None  # a first reading or a reset: the next period measures
        self.last_rate = sum(r for r in rates.values() if r is not None)
        self.threads = self.busy_threads()
        self.held = self.controller.update(self.last_rate, self.threads, self.held)
        curve = self.controller.curves.get(self.controller.threads)
        self.lowest_bound = min(curve.points.values()) if curve is not None and curve.points else None
        if not self.held.unreachable:
            self.unreachable_since = None
        elif self.unreachable_since is None:
            self.unreachable_since = now
        return self.held

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

    def _steer(self) -> None:
        start = self.clock()
        k = 0
        while not self._stop.is_set():
            hold = self.step()
            parts = hold.values if hold is not None else [(self.held.low, 1.0)]
            offset = 0.0
            for value, share in parts:
                self.group.set_mb(value)
                offset += share * self.period
                if len(parts) > 1 and share < 1.0 and self._stop.wait(max(0.0, start + k * self.period + offset
                                                                           - self.clock())):
                    return
            k += 1
            # the next period starts on the schedule, not after this one's work
            if self._stop.wait(max(0.0, start + k * self.period - self.clock())):
                return

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
