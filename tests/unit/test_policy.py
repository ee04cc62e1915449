"""The contention policy is pure: samples in, decisions out."""

from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from support.examples import examples

from noded.config import ContentionConfig
from noded.jobs.model import JobMeta
from noded.policy.contention import PolicyState, decide
from noded.samplers.sample import CPU, GPU, JobSample, Sample

GB = 1e9
PEAK = 10 * GB
CFG = ContentionConfig(threshold=0.75, release_threshold=0.6, hold_s=10, settle_s=2, gpu_drop_margin=0.1)


def js(jid, kind, util=None, bw=None, exempt=False):
    return JobSample(jid, "registered", frozenset(), JobMeta(exempt=exempt), kind, ("GPU-0",) if kind == GPU else (),
                     util, bw, "own")


def sample(node_gbps, *jobs, t=0.0):
    node = None if node_gbps is None else node_gbps * GB
    return Sample(t, MappingProxyType({j.id: j for j in jobs}), (), True, None, (0,), MappingProxyType({0: node}),
                  (), ())


def run(samples, state=None, max_level=5, cfg=CFG, overrides=None):
    state = state or PolicyState()
    out = []
    for s in samples:
        levels = {j: max_level for j in s.jobs}
        d, state = decide(s, state, cfg, PEAK, levels, s.t, overrides or {})
        out.append(d)
    return out, state


def test_both_conditions_are_needed_and_the_heaviest_cpu_job_goes_first():
    quiet = [sample(4, js("nlp", GPU, 80), js("hog", CPU, bw=2 * GB), js("small", CPU, bw=1 * GB), t=t)
             for t in range(3)]
    busy_but_fine = sample(9, js("nlp", GPU, 79), js("hog", CPU, bw=7 * GB), js("small", CPU, bw=1 * GB), t=3)
    slowed = sample(9.5, js("nlp", GPU, 40), js("hog", CPU, bw=7.5 * GB), js("small", CPU, bw=1 * GB), t=4)
    ds, state = run(quiet + [busy_but_fine, slowed])
    assert not any(d.actions for d in ds[:4])  # bandwidth high but GPU utilisation holds: nothing
    (a,) = ds[4].actions
    assert (a.job, a.from_level, a.to_level) == ("hog", 0, 1)
    assert "node bandwidth 95% >= 75%" in a.reason and "nlp at 40% < baseline 80%" in a.reason
    assert ds[4].slowed == ("nlp",) and state.throttles["hog"].level == 1


def test_steps_wait_to_settle_and_gpu_jobs_are_never_throttled():
    base = [sample(4, js("nlp", GPU, 80), js("hog", CPU, bw=3 * GB), t=0)]
    hot = [sample(9.5, js("nlp", GPU, 40), js("hog", CPU, bw=8 * GB), js("gpu2", GPU, 10), t=t)
           for t in (1, 2, 3, 4, 5)]
    ds, state = run(base + hot)
    steps = [(d.node_share, [a.to_level for a in d.actions]) for d in ds[1:]]
    assert [s[1] for s in steps] == [[1], [], [2], [], [3]]  # one step every settle_s (2 s)
    assert "gpu2" not in state.throttles


def test_a_tick_whose_job_rates_span_more_than_one_tick_takes_no_step_the_next_does():
    # the node was read thin until now (noded.samplers.bandwidth): the hog that rose since its
    # last read reads low, so heaviest-first would pick "steady"; the policy waits one tick
    from dataclasses import replace
    base = [sample(3, js("nlp", GPU, 80), js("hog", CPU, bw=0.5 * GB), js("steady", CPU, bw=2 * GB), t=0)]
    first = replace(sample(9.5, js("nlp", GPU, 40), js("hog", CPU, bw=1.6 * GB), js("steady", CPU, bw=2 * GB), t=1),
                    job_bandwidth_current=False)
    then = sample(9.5, js("nlp", GPU, 40), js("hog", CPU, bw=7 * GB), js("steady", CPU, bw=2 * GB), t=2)
    ds, state = run(base + [first, then])
    assert ds[1].actions == () and "waiting a tick" in ds[1].note
    (a,) = ds[2].actions
    assert (a.job, a.to_level) == ("hog", 1)


def test_missing_bandwidth_never_throttles():
    ds, state = run([sample(4, js("nlp", GPU, 80), js("hog", CPU, bw=3 * GB), t=0),
                     sample(None, js("nlp", GPU, 30), js("hog", CPU, bw=9 * GB), t=1)])
    assert ds[1].actions == () and ds[1].note == "holding: node bandwidth unknown"


def test_release_is_one_step_per_hold_period_after_calm():
    state = None
    ds, state = run([sample(4, js("nlp", GPU, 80), js("hog", CPU, bw=3 * GB), t=0)] +
                    [sample(9.5, js("nlp", GPU, 40), js("hog", CPU, bw=8 * GB), t=t) for t in (1, 3, 5)])
    assert state.throttles["hog"].level == 3
    calm = [sample(3, js("nlp", GPU, 80), js("hog", CPU, bw=1 * GB), t=t) for t in range(6, 40)]
    ds, state = run(calm, state)
    releases = [(s.t, a.to_level) for s, d in zip(calm, ds) for a in d.actions]
    assert releases == [(16, 2), (26, 1), (36, 0)]
    assert "hog" not in state.throttles


