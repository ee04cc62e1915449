"""Right-sizing the CPU side of GPU jobs (issue #13): curves, the steady signal window,
CODA's and Synergy's searches, operator controls and the remembered answers."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from support.examples import examples

from noded.rightsize import allocator as al
from noded.rightsize.jobsizing import JobSizing
from noded.rightsize.sizing import (CODA, SYNERGY, AllocatorConfig, HintError, JobSpec, NotProbing, OutOfRange, Probe,
                                    Sized, SizingState)
from noded.rightsize.curves import BENCH_CURVES, CATEGORY_CACHE, CATEGORY_CURVES, MODEL_CURVES, curve_for
from noded.rightsize.history import FILE, HistoryView, Remembered, SizingHistory, parse_history
from noded.rightsize.signal import GPU_UTILISATION, ITERATION_TIME, BadSample, SignalConfig, Window, t_quantile
from noded.stores.securedir import SecureDir
from nodesim.workload import MODELS

CODA_CFG = AllocatorConfig(method=CODA)
SYNERGY_CFG = AllocatorConfig(method=SYNERGY)


def search(spec: JobSpec, value, config: AllocatorConfig, history: HistoryView | None = None,
           limits: dict[int, int] | None = None):
    """Run a search to its end, ``value(cores)`` standing in for the measured mean;
    returns (answer, the cores measured in order). ``limits``: before the n-th measurement,
    the plan's ceiling is set to that many cores (``al.limit``)."""
    out, state = al.begin(spec, history, config)
    probed = []
    while isinstance(out, Probe):
        assert out.cores == state.cores
        if limits and len(probed) in limits:
            cut, state = al.limit(state, limits.pop(len(probed)), config)
            out = out if cut is None else cut
            assert SizingState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
            if not isinstance(out, Probe):
                break
            assert out.cores == state.cores <= state.bound
        probed.append(out.cores)
        out, state = al.advance(state, value(out.cores), config)
        # every state on the way serialises and comes back the same
        assert SizingState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    return out, probed


# -- curves


def test_the_catalogue_names_every_model_of_the_simulated_node_with_its_category():
    for name, profile in MODELS.items():
        assert curve_for(name).category == profile.category
    assert set(CATEGORY_CURVES) == {"CV", "NLP", "Speech"}
    assert {c.optimum_cores for c in CATEGORY_CURVES.values()} == {3, 5}
    with pytest.raises(KeyError, match="known: "):
        curve_for("GPT-7")


def test_coda_shape_rises_linearly_to_the_optimum_falls_slightly_past_it_and_utilisation_peaks_with_it():
    c = MODEL_CURVES["BiDAF"]  # optimum 6
    rises = [c.throughput(k + 1) - c.throughput(k) for k in range(1, 6)]
    assert all(r > 0 for r in rises) and max(rises) - min(rises) < 1e-9  # linear
    assert c.best(14) == 6 and 0 < c.share(6) - c.share(7) <= 0.03  # "drops slightly"
    utils = [c.utilisation(k, 80.0) for k in range(1, 15)]
    assert utils.index(max(utils)) + 1 == c.best(14)  # CODA V-B: the same optimum
    assert c.best(28, gpus=2) == 12  # IV-B2: linear in the GPUs
    assert BENCH_CURVES["monotone"].best(14) == 14 and BENCH_CURVES["early-peak"].best(14) == 1
    assert BENCH_CURVES["flat-plateau"].just_enough(14, 0.05) < BENCH_CURVES["flat-plateau"].best(14)


def test_cache_memory_speeds_image_and_speech_models_and_leaves_language_models_flat():
    image, speech, language = CATEGORY_CACHE["CV"], CATEGORY_CACHE["Speech"], CATEGORY_CACHE["NLP"]
    assert image.share(500) / image.share(62) > 1.5  # Synergy 2.1: ResNet18 almost 2x
    assert speech.share(100) > speech.share(40)
    assert language.share(20) == language.share(500) == 1.0  # GNMT: flat from its process memory
    assert image.share(image.process_gb - 1) == 0.0


# -- the steady window


def feed_window(kind, values, config, dt=1.0):
    """Feed values one every ``dt`` s into a window opened at 0; (measurement, when it ended)."""
    w = Window(kind, 4, 0.0)
    t = 0.0
    for v in values:
        t += dt
        w = w.add(t, v, config)
        m = w.result(t, config)
        if m is not None:
            return m, t
    raise AssertionError("the window never ended")


