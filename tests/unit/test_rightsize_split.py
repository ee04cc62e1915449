"""The exact split (Synergy-OPT on one node): the numba kernel, its plain-Python dynamic
programme and a brute force agree; floors and capacities always hold; Synergy-TUNE never
beats the optimum; bad inputs are refused with the job named."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.examples import examples

from noded.rightsize import split_kernels, split_reference
from noded.rightsize.split import JobCurve, SplitError, normalised_progress, solve_split

INF = math.inf


def hole(k: int) -> float:
    return -INF if k % 2 else math.nan  # both mean "not a choice"


@st.composite
def progress_tables(draw, exact: bool):
    """(progress[j, c, m], cores available, memory units available): up to 4 jobs, 6
    cores, 3 memory units, about one point in five a hole. ``exact``: quarters up to 10,
    so every sum of four is exact and the tie rule decides alone."""
    n, cores, memory = draw(st.integers(0, 4)), draw(st.integers(0, 6)), draw(st.integers(0, 3))
    size = n * (cores + 1) * (memory + 1)
    if exact:
        raw = draw(st.lists(st.integers(-10, 40), min_size=size, max_size=size))
        values = [hole(k) if k < 0 else k / 4 for k in raw]
    else:
        point = st.one_of(st.integers(-2, -1).map(hole), st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0, 1e6))
        values = draw(st.lists(point, min_size=size, max_size=size))
    table = np.array(values, dtype=np.float64).reshape(n, cores + 1, memory + 1)
    return table, draw(st.integers(0, cores)), draw(st.integers(0, memory))


@settings(max_examples=examples(200), deadline=None)
@given(progress_tables(exact=True))
def test_kernel_python_dp_and_brute_force_agree(case):
    table, cores, memory = case
    got_c, got_m, got = split_kernels.best_split(table, cores, memory)
    dp = split_reference.best_split(table.tolist(), cores, memory)
    brute = split_reference.brute_force_split(table.tolist(), cores, memory)
    assert (got_c.tolist(), got_m.tolist(), got) == dp == brute


@settings(max_examples=examples(100), deadline=None)
@given(progress_tables(exact=False))
def test_kernel_and_python_dp_agree_bit_for_bit_on_any_floats(case):
    table, cores, memory = case
    got_c, got_m, got = split_kernels.best_split(table, cores, memory)
    assert (got_c.tolist(), got_m.tolist(), got) == split_reference.best_split(table.tolist(), cores, memory)
    # Rounding can reorder near-ties, so against the brute force only the optimum is compared.
    brute = split_reference.brute_force_split(table.tolist(), cores, memory)[2]
    assert got == brute or math.isclose(got, brute, rel_tol=1e-12)


@st.composite
def nodes(draw):
    """Curves of up to 4 jobs on a node of up to 6 GPUs, 6 cores and 3 memory units:
    whole rates with holes, the share's rate a power of two (so progress is exact);
    half the time only part of the node is available, so floors may not fit."""
    node_gpus, cores, memory = draw(st.integers(1, 6)), draw(st.integers(0, 6)), draw(st.integers(0, 3))
    n = draw(st.integers(1, min(4, node_gpus)))  # no jobs: test_no_jobs_is_an_empty_split
    gpus = draw(st.lists(st.integers(1, 2), min_size=n, max_size=n).filter(lambda g: sum(g) <= node_gpus))
    curves = []
    for j, g in enumerate(gpus):
        raw = draw(st.lists(st.integers(-3, 12), min_size=(cores + 1) * (memory + 1),
                            max_size=(cores + 1) * (memory + 1)))
        rates = np.array([hole(k) if k < 0 else float(k) for k in raw]).reshape(cores + 1, memory + 1)
        rates[cores * g // node_gpus, memory * g // node_gpus] = draw(st.sampled_from([1.0, 2.0, 4.0, 8.0]))
        curves.append(JobCurve(f"job{j}", g, rates))
    available = (cores, memory) if draw(st.booleans()) else (draw(st.integers(0, cores)),
                                                             draw(st.integers(0, memory)))
    return curves, cores, memory, node_gpus, available


def floor_point(curve, cores, memory, node_gpus):
    return cores * curve.gpus // node_gpus, memory * curve.gpus // node_gpus


def independent_progress(curves, cores, memory, node_gpus):
    """The objective's terms written out again, away from the code under test."""
    tables = []
    for curve in curves:
        floor = curve.throughput[floor_point(curve, cores, memory, node_gpus)]
        tables.append([[t / floor if math.isfinite(t) and t >= floor else -INF for t in row]
                       for row in curve.throughput.tolist()])
    return tables


