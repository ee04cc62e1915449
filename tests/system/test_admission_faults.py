"""Admission that cannot be fooled (issue #11, item 12): numbers that are not finite
are refused where they enter and by the placement kernel itself; a refusal reports
the kernel's own cause and GPU; a fitted speedup model decides, from the state
directory across a restart, and one that cannot be used is refused without
stopping noded."""

import dataclasses
import json
import logging
import math
import random
from types import MappingProxyType, SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noded.admin.protocol import RequestError, parse_request
from noded.colocation import kernels, reference
from noded.colocation.admission import ColocationRule, GpuLoad, decide
from noded.colocation.outcomes import Outcomes
from noded.colocation.profiles import JobProfile, ProfileError, load_profiles, parse_ncu_csv
from noded.colocation.service import Colocation
from noded.jobs.model import JobMeta
from noded.samplers.sample import JobSample, Sample
from noded.samplers.nvml import GpuSample

NAN_COEF = np.full(kernels.N_FEATURES, np.nan)
NCU_HEAD = ('"ID","gpu__time_duration.sum","sm__warps_active.avg.pct_of_peak_sustained_active",'
            '"dram__throughput.avg.pct_of_peak_sustained_elapsed"\n"","usecond","%","%"\n')


def admit_request(profile_json: str) -> bytes:
    return ('{"version":1,"command":"admit","args":{"job":"slurm:1","model":"m","batch_size":8,"profile":'
            + profile_json + '}}').encode()


# -- numbers that are not finite, at every door

@pytest.mark.parametrize("number,field,problem", [
    ("NaN", "args.profile.c", "NaN is not a finite number"),
    ("Infinity", "args.profile.c", "Infinity is not a finite number"),
    ("-Infinity", "args.profile.c", "-Infinity is not a finite number"),
    ("1e400", "args.profile.c", "1e400 is beyond a float's range"),
])
def test_a_request_with_a_number_that_is_not_finite_is_refused_naming_the_field(number, field, problem):
    with pytest.raises(RequestError) as e:
        parse_request(admit_request(f'{{"c":{number},"m":1,"window_us":1,"source":"x"}}'))
    assert str(e.value) == f"{field}: {problem}"


def test_a_request_profile_out_of_range_is_refused():
    with pytest.raises(RequestError, match=r"profile: c/window_us = 150 %"):
        parse_request(admit_request('{"c":150,"m":1,"window_us":1,"source":"x"}'))
    with pytest.raises(RequestError, match="profile: c and m must be >= 0 and window_us > 0"):
        parse_request(admit_request('{"c":1,"m":1,"window_us":0,"source":"x"}'))


json_numbers = st.one_of(
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "9" * 30, "1e-400", "0", "-0.0", "12.5"]),
    st.integers(-10**25, 10**25).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr))


@settings(max_examples=200, deadline=None)
@given(json_numbers, json_numbers, json_numbers, st.sampled_from(["c", "m", "window_us"]))
def test_no_request_yields_a_number_that_is_not_finite(c, m, w, _):
    try:
        _command, args = parse_request(admit_request(f'{{"c":{c},"m":{m},"window_us":{w},"source":"x"}}'))
    except RequestError as e:
        assert str(e).startswith(("args.profile.", "admit: profile"))
        return
    p = args["profile"]
    assert all(math.isfinite(p[k]) for k in ("c", "m", "window_us"))
    JobProfile("m", 8, float(p["c"]), float(p["m"]), float(p["window_us"]), "x")  # and it makes a profile


@pytest.mark.parametrize("row,where", [
    ('"0","nan","5","5"', "row 3: 'nan' is not a finite number"),
    ('"0","inf","5","5"', "row 3: 'inf' is not a finite number"),
    ('"0","10","NaN","5"', "row 3: 'NaN' is not a finite number"),
    ('"0","1e308","5","5"', "C must be a finite number"),  # 1e308 s in µs overflows
    ('"0","10"', "row 3: 2 columns"),
])
def test_an_ncu_export_with_numbers_that_are_not_finite_is_refused(row, where):
    with pytest.raises(ProfileError, match=where):
        parse_ncu_csv(NCU_HEAD + row + "\n", model="m", batch_size=8, source="t.csv")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["nan", "inf", "-1", "0", "5", "1e308", "100", "101", "2,000", "x", ""]),
                          st.sampled_from(["nan", "0", "50", "100", "100.5", "-inf"]),
                          st.sampled_from(["NaN", "0", "50", "100"])), min_size=1, max_size=4),
       st.one_of(st.none(), st.sampled_from([float("nan"), float("inf"), 0.0, -1.0, 1.0, 1e6])))
