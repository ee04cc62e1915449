"""The numba co-location kernels agree with their plain-Python references, and the
thesis's qualitative findings hold on profiles we construct."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.examples import examples

from noded.colocation import kernels, reference
from noded.colocation.profiles import ProfileError, load_profiles, parse_ncu_csv

NAN_COEF = np.full(kernels.N_FEATURES, np.nan)


@st.composite
def placements(draw):
    m, n = draw(st.integers(0, 20)), draw(st.integers(1, 6))
    f = st.floats(0, 100, allow_nan=False)
    arr = lambda k, s=f: np.array(draw(st.lists(s, min_size=k, max_size=k)), dtype=np.float64)
    gpu_n = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.int64)
    coef = NAN_COEF if draw(st.booleans()) else arr(kernels.N_FEATURES, st.floats(-1, 1, allow_nan=False))
    return (arr(m), arr(m), arr(m, st.sampled_from([16.0, 32.0, 64.0, 128.0])), arr(n), arr(n), gpu_n, arr(n),
            draw(st.integers(1, 4)), draw(st.floats(0, 300, allow_nan=False)), coef)


@settings(max_examples=examples(150), deadline=None)
@given(placements())
def test_placement_matches_the_reference(args):
    got_assign, got_delta = kernels.place(*args)
    want_assign, want_delta = reference.place(*[a.tolist() if isinstance(a, np.ndarray) else a for a in args])
    assert got_assign.tolist() == want_assign
    np.testing.assert_allclose(got_delta, want_delta, equal_nan=True)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_fits_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(40), rng.uniform(0, 100, (40, kernels.N_FEATURES - 1))])
    y = X @ rng.normal(size=kernels.N_FEATURES) + rng.normal(scale=0.1, size=40)
    np.testing.assert_allclose(kernels.fit_linear(X, y, 1e-3), reference.fit_linear(X.tolist(), y.tolist(), 1e-3),
                               rtol=1e-6, atol=1e-8)
    labels = (y > np.median(y)).astype(np.float64)
    np.testing.assert_allclose(kernels.fit_logistic(X, labels, 50, 0.5, 1e-3),
                               reference.fit_logistic(X.tolist(), labels.tolist(), 50, 0.5, 1e-3), rtol=1e-7,
                               atol=1e-9)


def test_fits_recover_what_generated_the_data():
    rng = np.random.default_rng(7)
    n = 2000
    sum_c = rng.uniform(0, 120, n)
    X = np.column_stack([np.ones(n), sum_c, rng.uniform(0, 80, n), rng.integers(2, 4, n), rng.choice([64, 128], n)])
    delta = 2.2 - 0.02 * sum_c + rng.normal(scale=0.02, size=n)  # speedup falls as ΣC grows
    coef = kernels.fit_linear(X, delta, 1e-6)
    assert coef[1] == pytest.approx(-0.02, rel=0.05) and coef[0] == pytest.approx(2.2, rel=0.05)
    w = kernels.fit_logistic(X, (delta > 1).astype(np.float64), 400, 0.5, 1e-4)
    p = kernels.predict_admit(w, X)
    assert ((p > 0.5) == (delta > 1)).mean() > 0.97


def test_algorithm_2_admits_small_jobs_and_refuses_a_resnet_pair():
    # Time-normalised C (average achieved occupancy, %) built to the thesis's findings:
    # low-occupancy models and small batches stay well under the threshold; ResNet-50
    # at a large batch is high-occupancy.
    threshold = 60.0
    small = {"VGG11 bs64": 12.0, "SE-Net bs64": 15.0, "ResNet-18 bs64": 18.0}
    resnet50_bs256 = 38.0
    c = np.array(list(small.values()))
    assign, _ = kernels.place(c, c * 0.8, np.full(3, 64.0), np.zeros(1), np.zeros(1), np.zeros(1, dtype=np.int64),
                              np.zeros(1), 3, threshold, NAN_COEF)
    assert assign.tolist() == [0, 0, 0]  # all three share the one GPU: ΣC = 45 <= 60
    pair = np.array([resnet50_bs256, resnet50_bs256])
    assign, _ = kernels.place(pair, pair, np.full(2, 256.0), np.zeros(1), np.zeros(1), np.zeros(1, dtype=np.int64),
                              np.zeros(1), 3, threshold, NAN_COEF)
    assert assign.tolist() == [0, -1]  # the second would make ΣC = 76 > 60: refused
    # With a fitted model predicting a slowdown, even an under-threshold pair is refused.
    slowdown = np.array([0.9, 0.0, 0.0, 0.0, 0.0])
    assign, delta = kernels.place(c[:2], c[:2], np.full(2, 64.0), np.zeros(1), np.zeros(1),
                                  np.zeros(1, dtype=np.int64), np.zeros(1), 3, threshold, slowdown)
    assert assign.tolist() == [0, -1] and math.isnan(delta[0])


NCU = '''"ID","Kernel Name","gpu__time_duration.sum","sm__warps_active.avg.pct_of_peak_sustained_active","dram__throughput.avg.pct_of_peak_sustained_elapsed"
"","","nsecond","%","%"
"0","volta_sgemm_128x64_nn","2,000","50.0","20.0"
"1","elementwise_kernel","1,000","10.0","80.0"
'''


def test_ncu_csv_gives_the_weighted_metrics():
    p = parse_ncu_csv(NCU, model="ResNet-50", batch_size=64, source="r.csv")
    # t in µs: 2 and 1; C = 50*2 + 10*1, M = 20*2 + 80*1
    assert (p.c, p.m, p.window_us) == (110.0, 120.0, 3.0)
    assert p.c_norm == pytest.approx(110 / 3) and p.m_norm == 40.0
    # Normalised values do not depend on the window: the same kernels twice give the same averages.
    twice = parse_ncu_csv(NCU + NCU.split("\n", 2)[2], model="ResNet-50", batch_size=64)
    assert twice.c == 2 * p.c and twice.c_norm == pytest.approx(p.c_norm)


@pytest.mark.parametrize("text,error", [
    (NCU.replace("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes"), "missing metric column"),
    (NCU.replace('"nsecond"', '"cycle"'), "unknown time unit 'cycle'"),
    (NCU.replace('"50.0"', '"150.0"'), "row 3: duration must be >= 0 and percentages in [0, 100]"),
    (NCU.replace('"2,000"', '"fast"'), "row 3: 'fast' is not a number"),
])
def test_ncu_csv_errors_name_the_problem(text, error):
    with pytest.raises(ProfileError, match=error.replace("[", r"\[").replace("]", r"\]")):
        parse_ncu_csv(text, model="x", batch_size=1, source="r.csv")


def test_compact_profile_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("ResNet-50:\n  64: {C: 3.1e7, M: 2.2e7, window_us: 1.0e6}\n")
    (p,) = load_profiles(str(f)).values()
    assert (p.model, p.batch_size, p.c_norm) == ("ResNet-50", 64, 31.0)
    f.write_text("ResNet-50:\n  64: {C: 3.1e7, M: 2.2e7}\n")
    with pytest.raises(ProfileError, match="ResNet-50: 64: expected exactly the keys C, M, window_us"):
        load_profiles(str(f))
