"""Right-sizing on the node (issue #13): the plan of every job's CPUs (GPU and CPU arrays,
lending, taking back, contention halving on top) and the node benchmark's invariants."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from support.examples import examples

from noded.util.halving import kept_cpus
from noded.rightsize.sizing import PINNED as PINNED_REASON
from noded.rightsize.sizing import Probe, Sized
from noded.rightsize.cpuplan import (BEYOND_RESERVE, CPU, FALLBACKS, GPU, HALVED, KEPT_ONE, KEPT_SHARE, LENT, OWN,
                                     PINNED, PROBING, RESERVE, SIZED, TAKEN_BACK, TRIMMED, CpuJob, GpuJob, NodeView,
                                     PlanConfig, PlanError, plan, reserve_from_history)
from noded.rightsize.history import HistoryView

ALL16 = frozenset(range(16))


def cpu_job(job, source="batch", own=ALL16, level=0, current=None):
    return CpuJob(job, source, frozenset(own), level, None if current is None else frozenset(current))


# -- unit cases


def test_the_gpu_array_is_the_top_of_the_node_and_gpu_jobs_are_packed_down_from_it_in_id_order():
    view = NodeView(tuple(range(16)), 4, (GpuJob("b", 1, 3, SIZED), GpuJob("a", 2, 4, PROBING)),
                    (cpu_job("c:etl", "etl"),))
    p = plan(view, PlanConfig(reserve_cores=10))
    assert p.gpu_array == tuple(range(6, 16)) and p.cpu_array == tuple(range(6))
    assert p.cpus_of("a") == (12, 13, 14, 15) and p.jobs["a"].reasons == (PROBING,)
    assert p.cpus_of("b") == (9, 10, 11) and p.jobs["b"].reasons == (SIZED,)
    assert p.jobs["a"].kind == GPU and p.jobs["c:etl"].kind == CPU
    # etl may not borrow: its own CPUs in the CPU array only; the idle reserve stays idle
    assert p.cpus_of("c:etl") == tuple(range(6)) and p.jobs["c:etl"].reasons == (OWN,)
    assert p.idle == (6, 7, 8) and p.lent == ()


def test_idle_reserve_and_cores_a_slimmed_job_gave_up_are_lent_to_borrowers_only():
    view = NodeView(tuple(range(16)), 4, (GpuJob("g", 1, 2, SIZED),),
                    (cpu_job("c:batch", "batch"), cpu_job("c:etl", "etl")))
    p = plan(view, PlanConfig(reserve_cores=12, lend_to=frozenset({"batch"})))
    assert p.cpus_of("g") == (14, 15)
    assert p.cpus_of("c:batch") == tuple(range(14)) and p.jobs["c:batch"].reasons == (OWN, LENT)
    assert "10 lent from the GPU array" in p.jobs["c:batch"].note
    assert p.cpus_of("c:etl") == (0, 1, 2, 3)
    assert p.lent == tuple(range(4, 14)) and p.idle == ()


def test_a_gpu_job_that_arrives_takes_its_cores_back_from_the_borrower_at_once():
    config = PlanConfig(reserve_cores=12, lend_to=frozenset({"batch"}))
    before = plan(NodeView(tuple(range(16)), 4, (GpuJob("g1", 1, 4, SIZED),), (cpu_job("c:batch"),)), config)
    assert before.cpus_of("c:batch") == tuple(range(12))
    after = plan(NodeView(tuple(range(16)), 4,
                          (GpuJob("g1", 1, 4, SIZED, frozenset(before.cpus_of("g1"))), GpuJob("g0", 2, 5, PROBING)),
                          (cpu_job("c:batch", current=before.cpus_of("c:batch")),)), config)
    assert after.cpus_of("g1") == before.cpus_of("g1")  # the job already there does not move
    assert after.cpus_of("g0") == (7, 8, 9, 10, 11)
    assert after.cpus_of("c:batch") == (0, 1, 2, 3, 4, 5, 6)
    assert after.jobs["c:batch"].reasons == (OWN, LENT, TAKEN_BACK)
    assert "5 taken back" in after.jobs["c:batch"].note


def test_gpu_jobs_beyond_the_reserve_spill_into_the_cpu_array_sparing_each_cpu_jobs_last_own_cpu():
    view = NodeView(tuple(range(8)), 2, (GpuJob("g", 2, 6, SIZED),),
                    (cpu_job("c:a", own={0, 1}), cpu_job("c:b", own={2})))
    p = plan(view, PlanConfig(reserve_cores=4))
    # the GPU array 4..7, then the CPU array from the top: 3, then 1 (2 is c:b's only CPU)
    assert p.cpus_of("g") == (1, 3, 4, 5, 6, 7)
    assert p.jobs["g"].reasons == (SIZED, BEYOND_RESERVE) and "2 beyond the reserve of 4" in p.jobs["g"].note
    assert p.cpus_of("c:a") == (0,) and p.cpus_of("c:b") == (2,)
    assert p.jobs["c:b"].reasons == (OWN,)


def test_a_cpu_job_is_never_left_without_a_cpu_and_says_which_fallback_it_took():
    # the GPU jobs need the whole node: c:share keeps its CPU-array share, overlapping
    view = NodeView(tuple(range(4)), 4, (GpuJob("g1", 2, 2, SIZED), GpuJob("g2", 2, 2, SIZED)),
                    (cpu_job("c:share", own={0}),))
    p = plan(view, PlanConfig(reserve_cores=2))
    assert p.cpus_of("c:share") == (0,) and p.jobs["c:share"].reasons == (KEPT_SHARE,)
    assert 0 in p.gpu_cpus
    # no CPU in the CPU array at all (its own are all in the GPU array): one of its own,
    # the lowest a GPU job does not have
    view = NodeView(tuple(range(8)), 2, (GpuJob("g", 1, 2, SIZED),), (cpu_job("c:one", "etl", own={4, 5, 6}),))
    p = plan(view, PlanConfig(reserve_cores=4))
    assert p.cpus_of("g") == (6, 7)
    assert p.cpus_of("c:one") == (4,) and p.jobs["c:one"].reasons == (KEPT_ONE,)


def test_when_the_targets_do_not_fit_the_one_furthest_above_its_share_is_cut_first():
    # 16 CPUs, 4 GPUs: a 1-GPU share is 4; "big" asks 12 (8 over), "small" 4 (its share)
    view = NodeView(tuple(range(16)), 4, (GpuJob("big", 1, 12, SIZED), GpuJob("small", 1, 4, SIZED),
                                          GpuJob("pair", 2, 8, PROBING)))
    p = plan(view, PlanConfig())
    assert [len(p.cpus_of(j)) for j in ("big", "small", "pair")] == [4, 4, 8]
    assert p.jobs["big"].reasons == (SIZED, TRIMMED) and "trimmed from 12" in p.jobs["big"].note
    assert p.jobs["small"].reasons == (SIZED,)


def test_halving_applies_to_the_lent_extended_set_and_gives_up_lent_cpus_first():
    view = NodeView(tuple(range(16)), 4, (GpuJob("g", 1, 2, SIZED),), (cpu_job("c:batch", level=2),))
    p = plan(view, PlanConfig(reserve_cores=12, lend_to=frozenset({"batch"})))
    job = p.jobs["c:batch"]
    assert job.granted == tuple(range(14)) and job.cpus == (0, 1, 2)  # 14 >> 2
    assert job.reasons == (OWN, LENT, HALVED) and "level 2: 3 of 14" in job.note
    deep = plan(NodeView(view.cpus, 4, view.gpu_jobs, (cpu_job("c:batch", level=9),)),
                PlanConfig(reserve_cores=12, lend_to=frozenset({"batch"})))
    assert deep.cpus_of("c:batch") == (0,)  # never below one CPU


def test_a_gpu_job_without_a_target_gets_the_cores_per_gpu_and_the_default_reserve_is_the_whole_node():
    view = NodeView(tuple(range(32)), 8, (GpuJob("g", 2),), (cpu_job("c", own=range(32)),))
    p = plan(view, PlanConfig(lend_to=frozenset({"batch"})))
    assert p.reserve == 32 and p.cpu_array == ()
    assert len(p.cpus_of("g")) == 8 and p.jobs["g"].reasons == (RESERVE,)
    assert p.cpus_of("c") == tuple(range(24)) and p.jobs["c"].reasons == (LENT,)
    p = plan(view, PlanConfig(cores_per_gpu=3))
    assert p.reserve == 24 and len(p.cpus_of("g")) == 6


def test_gpu_job_from_the_allocators_request():
    assert GpuJob.from_allocator("j", 1, None) == GpuJob("j", 1)
    assert GpuJob.from_allocator("j", 1, Probe("j", 5, "down"), [3]) == GpuJob("j", 1, 5, PROBING, frozenset({3}))
    assert GpuJob.from_allocator("j", 1, Sized("j", 4, 1.0, ((4, 1.0),), 1, "searched")).sizing == SIZED
    assert GpuJob.from_allocator("j", 1, Sized("j", 4, None, (), 0, PINNED_REASON)).sizing == PINNED


def test_reserve_from_history_is_the_mean_cores_per_gpu_rounded_up_times_the_gpus():
    history = HistoryView({}, {("a", "CV"): (3.0, 4.0), ("b", "NLP"): (2.5,)})
    assert reserve_from_history(history, 8, 64, 8) == 32  # mean 3.17 -> 4 per GPU
    assert reserve_from_history(HistoryView(), 8, 64, 8) == 64
    assert reserve_from_history(HistoryView({}, {("a", None): (20.0,)}), 8, 64, 8) == 64  # at most the node


def test_views_no_plan_can_satisfy_are_refused_with_the_job_named():
    with pytest.raises(PlanError, match="3 GPU jobs cannot each have a CPU"):
        plan(NodeView((0, 1), 4, (GpuJob("a", 1), GpuJob("b", 1), GpuJob("c", 1))), PlanConfig())
    with pytest.raises(PlanError, match="more than once: a"):
        NodeView((0, 1), 4, (GpuJob("a", 1),), (cpu_job("a", own={0}),))
    with pytest.raises(PlanError, match="hold 5 GPUs together"):
        NodeView((0, 1), 4, (GpuJob("a", 4), GpuJob("b", 1)))
    with pytest.raises(PlanError, match="job x: a target comes with its sizing"):
        GpuJob("x", 1, 3)
    with pytest.raises(PlanError, match="job c: a CPU job has at least one CPU"):
        cpu_job("c", own=())
    with pytest.raises(PlanError, match="lend_to is a set"):
        PlanConfig(lend_to="batch")


# -- properties


@st.composite
def views(draw, max_cpus=24):
    cpus = sorted(draw(st.sets(st.integers(0, 63), min_size=1, max_size=max_cpus)))
    node_gpus = draw(st.integers(1, 8))
    gpu_counts = draw(st.lists(st.integers(1, 4), max_size=min(node_gpus, len(cpus))))
    kept, total = [], 0
    for g in gpu_counts:
        if total + g <= node_gpus:
            kept.append(g)
            total += g
    gpu_jobs = []
    for i, g in enumerate(kept):
        target = draw(st.one_of(st.none(), st.integers(1, len(cpus) + 2)))
        sizing = None if target is None else draw(st.sampled_from((PROBING, SIZED, PINNED)))
        current = draw(st.sets(st.sampled_from(cpus), max_size=4))
        gpu_jobs.append(GpuJob(f"g{i}", g, target, sizing, frozenset(current)))
    cpu_jobs = []
    for i in range(draw(st.integers(0, 4))):
        own = draw(st.sets(st.sampled_from(cpus), min_size=1, max_size=len(cpus)))
        current = draw(st.one_of(st.none(), st.sets(st.sampled_from(cpus), max_size=6)))
        cpu_jobs.append(CpuJob(f"c{i}", draw(st.sampled_from(("a", "b"))), frozenset(own), draw(st.integers(0, 5)),
                               None if current is None else frozenset(current)))
    return NodeView(tuple(cpus), node_gpus, tuple(gpu_jobs), tuple(cpu_jobs))


configs = st.builds(PlanConfig, reserve_cores=st.one_of(st.none(), st.integers(0, 30)),
                    cores_per_gpu=st.one_of(st.none(), st.integers(1, 6)),
                    lend_to=st.sets(st.sampled_from(("a", "b"))).map(frozenset))


def asked_for(view: NodeView, config: PlanConfig, j: GpuJob) -> int:
    """What a GPU job asks of the plan: its target, else the cores per GPU (or its share)."""
    per_gpu = config.cores_per_gpu * j.gpus if config.cores_per_gpu else view.share(j.gpus)
    return min(len(view.cpus), j.target if j.target is not None else per_gpu)


def check_invariants(view: NodeView, config: PlanConfig, p):
    gpu_used: set[int] = set()
    for j in view.gpu_jobs:
        mine = set(p.cpus_of(j.job))
        assert mine and mine <= set(view.cpus)
        assert not mine & gpu_used, "two GPU jobs share a CPU"
        gpu_used |= mine
    assert gpu_used == set(p.gpu_cpus)
    assert set(p.lent) | set(p.idle) == set(p.gpu_array) - gpu_used
    for j in view.cpu_jobs:
        got = p.jobs[j.job]
        assert got.cpus and set(got.cpus) <= set(got.granted)
        assert got.cpus == tuple(kept_cpus(list(got.granted), j.level))  # halving composes
        fallback = set(got.reasons) & set(FALLBACKS)
        if not fallback:
            assert not set(got.granted) & gpu_used, "a CPU job on a GPU job's CPU"
        if j.source not in config.lend_to and not fallback:
            assert not set(got.granted) & set(p.gpu_array), "lent to a source that may not borrow"
        if LENT in got.reasons:
            assert set(p.lent) <= set(got.granted)
    # the ones asked for whenever they fit
    asked = {j.job: asked_for(view, config, j) for j in view.gpu_jobs}
    if sum(asked.values()) <= len(view.cpus):
        assert all(len(p.cpus_of(job)) == n for job, n in asked.items())
    else:  # every job keeps its GPU-proportional share when the shares fit
        shares = {j.job: view.share(j.gpus) for j in view.gpu_jobs}
        if sum(shares.values()) <= len(view.cpus):
            assert all(len(p.cpus_of(job)) >= min(asked[job], shares[job]) for job in asked)


@settings(max_examples=examples(200), deadline=None)
@given(views(), configs)
def test_property_no_overlap_no_borrower_on_gpu_cpus_everyone_at_least_one_cpu(view, config):
    assume(len(view.gpu_jobs) <= len(view.cpus))
    check_invariants(view, config, plan(view, config))


@settings(max_examples=examples(100), deadline=None)
@given(views(), configs, st.randoms(use_true_random=False))
def test_property_the_plan_depends_on_the_view_alone_not_on_the_order_of_its_jobs(view, config, rnd):
    gpu, cpu = list(view.gpu_jobs), list(view.cpu_jobs)
    rnd.shuffle(gpu)
    rnd.shuffle(cpu)
    first = plan(view, config)
    again = plan(NodeView(tuple(reversed(view.cpus)), view.node_gpus, tuple(gpu), tuple(cpu)), config)
    assert dict(first.jobs) == dict(again.jobs) and first == plan(view, config)


@settings(max_examples=examples(150), deadline=None)
@given(views(), configs, st.integers(1, 4), st.integers(1, 8), st.data())
def test_property_a_gpu_job_arriving_or_growing_only_takes_back(view, config, gpus, target, data):
    """From one plan to the next (GPU jobs keep their CPUs), a new GPU job or a larger target
    only shrinks every CPU job's set before halving, and none keeps a GPU job's CPU."""
    before = plan(view, config)
    kept = tuple(GpuJob(j.job, j.gpus, j.target, j.sizing, frozenset(before.cpus_of(j.job))) for j in view.gpu_jobs)
    if data.draw(st.booleans()) and kept:
        grown = data.draw(st.sampled_from(kept))
        now = tuple(GpuJob(j.job, j.gpus, asked_for(view, config, j) + target if j is grown else j.target,
                           (j.sizing or SIZED) if j is grown else j.sizing, j.current) for j in kept)
    else:
        assume(sum(j.gpus for j in kept) + gpus <= view.node_gpus)
        now = (*kept, GpuJob("new", gpus, target, PROBING))
    cpu_now = tuple(CpuJob(j.job, j.source, j.own, j.level, frozenset(before.jobs[j.job].cpus))
                    for j in view.cpu_jobs)
    after_view = NodeView(view.cpus, view.node_gpus, now, cpu_now)
    asked = sum(asked_for(view, config, j) for j in now)
    assume(len(now) <= len(view.cpus) and asked <= len(view.cpus))  # nothing trimmed
    after = plan(after_view, config)
    check_invariants(after_view, config, after)
    assert set(before.gpu_cpus) <= set(after.gpu_cpus)
    for j in view.cpu_jobs:
        old, new = before.jobs[j.job], after.jobs[j.job]
        if set(new.reasons) & set(FALLBACKS) or set(old.reasons) & set(FALLBACKS):
            continue
        assert set(new.granted) <= set(old.granted)
        if set(old.cpus) & set(after.gpu_cpus):
            assert TAKEN_BACK in new.reasons


@settings(max_examples=examples(100), deadline=None)
@given(views(), configs, st.integers(0, 6))
def test_property_halving_is_a_function_of_what_was_granted_at_level_zero(view, config, level):
    at_zero = plan(NodeView(view.cpus, view.node_gpus, view.gpu_jobs,
                            tuple(CpuJob(j.job, j.source, j.own, 0, j.current) for j in view.cpu_jobs)), config)
    at_level = plan(NodeView(view.cpus, view.node_gpus, view.gpu_jobs,
                             tuple(CpuJob(j.job, j.source, j.own, level, j.current) for j in view.cpu_jobs)), config)
    for j in view.cpu_jobs:
        assert at_level.jobs[j.job].granted == at_zero.jobs[j.job].granted
        assert at_level.jobs[j.job].cpus == tuple(kept_cpus(list(at_zero.jobs[j.job].granted), level))
        assert (HALVED in at_level.jobs[j.job].reasons) == (level > 0)
    for j in view.gpu_jobs:
        assert at_level.cpus_of(j.job) == at_zero.cpus_of(j.job)  # halving never moves a GPU job


# -- the benchmark


def test_bench_rightsize_smoke(tmp_path, capsys):
    from nodesim import rightsize_node as rightsize
    out = tmp_path / "rightsize.json"
    assert rightsize.main(["--hours", "0.5", "--seed", "1", "--curves", "2", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    m = re.fullmatch(r"tuned/oracle throughput: (\d+\.\d{3})", lines[-1])
    assert m, lines[-1]
    x = float(m.group(1))
    assert 0 < x <= 1.0001
    data = json.loads(out.read_text())
    assert data["tuned_over_oracle"] == pytest.approx(x, abs=5e-4)
    noded = data["schemes"]["noded"]
    assert noded["worst_ratio"] >= 1.0, noded["per_job"]  # no GPU job below its proportional progress
    assert data["schemes"]["proportional"]["worst_ratio"] == 1.0
    assert noded["cpu_core_s"] > data["schemes"]["proportional"]["cpu_core_s"]
    assert noded["lent_core_s"] > 0 and data["steps_mean"] >= 1
    assert data["unsized"] == [] and "no floor phase" in data["schemes"]  # every job sized
    assert any("GPU utilisation over GPU-proportional" in line and "+20.8%" in line for line in lines)
    # CODA's greedy search beside it, and the generated curves' three jobs per method
    assert "noded, coda" in data["schemes"]
    assert set(data["generated"]) == {"coda", "top"} and all(
        row["runs"] == 2 * 2 * 3 for jobs in data["generated"].values() for row in jobs.values())
