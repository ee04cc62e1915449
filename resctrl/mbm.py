"""Memory-bandwidth monitoring: counter readings and the rates between them.

A counter file holds a u64 byte count that grows from the group's creation, or a
word saying why there is no value (``Unavailable``, ``Error``, ``Unassigned``).
Counters can also go backwards (reconfiguration, a domain going offline and
back): a rate is only ever computed between two good readings where the later is
not smaller, over a positive interval, and below a plausibility ceiling.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

MBM_TOTAL = "mbm_total_bytes"
MBM_LOCAL = "mbm_local_bytes"
LLC_OCCUPANCY = "llc_occupancy"
DOMAIN_PREFIX = "mon_L3_"

OK = "ok"
STATES = ("Unavailable", "Error", "Unassigned")
#: No memory system moves 10 TB/s through one L3 domain; a rate above this is a glitch.
DEFAULT_MAX_RATE = 10e12


@dataclass(frozen=True)
class CounterReading:
    value: int | None  # bytes, None when the kernel gave no value
    state: str = OK  # "ok" or the kernel's word: Unavailable / Error / Unassigned

    @property
    def ok(self) -> bool:
        return self.value is not None


# domain id -> event name -> reading
MbmSample = dict[int, dict[str, CounterReading]]


def parse_counter(text: str) -> CounterReading:
    """One counter file's content."""
    word = text.strip()
    if word.isdigit():
        return CounterReading(int(word))
    if word in STATES:
        return CounterReading(None, word)
    raise ValueError(f"unexpected MBM counter content {text!r}")


def read_mbm(group_path: str, events: tuple[str, ...] = (MBM_TOTAL, MBM_LOCAL)) -> MbmSample:
    """Read the counters of one group for every L3 domain currently present.

    A domain that disappears between listing and reading is left out; any other
    I/O error propagates (the caller's sampler decides what is missing).
    """
    mon_data = os.path.join(group_path, "mon_data")
    sample: MbmSample = {}
    for name in os.listdir(mon_data):
        if not name.startswith(DOMAIN_PREFIX):
            continue  # mon_sub_L3_YY (Sub-NUMA) folds into its parent's numbers
        domain = int(name[len(DOMAIN_PREFIX):])
        readings = {}
        try:
            for event in events:
                with open(os.path.join(mon_data, name, event), "rb") as f:
                    readings[event] = parse_counter(f.read().decode())
        except FileNotFoundError:
            continue
        sample[domain] = readings
    return sample


def rate_between(prev_value: int, prev_t: float, value: int, t: float, max_rate: float = DEFAULT_MAX_RATE) -> float | None:
    """Bytes/second between two good readings, or None where no honest rate exists."""
    dt = t - prev_t
    if dt <= 0 or value < prev_value:
        return None
    rate = (value - prev_value) / dt
    return rate if rate <= max_rate else None


class BandwidthMeter:
    """Turns successive samples of one group into bytes/second per domain.

    ``update(sample, now)`` takes ``now`` from a monotonic clock the caller reads
    right after sampling. The first sample of a domain, a reset, a missing value or
    an absurd jump yields None for that domain (and re-baselines); a domain that is
    gone is dropped.
    """

    def __init__(self, event: str = MBM_TOTAL, max_rate: float = DEFAULT_MAX_RATE, dip_tolerance: int = 0):
        self.event = event
        self.max_rate = max_rate
        # A value derived from several counters read one after another (a residual)
        # can dip by what moved between the reads; a dip this small means "no traffic",
        # not a reset. Plain counters use 0: any decrease is a reset.
        self.dip_tolerance = dip_tolerance
        self._last: dict[int, tuple[int, float]] = {}

    def start_from_zero(self, domains: tuple[int, ...] | list[int], t: float) -> None:
        """Baseline a group created at ``t``: its counters start at zero at mkdir, so
        its very first reading already gives a rate."""
        for d in domains:
            self._last.setdefault(d, (0, t))

    def update(self, sample: Mapping[int, Mapping[str, CounterReading]], now: float,
               dip_tolerance: Mapping[int, int] | None = None) -> dict[int, float | None]:
        """Rates per domain; ``dip_tolerance`` overrides the meter's own per domain."""
        rates: dict[int, float | None] = {}
        last, event, max_rate = self._last, self.event, self.max_rate  # every group, every tick: locals
        if not last.keys() <= sample.keys():
            for domain in [d for d in last if d not in sample]:
                del last[domain]
        for domain, readings in sample.items():
            reading = readings.get(event)
            value = reading.value if reading is not None else None
            if value is None:
                last.pop(domain, None)
                rates[domain] = None
                continue
            prev = last.get(domain)
            if prev is None:
                rates[domain] = None
                last[domain] = (value, now)
                continue
            prev_value, prev_t = prev
            if value < prev_value:
                tolerance = dip_tolerance.get(domain, self.dip_tolerance) if dip_tolerance else self.dip_tolerance
                if prev_value - value <= tolerance:
                    rates[domain] = 0.0 if now > prev_t else None
                    last[domain] = (prev_value, now)
                    continue
            rates[domain] = rate_between(prev_value, prev_t, value, now, max_rate)
            last[domain] = (value, now)
        return rates