def test_an_ncu_export_gives_finite_numbers_in_range_or_an_error(rows, window):
    text = NCU_HEAD + "".join(f'"{i}","{t}","{q}","{p}"\n' for i, (t, q, p) in enumerate(rows))
    try:
        prof = parse_ncu_csv(text, model="m", batch_size=8, source="t.csv", window_us=window)
    except ProfileError as e:
        assert str(e).startswith("t.csv: ")
        return
    assert all(math.isfinite(x) for x in (prof.c, prof.m, prof.window_us)) and prof.window_us > 0
    assert 0 <= prof.c_norm <= 100 + 1e-6 and 0 <= prof.m_norm <= 100 + 1e-6


@pytest.mark.parametrize("value,problem", [
    (".nan", "C: 'nan' is not a finite number"),
    (".inf", "C: 'inf' is not a finite number"),
    ("-.inf", "C: '-inf' is not a finite number"),
    ("2.0e8", "C/window_us = 200 %"),  # above 100 % average occupancy: not a profile
])
def test_a_profile_file_with_numbers_that_are_not_finite_is_refused(tmp_path, value, problem):
    f = tmp_path / "p.yaml"
    f.write_text(f"ResNet-50:\n  64: {{C: {value}, M: 1.0e5, window_us: 1.0e6}}\n")
    with pytest.raises(ProfileError, match=f"{f}: ResNet-50: 64: {problem}"):
        load_profiles(str(f))


def test_no_profile_can_hold_a_number_that_is_not_finite():
    for c, m, w in [(math.nan, 1, 1), (1, math.inf, 1), (1, 1, math.nan), (1, 1, 0), (200, 1, 1)]:
        with pytest.raises(ProfileError, match="src: m at batch size 8"):
            JobProfile("m", 8, c, m, w, "src")


def test_nvml_utilisation_that_is_not_finite_is_never_learned():
    now = [0.0]
    service = Colocation(ColocationRule(), {}, mps=None, clock=lambda: now[0], probation_s=4)
    gpu = GpuSample(0, "GPU-a", "A100", 35, 20, 0, 1, 0)
    for util in (math.nan, math.inf, 250.0):
        js = JobSample("slurm:9", "slurm", frozenset({5}), JobMeta(model="BERT", batch_size=32), "gpu", ("GPU-a",),
                       util, None, "own")
        s = Sample(0.0, MappingProxyType({js.id: js}), (gpu,), True, None, (), MappingProxyType({}), (), ())
        for t in range(0, 12, 2):
            now[0] += 2.0
            service.tick(s)
    assert service.learned == {}


def test_the_placement_kernel_refuses_what_is_not_finite():
    ok = dict(job_c=np.array([10.0]), job_m=np.array([5.0]), job_batch=np.array([8.0]), gpu_c=np.array([20.0]),
              gpu_m=np.array([5.0]), gpu_n=np.array([1]), gpu_batch=np.array([8.0]), max_per_gpu=3,
              threshold_c=60.0, coef=NAN_COEF)
    assert kernels.place_explained(**ok)[2].tolist() == [kernels.PLACED]
    bad = [("job_c", np.array([np.nan])), ("job_m", np.array([np.inf])), ("gpu_c", np.array([np.nan])),
           ("gpu_batch", np.array([-np.inf])), ("threshold_c", np.nan),
           ("coef", np.array([1.0, np.nan, 0.0, 0.0, 0.0])), ("coef", np.array([np.inf, 0.0, 0.0, 0.0, 0.0]))]
    for name, value in bad:
        args = {**ok, name: value}
        assign, delta, why, where = kernels.place_explained(**args)
        assert assign.tolist() == [-1] and why.tolist() == [kernels.NOT_FINITE], name
        ref = reference.place_explained(*[a.tolist() if isinstance(a, np.ndarray) else a for a in args.values()])
        assert ref[2] == [reference.NOT_FINITE], name
    # Before: a NaN C passed `ΣC > threshold` (False for NaN) and was admitted.
    loads = [GpuLoad("GPU-a", 0, 20.0, 5.0, 1, 8.0, ("test",))]
    nan_profile = SimpleNamespace(c_norm=math.nan, m_norm=1.0, source="bug")  # around JobProfile's checks
    d = decide("j", nan_profile, 8, loads, ColocationRule())
    assert not d.admit and "not finite" in d.reason


