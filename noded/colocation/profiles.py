"""Job profiles for co-location: the thesis's weighted kernel metrics.

For a profiled training job with kernels i = 1..N, each taking t_i (µs) at an
achieved occupancy q_i (%) and a DRAM throughput p_i (% of peak):

    C = Σ q_i t_i        (eq. 4.3)        M = Σ p_i t_i        (eq. 4.2)

in %·µs, as the thesis uses them (its V100 threshold ΣC ≤ 4·10⁷ is on this
scale). They grow with the profiled window, so noded also keeps the
time-normalised forms C / W and M / W (W = the profiled window in µs, by default
the sum of kernel durations): an average occupancy and bandwidth share in %.

Sources: an Nsight Compute CSV export (``ncu --csv --page raw``), or a compact
YAML file of our own (per model and batch size).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

from noded.util.yamlsafe import YamlError, read_regular_file, read_yaml_file

#: the largest ncu CSV read (``ncu --page raw`` has a row per kernel launch: a long
#: profile's is tens of MiB); a larger one is refused unread
MAX_NCU_CSV_BYTES = 64 << 20

#: The ncu metric names accepted, and how their units convert to µs / %.
NCU_DURATION = "gpu__time_duration.sum"
NCU_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"  # achieved occupancy
NCU_DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
_TIME_UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
                  "second": 1e6, "s": 1e6}


class ProfileError(ValueError):
    pass


#: Headroom for rounding when checking C <= 100·W (each q_i is at most 100 %).
_ROUNDING = 1e-9


def check_profile_numbers(c: float, m: float, window_us: float,
                          names: tuple[str, str, str] = ("C", "M", "window_us")) -> str | None:
    """What is wrong with these profile numbers, or None. Every source of a profile
    (ncu CSV, profile file, a request, NVML) passes here: a NaN compares false with
    every threshold and would otherwise be admitted anywhere. ``names``: what the
    caller's input calls C, M and the window."""
    nc, nm, nw = names
    for name, x in zip(names, (c, m, window_us)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            return f"{name} must be a finite number, got {x!r}"
    if c < 0 or m < 0 or window_us <= 0:
        return f"{nc} and {nm} must be >= 0 and {nw} > 0"
    for name, x in ((nc, c), (nm, m)):
        if x > 100.0 * window_us * (1 + _ROUNDING):
            return (f"{name}/{nw} = {x / window_us:.6g} %: {name} is a sum of percentages (at most 100) "
                    f"times kernel durations, so it cannot exceed 100·{nw}")
    return None


@dataclass(frozen=True)
class JobProfile:
    """Finite numbers in range only (checked here, so no source can bring another)."""

    model: str
    batch_size: int
    c: float  # Σ q_i t_i, %·µs
    m: float  # Σ p_i t_i, %·µs
    window_us: float  # the profiled window W
    source: str  # "ncu:<file>", "profile:<file>", or "nvml" (live samples)

    def __post_init__(self):
        problem = check_profile_numbers(self.c, self.m, self.window_us)
        if problem:
            raise ProfileError(f"{self.source}: {self.model} at batch size {self.batch_size}: {problem}")

    @property
    def c_norm(self) -> float:
        """Average achieved occupancy over the window, %."""
        return self.c / self.window_us if self.window_us else 0.0

    @property
    def m_norm(self) -> float:
        """Average DRAM throughput over the window, % of peak."""
        return self.m / self.window_us if self.window_us else 0.0


def _number(text: str, where: str) -> float:
    try:
        x = float(text.replace(",", ""))
    except ValueError:
        raise ProfileError(f"{where}: {text[:80]!r} is not a number") from None
    if not math.isfinite(x):
        raise ProfileError(f"{where}: {text[:80]!r} is not a finite number")
    return x


def read_ncu_csv(path: str, *, model: str, batch_size: int) -> JobProfile:
    """The profile in an ncu CSV file, read as untrusted bytes: a regular file only
    (opened without blocking), at most ``MAX_NCU_CSV_BYTES``, strict UTF-8. Raises only
    ProfileError, naming the file."""
    try:
        data = read_regular_file(path, max_bytes=MAX_NCU_CSV_BYTES, kind="an ncu CSV file")
    except YamlError as e:
        raise ProfileError(str(e)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProfileError(f"{path}: not UTF-8: byte 0x{data[e.start]:02x} at byte {e.start} of the file") from None
    return parse_ncu_csv(text, model=model, batch_size=batch_size, source=path)


def parse_ncu_csv(text: str, *, model: str, batch_size: int, source: str = "ncu",
                  window_us: float | None = None) -> JobProfile:
    """Parse ``ncu --csv --page raw`` output (a header row, a units row, one row per kernel)."""
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:  # a field over the csv module's limit, a quote left open at the end, ...
        raise ProfileError(f"{source}: not an ncu CSV ({e})") from None
    rows = [r for r in rows if r and not r[0].startswith("==")]  # ncu's own log lines
    if len(rows) < 2:
        raise ProfileError(f"{source}: expected a header row, a units row and kernel rows")
    header, units, kernels = rows[0], rows[1], rows[2:]
    missing = [m for m in (NCU_DURATION, NCU_OCCUPANCY, NCU_DRAM) if m not in header]
    if missing:
        raise ProfileError(f"{source}: missing metric column(s) {missing}; collect them with "
                           f"ncu --metrics {','.join((NCU_DURATION, NCU_OCCUPANCY, NCU_DRAM))} --csv --page raw")
    di, oi, pi = (header.index(m) for m in (NCU_DURATION, NCU_OCCUPANCY, NCU_DRAM))
    width = max(di, oi, pi) + 1
    if len(units) < width:
        raise ProfileError(f"{source}: row 2 (the units) has {len(units)} columns, the header has {len(header)}")
    unit = units[di].strip()
    if unit not in _TIME_UNITS_US:
        raise ProfileError(f"{source}: unknown time unit {unit!r} for {NCU_DURATION}")
    for i, u in ((oi, NCU_OCCUPANCY), (pi, NCU_DRAM)):
        if units[i].strip() != "%":
            raise ProfileError(f"{source}: {u} must be in %, got {units[i]!r}")
    if not kernels:
        raise ProfileError(f"{source}: no kernel rows")
    if window_us is not None and not (math.isfinite(window_us) and window_us > 0):
        raise ProfileError(f"{source}: the window must be a finite number of µs > 0, got {window_us!r}")
    c = m = total = 0.0
    for n, row in enumerate(kernels, start=3):
        where = f"{source}: row {n}"
        if len(row) < width:
            raise ProfileError(f"{where}: {len(row)} columns, the header has {len(header)}")
        t = _number(row[di], where) * _TIME_UNITS_US[unit]
        q, p = _number(row[oi], where), _number(row[pi], where)
        if t < 0 or not 0 <= q <= 100 or not 0 <= p <= 100:
            raise ProfileError(f"{where}: duration must be >= 0 and percentages in [0, 100]")
        c += q * t
        m += p * t
        total += t
    problem = check_profile_numbers(c, m, window_us or total)
    if problem:
        raise ProfileError(f"{source}: {problem}" + ("" if total else " (every kernel took 0 µs)"))
    return JobProfile(model, batch_size, c, m, window_us or total, source)


def load_profiles(path: str) -> dict[tuple[str, int], JobProfile]:
    """Our compact format::

        ResNet-50:
          64:  {C: 3.1e7, M: 2.2e7, window_us: 1.2e6}
          128: {C: 5.9e7, M: 4.0e7, window_us: 2.3e6}
    """
    try:
        data = read_yaml_file(path).data or {}
    except YamlError as e:  # unreadable, not YAML, aliases, duplicate keys, …: with its line
        raise ProfileError(str(e)) from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping of model -> batch size -> {{C, M, window_us}}")
    out = {}
    for model, sizes in data.items():
        if not isinstance(sizes, dict):
            raise ProfileError(f"{path}: {model}: expected a mapping of batch size -> metrics")
        for bs, v in sizes.items():
            where = f"{path}: {model}: {bs}"
            if not isinstance(bs, int) or bs < 1:
                raise ProfileError(f"{where}: batch size must be a positive integer")
            if not isinstance(v, dict) or set(v) != {"C", "M", "window_us"}:
                raise ProfileError(f"{where}: expected exactly the keys C, M, window_us")
            # YAML 1.1 reads 3.1e7 (no dot) as a string: accept numbers written either way.
            nums = [_number(str(v[k]), f"{where}: {k}") if not isinstance(v[k], bool) else -1.0
                    for k in ("C", "M", "window_us")]
            problem = check_profile_numbers(*nums)
            if problem:
                raise ProfileError(f"{where}: {problem}")
            out[(str(model), bs)] = JobProfile(str(model), bs, nums[0], nums[1], nums[2], f"profile:{path}")
    return out
