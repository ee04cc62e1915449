"""Right-sizing in the daemon (issue #13), end to end on the simulated node: real
processes whose affinity noded changes, the simulated GPUs' utilisation following each
job's core curve at the CPUs it really has. The clock is the test's: each step is one
tick of 0.25 s, and nothing sleeps."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from support.rebuild import rebuilt
from noded.config import Config, MetricsConfig, RightsizeConfig
from noded.rightsize import allocator as alloc
from noded.rightsize import cpuplan
from noded.rightsize.curves import MODEL_CURVES
from nodesim.node import SimNode
from nodesim.scenario import parse_scenario

REAL = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(REAL) != 2, reason="the expectations are for a host of 2 CPUs")

#: a on GPU 0 and a CPU job that may borrow from the start; b (same owner and model) arrives
#: on GPU 1 at 30 s while a runs. On 2 real CPUs and 16 simulated ones, one real CPU is 8
#: simulated cores: AlexNet (best at 4) is faster on 8 than on 16. At CHANGE_AT a's input
#: changes (another curve: VGG16's, 10 % faster at its answer); the other tests end before.
CHANGE_AT = 120
SCENARIO = f"""
seed: 3
duration_s: 600
node: {{gpus: 2, cpus: 16}}
events:
  - {{at: 0, start: {{id: a, model: AlexNet, gpu: 0}}}}
  - {{at: 0, start: {{id: c, cpu: batch}}}}
  - {{at: 30, start: {{id: b, model: AlexNet, gpu: 1}}}}
  - {{at: {CHANGE_AT}, change: {{id: a, model: VGG16}}}}
