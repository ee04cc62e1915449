"""A job held at a bandwidth cap (issue #27, item 3): noded's controller against the
emulator's MBA as hardware applies it, and against the kernel's own one-step-a-second rule."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodesim.bandwidth_cap import PHASE_S, PROFILE_NAMES, RESERVE, Bench, FakeProc, measure, one_run
from noded.capping.controller import AMD_UNIT_BYTES, CapController, Hold, KernelStyleController
from noded.capping.curve import LevelCurve

GB = 1e9
INTEL = list(range(10, 101, 10))


@pytest.fixture(scope="module")
def proc():
    return FakeProc()


# ------------------------------------------------------------------ the learned curve

def test_curve_is_monotone_whatever_it_measures():
    curve = LevelCurve()
    curve.learn(100, 14 * GB)
    curve.learn(50, 9 * GB)
    curve.learn(60, 8 * GB)  # less at a larger value: the older point gives way
    assert curve.points[50] <= curve.points[60] <= curve.points[100]


def test_curve_upper_bound_is_what_a_concave_throttle_allows():
    curve = LevelCurve({10: 1.77 * GB, 100: 14 * GB})
    # through the origin and 10 %: a concave curve is below that line beyond it
    assert curve.upper(30) == pytest.approx(5.31 * GB)
    assert curve.upper(100) == 14 * GB
    curve.learn(30, 5.31 * GB)
    assert curve.upper(40) == pytest.approx(7.08 * GB)


def test_a_job_with_more_busy_threads_starts_from_the_curve_scaled_by_them():
    c = CapController(INTEL, 10 * GB)
    c.update(14 * GB, 1, Hold(100, 100))
    c.update(1.77 * GB, 1, Hold(10, 10))
    c.update(4 * 1.77 * GB, 4, Hold(10, 10))
    assert c.curves[4].points[100] == pytest.approx(56 * GB)


# ----------------------------------------------------- against the emulator's hardware

@pytest.mark.parametrize("profile", ["intel-linear", "intel-quantised", "intel-per-thread", "amd"])
@pytest.mark.parametrize("threads", [1, 16])
def test_cap_is_met_within_a_second_without_overshooting(proc, profile, threads):
    run = one_run(proc, profile, threads, 0.5, "step", "noded")
    assert run.reachable
    assert run.settle_s is not None and run.settle_s <= 1.0
    assert run.overshoot_pct <= 10 and run.overshoot_ms <= 200
    assert run.steady_error_pct <= 5


def test_the_kernel_style_controller_takes_seconds_and_settles_a_step_away(proc):
    # update_mba_bw: one 10 % step a second, and its up-step's hysteresis leaves it below.
    run = one_run(proc, "intel-linear", 4, 0.2, "step", "kernel-style")
    assert run.last_move_s >= 7.0
    assert run.settle_s is None and run.steady_error_pct > 5


def test_demand_moving_while_capped_is_followed(proc):
    # 90 % of 14 GB/s per thread is above the 80 % value's bandwidth: when every thread
    # asks 17.5 the values near the top pass more, and the controller must come back down.
    bench = Bench(proc, "intel-linear", 4, 0.9, "step")
    bench.lowest_bandwidth()
    windows = bench.run(CapController(bench.scale, bench.cap), 0.1)
    settle, resettle, height, duration, error = measure(windows, bench.cap)
    assert resettle is not None and resettle <= 1.0
    assert error <= 5


def test_amd_starts_from_the_absolute_value_the_cap_divides_into(proc):
    # A value is a per-thread limit in 1/8 GB/s: 4 threads capped at 8 GB/s want 16 units.
    c = CapController(list(range(0, 2049)), 8 * GB, absolute_unit_bytes=AMD_UNIT_BYTES)
    first = c.update(4 * 14 * GB, 4, Hold(2048, 2048))
    assert first.values == [(16, 1.0)]


def test_a_cap_below_the_lowest_value_says_so_and_does_not_wind_up(proc):
    c = CapController(INTEL, 1 * GB)
    held = c.update(14 * GB, 1, Hold(100, 100))
    assert held.values == [(10, 1.0)]
    for _ in range(20):
        held = c.update(4 * GB, 1, held)
    assert held.unreachable and held.values == [(10, 1.0)] and c.integral == 0.0


def test_bad_scales_and_caps_are_refused():
    with pytest.raises(ValueError, match="ascending"):
        CapController([20, 10], 1 * GB)
    with pytest.raises(ValueError, match="positive"):
        CapController(INTEL, 0)
    assert KernelStyleController(INTEL, 5 * GB).update(14 * GB, 1, Hold(100, 100)).values == [(90, 1.0)]
    assert PHASE_S == 12.0


@given(st.lists(st.tuples(st.sampled_from(INTEL), st.floats(0, 100e9, allow_nan=False)), max_size=30))
def test_the_curve_stays_monotone_and_its_bound_holds_whatever_it_is_told(measurements):
    curve = LevelCurve()
    for value, bps in measurements:
        curve.learn(value, bps)
        xs = sorted(curve.points)
        assert all(curve.points[a] <= curve.points[b] for a, b in zip(xs, xs[1:]))
    for v in INTEL:
        if v in curve.points:
            assert curve.upper(v) == curve.points[v]
        nxt = [curve.points[x] for x in curve.points if x > v]
        if nxt:
            assert curve.upper(v) <= min(nxt)


def test_a_value_seen_moving_nothing_then_mixed_with_another_leaves_the_holder_steering():
    """A value whose point is 0 (the job moved nothing there, as a job between phases does)
    then a period mixing it with another: the correction's damping divided by that 0, and the
    ZeroDivisionError killed the holder's thread, leaving the cap unsteered (seen in
    tests/system/test_caps.py's reserve test as an exception in thread cap-sim:hog)."""
    c = CapController(INTEL, 1 * GB)
    c.update(1e6, 4, Hold(10, 10))
    c.update(0.0, 4, Hold(20, 20))  # the curve is monotone: 10's point goes to 0 too
    assert c.update(0.0, 4, Hold(10, 20, 0.05)).values  # answered, not raised


