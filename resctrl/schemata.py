"""schemata text <-> values, as pure functions.

A schemata is ``{resource: {domain_id: value}}``: cache resources (``L3``,
``L3CODE``, ``L3DATA``, ``L2``…) hold capacity bit masks, ``MB`` holds a
bandwidth value whose unit depends on the flavour (percent on Intel, 1/8 GB/s on
AMD, MBps under ``mba_MBps``). Parsing accepts what every kernel prints: names
right-aligned under CDP, values padded by older kernels.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

Schemata = dict[str, dict[int, int]]

MB = "MB"
U32_MAX = 0xFFFFFFFF


class MbFlavour(enum.Enum):
    PERCENT = "percent"  # Intel: min_bandwidth..100, rounded up to bandwidth_gran
    AMD_UNITS = "amd"  # AMD: 0..2048 in units of 1/8 GB/s
    MBPS = "mbps"  # mounted with mba_MBps: a MiB/s target per domain


@dataclass(frozen=True)
class MbLimits:
    flavour: MbFlavour
    min_bandwidth: int
    bandwidth_gran: int
    max_bandwidth: int


class SchemataParseError(ValueError):
    def __init__(self, line_no: int, line: str, reason: str):
        self.line_no = line_no
        self.line = line
        super().__init__(f"schemata line {line_no} {line!r}: {reason}")


def is_bandwidth(resource: str) -> bool:
    return resource in (MB, "SMBA")


def parse_schemata(text: str) -> Schemata:
    """Parse what reading a group's ``schemata`` file returns."""
    out: Schemata = {}
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or not name:
            raise SchemataParseError(no, line, "missing 'RESOURCE:'")
        if name in out:
            raise SchemataParseError(no, line, f"resource {name} appears twice")
        values: dict[int, int] = {}
        for item in rest.split(";"):
            if not item.strip():
                continue
            dom, eq, val = item.partition("=")
            dom, val = dom.strip(), val.strip()
            if not eq or not dom.isdigit():
                raise SchemataParseError(no, line, f"bad domain entry {item!r}")
            if int(dom) in values:
                raise SchemataParseError(no, line, f"domain {dom} appears twice")
            try:
                values[int(dom)] = int(val, 10 if is_bandwidth(name) else 16)
            except ValueError:
                raise SchemataParseError(no, line, f"bad value {val!r} for domain {dom}") from None
        out[name] = values
    return out


def format_line(resource: str, values: Mapping[int, int], width: int = 0) -> str:
    """One schemata line, newline included: ``MB:0=50;1=100``."""
    fmt = "{}={}" if is_bandwidth(resource) else "{}={:x}"
    body = ";".join(fmt.format(d, v) for d, v in sorted(values.items()))
    return f"{resource:>{width}}:{body}\n"


def format_schemata(schemata: Mapping[str, Mapping[int, int]], *, align: bool = False) -> str:
    """Schemata text; ``align`` right-aligns names as the kernel does under CDP."""
    width = max((len(r) for r in schemata), default=0) if align else 0
    return "".join(format_line(r, v, width) for r, v in schemata.items() if v)


def changed_values(current: Mapping[str, Mapping[int, int]], desired: Mapping[str, Mapping[int, int]]) -> Schemata:
    """Only the resource/domain values in ``desired`` that differ from ``current``."""
    out: Schemata = {}
    for res, values in desired.items():
        now = current.get(res, {})
        diff = {d: v for d, v in values.items() if now.get(d) != v}
        if diff:
            out[res] = diff
    return out


def normalize_mb(value: int, limits: MbLimits) -> int:
    """The MB value the kernel will actually apply for a requested one.

    Clamped into range, then (Intel percent) rounded up to the granularity as the
    kernel's bw_validate() does, so comparing against a read-back never loops.
    """
    if limits.flavour is MbFlavour.MBPS:
        return max(0, min(int(value), U32_MAX))
    v = max(limits.min_bandwidth, min(int(value), limits.max_bandwidth))
    gran = max(1, limits.bandwidth_gran)
    return min(-(-v // gran) * gran, limits.max_bandwidth)