class MbmReader:
    """Reads counters through file descriptors kept open between samples.

    Opening a kernfs file costs a path walk; re-reading it from offset 0 makes the
    kernel produce a fresh value, so a sampler that reads the same groups every
    tick keeps the descriptors. A group or domain that went away makes its read
    fail; the descriptor is closed and the domain left out of that sample. Call
    ``forget`` when a group is removed and ``close`` at the end.

    ``keep_open=False`` reads each file with open, pread, close at once, for a
    reader that reads each file once and must hold nothing open afterwards.
    """

    def __init__(self, events: tuple[str, ...] = (MBM_TOTAL, MBM_LOCAL), *, keep_open: bool = True):
        self.events = events
        self.keep_open = keep_open
        self._fds: dict[str, int] = {}

    def _read_once(self, path: str) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return os.pread(fd, 64, 0)
        except OSError:
            return None  # ENODEV/ENOENT: the group or domain was removed after the open
        finally:
            try:
                os.close(fd)
            except OSError:
                pass  # e.g. ENOTCONN from a filesystem that went away: the fd is released anyway

    def _read_file(self, path: str) -> bytes | None:
        if not self.keep_open:
            return self._read_once(path)
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except (FileNotFoundError, NotADirectoryError):
                return None
            self._fds[path] = fd
        try:
            return os.pread(fd, 64, 0)
        except OSError:
            # ENODEV/ENOENT after the group or domain was removed underneath us.
            self._close(path)
            return None

    def _close(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass  # e.g. ENOTCONN from a filesystem that went away: the fd is released anyway

    def read(self, group_path: str, domains: tuple[int, ...] | list[int]) -> MbmSample:
        """Counters of one group for the given domain ids (list them once per tick
        with ``resctrl.info.read_domains``)."""
        sample: MbmSample = {}
        group_path = group_path.rstrip("/")
        # every counter of every group every tick: one call a file, names bound once a group
        read_file, events = (self._read_file if self.keep_open else self._read_once), self.events
        for domain in domains:
            # plain string formatting, not os.path.join
            base = f"{group_path}/mon_data/{DOMAIN_PREFIX}{domain:02d}/"
            readings = {}
            for event in events:
                raw = read_file(base + event)
                if raw is None:
                    self._forget_prefix(base)
                    break
                word = raw.strip()
                # a value, nearly always: digits (bytes.isdigit is ASCII only); else the kernel's word
                readings[event] = CounterReading(int(word)) if word.isdigit() else parse_counter(raw.decode())
            else:
                sample[domain] = readings
        return sample

    def forget(self, group_path: str) -> None:
        self._forget_prefix(group_path.rstrip("/") + "/mon_data/")

    def _forget_prefix(self, prefix: str) -> None:
        for path in [p for p in self._fds if p.startswith(prefix)]:
            self._close(path)

    @property
    def open_files(self) -> int:
        return len(self._fds)

    def close(self) -> None:
        for path in list(self._fds):
            self._close(path)
