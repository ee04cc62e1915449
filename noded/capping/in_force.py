"""Which MB value was in force, and for how long, over a period a holder measured.

A holder plans each period's values and shares, but what the job moved is what was really
in force between its two counter readings: a starved holder writes late (its wake-ups and
its writes wait for a CPU), so the plan is not what happened. The holder records each write
(the clock before it began and after it returned) and asks what was in force between two
readings.

A write took effect somewhere between its two times: that span is uncertain, and it is
counted to the lower of the two values either side of it. Counted to the higher, a value's
time would be over-stated, its bandwidth learned too low, and the next plan would hold it
longer than the cap allows; counted to the lower, the error goes under the cap, never over
(a cap is a promise to the other tenants). The uncertain seconds are said too, so that a
period whose times are mostly unknown is not learned from at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Write:
    """One schemata write: ``value`` took effect between ``began`` and ``returned`` (clock)."""

    value: int
    began: float
    returned: float


@dataclass(frozen=True)
class InForce:
    """Over ``span`` seconds: the seconds each MB value was in force, and how many of them
    were uncertain (a write's own span, counted to the lower value)."""

    seconds: dict[int, float]
    uncertain_s: float
    span: float

    def shares(self) -> dict[int, float]:
        """Each value's share of the span (the shares add up to 1)."""
        total = sum(self.seconds.values())
        return {v: s / total for v, s in self.seconds.items()} if total > 0 else {}


@dataclass
class WriteRecord:
    """A holder's writes since the value in force at its last reading: ``before`` is that value."""

    before: int
    writes: list[Write] = field(default_factory=list)

    def wrote(self, value: int, began: float, returned: float) -> None:
        self.writes.append(Write(value, began, returned))

    def over(self, start: float, end: float) -> InForce:
        """What was in force from ``start`` to ``end`` (no write spans either: a holder reads
        and writes from one thread); the writes before ``end`` are forgotten, the last of
        them is what was in force there."""
        seconds: dict[int, float] = {}
        uncertain = 0.0

        def count(value: int, a: float, b: float) -> float:
            spent = max(0.0, min(b, end) - max(a, start))
            if spent > 0:
                seconds[value] = seconds.get(value, 0.0) + spent
            return spent

        value, since = self.before, start
        kept = []
        for w in self.writes:
            if w.began >= end:
                kept.append(w)
                continue
            count(value, since, w.began)
            spent = count(min(value, w.value), w.began, w.returned)
            if w.value != value:  # the same value written again: nothing changed, nothing uncertain
                uncertain += spent
            value, since = w.value, w.returned
        count(value, since, end)
        self.before, self.writes = value, kept
        return InForce(seconds, uncertain, max(0.0, end - start))
