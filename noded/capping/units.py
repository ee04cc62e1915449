"""Bandwidth as operators write it: ``6GB/s``, ``6.5 GB/s``, ``512MiB/s``.

Four units, spelled exactly: ``GB/s`` and ``MB/s`` are decimal (10^9, 10^6 bytes a second:
what MBM, pqos and noded's metrics report), ``GiB/s`` and ``MiB/s`` binary (2^30, 2^20:
what the kernel's ``mba_MBps`` schemata takes, in MiB/s). Nothing else is guessed: ``6G``,
``6gb/s``, ``6 Gbps`` (bits?) and a bare number are refused, naming what was wrong, since a
cap off by a factor of 8 or 1000 would hold a job to nothing or to everything.
"""

from __future__ import annotations

import re

UNITS = {"GB/s": 10**9, "MB/s": 10**6, "GiB/s": 2**30, "MiB/s": 2**20}
#: no memory system moves more than this (a cap above it is a typo, not a cap)
MAX_BYTES_PER_S = 10**13  # 10 TB/s
_FORM = re.compile(r"([0-9]+(?:\.[0-9]+)?) ?([A-Za-z/]+)")


class BandwidthError(ValueError):
    pass


def parse_bandwidth(text: str) -> float:
    """Bytes a second for ``text``; raises BandwidthError naming what was wrong."""
    shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
    m = _FORM.fullmatch(text)
    if m is None:
        raise BandwidthError(f"bad bandwidth {shown}: write a number and a unit, e.g. 6GB/s, 6.5 GB/s or 512MiB/s")
    number, unit = m.groups()
    if unit not in UNITS:
        raise BandwidthError(f"bad bandwidth {shown}: unknown unit {unit[:12]!r}; the units are "
                             + ", ".join(UNITS) + " (spelled exactly: GB and MB decimal, GiB and MiB binary)")
    value = float(number) * UNITS[unit]
    if not 0 < value <= MAX_BYTES_PER_S:
        raise BandwidthError(f"bad bandwidth {shown}: it must be more than 0 and at most "
                             f"{MAX_BYTES_PER_S / 1e12:g} TB/s")
    return value


def format_bandwidth(bytes_per_s: float) -> str:
    """How noded says a bandwidth back: decimal GB/s, as ``parse_bandwidth`` reads it."""
    return f"{bytes_per_s / 1e9:.3g} GB/s"
