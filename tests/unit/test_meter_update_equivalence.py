"""BandwidthMeter.update was rewritten for speed (locals, one lookup a domain, the dip test
only on a decrease): the same rates and the same baselines as before for every sequence of
readings. The reference is the update as it stood before (resctrl/mbm.py at 45e6e3b), copied
here whole: counters that rise, dip within and past the tolerance, wrap (reset), go missing,
read None, domains that come and go, a per-domain tolerance, a clock that stands still or
steps back, and groups baselined from zero at mkdir."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from support.examples import examples

from resctrl.mbm import MBM_TOTAL, BandwidthMeter, CounterReading, rate_between


def reference_update(meter: BandwidthMeter, sample, now, dip_tolerance=None):
    """The update before the rewrite, line for line, on the meter's own state."""
    rates = {}
    for domain in list(meter._last):
        if domain not in sample:
            del meter._last[domain]
    for domain, readings in sample.items():
        reading = readings.get(meter.event)
        if reading is None or reading.value is None:
            meter._last.pop(domain, None)
            rates[domain] = None
            continue
        prev = meter._last.get(domain)
        tolerance = dip_tolerance.get(domain, meter.dip_tolerance) if dip_tolerance else meter.dip_tolerance
        if prev and 0 < prev[0] - reading.value <= tolerance:
            rates[domain] = 0.0 if now > prev[1] else None
            meter._last[domain] = (prev[0], now)
            continue
        rates[domain] = rate_between(prev[0], prev[1], reading.value, now, meter.max_rate) if prev else None
        meter._last[domain] = (reading.value, now)
    return rates


DOMAINS = st.integers(0, 3)
# small values so that equal, rising, small dips, large dips and jumps past max_rate all occur
VALUE = st.one_of(st.integers(0, 6), st.integers(0, 6), st.integers(0, 6), st.none(), st.integers(0, 2**64 - 1))
TOTAL = st.builds(lambda v: {MBM_TOTAL: CounterReading(v)}, VALUE)
READINGS = st.one_of(
    TOTAL, TOTAL, TOTAL,
    st.just({}),  # the event not read
    st.builds(lambda v: {"mbm_local_bytes": CounterReading(v)}, VALUE),  # another event only
)
SAMPLE = st.dictionaries(DOMAINS, READINGS, max_size=4)
TOLERANCES = st.one_of(st.none(), st.dictionaries(DOMAINS, st.integers(-1, 5), max_size=4))
STEP = st.one_of(
    st.tuples(st.just("update"), SAMPLE, st.floats(-1.0, 3.0), TOLERANCES),
    st.tuples(st.just("from_zero"), st.lists(DOMAINS, max_size=3), st.floats(-1.0, 3.0)),
)


def _at(value):
    return {0: {MBM_TOTAL: CounterReading(value)}}


@settings(max_examples=examples(300), deadline=None)
@example(steps=[("update", _at(5), 1.0, None), ("update", _at(3), 1.0, None)], tolerance=2, max_rate=1e12)  # dip at it
@example(steps=[("update", _at(5), 1.0, None), ("update", _at(2), 1.0, None)], tolerance=2, max_rate=1e12)  # past it
@example(steps=[("update", _at(5), 1.0, None), ("update", _at(4), 1.0, {0: 0})], tolerance=2, max_rate=1e12)
@example(steps=[("update", _at(5), 1.0, None), ("update", _at(4), 0.0, None)], tolerance=2, max_rate=1e12)  # clock still
@example(steps=[("from_zero", [0], 1.0), ("update", _at(30), 1.0, None), ("update", {}, 1.0, None)], tolerance=0,
         max_rate=10.0)  # past max_rate, then the domain gone
@given(steps=st.lists(STEP, max_size=12), tolerance=st.integers(0, 5), max_rate=st.sampled_from([10.0, 1e12]))
def test_update_gives_what_it_gave_before_the_rewrite_for_every_sequence(steps, tolerance, max_rate):
    new, old = (BandwidthMeter(dip_tolerance=tolerance, max_rate=max_rate) for _ in range(2))
    now = 0.0
    for step in steps:
        now += step[2]  # the clock may stand still or step back
        if step[0] == "from_zero":
            new.start_from_zero(step[1], now)
            old.start_from_zero(step[1], now)
            continue
        _, sample, _, tolerances = step
        assert new.update(sample, now, tolerances) == reference_update(old, sample, now, tolerances)
        assert new._last == old._last