@settings(max_examples=examples(200), deadline=None)
@given(nodes())
def test_split_is_optimal_keeps_every_floor_and_fits(node):
    curves, cores, memory, node_gpus, (avail_c, avail_m) = node
    split = solve_split(curves, cores, memory, node_gpus, available_cores=avail_c, available_memory_units=avail_m)
    want_c, want_m, want = split_reference.brute_force_split(
        independent_progress(curves, cores, memory, node_gpus), avail_c, avail_m)
    if curves and want_c[0] < 0:
        assert not split.feasible and split.allocations == {} and split.objective == -INF
        assert "floors cannot all be met" in split.reason and any(repr(c.job_id) in split.reason for c in curves)
        return
    assert split.feasible and split.objective == want
    assert list(split.allocations) == [c.job_id for c in curves]
    assert list(split.allocations.values()) == list(zip(want_c, want_m))
    assert sum(c for c, _ in split.allocations.values()) <= avail_c
    assert sum(m for _, m in split.allocations.values()) <= avail_m
    for curve in curves:
        assert curve.throughput[split.allocations[curve.job_id]] >= curve.throughput[
            floor_point(curve, cores, memory, node_gpus)]
        assert split.proportional[curve.job_id] == floor_point(curve, cores, memory, node_gpus)
        assert split.progress[curve.job_id] >= 1.0


@settings(max_examples=examples(200), deadline=None)
@given(nodes())
def test_tune_keeps_every_floor_and_never_beats_the_optimum(node):
    curves, cores, memory, node_gpus, (avail_c, avail_m) = node
    progress, shares = normalised_progress(curves, cores, memory, node_gpus)
    tune_c, tune_m, tune = split_reference.tune_split(progress.tolist(), [c.gpus for c in curves], shares,
                                                      avail_c, avail_m)
    opt_c, _, opt = split_kernels.best_split(progress, avail_c, avail_m)
    if (avail_c, avail_m) == (cores, memory):
        assert tune > -INF  # the shares always fit the whole node (rounded down)
    if tune == -INF:
        return
    assert opt >= tune
    assert sum(tune_c) <= avail_c and sum(tune_m) <= avail_m
    assert all(progress[j, tune_c[j], tune_m[j]] >= 1.0 for j in range(len(curves)))


def test_hand_computed_example():
    # 2 GPUs, 4 cores, 2 memory units: each job's share is (2 cores, 1 memory unit).
    # GNMT (a language model) saturates at 1 core and ignores the cache (Synergy Sec. 2.1);
    # ResNet-18 wants 3 cores and the whole cache. Rows are cores 0..4, columns memory 0..2.
    gnmt = np.array([[0, 0, 0], [10, 10, 10], [10, 10, 10], [10, 10, 10], [10, 10, 10]], dtype=float)
    resnet = np.array([[0, 0, 0], [2, 3, 4], [4, 6, 8], [6, 9, 12], [6, 9, 12]], dtype=float)
    split = solve_split([JobCurve("gnmt", 1, gnmt), JobCurve("resnet18", 1, resnet)], 4, 2, 2)
    # GNMT's floor is 10 (met with 1 core, no cache); ResNet's is 6, and with the 3 cores
    # and 2 memory units left it runs at 12: progress 1 + 2 = 3, against 2 for the shares.
    assert split.feasible
    assert dict(split.allocations) == {"gnmt": (1, 0), "resnet18": (3, 2)}
    assert split.objective == 3.0 and dict(split.progress) == {"gnmt": 1.0, "resnet18": 2.0}
    assert dict(split.proportional) == {"gnmt": (2, 1), "resnet18": (2, 1)}
    # TUNE gets there too: ResNet's demand (3, 2) packs first, then GNMT's (1, 0).
    progress, shares = normalised_progress([JobCurve("gnmt", 1, gnmt), JobCurve("resnet18", 1, resnet)], 4, 2, 2)
    assert split_reference.tune_split(progress.tolist(), [1, 1], shares, 4, 2) == ([1, 3], [0, 2], 3.0)


