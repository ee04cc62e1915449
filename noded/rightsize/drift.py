"""Drift (ours, all methods): a sized job's passive windows at its answer (``Watch``).

A searched answer keeps a passive window; when ``DRIFT_WINDOWS`` windows in a row measure
the job beyond the band in one direction, it is searched again from the top with nothing
measured before kept (``search.drifted``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from noded.rightsize import topsearch
from noded.rightsize.sizing import is_number, is_positive

#: drift: a sized job's passive windows that must each measure it beyond the margin (and the
#: noise seen at rest), in the same direction and in a row, before it is searched again
DRIFT_WINDOWS = 3


@dataclass(frozen=True)
class Watch:
    """A sized job's passive measurement at its answer (drift, ours). ``reference``: the
    throughput there, the mean of the ``k`` passive windows that stayed within the band
    (with ``k`` 0, the search's own measurement, which only the first passive window replaces:
    the search chose the answer by its windows, and a window that came out high would make
    every later one look slow); ``n``/``m2``: the count and summed squared
    relative distance from the reference of the windows that turned out to be noise (those
    within the band, and strikes whose streak broke: a band that left them out would narrow
    itself); ``strikes``: windows in a row beyond the band, ``sign`` their direction (+1
    faster, -1 slower), ``pending`` their summed squared distance."""

    reference: float
    k: int = 0
    n: int = 0
    m2: float = 0.0
    strikes: int = 0
    sign: int = 0
    pending: float = 0.0

    def band(self, margin: float, error: float) -> float:
        """How far (a share of the reference) a window may be off before it counts: the
        margin, or the noise (the search's window error, the spread at rest) when wider;
        beyond the margin, by the reference's own error too (the mean of ``k`` windows: a
        reference that came out high made three ordinary windows in a row look slow, seed
        23223 on 8 cores at 4.8 % iteration jitter)."""
        noise = max(error, math.sqrt(self.m2 / self.n) if self.n else 0.0)
        return max(margin + topsearch.Z * noise / math.sqrt(max(1, self.k)), topsearch.Z * math.sqrt(2) * noise)

    def seen(self, mean: float, margin: float, error: float) -> "Watch":
        """The watch after a passive window measured ``mean``."""
        if self.k == 0:
            return Watch(mean, 1)
        off = mean / self.reference - 1
        if abs(off) <= self.band(margin, error):
            k = self.k + 1
            return Watch(self.reference + (mean - self.reference) / k, k, self.n + 1 + self.strikes,
                         self.m2 + off * off + self.pending)
        sign = 1 if off > 0 else -1
        if sign == self.sign:
            return replace(self, strikes=self.strikes + 1, pending=self.pending + off * off)
        # a streak the other way broke: its windows were noise
        return Watch(self.reference, self.k, self.n + self.strikes, self.m2 + self.pending, 1, sign, off * off)

    @property
    def drifted(self) -> bool:
        return self.strikes >= DRIFT_WINDOWS

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "k": self.k, "n": self.n, "m2": self.m2, "strikes": self.strikes,
                "sign": self.sign, "pending": self.pending}

    @classmethod
    def from_dict(cls, data: Any) -> "Watch":
        """Raises ValueError on any other shape."""
        keys = {"reference", "k", "n", "m2", "strikes", "sign", "pending"}
        if not isinstance(data, dict) or set(data) != keys:
            raise ValueError(f"a watch: expected {', '.join(sorted(keys))}")
        counts = [data[key] for key in ("k", "n", "strikes")]
        if not is_positive(data["reference"]) or not all(type(c) is int and c >= 0 for c in counts) \
                or data["sign"] not in (-1, 0, 1) \
                or not all(is_number(data[key]) and data[key] >= 0 for key in ("m2", "pending")):
            raise ValueError("a watch: a value out of its range")
        return cls(float(data["reference"]), data["k"], data["n"], float(data["m2"]), data["strikes"], data["sign"],
                   float(data["pending"]))
