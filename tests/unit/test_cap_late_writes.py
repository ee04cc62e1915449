"""What a cap holder whose writes land late learns: what was in force over a period (not
what was planned), and what a late switch owes the next periods. The holder's own loop,
starved, on a clock the test holds: tests/kernel/test_cap_starved_holder.py."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from noded.capping.controller import CapController, Hold
from noded.capping.in_force import WriteRecord
from noded.capping.owed import MAX_OWED_SHARE, HighTimeOwed

GB = 1e9


# ------------------------------------------------------------------ what was in force

def test_a_write_late_by_its_wake_up_is_counted_from_when_it_landed():
    record = WriteRecord(10)
    record.wrote(20, 0.030, 0.032)  # the higher value, 30 ms into the period
    record.wrote(10, 0.080, 0.081)
    seen = record.over(0.0, 0.1)
    # 30 ms of the lower value before, the writes' own spans to the lower: 48 ms surely at 20
    assert seen.seconds == pytest.approx({10: 0.052, 20: 0.048})
    assert seen.uncertain_s == pytest.approx(0.003) and seen.span == pytest.approx(0.1)
    # and the next window starts at the value the last write left
    assert record.over(0.1, 0.2).seconds == pytest.approx({10: 0.1})


def test_the_same_value_written_again_is_no_uncertainty():
    record = WriteRecord(10)
    record.wrote(10, 0.01, 0.05)
    assert record.over(0.0, 0.1).uncertain_s == 0.0


@given(st.lists(st.tuples(st.sampled_from([10, 20, 30]), st.floats(0, 0.02), st.floats(0, 0.02),
                          st.floats(0, 1)), max_size=8),
       st.floats(0, 0.05), st.floats(0.05, 0.3))
def test_what_was_in_force_adds_up_and_never_overstates_the_time_at_or_above_any_value(writes, start, end):
    # each write lands somewhere within its span (``landed``: how far in); whenever it landed,
    # the record's time at or above any value is no more than the truth's
    record = WriteRecord(10)
    t, changes = 0.0, [(float("-inf"), 10)]
    for value, gap, span, landed in writes:
        t += gap
        record.wrote(value, t, t + span)
        changes.append((t + landed * span, value))
        t += span
    seen = record.over(start, end)
    assert sum(seen.seconds.values()) == pytest.approx(end - start, abs=1e-9)
    assert 0.0 <= seen.uncertain_s <= end - start + 1e-9
    truth: dict[int, float] = {}
    for (at, value), (until, _) in zip(changes, changes[1:] + [(float("inf"), 0)]):
        truth[value] = truth.get(value, 0.0) + max(0.0, min(until, end) - max(at, start))
    for floor in (10, 20, 30):
        def at_or_above(seconds):
            return sum(s for v, s in seconds.items() if v >= floor)
        assert at_or_above(seen.seconds) <= at_or_above(truth) + 1e-9


# ------------------------------------------------------------------ the controller, told what was in force

def test_the_controller_learns_the_higher_value_from_the_time_it_was_in_force_not_the_plan():
    c = CapController(list(range(10, 101, 10)), 20 * GB)
    c.curves[4] = curve = c._curve(4)
    curve.learn(10, 16 * GB)
    curve.learn(100, 56 * GB)
    planned = Hold(10, 20, 0.8)
    # held at 20 for only half the period (a late wake-up): the job moved 18.6 GB/s
    c.update(0.5 * 21.2 * GB + 0.5 * 16 * GB, 4, planned, {20: 0.5, 10: 0.5})
    assert curve.points[20] == pytest.approx(21.2 * GB)


def test_another_plans_value_in_force_for_part_of_the_period_is_taken_out_at_its_point():
    c = CapController(list(range(10, 101, 10)), 20 * GB)
    curve = c._curve(4)
    curve.learn(10, 16 * GB)
    curve.learn(30, 26 * GB)
    curve.learn(100, 56 * GB)
    # the last period's 30 in force for the first 10 %, then this one's 20 and 10
    measured = 0.1 * 26 * GB + 0.6 * 21.2 * GB + 0.3 * 16 * GB
    c.update(measured, 4, Hold(10, 20, 0.7), {30: 0.1, 20: 0.6, 10: 0.3})
    assert curve.points[20] == pytest.approx(21.2 * GB)


def test_a_period_with_a_value_never_measured_in_it_from_another_plan_teaches_nothing():
    c = CapController(list(range(10, 101, 10)), 20 * GB)
    curve = c._curve(4)
    curve.learn(10, 16 * GB)
    curve.learn(100, 56 * GB)
    c.update(30 * GB, 4, Hold(10, 20, 0.7), {50: 0.2, 20: 0.5, 10: 0.3})
    assert 20 not in curve.points


# ------------------------------------------------------------------ what a late switch owes

def test_a_switch_late_to_the_higher_value_is_given_back_next_period():
    owed = HighTimeOwed(0.1)
    planned = owed.plan(20, 10, 0.6)
    assert planned == pytest.approx(0.06)
    owed.held_for(planned, 0.04)  # cut short by the period's end
    assert owed.plan(20, 10, 0.6) == pytest.approx(0.08)


def test_a_switch_late_back_to_the_lower_value_is_taken_out_next_period():
    owed = HighTimeOwed(0.1)
    owed.held_for(owed.plan(20, 10, 0.3), 0.07)  # woken 40 ms late to switch back
    assert owed.plan(20, 10, 0.3) == pytest.approx(0.0)


def test_what_is_owed_is_bounded_and_forgotten_with_the_pair():
    owed = HighTimeOwed(0.1)
    owed.held_for(owed.plan(20, 10, 0.9), 0.0)  # a whole stall
    assert owed.seconds == pytest.approx(MAX_OWED_SHARE * 0.1)
    assert owed.plan(30, 20, 0.5) == pytest.approx(0.05)  # another pair: nothing owed