def test_tune_can_fall_well_short_of_the_optimum():
    # 2 GPUs, 5 cores, no cache: shares of 2 cores, floors at the rate with 2 cores.
    # a: 2.45x its floor with 3 cores, 2.5x with 4 (its peak); b: 1.5x with 3 (its peak).
    a = np.array([[0], [1], [2], [4.9], [5], [5]])
    b = np.array([[0], [1], [2], [3], [3], [3]])
    curves = [JobCurve("a", 1, a), JobCurve("b", 1, b)]
    progress, shares = normalised_progress(curves, 5, 0, 2)
    # TUNE packs a's demand (4 cores) first; b's demand (3) and then its share (2) do not
    # fit the 1 core left, so a goes back to its share (step 2a): 1 + 1, a core idle.
    assert split_reference.tune_split(progress.tolist(), [1, 1], shares, 5, 0) == ([2, 2], [0, 0], 2.0)
    # The optimum gives a 3 cores and b its share: 2.45 + 1.
    split = solve_split(curves, 5, 0, 2)
    assert dict(split.allocations) == {"a": (3, 0), "b": (2, 0)}
    assert split.objective == pytest.approx(3.45)


def test_ties_give_the_fewest_cores_then_the_earlier_job_less():
    # Flat curves: any point is the share's progress, so nobody gets anything.
    flat = np.full((5, 3), 7.0)
    split = solve_split([JobCurve("x", 1, flat), JobCurve("y", 1, flat)], 4, 2, 2)
    assert dict(split.allocations) == {"x": (0, 0), "y": (0, 0)} and split.objective == 2.0
    # Two identical jobs, one spare core: it goes to the later job, the earlier one keeps fewer.
    curve = np.array([[0.0], [1.0], [2.0], [2.0]])
    split = solve_split([JobCurve("x", 1, curve), JobCurve("y", 1, curve)], 3, 0, 2)
    assert dict(split.allocations) == {"x": (1, 0), "y": (2, 0)} and split.objective == 3.0


def test_floors_that_cannot_fit_are_reported_not_dropped():
    gnmt = np.array([[0, 0], [10, 10], [10, 10], [10, 10]], dtype=float)
    resnet = np.array([[0, 0], [2, 3], [4, 6], [6, 9]], dtype=float)
    curves = [JobCurve("gnmt", 1, gnmt), JobCurve("resnet18", 1, resnet)]
    # Shares of a 3-core node with 2 GPUs: 1 core each (rounded down); with 1 core
    # available only one floor fits.
    split = solve_split(curves, 3, 1, 2, available_cores=1)
    assert not split.feasible and split.allocations == {} and split.objective == -INF
    assert "job 'gnmt' needs >= 1 cores" in split.reason and "job 'resnet18' needs >= 1 cores" in split.reason
    assert "together >= 2 cores" in split.reason
    assert dict(split.proportional) == {"gnmt": (1, 0), "resnet18": (1, 0)}
    # Jobs whose floors need more than is available at all are named on their own.
    split = solve_split(curves, 3, 1, 2, available_cores=0)
    assert not split.feasible
    assert "jobs 'gnmt', 'resnet18' reach the GPU-proportional progress only with more than 0 cores" in split.reason
    # On a 4-core node the shares are 2 cores: ResNet's floor needs 2, GNMT's still 1.
    curves = [JobCurve("gnmt", 1, np.vstack([gnmt, gnmt[-1:]])), JobCurve("resnet18", 1, np.vstack([resnet, [6, 9]]))]
    split = solve_split(curves, 4, 1, 2, available_cores=1)
    assert not split.feasible
    assert split.reason.endswith("job 'resnet18' reaches the GPU-proportional progress only with more than 1 cores "
                                 "or 1 memory units")


def test_floors_that_fit_one_by_one_but_not_together():
    # Shares (2 cores, 1 memory unit) of a 4-core, 2-unit node; each floor is met with
    # 2 cores and 1 unit, or with 1 core and 2 units. With 3 cores available, each job
    # fits on its own, but two of either, or one of each, overrun a capacity.
    rate = np.array([[0, 0, 0], [1, 1, 5], [1, 5, 5], [1, 5, 5], [1, 5, 5]], dtype=float)
    split = solve_split([JobCurve("a", 1, rate), JobCurve("b", 1, rate)], 4, 2, 2, available_cores=3)
    assert not split.feasible
    assert "job 'a' needs >= 1 cores and >= 1 memory units; job 'b' needs >= 1 cores" in split.reason
    assert "no combination meets every floor at once" in split.reason
    assert solve_split([JobCurve("a", 1, rate), JobCurve("b", 1, rate)], 4, 2, 2).feasible


