"""Memory bandwidth from resctrl MBM: the node's per domain and each job's.

A task counts in exactly one RMID, so the node's traffic is the sum of every job
group's and of each control group's *residual* (its total minus the job groups
inside it, i.e. the tasks in its own RMID). Summing residuals rather than control
group totals keeps the node rate steady when a job's group is removed (the
parent's total drops by that group's count, as on the kernel) or created.

While the groups stay as they are, the node's rate is read from the control groups'
totals (each holds its monitoring groups' counts), which is the same sum read at once. A
job group made since goes on counting what its control group counted before (the total goes
on); one noded removed had its counters read just before its rmdir (``removed``, from the
monitoring sync), and the kernel dropped its count from the total: it is added back to each
reading of that total from then on, so the totals go on across the jobs that end too (else
the first tick after thin ticks summed means over different windows). A group moved, or
removed unread, starts the totals again, that tick's rate the residuals' sum. All of it
only where every job's counters read a value on this tick and on the tick before: the kernel
leaves a monitoring group whose read fails out of its control group's total, silently
(fs/resctrl/monitor.c, mon_event_count), so a total then lacks that job, and gains its whole
count back the tick it reads again.

A quiet node (the caller says when: nothing throttled, capped or overridden; and the node
below ``QuietRead.below_bps`` on every domain, and so for ``QuietRead.calm_s``) is read
thin: every control group's total each tick, each job's counters every ``QuietRead.every``
ticks, a share of the jobs each tick (those read longest ago first). A job's rate is then its mean since its last read, carried until
its next; the sample says so (``jobs_current`` False). The first tick the node is not quiet
reads every job again, and says the same of that tick: a job read some ticks ago has a
longer window, and heaviest-first must not act on it (the policy waits one tick). The node
then stays read in full for ``calm_s`` after it was last at or over the bound: a hog that
bursts past the threshold every few ticks would otherwise find a thin tick before each
burst, and each burst's rates never over one tick.

No descriptor stays open between ticks (an operator must be able to unmount
resctrl); a reading that is missing makes that rate None, never zero, so policy
can tell quiet from unknown.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple

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
    #: every job's rate is over the last tick alone (False on a thin tick, where rates are
    #: means since each job's last read, and on the first tick after one)
    jobs_current: bool = True
    #: job id -> seconds since its counters were last read, for each job whose rate is
    #: carried (not read this tick, on a thin tick); a job not here was read this tick
    job_age_s: Mapping[str, float] = field(default_factory=dict)
    #: job id -> the seconds its rate is a mean over (its last read to the one before),
    #: where both reads are known (not for a job's first rate, since its group's start)
    job_window_s: Mapping[str, float] = field(default_factory=dict)


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


def _every_domain(rates: dict[int, float | None], domains: tuple[int, ...]) -> dict[int, float | None]:
    """A meter's rates with every domain of this tick's (readings hold only those domains:
    as many rates means every domain has one)."""
    return rates if len(rates) == len(domains) else {d: rates.get(d) for d in domains}


def _has_values(readings: MbmSample, domains: tuple[int, ...]) -> bool:
    """A group's counters gave a value on every domain (none gone, none a word)."""
    if len(readings) != len(domains):
        return False
    for events in readings.values():
        r = events.get(MBM_TOTAL)
        if r is None or r.value is None:
            return False
    return True


class QuietRead(NamedTuple):
    """The caller's word that nothing is throttled, capped or overridden: below
    ``below_bps`` per domain, and so for ``calm_s`` seconds, each job's counters are read
    every ``every`` ticks."""

    below_bps: float
    every: int
    calm_s: float = 0.0


