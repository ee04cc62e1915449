"""The bytes a held group moved against its cap, as its counters say: what the next periods
make up or pay back.

A holder plans each period's MB values by time, but a holder starved of CPU (a quota, a
loaded host) wakes late and writes late, and may only get to switch when its quota
refills: the plan is then not what was held, and the job runs below its cap (the higher
value cut short) or above it (the switch back late). Timing each write says what was
probably in force; the counters say what was moved. So the make-up is kept in bytes, from
the counters (``moved - cap x seconds`` each period), not from the write times, whose
errors would add up: each period's seconds run from the middle of one counter read to the
middle of the next, so the sum of the seconds telescopes and is off by at most half of two
reads' spans however many periods it covers.

What is owed either way is bounded, and the two ways differently, because over the cap is
the worse error (a cap is a promise to the other tenants):

* under (``credit``): at most ``MAX_CREDIT_SHARE`` of a period at the cap, only while
  the job was held back (a job under its cap at the top value wanted no more: nothing is
  owed to it), only below ``UNDER_FREE_SHARE`` of the cap, and not for a stalled period;
* over (``debt``): up to ``MAX_DEBT_PERIODS`` whole periods at the cap (more is where
  even the lowest value passes more than the cap: nothing the holder can pay back), paid
  back by lower targets and, past ``OVER_ALONE_SHARE``, by the lower value alone.

So over any span of periods the group moves at most ``cap x seconds + debt at its end +
the credit at its start`` (plus the reads' spans): the credit is the most a make-up can
ever put above the cap, and it is only ever owed for bytes that were not moved before.
A new cap starts a new account (what was owed was against the old one).
"""

from __future__ import annotations

#: the most of a shortfall made up, as a share of a period's bytes at the cap
MAX_CREDIT_SHARE = 0.5
#: the most of an overrun remembered and paid back, in periods' bytes at the cap
MAX_DEBT_PERIODS = 2.0
#: a shortfall within this share of the cap is not made up: a holder at the cap, starved
#: now and then at its higher value, goes over it for a while; one held a little below
#: has that much room
UNDER_FREE_SHARE = 0.02
#: a period this many times its length or longer stalled (its holder starved): what it fell
#: short is not made up
STALL_PERIODS = 2.0
#: what is owed is taken out over so many periods (in each, this share of what is left)
PAYBACK_PERIODS = 2.0
#: what is paid back in one period at most, as a share of the cap: the target stays at
#: least half the cap (a target near nothing would hold a job at nothing, which on AMD's
#: absolute scale is a value of 0, and learn nothing of the values near its cap)
MAX_PAYBACK_SHARE = 0.5
#: over the cap by more than this share of a period's bytes at it, the next period holds
#: the lower value alone: a holder that can only switch when its quota refills holds any
#: mixed period's higher value for the whole period, whatever its planned share
OVER_ALONE_SHARE = 0.1


class ByteAccount:
    """``balance``: bytes moved beyond the cap (negative: short of it) over the periods held."""

    def __init__(self, cap_bps: float, period_s: float):
        self.cap = cap_bps
        self.period = period_s
        self.balance = 0.0

    def add(self, moved_bytes: float, seconds: float, *, held_back: bool) -> None:
        """A period of ``seconds`` in which the group moved ``moved_bytes``; ``held_back``:
        whether a value below the top of the scale was in force in it (else a shortfall
        is the job's own: nothing is owed to it)."""
        if seconds <= 0:
            return
        over = moved_bytes - self.cap * seconds
        if over < 0:
            # a shortfall within UNDER_FREE_SHARE of the cap is not owed; nor one of a
            # period that stalled (a stall is as likely at the higher value, and there it
            # goes over: made up when under and paid back when over, stalls would average
            # to the cap, and a second with two of them at the higher value well over it)
            over = min(0.0, moved_bytes - (1 - UNDER_FREE_SHARE) * self.cap * seconds)
            if seconds > STALL_PERIODS * self.period:
                over = max(over, -max(0.0, self.balance))
        balance = self.balance + over
        floor = -MAX_CREDIT_SHARE * self.cap * self.period if held_back else 0.0
        self.balance = max(floor, min(MAX_DEBT_PERIODS * self.cap * self.period, balance))

    def set_cap(self, cap_bps: float) -> None:
        self.cap = cap_bps
        self.balance = 0.0

    def clear(self) -> None:
        self.balance = 0.0

    @property
    def over(self) -> bool:
        """Whether the group is over its cap by more than a tenth of a period's bytes: the
        next period is to hold no higher value."""
        return self.balance > OVER_ALONE_SHARE * self.cap * self.period

    @property
    def makeup_bps(self) -> float:
        """What to add to the next period's target: positive makes up a shortfall,
        negative pays back an overrun."""
        return max(-MAX_PAYBACK_SHARE * self.cap, -self.balance / (PAYBACK_PERIODS * self.period))