def test_no_jobs_is_an_empty_split():
    split = solve_split([], 4, 2, 2)
    assert split.feasible and split.allocations == {} and split.objective == 0.0


def test_a_curve_is_a_read_only_copy():
    rates = np.ones((3, 2))
    curve = JobCurve("a", 1, rates)
    rates[1, 0] = 9.0
    assert curve.throughput[1, 0] == 1.0 and not curve.throughput.flags.writeable


GOOD = np.ones((3, 2))  # a node of 2 cores and 1 memory unit; a 1-GPU share of 2 GPUs is (1, 0)


def changed(point, value):
    out = GOOD.copy()
    out[point] = value
    return out


@pytest.mark.parametrize("make, message", [
    (lambda: JobCurve("a", 0, GOOD), "job 'a': gpus must be a whole number >= 1, got 0"),
    (lambda: JobCurve("a", True, GOOD), "job 'a': gpus must be a whole number >= 1, got True"),
    (lambda: JobCurve(["a"], 1, GOOD), "job ['a']: job_id must be hashable"),
    (lambda: JobCurve("a", 1, np.ones(3)),
     "job 'a': throughput must be a 2-D table [cores][memory units], got shape (3,)"),
    (lambda: JobCurve("a", 1, [["x", 1.0]]), "job 'a': throughput must be numbers"),
    (lambda: JobCurve("a", 1, changed((1, 1), INF)), "job 'a': throughput at (1 cores, 1 memory units) is +inf"),
    (lambda: JobCurve("a", 1, changed((2, 0), -1.0)),
     "job 'a': throughput at (2 cores, 0 memory units) is negative (-1.0)"),
    (lambda: solve_split([JobCurve("a", 1, GOOD), JobCurve("a", 1, GOOD)], 2, 1, 2), "job 'a' appears more than once"),
    (lambda: solve_split([JobCurve("b", 1, GOOD)], 3, 1, 2),
     "job 'b': throughput has shape (3, 2); a node of 3 cores and 1 memory units needs (4, 2)"),
    (lambda: solve_split([JobCurve("a", 1, GOOD), JobCurve("b", 2, GOOD)], 2, 1, 2),
     "the jobs ask for 3 GPUs together ('a': 1, 'b': 2); the node has 2"),
    (lambda: solve_split([JobCurve("c", 1, changed((1, 0), math.nan))], 2, 1, 2),
     "job 'c': throughput at its GPU-proportional share, (1 cores, 0 memory units), is not measured"),
    (lambda: solve_split([JobCurve("c", 1, changed((1, 0), -INF))], 2, 1, 2), "job 'c': throughput at its GPU-pro"),
    (lambda: solve_split([JobCurve("c", 1, changed((1, 0), 0.0))], 2, 1, 2),
     "job 'c': throughput at its GPU-proportional share, (1 cores, 0 memory units), is 0"),
    (lambda: solve_split([JobCurve("c", 1, changed((1, 0), 1e-300) * changed((2, 1), 1e300))], 2, 1, 2),
     "job 'c': throughput over its share's (1e-300) overflows"),
    (lambda: solve_split([], -1, 1, 2), "cores must be a whole number >= 0, got -1"),
    (lambda: solve_split([], 2, 1.5, 2), "memory_units must be a whole number >= 0, got 1.5"),
    (lambda: solve_split([], 2, 1, 0), "node_gpus must be a whole number >= 1, got 0"),
    (lambda: solve_split([JobCurve("a", 1, GOOD)], 2, 1, 2, available_cores=3),
     "available_cores must be a whole number in 0..2, got 3"),
    (lambda: solve_split(["a"], 2, 1, 2), "curves must be JobCurve, got str"),
])
def test_bad_inputs_are_refused_naming_the_job(make, message):
    with pytest.raises(SplitError) as e:
        make()
    assert message in str(e.value)
