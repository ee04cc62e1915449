"""The windows-per-comparison arithmetic (nodesim.window_odds) draws what the curve
generator draws, and its verdicts follow from the odds it prints."""

import numpy as np
from hypothesis import given, strategies as st

from nodesim.curvegen import window_factor_of
from nodesim.window_odds import odds, window_factors


@given(st.floats(0.0, 0.2), st.lists(st.floats(-10.0, 10.0), min_size=1, max_size=50))
def test_bulk_window_factors_are_the_generators_own(noise, zs):
    bulk = window_factors(noise, np.array(zs))
    assert bulk.tolist() == [window_factor_of(noise, z) for z in zs]


def test_no_noise_needs_one_window_and_eight_percent_needs_many():
    rng = np.random.default_rng(0)
    quiet = odds(0.0, 1, 20_000, rng)
    assert quiet["both"] and quiet["flat_kept_at_margin"] == 1.0 and quiet["worst_taken_at_margin"] == 0.0
    noisy = odds(0.08, 1, 20_000, rng)
    # one window a side at 8 %: a 0.90 point read within 3 % of the top about 1 time in 12
    assert not noisy["both"] and 0.05 < noisy["worst_taken_at_margin"] < 0.13


def test_more_windows_narrow_the_ratio():
    rng = np.random.default_rng(1)
    one, many = odds(0.08, 1, 50_000, rng), odds(0.08, 16, 50_000, rng)
    assert many["theta_flat"] > one["theta_flat"] and many["theta_worst"] < one["theta_worst"]