# -- the reason is the kernel's decision

@st.composite
def placements(draw):
    m, n = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    f = st.floats(0, 100, allow_nan=False)
    special = st.sampled_from([math.nan, math.inf, -math.inf])
    value = st.one_of(f, special) if draw(st.booleans()) else f
    arr = lambda k, s=value: draw(st.lists(s, min_size=k, max_size=k))
    coef = [math.nan] * kernels.N_FEATURES if draw(st.booleans()) else arr(kernels.N_FEATURES,
                                                                              st.floats(-1, 1, allow_nan=False))
    return (arr(m), arr(m), arr(m, st.sampled_from([16.0, 64.0])), arr(n), arr(n),
            draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), arr(n), draw(st.integers(1, 4)),
            draw(st.one_of(st.floats(0, 300, allow_nan=False), special)), coef)


@settings(max_examples=300, deadline=None)
@given(placements())
def test_placement_and_its_reasons_match_the_reference(args):
    np_args = [np.array(a, dtype=np.int64 if i == 5 else np.float64) if isinstance(a, list) else a
               for i, a in enumerate(args)]
    got = kernels.place_explained(*np_args)
    want = reference.place_explained(*args)
    assert got[0].tolist() == want[0] and got[2].tolist() == want[2] and got[3].tolist() == want[3]
    np.testing.assert_allclose(got[1], want[1], equal_nan=True)


def test_a_refusal_names_the_gpu_the_kernel_chose_not_the_least_loaded_one():
    # GPU 0 has the lowest ΣC but no free slot; the kernel looks at GPU 1, where ΣC
    # would exceed the threshold. (The old reason re-picked GPU 0 in Python and blamed
    # "the speedup model" with δ̂ = nan.)
    loads = [GpuLoad("GPU-a", 0, 10.0, 5.0, 3, 24.0, ("p0",)), GpuLoad("GPU-b", 1, 50.0, 20.0, 1, 8.0, ("p1",))]
    profile = JobProfile("m", 8, 20e6, 5e6, 1e6, "mine")
    d = decide("j", profile, 8, loads, ColocationRule(threshold_c=60.0, max_jobs_per_gpu=3))
    assert not d.admit
    assert d.reason == "ΣC on GPU 1 (the least loaded with a free slot) would be 70.0 > threshold 60"
    assert d.sources == ("mine", "p1")
    full = [dataclasses.replace(loads[1], n_jobs=3), loads[0]]
    assert decide("j", profile, 8, full, ColocationRule()).reason == "every GPU already holds 3 jobs"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.integers(0, 3)), min_size=1, max_size=5), st.floats(0, 100),
       st.booleans())
def test_every_refusal_names_the_least_loaded_gpu_with_a_free_slot(gpus, c, fitted):
    loads = [GpuLoad(f"GPU-{i}", i, sc, 10.0, n, 8.0 * n, ()) for i, (sc, n) in enumerate(gpus)]
    rule = ColocationRule(threshold_c=60.0, max_jobs_per_gpu=3, coef=(1.5, -0.01, -0.01, 0.0, 0.0) if fitted else None)
    d = decide("j", JobProfile("m", 8, c, 1.0, 1.0, "x"), 8, loads, rule)
    room = [l for l in loads if l.n_jobs < 3]
    if not room:
        assert not d.admit and d.reason == "every GPU already holds 3 jobs"
        return
    target = min(room, key=lambda l: (l.sum_c, l.index))
    if d.admit:
        assert d.gpu_index == target.index
    else:
        assert f"on GPU {target.index} (the least loaded with a free slot)" in d.reason
        assert ("δ̂ = " in d.reason) == fitted and ("threshold" in d.reason) != fitted


# -- the fitted model decides