@given(st.lists(st.tuples(st.sampled_from([0.0, 1e6, 0.5 * GB, 1 * GB, 2 * GB]), st.sampled_from(INTEL),
                          st.sampled_from(INTEL), st.sampled_from([0.0, 0.05, 0.2, 0.5, 0.9])), min_size=1, max_size=8))
def test_whatever_a_job_moves_the_controller_answers_a_hold_within_the_scale(periods):
    c = CapController(INTEL, 1 * GB)
    for measured, a, b, share in periods:
        hold = c.update(measured, 4, Hold(min(a, b), max(a, b), share))
        assert all(v in INTEL and 0 <= s <= 1 for v, s in hold.values)


@pytest.mark.parametrize("threads", [4, 16])
def test_skylake_at_a_90_percent_cap_while_demand_ramps_stays_within_the_overshoot_goal(proc, threads):
    # 70 % applies as 90 % there, and the ramp takes its bandwidth past what the mix's
    # points say: each mixed period's error went back and forth between the two points
    # and grew (29 % for 300 ms with 4 threads, 14.5 % with 16); now a small correction is
    # taken by half, and a higher value found to pass no more than the lower one has the
    # lower one measured alone instead
    run = one_run(proc, "intel-quantised", threads, 0.9, "ramp", "noded")
    assert run.overshoot_pct <= 10 and run.overshoot_ms <= 200
    assert run.settle_s is not None and run.settle_s <= 1.0 and run.steady_error_pct <= 5


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_with_the_reserve_the_gpu_job_keeps_its_solo_speed_beside_a_job_that_fills_the_domain(proc, profile):
    capped = one_run(proc, profile, 4, 0.0, "ramp", "noded", RESERVE)
    free = one_run(proc, profile, 4, 0.0, "ramp", "uncapped", RESERVE)
    assert capped.gpu_vs_solo >= 0.95 and capped.gpu_vs_solo_p5 >= 0.95
    assert free.gpu_vs_solo < 0.5  # what the reserve is for