def test_a_medium_node_neither_releases_nor_throttles():
    _, state = run([sample(4, js("nlp", GPU, 80), js("hog", CPU, bw=3 * GB), t=0),
                    sample(9.5, js("nlp", GPU, 40), js("hog", CPU, bw=8 * GB), t=1)])
    ds, state = run([sample(7, js("nlp", GPU, 78), js("hog", CPU, bw=5 * GB), t=t) for t in range(2, 60)], state)
    assert not any(d.actions for d in ds) and state.throttles["hog"].level == 1


def test_exempt_jobs_overrides_and_finished_jobs():
    jobs = lambda t, nlp=40: [js("nlp", GPU, nlp), js("hog", CPU, bw=8 * GB, exempt=True), js("b", CPU, bw=1 * GB)]
    ds, state = run([sample(4, *jobs(0, 80), t=0), sample(9.5, *jobs(1), t=1)])
    assert [a.job for a in ds[1].actions] == ["b"]  # the exempt hog is passed over
    ds, state = run([sample(9.5, *jobs(2), t=2)], state, overrides={"hog": 2})
    assert state.throttles["hog"].level == 2 and "operator override" in ds[0].actions[0].reason
    ds, state = run([sample(9.5, js("nlp", GPU, 40), t=3)], state)
    assert dict(state.throttles) == {}  # finished jobs hold nothing


def test_per_job_cap_throttles_regardless_of_gpus():
    cfg = ContentionConfig(cpu_job_cap_gbps=4, settle_s=0, hold_s=5)
    ds, state = run([sample(5, js("big", CPU, bw=6 * GB), t=0)], cfg=cfg)
    assert ds[0].actions[0].to_level == 1 and "above the per-job cap 4 GB/s" in ds[0].actions[0].reason
    # Still above half the cap: stays throttled although the node is calm.
    ds, state = run([sample(3, js("big", CPU, bw=3 * GB), t=t) for t in range(1, 30)], state, cfg=cfg)
    assert state.throttles["big"].level == 1


def test_a_per_job_cap_acts_only_on_one_ticks_rates():
    # a cap set by a reload while the node was read thin: the job's first rate is a mean
    # over several ticks (a hog that stopped still reads 6 GB/s); the next tick's is its own
    from dataclasses import replace
    cfg = ContentionConfig(cpu_job_cap_gbps=4, settle_s=0, hold_s=5)
    ds, state = run([replace(sample(5, js("was_big", CPU, bw=6 * GB), t=0), job_bandwidth_current=False),
                     sample(1, js("was_big", CPU, bw=0.5 * GB), t=1)], cfg=cfg)
    assert ds[0].actions == () and ds[1].actions == () and "was_big" not in state.throttles


@settings(max_examples=examples(200))
@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0, 12)),  # node GB/s
                          st.floats(0, 100), st.floats(0, 10), st.floats(0, 10), st.booleans()),
                min_size=1, max_size=40))
def test_invariants_over_any_sequence(steps):
    state = PolicyState()
    for t, (node, util, hog, other, exempt) in enumerate(steps):
        s = sample(node, js("gpu", GPU, util), js("hog", CPU, bw=hog * GB, exempt=exempt),
                   js("other", CPU, bw=other * GB), t=float(t))
        d, state = decide(s, state, CFG, PEAK, {"gpu": 5, "hog": 5, "other": 5}, float(t))
        assert "gpu" not in d.levels
        assert not (exempt and "hog" in d.levels)
        assert all(0 < lvl <= 5 for lvl in d.levels.values())
        assert all(abs(a.to_level - a.from_level) == 1 or a.to_level == 0 for a in d.actions)
        if node is None:
            assert all(a.kind == "release" for a in d.actions)


def test_fail_safe_releases_everything_but_overrides_when_inputs_stay_missing():
    cfg = ContentionConfig(settle_s=0, missing_release_s=5)
    _, state = run([sample(4, js("nlp", GPU, 80), js("hog", CPU, bw=3 * GB), js("pinned", CPU, bw=1 * GB), t=0),
                    sample(9.5, js("nlp", GPU, 40), js("hog", CPU, bw=8 * GB), js("pinned", CPU, bw=1 * GB), t=1)],
                   cfg=cfg, overrides={"pinned": 2})
    assert dict((j, t.level) for j, t in state.throttles.items()) == {"hog": 1, "pinned": 2}
    blind = [sample(None, js("nlp", GPU, 40), js("hog", CPU, bw=8 * GB), js("pinned", CPU, bw=1 * GB), t=t)
             for t in (2, 4, 6, 7, 8)]
    ds, state = run(blind, state, cfg=cfg, overrides={"pinned": 2})
    assert [d.levels.get("hog", 0) for d in ds] == [1, 1, 1, 0, 0]  # held for 5 s, then released
    assert ds[3].actions[0].cause == "inputs_missing" and "fail safe" in ds[3].note
    assert all(d.levels["pinned"] == 2 for d in ds)  # the operator's decision stands
