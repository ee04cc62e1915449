"""How many examples a property test draws: its count as written, scaled for the run.

`make test` runs every tier on this 2-core machine in its time budget, and the unit tier in
under 30 s, so the heaviest property tests draw half their written count there (hypothesis's
example database still replays every failure it found before, first). `NODED_EXAMPLES_SCALE=1`
draws the written counts (a thorough run: `make test-thorough`); any positive number scales.
"""

from __future__ import annotations

import os

#: the share of its written count a test draws in this run
SCALE = float(os.environ.get("NODED_EXAMPLES_SCALE", "0.5"))
if not SCALE > 0:
    raise ValueError(f"NODED_EXAMPLES_SCALE must be a positive number, not {os.environ['NODED_EXAMPLES_SCALE']!r}")


def examples(written: int) -> int:
    """``written`` scaled for this run, at least 10."""
    return max(10, round(written * SCALE))