"""


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture(params=["auto", "cores"])
def node(request):
    """The simulated node's host has MBA (auto: the throttle is MBA, the owner of CPUs only
    sizes and lends), or noded is told to halve cores (the plan holds the levels too)."""
    from noded.commands.wiring import build_daemon
    from noded.config import ContentionConfig

    clock = Clock()
    scratch = tempfile.mkdtemp(prefix="noded-rs-")
    sim = SimNode(parse_scenario(SCENARIO, "inline"), clock=clock).start()
    built = None
    try:
        config = sim.configure(Config(tick_s=0.25, metrics=MetricsConfig(port=0),
                                      contention=ContentionConfig(method=request.param), rightsize=RightsizeConfig(
            sources=("registered",), lend_to=("registered",), warmup_s=1.0, max_window_s=20.0)), scratch)
        os.makedirs(config.runtime_dir, mode=0o755)
        built = build_daemon(config, discovery=sim.discovery, clock=clock)
        assert built.daemon.parts.throttle.kind == ("cores" if request.param == "cores" else "mba")
        yield sim, built.daemon, clock
    finally:
        if built is not None:
            built.daemon.shutdown()
        sim.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def run(sim, daemon, clock, until, seconds):
    for _ in range(int(seconds / 0.25)):
        clock.t += 0.25
        sim.step()
        result = daemon.tick()
        if until(result):
            return result
    raise AssertionError(f"not reached in {seconds}s: {daemon.last.rightsize}")


def affinity(sim, sim_id):
    return set(os.sched_getaffinity(sim.procs[sim_id].pid))


@pytest.mark.fuse
@needs_two_cpus
def test_a_gpu_job_is_probed_for_real_sized_at_its_curves_best_remembered_and_lends_its_idle_cores(node):
    sim, daemon, clock = node
    seen: set[int] = set()

    def a_sized(result):
        seen.add(len(affinity(sim, "a")))
        v = result.rightsize.jobs.get("sim:a")
        return v is not None and v.state == "sized"

    result = run(sim, daemon, clock, a_sized, 25)
    v = result.rightsize.jobs["sim:a"]
    # the best of the curve at the granularity there is: 1 real CPU (8 simulated cores) or 2 (16)
    curve = MODEL_CURVES["AlexNet"]
    best = max((1, 2), key=lambda n: curve.share(sim.simulated_cores(n)))
    assert seen == {1, 2}  # probed for real: both sizes were the job's affinity
    assert v.optimal == best == 1 and v.reason == alloc.SEARCHED and {c for c, _ in v.points} == {1, 2}
    assert v.remembered and v.owner == str(os.getuid())
    assert result.levels == {}  # no contention here: no CPU job is at a level (lent CPUs are no level)
    run(sim, daemon, clock, lambda r: len(affinity(sim, "a")) == 1 and affinity(sim, "c") == {REAL[0]}, 2)
    # its idle core is lent to the CPU job (lend_to: registered)
    r = daemon.last
    assert r.rightsize.borrowed == {"sim:c": (REAL[0],)} and r.rightsize.lent == (REAL[0],)
    # b arrives: of the same owner and model, it starts at a's answer (the place its search
    # looks first after the top); the lent core is taken back for it in the same tick
    result = run(sim, daemon, clock, lambda r: "sim:b" in r.rightsize.jobs, 30)
    vb = result.rightsize.jobs["sim:b"]
    assert vb.start_source == alloc.FROM_HISTORY and vb.target == 1 and vb.planned == (REAL[0],)
    assert affinity(sim, "b") == {REAL[0]} and affinity(sim, "a") == {REAL[1]}
    assert result.rightsize.borrowed == {} and result.rightsize.lent == ()  # taken back at once
    assert affinity(sim, "c") == {REAL[0]}  # its last CPU kept (beside b's): a CPU job never has none
    result = run(sim, daemon, clock, lambda r: r.rightsize.jobs["sim:b"].state in ("sized", "limited"), 15)
    vb = result.rightsize.jobs["sim:b"]
    # the remembered answer decides nothing unmeasured: b is measured (at the plan's ceiling of
    # one CPU, its top now) before it is sized
    assert vb.reason in (alloc.SEARCHED, alloc.LIMITED) and vb.points and vb.optimal == 1
    # every original back at stop
    daemon.shutdown()
    assert affinity(sim, "a") == affinity(sim, "b") == affinity(sim, "c") == set(REAL)


@pytest.mark.fuse
@needs_two_cpus
def test_nothing_changes_while_no_source_is_sized(node):
    sim, daemon, clock = node
    daemon = rebuilt(daemon, rightsize=None, cpu_owner=None)  # as built with rightsize.sources empty
    result = run(sim, daemon, clock, lambda r: r.tick >= 40, 15)
    assert result.rightsize is None and result.cpus is None
    assert affinity(sim, "a") == affinity(sim, "c") == set(REAL)
    assert cpuplan.LENT  # (the plan's vocabulary is importable without right-sizing on)


@pytest.mark.fuse
@needs_two_cpus
def test_while_paused_no_probe_begins_or_moves_on(node):
    sim, daemon, clock = node
    result = run(sim, daemon, clock, lambda r: "sim:a" in r.rightsize.jobs, 5)
    first = result.rightsize.jobs["sim:a"]
    assert first.state == "probing"
    daemon.control.pause("maintenance")
    for _ in range(84):  # 21 s paused: more than a probe's longest window (max_window_s 20)
        clock.t += 0.25
        sim.step()
        result = daemon.tick()
        v = result.rightsize.jobs["sim:a"]
        assert (v.state, v.target, v.points) == (first.state, first.target, first.points)
    daemon.control.resume()
    # the window starts again at the resume: the probe is measured, not ended empty-handed
    result = run(sim, daemon, clock, lambda r: r.rightsize.jobs["sim:a"].points != first.points, 8)
    assert result.rightsize.jobs["sim:a"].reason != alloc.NO_SIGNAL


@pytest.mark.slow
@pytest.mark.fuse
@needs_two_cpus
def test_a_gpu_job_whose_curve_changes_while_it_runs_is_noticed_and_probed_again_for_real(node):
    sim, daemon, clock = node
    run(sim, daemon, clock, lambda r: r.rightsize.jobs.get("sim:a") is not None
        and r.rightsize.jobs["sim:a"].state == "sized", 25)
    run(sim, daemon, clock, lambda r: len(affinity(sim, "a")) == 1, 2)
    held = daemon.last.rightsize.jobs["sim:a"]
    assert sim.elapsed < CHANGE_AT - 12
    # at rest until the change: its passive windows at the answer (the first sets the
    # reference), b's arrival beside it, and no probe started on its own
    def at_rest_until_the_change(result):
        v = result.rightsize.jobs["sim:a"]
        assert v.state in ("sized", "limited") and v.start_source != alloc.FROM_DRIFT, v
        return sim.specs["a"].model == "VGG16"

    run(sim, daemon, clock, at_rest_until_the_change, CHANGE_AT + 1)
    # the scenario's change event: the job's input or batch changed under noded
    seen: set[int] = set()

    def probed_again(result):
        seen.add(len(affinity(sim, "a")))
        v = result.rightsize.jobs["sim:a"]
        return v.state == "probing" and v.start_source == alloc.FROM_DRIFT

    result = run(sim, daemon, clock, probed_again, 30)
    v = result.rightsize.jobs["sim:a"]
    # from the top (its CPUs, or what the plan can give it once b has arrived), nothing kept
    top = v.max_cores if v.ceiling is None else min(v.ceiling, v.max_cores)
    assert v.target == top and {c for c, _ in v.points} <= {top}
    seen.clear()

    def sized_again(result):
        seen.add(len(affinity(sim, "a")))
        return result.rightsize.jobs["sim:a"].state in ("sized", "limited")

    result = run(sim, daemon, clock, sized_again, 30)
    assert seen == ({1, 2} if top == 2 else {1})  # probed for real: the top, then fewer, to its answer
    v = result.rightsize.jobs["sim:a"]
    assert v.optimal == 1 and v.points != held.points


@pytest.mark.parametrize("event, says", [
    ("{at: 5, change: {id: x, model: VGG16}}", "job 'x' is not running at 5"),
    ("{at: 5, change: {id: c, model: VGG16}}", "only a GPU job's curve can change"),
    ("{at: 5, change: {id: r, model: VGG16}}", "a reporting job's iteration times come from its own process"),
    ("{at: 5, change: {id: a, model: Nope}}", "events[3].change.model: 'Nope' is not one of"),
    ("{at: 5, change: {id: a}}", "events[3].change"),
])
def test_a_change_event_names_a_running_gpu_job_and_a_model(event, says):
    from nodesim.scenario import ScenarioError
    text = ("duration_s: 10\nnode: {gpus: 2, cpus: 16}\nevents:\n  - {at: 0, start: {id: a, model: AlexNet, gpu: 0}}\n"
            "  - {at: 0, start: {id: c, cpu: batch}}\n"
            "  - {at: 0, start: {id: r, model: AlexNet, gpu: 1, reports: true}}\n  - " + event + "\n")
    with pytest.raises(ScenarioError) as raised:
        parse_scenario(text, "s.yaml")
    assert says in str(raised.value) and str(raised.value).startswith("s.yaml: events[3]")
    ok = parse_scenario(text.replace(event, "{at: 5, change: {id: a, model: VGG16}}"), "s.yaml")
    assert ok.events[-1].action == "change" and ok.events[-1].args == {"id": "a", "model": "VGG16"}
