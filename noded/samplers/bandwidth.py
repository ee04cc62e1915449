"""Memory bandwidth from resctrl MBM: the node's per domain and each job's.

A task counts in exactly one RMID, so the node's traffic is the sum of every job
group's and of each control group's *residual* (its total minus the job groups
inside it, i.e. the tasks in its own RMID). Summing residuals rather than control
group totals keeps the node rate steady when a job's group is removed (the
parent's total drops by that group's count, as on the kernel) or created.

No descriptor stays open between ticks (an operator must be able to unmount
resctrl); a reading that is missing makes that rate None, never zero, so policy
can tell quiet from unknown.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping

from resctrl import BandwidthMeter, CounterReading, MonGroup, Resctrl
from resctrl.info import read_domains
from resctrl.mbm import MBM_TOTAL, MbmReader, MbmSample

from noded.samplers.mongroups import JobMonitor


@dataclass(frozen=True)
class BandwidthSample:
    domains: tuple[int, ...]
    node_bps: dict[int, float | None]  # per domain
    job_bps: dict[str, dict[int, float | None]]  # job id -> domain -> bytes/s
    missing: tuple[str, ...]  # what could not be measured, in words


def residual(total: MbmSample, children: list[MbmSample], domains: tuple[int, ...]) -> MbmSample:
    """A control group's own-RMID counts: its total minus its monitoring groups'."""
    out: MbmSample = {}
    for d in domains:
        values = [total.get(d, {}).get(MBM_TOTAL)] + [c.get(d, {}).get(MBM_TOTAL) for c in children]
        if any(v is None or v.value is None for v in values):
            bad = next((v for v in values if v is not None and v.value is None), None)
            out[d] = {MBM_TOTAL: CounterReading(None, bad.state if bad else "Unavailable")}
            continue
        own = values[0].value - sum(v.value for v in values[1:])
        # Children are read first, so the total can only be larger; a negative
        # residual means a counter reset somewhere: no honest value this time.
        out[d] = {MBM_TOTAL: CounterReading(own) if own >= 0 else CounterReading(None, "Unavailable")}
    return out


#: Residual read-order jitter floor. On top of it, a residual may dip by twice what
#: its children moved while we read (microseconds on a real mount, tens of
#: milliseconds through the emulator). Real resets drop a counter to about zero.
RESIDUAL_DIP_BYTES = 256 << 20


def _add_into(total: dict[int, float | None], rates: Mapping[int, float | None]) -> None:
    """Adds one group's rates into the node's, per domain; unknown (None) on either side
    makes the domain's total unknown."""
    for d, r in rates.items():
        t = total[d]
        if t is not None:
            total[d] = None if r is None else t + r