def test_the_window_ends_early_on_steady_data_and_later_on_noisy_data():
    config = SignalConfig(tolerance=0.02, min_samples=10, max_window_s=90, warmup_s=5, warmup_samples=2)
    rng = random.Random(1)
    steady = [0.5 * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(1000)]
    noisy = [0.5 * (1 + 0.15 * rng.gauss(0, 1)) for _ in range(1000)]
    m1, t1 = feed_window(ITERATION_TIME, steady, config, dt=0.5)
    m2, t2 = feed_window(ITERATION_TIME, noisy, config, dt=0.5)
    # steady: warm-up (until 5 s, then 2 samples) then exactly min_samples
    assert m1.steady and m1.samples == 10 and t1 == pytest.approx(5 + 0.5 * 11)
    assert m1.mean == pytest.approx(2.0, rel=0.02) and m1.rel_half_width <= 0.02
    assert t2 > 3 * t1 and m2.samples > 50
    # noisier still: cut off at the maximum window with what it has, marked not steady
    m3, t3 = feed_window(GPU_UTILISATION, [min(100, max(0, 60 * (1 + 0.4 * rng.gauss(0, 1)))) for _ in range(200)],
                         config)
    assert not m3.steady and t3 == 90 and m3.mean == pytest.approx(60, rel=0.15)


def test_the_window_skips_the_warm_up_and_late_samples_and_refuses_values_of_the_wrong_kind():
    config = SignalConfig(warmup_s=5, warmup_samples=1, min_samples=5)
    w = Window(GPU_UTILISATION, 2, 100.0)
    w = w.add(103.0, 10.0, config)  # within warmup_s
    w = w.add(106.0, 10.0, config)  # the first warmup sample
    assert w.n == 0 and w.skipped == 1
    w = w.add(107.0, 50.0, config).add(106.5, 99.0, config)  # the second is out of order: dropped
    assert w.n == 1 and w.value() == 50.0
    for bad in (101.0, -1.0, float("nan"), True, "50"):
        with pytest.raises(BadSample):
            w.add(108.0, bad, config)
    with pytest.raises(BadSample):
        Window(ITERATION_TIME, 2, 0.0).add(10.0, 0.0, config)
    assert Window.from_dict(json.loads(json.dumps(w.to_dict()))) == w
    empty = Window(ITERATION_TIME, 2, 0.0).result(90.0, config)
    assert empty.mean is None and empty.samples == 0 and not empty.steady


def test_t_quantile_matches_the_table():
    for df, exact in ((4, 2.776), (9, 2.262), (29, 2.045), (1000, 1.962)):
        assert t_quantile(0.975, df) == pytest.approx(exact, rel=0.002)


# -- the searches


@pytest.mark.parametrize("name", sorted(MODEL_CURVES))
def test_coda_finds_the_optimum_of_every_model_within_a_few_steps(name):
    curve = MODEL_CURVES[name]
    spec = JobSpec("j", 14, category=curve.category)
    sized, probed = search(spec, curve.throughput, CODA_CFG)
    assert sized.cores == curve.best(14) and sized.reason == "searched"
    # measure the start, walk to the optimum one core at a time, one more to see it fall
    start = al.DEFAULT_START[curve.category]
    expected = 1 + abs(curve.best(14) - start) + 1 + (1 if curve.best(14) > start else 0)
    if curve.best(14) == start:
        expected = 3  # the start, one fewer (worse), one more (worse)
    if curve.best(14) == 1:
        expected -= 1  # nothing below one core to try
    assert sized.steps == len(probed) == expected <= 5
    assert sized.throughput == curve.throughput(sized.cores)
    assert [c for c, _ in sized.curve_points] == sorted(probed)


def test_coda_step_counts_match_coda_table_ii_where_the_optima_allow():
    steps = {name: search(JobSpec("j", 14, category=c.category), c.throughput, CODA_CFG)[0].steps
             for name, c in MODEL_CURVES.items()}
    assert steps == {"AlexNet": 4, "VGG16": 3, "InceptionV3": 3, "ResNet-50": 3, "BiDAF": 4, "Transformer": 5,
                     "WaveNet": 3, "DeepSpeech": 3}


@pytest.mark.parametrize("name", sorted({*MODEL_CURVES, *BENCH_CURVES}))
def test_synergy_finds_the_fewest_cores_within_its_threshold_in_log_steps(name):
    curve = curve_for(name)
    sized, probed = search(JobSpec("j", 14, category=curve.category), curve.throughput, SYNERGY_CFG)
    assert probed[0] == 14  # from the maximum
    assert sized.steps <= 1 + math.ceil(math.log2(14))
    best = curve.throughput(curve.best(14))
    assert sized.throughput >= 0.9 * max(v for _, v in sized.curve_points) >= 0.9 * 0.9 * best
    assert not any(c < sized.cores and v >= 0.9 * max(v for _, v in sized.curve_points)
                   for c, v in sized.curve_points)