class BandwidthSampler:
    name = "resctrl"

    def __init__(self, monitor: JobMonitor, reader: MbmReader | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.clock = clock  # rates are taken at the time of reading, not the tick's start
        self.monitor = monitor
        # each counter is read once a sample: opened, read and closed at once
        self.reader = reader or MbmReader(events=(MBM_TOTAL,), keep_open=False)
        # each job's meter by job id, each control group's residual's by its path: two maps,
        # so no key is formatted for every group every tick
        self._job_meters: dict[str, BandwidthMeter] = {}
        self._own_meters: dict[str, BandwidthMeter] = {}
        self._ctrl_paths: set[str] = set()
        self._last_read: float | None = None
        self._generation: int | None = None
        # each control group's total (its own RMID and its monitoring groups'), by its path:
        # the node's rate while the groups stay as they are
        self._total_meters: dict[str, BandwidthMeter] = {}
        # control group path -> domain -> bytes of its groups removed since its total's meter
        # began: the kernel dropped them from the total, each reading gets them back
        self._removed_bytes: dict[str, dict[int, int]] = {}
        self._layout: tuple | None = None  # the groups as last read: which job's is where
        self._job_bps: dict[str, dict[int, float | None]] = {}  # each job's last rate (carried on thin ticks)
        self._job_read_at: dict[str, float] = {}  # when each job's counters were last read
        self._job_window: dict[str, float] = {}  # the span of each job's last rate (carried with it)
        self._behind: set[str] = set()  # jobs not read on the last tick
        self._young: set[str] = set()  # jobs read once only: their next read is on the next tick
        self._loud_at: float | None = None  # when the node was last read at or over the quiet bound
        # every job's counters read a value when last read (so the totals held every group)
        self._whole = False

    def _new_meter(self, domains: tuple[int, ...], created_at: float | None, dip: int) -> BandwidthMeter:
        meter = BandwidthMeter(MBM_TOTAL, dip_tolerance=dip)
        if created_at is not None:
            # Counted from zero since mkdir. Rates of all groups are summed into the
            # node's, so each must cover the same window: the one since our last
            # read (what the group took over had been counted elsewhere until then).
            start = created_at if self._last_read is None else min(created_at, self._last_read)
            meter.start_from_zero(domains, start)
        return meter

    def sample(self, rc: Resctrl, generation: int, groups: Mapping[str, MonGroup],
               quiet: QuietRead | None = None,
               removed: tuple[tuple[str, str, MbmSample], ...] = ()) -> BandwidthSample:
        """Rates of every job group and the node, from counters read now; with ``quiet``, a
        quiet node read thin (see the module's doc); None: every counter. ``removed``: the
        job groups removed since the last sample, each with its control group and its
        counters read just before its rmdir (noded.samplers.mongroups). Descriptors are
        closed before returning: noded holds nothing open in resctrl between ticks."""
        if generation != self._generation:
            # A new mount: counters of the old one mean nothing here.
            self._job_meters.clear()
            self._own_meters.clear()
            self._total_meters.clear()
            self._removed_bytes.clear()
            self._ctrl_paths.clear()
            self._job_bps.clear()
            self._job_read_at.clear()
            self._job_window = {}  # a new one: an earlier sample holds the old
            self._young.clear()
            self._layout = None
            self._last_read = None
            self._generation = generation
        try:
            return self._sample(rc, groups, quiet, removed)
        finally:
            self.reader.close()

    def _sample(self, rc: Resctrl, groups: Mapping[str, MonGroup], quiet: QuietRead | None,
                removed: tuple[tuple[str, str, MbmSample], ...]) -> BandwidthSample:
        domains = read_domains(rc.root, True)
        ctrl_paths = [rc.root] + [g.path for g in rc.list_ctrl_groups()]
        layout = (tuple(ctrl_paths), frozenset((j, g.path, g.parent.path) for j, g in groups.items()))
        same = layout == self._layout
        # the totals still count every byte across the change: see _totals_carry_over
        carried = not same and self._totals_carry_over(layout, removed, domains)
        if not same and not carried:
            self._total_meters.clear()  # a group moved, or removed unread: each total jumps or dips
            self._removed_bytes.clear()
        self._layout = layout
        by_totals: dict[int, float | None] | None = None
        totals_read = False  # this tick's totals taken already: a second read would measure microseconds
        if same and quiet is not None and quiet.every > 1 and self._every_job_rated(groups):
            totals_read = True
            by_totals = self._node_from_totals(self._read_all({p: p for p in ctrl_paths}, domains, self.clock()),
                                               domains)
            calm = self._loud_at is None or self.clock() - self._loud_at >= quiet.calm_s
            if calm and by_totals is not None and all(r < quiet.below_bps for r in by_totals.values()):
                return self._thin(groups, domains, by_totals, quiet)
        return self._full(groups, domains, ctrl_paths, quiet, same or carried, totals_read, by_totals)

    def _full(self, groups: Mapping[str, MonGroup], domains: tuple[int, ...], ctrl_paths: list[str],
              quiet: QuietRead | None, totals_go_on: bool, totals_read: bool,
              by_totals: dict[int, float | None] | None) -> BandwidthSample:
        """A full tick: every job group's counters, then every control group's. The node's
        rate is the jobs' and each control group's residual, or the totals' where they still
        count every byte (``totals_go_on``) and every job's counters gave values on this tick
        and the last; ``by_totals``: this tick's totals, where ``totals_read`` already."""
        # Job groups first, then their control groups (see residual()).
        started = self.clock()
        behind = bool(self._behind & groups.keys())  # some job's last reading is older than the last tick
        job_readings = self._read_all({job_id: g.path for job_id, g in groups.items()}, domains, started)
        ctrl_readings = self._read_all({p: p for p in ctrl_paths}, domains, self.clock())
        now = self.clock()
        node: dict[int, float | None] = dict.fromkeys(domains, 0.0)
        self._young.clear()  # every job read now: those read once before have their second read
        job_bps = self._job_rates(job_readings, domains, node)
        self._job_bps = job_bps
        before = self._job_read_at
        self._job_read_at = {j: at for j, (_, at) in job_readings.items()}
        self._job_window = {j: at - before[j] for j, at in self._job_read_at.items() if j in before}
        self._behind = set()
        self._add_residuals(node, groups, job_readings, ctrl_readings, domains, now - started)
        if not totals_read:
            by_totals = self._node_from_totals(ctrl_readings, domains)
        whole = all(_has_values(readings, domains) for readings, _ in job_readings.values())
        if totals_go_on and by_totals is not None and whole and self._whole:
            # the same counters summed at once: after thin ticks the jobs' and residuals'
            # windows differ, the totals' is the last tick's (each held every group at both ends)
            node = by_totals
        self._whole = whole
        missing = [f"node bandwidth on L3 domain {d}" for d, r in node.items() if r is None]
        if quiet is not None and any(r is not None and r >= quiet.below_bps for r in node.values()):
            self._loud_at = now
        for job_id in [j for j in self._job_meters if j not in groups]:
            del self._job_meters[job_id]
        for path in self._own_meters.keys() - set(ctrl_paths):
            del self._own_meters[path]
        self._ctrl_paths = set(ctrl_paths)
        self._last_read = now
        return BandwidthSample(domains, node, job_bps, tuple(missing), jobs_current=not behind,
                               job_window_s=self._job_window)

    def _add_residuals(self, node: dict[int, float | None], groups: Mapping[str, MonGroup],
                       job_readings: Mapping[str, tuple[MbmSample, float]],
                       ctrl_readings: Mapping[str, tuple[MbmSample, float]], domains: tuple[int, ...],
                       span: float) -> None:
        """Adds into ``node`` each control group's own rate: its counters less its job groups'
        (``span``: how long the reads took, the dip a residual may show for the jobs' bytes
        moved meanwhile)."""
        job_bps = self._job_bps
        in_ctrl: dict[str, list[str]] = {}  # control group path -> its job groups
        for job_id, g in groups.items():
            in_ctrl.setdefault(g.parent.path, []).append(job_id)
        for path, (readings, at) in ctrl_readings.items():
            kids = in_ctrl.get(path, [])
            # A control group new since the last read (a throttle level) holds nothing
            # of its own yet: its residual starts at zero.
            new = self._last_read is not None and path not in self._ctrl_paths
            moved = {d: sum(job_bps[j][d] or 0.0 for j in kids) * span for d in domains}
            tolerance = {d: RESIDUAL_DIP_BYTES + int(2 * moved[d]) for d in domains}
            own = residual(readings, [job_readings[j][0] for j in kids], domains)
            meter = self._own_meters.get(path)
            if meter is None:
                meter = self._own_meters[path] = self._new_meter(domains, self._last_read if new else None,
                                                                 RESIDUAL_DIP_BYTES)
            _add_into(node, _every_domain(meter.update(own, at, tolerance), domains))

    def _totals_carry_over(self, layout: tuple, removed: tuple[tuple[str, str, MbmSample], ...],
                           domains: tuple[int, ...]) -> bool:
        """Whether each control group's total still counts every byte across this change of
        the groups, so that its meter's rates stay the last tick's: the same control groups;
        a group made (it counts from zero what its control group counted before: the total
        goes on); a group removed only where noded read its counters just before its rmdir
        (the kernel drops its count from the total: added back, from now on, to every reading
        of that total). A group moved, or removed unread (by someone else, or its last read
        failed), and the totals start again."""
        if self._layout is None or layout[0] != self._layout[0]:
            return False
        before, now = self._layout[1], layout[1]
        jobs_now = {j for j, _, _ in now}
        if any(j in jobs_now for j, _, _ in before - now):
            return False  # a job's group moved (or another took its place)
        last = {path: (parent, readings) for path, parent, readings in removed}
        gone = before - now
        if any(path not in last or last[path][0] != parent or not _has_values(last[path][1], domains)
               for _, path, parent in gone):
            return False
        for _, path, parent in gone:
            into = self._removed_bytes.setdefault(parent, dict.fromkeys(domains, 0))
            for d in domains:
                into[d] = into.get(d, 0) + last[path][1][d][MBM_TOTAL].value
        return True

    def _node_from_totals(self, ctrl_readings: Mapping[str, tuple[MbmSample, float]],
                          domains: tuple[int, ...]) -> dict[int, float | None] | None:
        """The node's rate per domain as the sum of every control group's total's (with the
        counts of the groups removed from it since its meter began added back); None where
        a total has no rate yet (a new meter, a group moved or removed unread)."""
        node: dict[int, float | None] = dict.fromkeys(domains, 0.0)
        for path, (readings, at) in ctrl_readings.items():
            meter = self._total_meters.get(path)
            if meter is None:
                meter = self._total_meters[path] = BandwidthMeter(MBM_TOTAL, dip_tolerance=RESIDUAL_DIP_BYTES)
            if (back := self._removed_bytes.get(path)) is not None:
                readings = {d: {MBM_TOTAL: CounterReading(r.value + back.get(d, 0))}
                            if (r := events.get(MBM_TOTAL)) is not None and r.value is not None else events
                            for d, events in readings.items()}
            _add_into(node, _every_domain(meter.update(readings, at), domains))
        return None if any(r is None for r in node.values()) else node

    def _every_job_rated(self, groups: Mapping[str, MonGroup]) -> bool:
        """Every job has a rate to carry: a job never read, or whose last read gave none (a
        first reading, a counter the kernel could not give), is read every tick."""
        rates = self._job_bps
        return all(j in rates and None not in rates[j].values() for j in groups)

    def _thin(self, groups: Mapping[str, MonGroup], domains: tuple[int, ...], node: dict[int, float | None],
              quiet: QuietRead) -> BandwidthSample:
        """A thin tick: the node's rate from the totals (read), and the share of the jobs
        whose turn it is, those read longest ago first; the others' rates carried."""
        share = math.ceil(len(groups) / quiet.every)
        # a job read once only (its first rate, since its start, a ramp included) first, then
        # those read longest ago
        young = [j for j in sorted(self._young) if j in groups]
        due = young + sorted((j for j in groups if j not in self._young), key=lambda j: (self._job_read_at[j], j))[
            :max(0, share - len(young))]
        self._young.clear()
        job_readings = self._read_all({j: groups[j].path for j in due}, domains, self.clock())
        job_bps = {j: self._job_bps[j] for j in groups}
        read_at, window = dict(self._job_read_at), dict(self._job_window)  # the last sample's stay as they were
        for job_id, (readings, at) in job_readings.items():
            job_bps[job_id] = _every_domain(self._job_meters[job_id].update(readings, at), domains)
            if job_id in read_at:
                window[job_id] = at - read_at[job_id]
            read_at[job_id] = at
            self._whole = self._whole and _has_values(readings, domains)
        self._job_bps, self._job_read_at, self._job_window = job_bps, read_at, window
        self._behind = groups.keys() - job_readings.keys()
        now = self._last_read = self.clock()
        return BandwidthSample(domains, node, job_bps, (), jobs_current=False,
                               job_age_s={j: now - read_at[j] for j in self._behind},
                               job_window_s={j: window[j] for j in groups if j in window})

    def _read_all(self, paths: Mapping[str, str], domains: tuple[int, ...],
                  before: float) -> dict[str, tuple[MbmSample, float]]:
        """Each group's counters (key -> its path) and when they were read: the middle of
        its own read, ``before`` being the clock just before the first. Each group's rate is
        taken over its own interval: one time for the whole tick would skew every rate by how
        long the reads after it took (much, through a slow filesystem or on a loaded host)."""
        clock, read = self.clock, self.reader.read
        out = {}
        for key, path in paths.items():
            readings = read(path, domains)
            after = clock()  # this group's end is the next one's start: one clock read a group
            out[key] = (readings, (before + after) / 2)
            before = after
        return out

    def _job_rates(self, job_readings: Mapping[str, tuple[MbmSample, float]], domains: tuple[int, ...],
                   node: dict[int, float | None]) -> dict[str, dict[int, float | None]]:
        """Each job's rates per domain (added into ``node``'s); a job's first (a new meter)
        over the time its group counted (see _own_rate)."""
        meters = self._job_meters
        job_bps = {}
        for job_id, (readings, at) in job_readings.items():
            meter = meters.get(job_id)
            if meter is None:
                # when its group was made matters only to a new meter (asked once, not every tick)
                created_at = self.monitor.created_at(job_id)
                meter = meters[job_id] = self._new_meter(domains, created_at, 0)
                self._young.add(job_id)  # its first rate reaches back to its start: read again next tick
                rates = _every_domain(meter.update(readings, at), domains)
                _add_into(node, rates)
                job_bps[job_id] = self._own_rate(rates, at, created_at)
            else:
                rates = _every_domain(meter.update(readings, at), domains)
                _add_into(node, rates)
                job_bps[job_id] = rates
        return job_bps

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