class BandwidthSampler:
    name = "resctrl"

    def __init__(self, monitor: JobMonitor, reader: MbmReader | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.clock = clock  # rates are taken at the time of reading, not the tick's start
        self.monitor = monitor
        # each counter is read once a sample: opened, read and closed at once
        self.reader = reader or MbmReader(events=(MBM_TOTAL,), keep_open=False)
        self._meters: dict[str, BandwidthMeter] = {}
        self._ctrl_paths: set[str] = set()
        self._last_read: float | None = None
        self._generation: int | None = None

    def _meter(self, key: str, domains: tuple[int, ...], created_at: float | None) -> BandwidthMeter:
        meter = self._meters.get(key)
        if meter is None:
            dip = RESIDUAL_DIP_BYTES if key.endswith("#own") else 0
            meter = self._meters[key] = BandwidthMeter(MBM_TOTAL, dip_tolerance=dip)
            if created_at is not None:
                # Counted from zero since mkdir. Rates of all groups are summed into the
                # node's, so each must cover the same window: the one since our last
                # read (what the group took over had been counted elsewhere until then).
                start = created_at if self._last_read is None else min(created_at, self._last_read)
                meter.start_from_zero(domains, start)
        return meter

    def sample(self, rc: Resctrl, generation: int, groups: Mapping[str, MonGroup]) -> BandwidthSample:
        """Rates of every job group and the node, from counters read now. Descriptors are
        closed before returning: noded holds nothing open in resctrl between ticks."""
        if generation != self._generation:
            # A new mount: counters of the old one mean nothing here.
            self._meters.clear()
            self._ctrl_paths.clear()
            self._last_read = None
            self._generation = generation
        try:
            return self._sample(rc, groups)
        finally:
            self.reader.close()

    def _sample(self, rc: Resctrl, groups: Mapping[str, MonGroup]) -> BandwidthSample:
        domains = read_domains(rc.root, True)
        # Job groups first, then their control groups (see residual()).
        started = self.clock()
        job_readings = {job_id: self._read(g.path, domains) for job_id, g in groups.items()}
        ctrl_paths = [rc.root] + [g.path for g in rc.list_ctrl_groups()]
        ctrl_readings = {p: self._read(p, domains) for p in ctrl_paths}
        now = self.clock()
        span = now - started
        job_bps = {}
        node: dict[int, float | None] = dict.fromkeys(domains, 0.0)
        for job_id, (readings, at) in job_readings.items():
            key = f"job:{job_id}"
            # when its group was made matters only to a new meter (asked once, not every tick)
            created_at = None if key in self._meters else self.monitor.created_at(job_id)
            rates = self._rate(key, readings, domains, at, created_at)
            _add_into(node, rates)
            job_bps[job_id] = self._own_rate(rates, at, created_at)
        in_ctrl: dict[str, list[str]] = {}  # control group path -> its job groups
        for job_id, g in groups.items():
            in_ctrl.setdefault(g.parent.path, []).append(job_id)
        for path, readings in ctrl_readings.items():
            kids = in_ctrl.get(path, [])
            # A control group new since the last read (a throttle level) holds nothing
            # of its own yet: its residual starts at zero.
            new = self._last_read is not None and path not in self._ctrl_paths
            moved = {d: sum(job_bps[j][d] or 0.0 for j in kids) * span for d in domains}
            tolerance = {d: RESIDUAL_DIP_BYTES + int(2 * moved[d]) for d in domains}
            own = residual(readings[0], [job_readings[j][0] for j in kids], domains)
            _add_into(node, self._rate(path + "#own", own, domains, readings[1], self._last_read if new else None,
                                       tolerance))
        missing = [f"node bandwidth on L3 domain {d}" for d, r in node.items() if r is None]
        live = {p + "#own" for p in ctrl_paths} | {f"job:{j}" for j in groups}
        for key in [k for k in self._meters if k not in live]:
            self._meters.pop(key)
        self._ctrl_paths = set(ctrl_paths)
        self._last_read = now
        return BandwidthSample(domains, node, job_bps, tuple(missing))

    def _own_rate(self, rates: dict[int, float | None], at: float, created_at: float | None) -> dict[int, float | None]:
        """A job's rate as the job ran: a group made since the last read counted only since
        its mkdir, so its share of the node's window (what the node sums) understates the
        job by the time it did not count (a hog pushing 16 GB/s read as 0.1 GB/s, and named
        so in its first throttle's reason); over the time it counted, it is the job's."""
        if created_at is None or self._last_read is None or created_at <= self._last_read:
            return rates
        window, counted = at - self._last_read, at - created_at
        if counted <= 0:
            return dict.fromkeys(rates)  # made as it was read: nothing counted yet, no rate
        return {d: None if r is None else r * window / counted for d, r in rates.items()}

    def _read(self, path: str, domains: tuple[int, ...]) -> tuple[MbmSample, float]:
        """A group's counters and when they were read. Each group's rate is taken over its
        own interval: one time for the whole tick would skew every rate by how long the
        reads after it took (much, through a slow filesystem or on a loaded host)."""
        before = self.clock()
        readings = self.reader.read(path, domains)
        return readings, (before + self.clock()) / 2

    def _rate(self, key: str, readings: MbmSample, domains: tuple[int, ...], now: float,
              created_at: float | None, dip_tolerance: dict[int, int] | None = None) -> dict[int, float | None]:
        rates = self._meter(key, domains, created_at).update(readings, now, dip_tolerance)
        # readings hold only the given domains: as many rates means every domain has one
        return rates if len(rates) == len(domains) else {d: rates.get(d) for d in domains}