def test_coda_walks_up_a_monotone_curve_and_down_to_an_early_peak():
    mono, early = BENCH_CURVES["monotone"], BENCH_CURVES["early-peak"]
    sized, probed = search(JobSpec("j", 14), mono.throughput, CODA_CFG)
    assert sized.cores == 14 and probed == [4, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    sized, probed = search(JobSpec("j", 14), early.throughput, CODA_CFG)
    assert sized.cores == 1 and probed == [4, 3, 2, 1]
    # the paper's rule keeps a step down only when it improves by more than the margin:
    # a loss of 3 % of the peak per core past it is inside a 4 % margin, so it stays put
    strict = AllocatorConfig(method=CODA, fewer_if_equal=False, noise_margin=0.04)
    assert search(JobSpec("j", 14), early.throughput, strict)[0].cores == 4


@settings(max_examples=60, deadline=None)
@given(noise=st.lists(st.floats(-0.014, 0.014), min_size=30, max_size=30),
       name=st.sampled_from(sorted(MODEL_CURVES)), fewer_if_equal=st.booleans())
def test_noise_within_the_margin_does_not_move_the_answer(noise, name, fewer_if_equal):
    """Started at the optimum, a search that sees each mean off by up to 1.4 % (two of them
    differ by less than the 3 % margin) stays there."""
    curve = MODEL_CURVES[name]
    best = curve.best(14)
    config = AllocatorConfig(method=CODA, fewer_if_equal=fewer_if_equal)
    # her answer for the model with another batch size: the search starts there
    history = HistoryView({("alice", name, 999): Remembered("alice", name, 999, curve.category, 1, best, 1.0,
                                                            ITERATION_TIME)}, {})
    errors = iter(noise)
    sized, probed = search(JobSpec("j", 14, owner="alice", category=curve.category, model=name),
                           lambda c: curve.throughput(c) * (1 + next(errors)), config, history)
    assert probed[0] == best and sized.cores == best and sized.steps <= 3


def test_a_search_on_a_real_signal_with_noisy_iterations_still_finds_the_optimum():
    curve = MODEL_CURVES["ResNet-50"]
    spec = JobSpec("j", 14, category="CV")
    rng = random.Random(7)
    now = 0.0
    out, sizing = al.begin_job(spec, None, CODA_CFG, now)
    measured = []
    while isinstance(out, Probe):
        step = None
        while step is None:
            dt = curve.iteration_time(out.cores, rng)
            now += dt
            step, sizing, m = al.feed(sizing, [(now, dt)], now, CODA_CFG)
        measured.append(m)
        assert JobSizing.from_dict(spec, json.loads(json.dumps(sizing.to_dict()))) == sizing
        out = step
    assert out.cores == 3 and out.steps == 3
    assert all(m.steady for m in measured) and now < 3 * 20  # three short windows, not 3 x 90 s


# -- where a search starts


def test_hints_adjust_the_start_from_the_category_defaults():
    def start(category="CV", gpus=1, max_cores=14, **labels):
        return al.start_point(JobSpec("j", max_cores, gpus=gpus, category=category, labels=labels), None)

    assert (start().cores, start().source) == (3, "category")
    assert start("NLP").cores == start("Speech").cores == 5
    assert start(None).cores == 4 and start(None).source == "default"
    assert start(pipelined=True).cores == 2
    assert start(pipelined=True, many_weights=True).cores == 1
    assert start(pipelined=True, many_weights=True, heavy_preprocessing=False).cores == 1
    assert start("NLP", heavy_preprocessing=True).cores == 6
    assert start("CV", pipelined=False).cores == 3
    assert start("CV", gpus=2).cores == 6  # per GPU (IV-B2)
    assert start("NLP", max_cores=4).cores == 4  # never above the job's maximum
    assert start(pipelined=True, many_weights=True, gpus=1, other_label="x").cores == 1
    for bad in ("yes", 1, "true", None.__class__):
        with pytest.raises(HintError, match="pipelined must be true or false"):
            start(pipelined=bad)


def test_the_owners_history_of_the_category_sets_the_start_and_an_exact_match_is_only_confirmed():
    history = HistoryView(
        {("alice", "ResNet-50", 64): Remembered("alice", "ResNet-50", 64, "CV", 1, 3, 1.6, ITERATION_TIME)},
        {("alice", "CV"): (2.0, 4.0, 3.0), ("alice", "NLP"): (6.0,)})
    spec = JobSpec("j", 14, owner="alice", category="CV", model="VGG16", labels={"pipelined": True})
    assert al.start_point(spec, history) == al.Start(4, "owner")  # the largest; hints not applied
    assert al.start_point(JobSpec("j", 14, owner="alice"), history).cores == 6  # no category: all of hers
    assert al.start_point(JobSpec("j", 28, gpus=2, owner="alice", category="CV"), history).cores == 8
    exact = JobSpec("j", 14, owner="alice", category="CV", model="ResNet-50", batch_size=64)
    assert al.start_point(exact, history) == al.Start(3, "history", 1.6)
    # the same answer on 2 GPUs or with another signal is a start, not a confirmation
    assert al.start_point(JobSpec("j", 28, gpus=2, owner="alice", model="ResNet-50", batch_size=64),
                          history) == al.Start(6, "history_scaled")
    assert al.start_point(JobSpec("j", 14, owner="alice", model="ResNet-50", batch_size=64,
                                  signal=GPU_UTILISATION), history).source == "history_scaled"
    # confirmed in one step when the job is as fast as remembered ...
    sized, probed = search(exact, lambda c: 1.6 * 0.98, CODA_CFG, history)
    assert (sized.cores, sized.steps, sized.reason, probed) == (3, 1, "confirmed", [3])
    # ... searched from there when it is slower (the job changed): the point is not measured again
    curve = MODEL_CURVES["AlexNet"]  # optimum 4; 0.78 iterations/s at 3 cores with a peak of 1
    sized, probed = search(exact, curve.share, CODA_CFG, history)
    assert sized.cores == 4 and probed == [3, 2, 4, 5] and sized.reason == "searched"
    sized, probed = search(exact, curve.share, SYNERGY_CFG, history)
    assert sized.cores == 4 and probed[:2] == [3, 14] and len(set(probed)) == len(probed)


def test_the_next_job_of_the_same_owner_model_and_batch_starts_at_the_answer_and_ends_in_one_step(tmp_path):
    curve = MODEL_CURVES["BiDAF"]
    store = SizingHistory(SecureDir(str(tmp_path / "state")))
    spec = JobSpec("slurm:1", 14, owner="alice", category="NLP", model="BiDAF", batch_size=32)
    first, _ = search(spec, curve.throughput, CODA_CFG, store.view())
    assert first.cores == 6 and first.steps == 4 and store.record(spec, first)
    reloaded = SizingHistory(SecureDir(str(tmp_path / "state")))  # as after a restart
    assert reloaded.notes == [] and reloaded.view() == store.view()
    again, probed = search(JobSpec("slurm:2", 14, owner="alice", category="NLP", model="BiDAF", batch_size=32),
                           curve.throughput, CODA_CFG, reloaded.view())
    assert (again.cores, again.steps, probed) == (6, 1, [6])
    # another batch size of hers starts at her answer for the model: found in 3 steps, not 4
    other, probed = search(JobSpec("slurm:3", 14, owner="alice", category="NLP", model="BiDAF", batch_size=64),
                           curve.throughput, CODA_CFG, reloaded.view())
    assert probed[0] == 6 and (other.cores, other.steps) == (6, 3) and probed == [6, 5, 7]
    assert al.start_point(JobSpec("s", 14, owner="alice", model="BiDAF"), reloaded.view()).source == "model"
    # another owner's job of the model starts there too (ours: the model before the category) ...
    assert search(JobSpec("slurm:4", 14, owner="bob", category="NLP", model="BiDAF", batch_size=32),
                  curve.throughput, CODA_CFG, reloaded.view())[1][0] == 6
    # ... and another model of hers at her largest NLP answer (CODA), never below the default
    assert al.start_point(JobSpec("slurm:5", 14, owner="alice", category="NLP", model="GNMT"),
                          reloaded.view()) == al.Start(6, "owner")
    # pinned, stopped and unmeasured answers are not remembered
    _, pinned = al.pin(al.begin(spec, None, CODA_CFG)[1], 2)
    assert not store.record(spec, pinned.answer())


# -- operator controls


def test_pin_stop_and_reprobe():
    curve = MODEL_CURVES["AlexNet"]  # optimum 4, CV start 3
    spec = JobSpec("j", 14, category="CV")
    out, state = al.begin(spec, None, CODA_CFG)
    out, state = al.advance(state, curve.throughput(3), CODA_CFG)
    assert out == Probe("j", 2, "down")
    # pin: that size, no probing; a late measurement is refused
    sized, pinned = al.pin(state, 7)
    assert (sized.cores, sized.reason, sized.throughput) == (7, "pinned", None)
    with pytest.raises(NotProbing):
        al.advance(pinned, 1.0, CODA_CFG)
    for bad in (0, 15, 2.5, True):
        with pytest.raises(OutOfRange):
            al.pin(state, bad)
    # stop mid-probe: keep the cores the job has now, with what was measured
    sized, stopped = al.stop(state)
    assert (sized.cores, sized.reason, sized.curve_points) == (2, "stopped", ((3, curve.throughput(3)),))
    assert al.stop(stopped)[0] == sized  # stopping an ended search changes nothing
    # re-probe: a new search from the cores the job has (the pin), earlier points forgotten
    out, again = al.reprobe(pinned, CODA_CFG)
    assert out == Probe("j", 7, "start") and again.points == () and again.start.source == "reprobe"
    while isinstance(out, Probe):
        out, again = al.advance(again, curve.throughput(out.cores), CODA_CFG)
    assert out.cores == 4 and out.steps == 5  # 7, 6, 5, 4 kept going down, 3 worse
    # the same on a job's sizing with its window
    probe, sizing = al.begin_job(spec, None, CODA_CFG, now=10.0)
    assert sizing.window.opened_at == 10.0 and sizing.window.cores == probe.cores
    sized, sizing = al.pin_job(sizing, 5)
    assert sizing.window is None and al.feed(sizing, [(20.0, 0.3)], 20.0, CODA_CFG)[0] is None
    probe, sizing = al.reprobe_job(sizing, CODA_CFG, now=30.0)
    assert probe.cores == 5 and sizing.window.opened_at == 30.0
    sized, sizing = al.stop_job(sizing)
    assert sized.cores == 5 and sized.reason == "stopped" and sizing.window is None


def test_no_signal_ends_the_search_at_the_best_known_cores_and_one_core_needs_no_search():
    curve = MODEL_CURVES["ResNet-50"]
    out, state = al.begin(JobSpec("j", 14, category="CV"), None, CODA_CFG)
    sized, _ = al.advance(state, None, CODA_CFG)
    assert (sized.cores, sized.reason, sized.steps) == (3, "no_signal", 0)
    out, state = al.advance(state, curve.throughput(3), CODA_CFG)
    out, state = al.advance(state, curve.throughput(2), CODA_CFG)
    sized, _ = al.advance(state, None, CODA_CFG)  # probing 4 when the job went quiet
    assert (sized.cores, sized.reason) == (3, "no_signal")
    sized, _ = al.begin(JobSpec("j", 1, category="NLP"), None, CODA_CFG)
    assert isinstance(sized, Sized) and (sized.cores, sized.reason, sized.steps) == (1, "no_choice", 0)
    # a window that ended without a sample says so to the allocator
    config = AllocatorConfig(signal=SignalConfig(max_window_s=30))
    out, sizing = al.begin_job(JobSpec("j", 14, category="CV"), None, config, now=0.0)
    sized, sizing, m = al.feed(sizing, [], 30.0, config)
    assert m.mean is None and sized.reason == "no_signal" and sized.cores == 3


def test_saved_states_that_could_not_be_reached_are_refused():
    out, state = al.begin(JobSpec("j", 8, category="CV"), None, CODA_CFG)
    good = state.to_dict()
    for change in ({"phase": "dancing"}, {"cores": 9}, {"points": [[3, 1.0], [3, 2.0]]}, {"points": [[3, -1]]},
                   {"method": "magic"}, {"max_cores": 0}, {"extra": 1}, {"reason": "bored"}):
        with pytest.raises(ValueError):
            SizingState.from_dict({**good, **change})
    spec = JobSpec("j", 8, category="CV")
    _, sizing = al.begin_job(spec, None, CODA_CFG, 0.0)
    with pytest.raises(ValueError, match="not this job's"):
        JobSizing.from_dict(JobSpec("other", 8), sizing.to_dict())


# -- properties


@st.composite
def jobs(draw):
    max_cores = draw(st.integers(1, 40))
    values = draw(st.lists(st.floats(0.01, 100.0), min_size=max_cores, max_size=max_cores))
    labels = {k: draw(st.booleans()) for k in al.HINTS if draw(st.booleans())}
    spec = JobSpec("j", max_cores, gpus=draw(st.integers(1, 4)), owner="alice",
                   category=draw(st.sampled_from([None, "CV", "NLP", "Speech"])), model="m", labels=labels,
                   share=draw(st.one_of(st.none(), st.integers(1, 48))))
    history = draw(st.sampled_from([
        None,
        HistoryView({}, {("alice", spec.category): (draw(st.floats(0.1, 50.0)),)}),
        HistoryView({("alice", "m", None): Remembered("alice", "m", None, None, spec.gpus,
                                                      draw(st.integers(1, max_cores)), draw(st.floats(0.01, 100.0)),
                                                      ITERATION_TIME)}, {}),
    ]))
    return spec, values, history


@settings(max_examples=examples(300), deadline=None)
# a ceiling of 1 set after the second (last) probe: 2 cores measured faster, out of reach (hypothesis found it)
@example(job=(JobSpec("j", max_cores=3, owner="alice", model="m"), [1.0, 2.0, 1.0],
              HistoryView({}, {("alice", None): (1.0,)})), method=CODA, fewer_if_equal=False, max_steps=3, cut=(2, 1))
@example(job=(JobSpec("j", max_cores=5, owner="alice", model="m", share=4), [1.0, 1.0, 2.0, 1.0, 3.0], None),
         method=SYNERGY, fewer_if_equal=False, max_steps=3, cut=(2, 4))
# flat within a ceiling of 4 set after two steps, twice as fast at 5: one core, the share unmeasured
@example(job=(JobSpec("j", max_cores=5, owner="alice", model="m", share=4), [1.0, 1.0, 1.0, 1.0, 2.0], None),
         method=SYNERGY, fewer_if_equal=False, max_steps=5, cut=(2, 4))
@given(job=jobs(), method=st.sampled_from([CODA, SYNERGY]), fewer_if_equal=st.booleans(),
       max_steps=st.integers(2, 30), cut=st.one_of(st.none(), st.tuples(st.integers(0, 6), st.integers(1, 44))))
def test_the_allocator_stays_within_1_and_max_cores_and_ends_within_a_bound(job, method, fewer_if_equal, max_steps,
                                                                           cut):
    spec, values, history = job
    config = AllocatorConfig(method=method, fewer_if_equal=fewer_if_equal, max_steps=max_steps)
    limits = dict([cut]) if cut else None
    sized, probed = search(spec, lambda c: values[c - 1], config, history, limits)
    applied = limits is not None and cut[0] not in limits  # the ceiling was set (search pops it): even after the last probe
    assert all(1 <= c <= spec.max_cores for c in probed) and 1 <= sized.cores <= spec.max_cores
    assert len(set(probed)) == len(probed) == sized.steps  # nothing measured twice
    if cut is not None and cut[0] < len(probed):
        # from the ceiling on, nothing above it is asked, nor answered after a search
        assert all(c <= cut[1] for c in probed[cut[0]:])
        if sized.reason in ("searched", "limited"):
            assert sized.cores <= cut[1]
    # CODA: the start, then at most one walk each way (a core per GPU); Synergy: the maximum
    # and a halving per step; a failed confirmation adds the remembered point, the floor phase
    # the share, a ceiling a second search; never more than max_steps
    one = spec.max_cores + 1 if method == CODA else 2 + math.ceil(math.log2(spec.max_cores))
    assert sized.steps <= min((2 if cut else 1) * one + 2, max_steps)
    if sized.reason in ("searched", "limited"):
        reachable = [(c, v) for c, v in sized.curve_points if not applied or c <= cut[1]]
        within = [v for _, v in reachable]
        if method == CODA:
            # what it keeps is never measurably slower than the best it saw (within the ceiling)
            assert sized.throughput >= max(within) * (1 - config.noise_margin)
        if spec.share is not None and sized.cores < min(spec.share, spec.max_cores):
            # below the share only when the share measured no faster, or nothing above the
            # answer was faster (the curve did not rise past it), or max_steps ended the
            # search before the floor phase had a step (the bound wins: hypothesis found it).
            # "Above" within the ceiling: a faster point past a ceiling set mid-search is out of reach.
            at_share = dict(sized.curve_points).get(min(spec.share, spec.max_cores))
            assert (at_share is not None and at_share <= sized.throughput) or (cut and cut[1] < spec.share) or \
                not any(c > sized.cores and v > sized.throughput for c, v in reachable) or \
                sized.steps >= max_steps


@settings(max_examples=40, deadline=None)
@given(entries=st.lists(st.tuples(st.sampled_from(["alice", "bob", "ü-ñ"]), st.sampled_from(["A", "B", "C"]),
                                  st.one_of(st.none(), st.integers(1, 512)),
                                  st.sampled_from([None, "CV", "NLP", "Speech"]), st.integers(1, 8),
                                  st.integers(1, 64), st.floats(1e-3, 1e4)), min_size=1, max_size=12))
def test_the_history_file_round_trips_and_stays_within_its_caps(tmp_path_factory, entries):
    state = SecureDir(str(tmp_path_factory.mktemp("state")))
    store = SizingHistory(state, max_jobs=4, max_owners=3)
    for owner, model, batch, category, gpus, cores, throughput in entries:
        spec = JobSpec("j", 64 * gpus, gpus=gpus, owner=owner, category=category, model=model, batch_size=batch)
        assert store.record(spec, Sized("j", cores, throughput, ((cores, throughput),), 3, "searched"))
    view = store.view()
    assert len(view.jobs) <= 4 and len(view.owners) <= 3
    assert all(1 <= len(v) <= 8 for v in view.owners.values())
    last = entries[-1]
    assert view.exact(last[0], last[1], last[2]).cores == last[5]  # the newest is never evicted
    again = SizingHistory(state, max_jobs=4, max_owners=3)
    assert again.notes == [] and again.view() == view
    assert parse_history(json.loads((state.read_bytes(FILE) or b"").decode())) == view


def test_a_corrupt_history_file_is_moved_aside_and_sizing_starts_without_history(tmp_path):
    for content in ("{not json", "[1, 2]", json.dumps({"version": 1, "jobs": [{"owner": "a"}], "owners": []}),
                    json.dumps({"version": 2, "jobs": [], "owners": []})):
        d = tmp_path / str(abs(hash(content)))
        d.mkdir(mode=0o700)
        (d / FILE).write_text(content)
        store = SizingHistory(SecureDir(str(d)))
        assert store.view() == HistoryView() and "moved aside" in store.notes[0]
        assert [p.name for p in d.iterdir() if p.name.startswith(f"{FILE}.corrupt-")]
        assert not (d / FILE).exists()


def test_a_dry_run_reads_the_history_but_never_writes_it(tmp_path):
    store = SizingHistory(SecureDir(str(tmp_path)), persist=False)
    spec = JobSpec("j", 8, owner="alice", category="CV", model="VGG16")
    assert store.record(spec, Sized("j", 2, 0.8, ((2, 0.8),), 3, "searched"))
    assert store.view().exact("alice", "VGG16", None).cores == 2 and not (tmp_path / FILE).exists()
    # nor an answer cut to the plan's ceiling: the job may want more
    assert not store.record(spec, Sized("j", 4, 0.8, ((4, 0.8),), 2, "limited"))
    # a name the file could not hold is not remembered (the file would be refused at the next start)
    long = JobSpec("j", 8, owner="x" * 300, category="CV", model="VGG16")
    assert not store.record(long, Sized("j", 2, 0.8, ((2, 0.8),), 3, "searched"))


def test_the_benchmark_runs(tmp_path, capsys):
    from nodesim import allocator_search
    assert allocator_search.main(["--catalogue", "--runs", "1", "--out", str(tmp_path / "out.json")]) == 0
    printed = capsys.readouterr().out
    assert "best answer" in printed and "fastest search" in printed
    assert json.loads((tmp_path / "out.json").read_text())["cells"]


def test_category_curves_are_found_from_their_own_defaults_in_three_steps():
    for category, curve in CATEGORY_CURVES.items():
        sized, probed = search(JobSpec("j", 14, category=category), curve.throughput, CODA_CFG)
        assert (sized.cores, sized.steps) == (curve.optimum_cores, 3)


# -- steps per GPU, the floor phase, the plan's ceiling


def test_a_step_is_one_core_per_gpu():
    """CODA's jobs are single-GPU: a step of one core. On 4 GPUs a core is a quarter core per
    GPU, inside the noise margin; a step of 4 walks the same curve per GPU (IV-B2)."""
    curve = MODEL_CURVES["BiDAF"]  # 6 per GPU: 24 on 4 GPUs
    spec = JobSpec("j", 64, gpus=4, category="NLP")
    sized, probed = search(spec, lambda c: curve.throughput(c, 4), CODA_CFG)
    assert probed == [20, 16, 24, 28] and sized.cores == 24 and sized.reason == "searched"
    # never above the maximum (the last step cut to it) nor below one core
    sized, probed = search(JobSpec("j", 22, gpus=4, category="NLP"), lambda c: curve.throughput(c, 4), CODA_CFG)
    assert probed == [20, 16, 22] and sized.cores == 22
    early = BENCH_CURVES["early-peak"]  # 1 per GPU
    sized, probed = search(JobSpec("j", 32, gpus=4), lambda c: early.throughput(c, 4), CODA_CFG)
    assert probed == [16, 12, 8, 4, 1] and sized.cores == 4


def test_from_the_same_jobs_answer_on_other_gpus_the_search_only_goes_down():
    curve = MODEL_CURVES["WaveNet"]  # 5 per GPU
    history = HistoryView({("alice", "WaveNet", 32): Remembered("alice", "WaveNet", 32, "Speech", 1, 5, 0.31,
                                                                 ITERATION_TIME)}, {})
    spec = JobSpec("j", 32, gpus=2, owner="alice", category="Speech", model="WaveNet", batch_size=32)
    sized, probed = search(spec, lambda c: curve.throughput(c, 2), CODA_CFG, history)
    assert probed == [10, 8] and sized.cores == 10  # fewer was worse: the start stands
    # a job that needs fewer on more GPUs is still walked down
    sized, probed = search(spec, lambda c: curve.throughput(2 * c, 2), CODA_CFG, history)  # 2.5 per GPU
    assert probed == [10, 8, 6, 4] and sized.cores == 6


def test_the_floor_phase_measures_the_share_once_when_the_curve_still_rose_below_it():
    slow = lambda c: 1.0 + 0.01 * min(c, 12)  # +1 % a core: never by the 3 % margin
    sized, probed = search(JobSpec("j", 16, share=8), slow, CODA_CFG)
    assert probed == [4, 3, 2, 1, 8] and (sized.cores, sized.reason, sized.steps) == (8, "searched", 5)
    # without a share, the search alone: down to one core
    sized, probed = search(JobSpec("j", 16), slow, CODA_CFG)
    assert probed == [4, 3, 2, 1] and sized.cores == 1
    # the share measured no faster: the answer stands (and the share was measured)
    bump = lambda c: {1: 1.0, 2: 1.02}.get(c, 0.99)
    sized, probed = search(JobSpec("j", 16, share=8), bump, CODA_CFG)
    assert probed == [4, 3, 2, 1, 8] and sized.cores == 1 and (8, 0.99) in sized.curve_points
    # past the optimum (nothing above the answer was faster): no floor phase
    curve = MODEL_CURVES["Transformer"]
    sized, probed = search(JobSpec("j", 16, category="NLP", share=8), curve.throughput, CODA_CFG)
    assert sized.cores == 2 and 8 not in probed
    # an answer at or above the share: none either
    curve = MODEL_CURVES["BiDAF"]
    assert search(JobSpec("j", 16, category="NLP", share=4), curve.throughput, CODA_CFG)[1] == [5, 4, 6, 7]
    # Synergy: its fewest cores within 10 % of the best, then the share (Synergy Sec. 4.2)
    flat = BENCH_CURVES["flat-plateau"]  # Synergy stops at 6 of its best 8 (6.7 % below)
    assert search(JobSpec("j", 14), flat.throughput, SYNERGY_CFG)[0].cores == 6
    sized, probed = search(JobSpec("j", 14, share=10), flat.throughput, SYNERGY_CFG)
    assert probed[0] == 14 and probed[-1] == 10 and sized.cores == 10
    # a remembered answer is confirmed, not checked again
    history = HistoryView({("a", "m", None): Remembered("a", "m", None, None, 1, 2, 1.02, ITERATION_TIME)}, {})
    sized, probed = search(JobSpec("j", 16, owner="a", model="m", share=8), slow, CODA_CFG, history)
    assert probed == [2] and sized.reason == "confirmed"


def test_a_probe_above_the_plans_ceiling_is_cut_to_it_and_the_search_resumes_within_it():
    curve = MODEL_CURVES["BiDAF"]  # optimum 6; NLP starts at 5
    spec = JobSpec("j", 14, category="NLP")
    # cut before the first measurement: the start moves to the ceiling
    out, state = al.begin(spec, None, CODA_CFG)
    out, state = al.limit(state, 4, CODA_CFG)
    assert out == Probe("j", 4, "start") and state.start == al.Start(4, "limit") and state.bound == 4
    sized, probed = search(spec, curve.throughput, CODA_CFG, limits={0: 4})
    # 4, then 3 (worse), no room above: the ceiling is the answer, not remembered
    assert probed == [4, 3] and (sized.cores, sized.reason) == (4, "limited")
    # a ceiling above the probe leaves it be, and bounds the walk up
    sized, probed = search(spec, curve.throughput, CODA_CFG, limits={1: 9})
    assert probed == [5, 4, 6, 7] and (sized.cores, sized.reason) == (6, "searched")
    # cut while walking up past points measured above it: from the best point within
    out, state = al.begin(spec, None, CODA_CFG)
    for c in (5, 4, 6):
        out, state = al.advance(state, curve.throughput(c), CODA_CFG)
    assert out == Probe("j", 7, "up")
    out, state = al.limit(state, 5, CODA_CFG)
    assert isinstance(out, Sized) and (out.cores, out.reason, out.steps) == (5, "limited", 3)
    # Synergy: the maximum cut to the ceiling, the range within it
    sized, probed = search(spec, curve.throughput, SYNERGY_CFG, limits={0: 8})
    assert probed[0] == 8 and max(probed) == 8 and sized.cores <= 8
    # a ceiling at or above max_cores lifts it; one below 1 is refused
    assert al.limit(state, 14, CODA_CFG)[1].ceiling is None
    with pytest.raises(OutOfRange):
        al.limit(state, 0, CODA_CFG)


def test_an_ended_search_keeps_its_answer_under_a_ceiling_and_a_reprobe_searches_within_it():
    curve = MODEL_CURVES["BiDAF"]
    spec = JobSpec("j", 14, category="NLP")
    out, state = al.begin(spec, None, CODA_CFG)
    while isinstance(out, Probe):
        out, state = al.advance(state, curve.throughput(out.cores), CODA_CFG)
    assert out.cores == 6
    cut, limited = al.limit(state, 4, CODA_CFG)
    assert cut is None and limited.answer() == out and limited.ceiling == 4
    out, again = al.reprobe(limited, CODA_CFG)
    assert out == Probe("j", 4, "start") and again.ceiling == 4
    # the ceiling survives a round trip; one at or above max_cores cannot be saved
    assert SizingState.from_dict(json.loads(json.dumps(again.to_dict()))) == again
    with pytest.raises(ValueError):
        SizingState.from_dict({**again.to_dict(), "ceiling": 14})


def test_limit_job_keeps_the_window_of_a_probe_that_stands_and_opens_one_for_a_cut_probe():
    curve = MODEL_CURVES["ResNet-50"]
    spec = JobSpec("j", 14, category="CV", share=7)
    probe, sizing = al.begin_job(spec, None, CODA_CFG, now=0.0)
    assert probe.cores == 3
    _, sizing, _ = al.feed(sizing, [(6.0, 1 / curve.throughput(3))], 6.0, CODA_CFG)
    out, same = al.limit_job(sizing, 10, CODA_CFG, now=7.0)
    assert out is None and same.window == sizing.window and same.state.ceiling == 10
    out, cut = al.limit_job(sizing, 2, CODA_CFG, now=7.0)
    assert out == Probe("j", 2, "start") and cut.window.opened_at == 7.0 and cut.window.cores == 2
    assert JobSizing.from_dict(spec, json.loads(json.dumps(cut.to_dict()))) == cut
    with pytest.raises(ValueError, match="not this job's"):
        JobSizing.from_dict(JobSpec("j", 14, gpus=2), cut.to_dict())


def test_the_same_model_is_looked_up_the_owners_newest_first_then_anyones_newest():
    def r(owner, model, batch, cores):
        return Remembered(owner, model, batch, "NLP", 1, cores, 1.0, ITERATION_TIME)

    jobs = {("bob", "BiDAF", 8): r("bob", "BiDAF", 8, 7), ("alice", "BiDAF", 16): r("alice", "BiDAF", 16, 6),
            ("carol", "BiDAF", 8): r("carol", "BiDAF", 8, 5), ("alice", "GNMT", 8): r("alice", "GNMT", 8, 2)}
    view = HistoryView(jobs, {})
    assert view.same_model("BiDAF", "alice").cores == 6  # hers, though carol's is newer
    assert view.same_model("BiDAF", "dave").cores == 5  # anyone's newest
    assert view.same_model("BERT", "alice") is None and view.same_model(None, "alice") is None
    # the start: per GPU, times the job's GPUs, before the owner's category
    view = HistoryView(jobs, {("alice", "NLP"): (2.0,)})
    assert al.start_point(JobSpec("j", 64, gpus=2, owner="alice", category="NLP", model="BiDAF", batch_size=4),
                          view) == al.Start(12, "model")