def write_records(path, n=60, seed=5):
    """Co-locations whose speedup falls with ΣM much faster than with ΣC:
    δ = 1.9 - 0.005·ΣC - 0.02·ΣM."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            sc, sm = rng.uniform(10, 90), rng.uniform(5, 60)
            f.write(json.dumps({"jobs": [f"a{i}", f"b{i}"], "sum_c": sc, "sum_m": sm, "n_jobs": rng.choice([2, 3]),
                                "sum_batch": rng.choice([64.0, 128.0, 256.0]),
                                "delta": 1.9 - 0.005 * sc - 0.02 * sm + rng.gauss(0, 0.005)}) + "\n")


def one_gpu(*job_ids):
    gpu = GpuSample(0, "GPU-a", "A100", 0, 0, 0, 80 << 30, 0)
    jobs = {j: JobSample(j, "registered", frozenset({1}), JobMeta(), "gpu", ("GPU-a",), 10.0, None, "own")
            for j in job_ids}
    return Sample(0.0, MappingProxyType(jobs), (gpu,), True, None, (), MappingProxyType({}), (), ())


LIGHT_C_HEAVY_M = JobProfile("heavy-m", 64, 10e6, 30e6, 1e6, "test")  # C 10 %, M 30 %
HEAVY_C_LIGHT_M = JobProfile("heavy-c", 64, 40e6, 5e6, 1e6, "test")  # C 40 %, M 5 %


def test_the_fitted_model_decides_and_the_sum_c_rule_is_the_fallback(tmp_path):
    write_records(tmp_path / "colocation-records.jsonl")
    without = Colocation(ColocationRule(threshold_c=60.0), {}, mps=None, clock=lambda: 0.0)
    assert without.decided_by == "ΣC rule (no speedup model fitted)"
    for p in (LIGHT_C_HEAVY_M, HEAVY_C_LIGHT_M):  # a GPU already holding the same job
        assert without.admit("first", one_gpu(), model=p.model, batch_size=64, profile=p).admit
        d = without.admit("second", one_gpu(), model=p.model, batch_size=64, profile=p)
        # ΣC 20 <= 60 admits the ΣM-heavy pair; ΣC 80 > 60 refuses the C-heavy one.
        assert d.admit == (p is LIGHT_C_HEAVY_M), d.reason
        without.release("first"), without.release("second")
    service = Colocation(ColocationRule(threshold_c=60.0), {}, mps=None, clock=lambda: 0.0,
                         outcomes=Outcomes(str(tmp_path)))
    model = service.fit()  # what `nodectl model fit` runs
    assert service.decided_by.startswith("speedup model fitted from 60 records")
    assert model["linear"][2] == pytest.approx(-0.02, abs=0.002)
    # δ̂ = 1.9 - 0.005·20 - 0.02·60 ≈ 0.6: refused though ΣC (20) is far under 60.
    assert service.admit("first", one_gpu(), model="heavy-m", batch_size=64, profile=LIGHT_C_HEAVY_M).admit
    d = service.admit("second", one_gpu(), model="heavy-m", batch_size=64, profile=LIGHT_C_HEAVY_M)
    assert not d.admit and d.predicted_speedup == pytest.approx(0.6, abs=0.05)
    assert d.reason.startswith("the fitted speedup model predicts a slowdown on GPU 0 (the least loaded with a "
                               f"free slot): δ̂ = {d.predicted_speedup:.2f} < 1 with 2 jobs, ΣC 20.0")
    service.release("first")
    # δ̂ = 1.9 - 0.005·80 - 0.02·10 ≈ 1.3: admitted though ΣC (80) is over 60. Before,
    # the fit also replaced the threshold with its own crossing point (about 40 here)
    # and refused this pair as "ΣC > threshold" although the model predicted a speedup.
    assert service.admit("first", one_gpu(), model="heavy-c", batch_size=64, profile=HEAVY_C_LIGHT_M).admit
    d = service.admit("second", one_gpu(), model="heavy-c", batch_size=64, profile=HEAVY_C_LIGHT_M)
    assert d.admit and d.predicted_speedup == pytest.approx(1.3, abs=0.05)
    assert d.reason == (f"the fitted speedup model predicts δ̂ = {d.predicted_speedup:.2f} >= 1 on GPU 0 with 2 jobs, "
                        "ΣC 80.0")
    assert service.rule.threshold_c == 60.0  # the operator's, kept for when no model is fitted


@pytest.mark.fuse
def test_a_model_fitted_before_a_restart_decides_after_it(tmp_path):
    """Records on disk -> fit (as `nodectl model fit` does, on a running daemon) -> a
    new daemon start (build_daemon, as `noded run` builds it) -> an admission the ΣC
    rule would allow is refused because the model predicts δ̂ < 1."""
    from support.waiting import wait_for
    from support.mps import STANDIN, processes_serving
    from support.eliminator import Harness

    from noded.commands.wiring import build_daemon
    from noded.config import ColocationConfig, MpsConfig

    h = Harness(tmp_path, "  []", gpus=1)
    daemons = []
    try:
        config = dataclasses.replace(h.config, runtime_dir=str(tmp_path / "run"), colocation=ColocationConfig(
            enabled=True, threshold_c=60.0, mps=MpsConfig(control=STANDIN, log_dir=str(tmp_path / "mpslog"))))
        write_records(f"{config.state_dir}/colocation-records.jsonl")

        def start():
            d = build_daemon(config, discovery=h.sim.discovery).daemon
            daemons.append(d)
            wait_for(lambda: d.parts.colocation.mps_state == "ok", timeout=30, what="MPS up")
            h.sim.step()
            d.tick()
            return d

        first = start()
        assert first.parts.colocation.decided_by == "ΣC rule (no speedup model fitted)"
        first.parts.colocation.fit()
        first.shutdown()
        second = start()  # a new daemon, on the same state directory
        assert second.parts.colocation.decided_by.startswith("speedup model fitted from 60 records")
        admit = lambda job: second.parts.colocation.admit(job, second.last.sample, model="heavy-m", batch_size=64,
                                                    profile=LIGHT_C_HEAVY_M)
        assert admit("slurm:1").admit
        d = admit("slurm:2")
        assert not d.admit and "δ̂ = 0.6" in d.reason and "< 1 with 2 jobs, ΣC 20.0" in d.reason
        pipe = second.parts.colocation.mps.pipe_dir
        second.shutdown()
        assert processes_serving(pipe) == []
    finally:
        for d in daemons:
            d.shutdown()
        h.stop()  # the harness's own daemon too: its threads (process events, NVML) end with it


@pytest.mark.parametrize("content,problem", [
    ("{not json", "not a usable co-location model"),
    ('{"linear": [NaN, 0, 0, 0, 0], "logistic": [0, 0, 0, 0, 0], "records": 9}', "NaN is not a finite number"),
    ('{"linear": [1, 1e999, 0, 0, 0], "logistic": [0, 0, 0, 0, 0], "records": 9}', "linear must be a list of 5 finite"),
    ('{"linear": [1, 0, 0], "logistic": [0, 0, 0, 0, 0], "records": 9}', "linear must be a list of 5 finite"),
    ('[1, 2]', "expected a JSON object"),
])
def test_a_model_file_that_cannot_be_used_is_refused_loudly_and_the_sum_c_rule_decides(tmp_path, caplog, content,
                                                                                     problem):
    (tmp_path / "colocation-model.json").write_text(content)
    with caplog.at_level(logging.ERROR, logger="noded.colocation.service"):
        service = Colocation(ColocationRule(threshold_c=60.0), {}, mps=None, clock=lambda: 0.0,
                             outcomes=Outcomes(str(tmp_path)))
    assert service.rule.coef is None and service.decided_by.startswith("ΣC rule (saved model refused")
    (record,) = [r for r in caplog.records if "REFUSED the saved speedup model" in r.getMessage()]
    assert str(tmp_path / "colocation-model.json") in record.getMessage() and problem in record.getMessage()
    assert service.admit("a", one_gpu(), model="m", batch_size=64, profile=LIGHT_C_HEAVY_M).admit
    d = service.admit("b", one_gpu(), model="m", batch_size=64, profile=LIGHT_C_HEAVY_M)
    assert d.admit and "ΣC on GPU 0 becomes 20.0 <= 60 with 2 jobs (no speedup model fitted)" in d.reason


def test_records_that_are_not_finite_are_skipped_not_fitted(tmp_path, caplog):
    write_records(tmp_path / "colocation-records.jsonl", n=10)
    with open(tmp_path / "colocation-records.jsonl", "a") as f:
        f.write('{"jobs": ["x", "y"], "sum_c": NaN, "sum_m": 1, "n_jobs": 2, "sum_batch": 64, "delta": 1.2}\n')
        f.write('{"jobs": ["x", "y"], "sum_c": 1, "sum_m": 1, "n_jobs": 2, "sum_batch": 64, "delta": Infin')  # torn
    out = Outcomes(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="noded.colocation.outcomes"):
        model = out.fit()
    assert model["records"] == 10 and all(math.isfinite(x) for x in model["linear"])
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2 and "line 11 skipped" in skipped[0] and "line 12 skipped" in skipped[1]
