"""The simulated node: scenario files, the workload model, and a short run."""

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.waiting import wait_for
from nodesim.scenario import ScenarioError, parse_scenario
from nodesim.workload import MODELS, contention, gpu_utilisation

BASE = "duration_s: 5\nnode: {gpus: 2}\nevents:\n"


@pytest.mark.parametrize("events,error", [
    ("  - {at: 0, start: {id: a, model: GPT-9}}", "events[0].start.model: 'GPT-9' is not one of"),
    ("  - {at: 0, start: {id: a, model: BiDAF, gpu: 2}}", "events[0].start.gpu: 2 is not a GPU index below 2"),
    ("  - {at: 0, start: {id: a, cpu: hog, colour: red}}", "events[0].start: unknown key(s) ['colour']"),
    ("  - {at: 0, start: {id: a, cpu: hog}}\n  - {at: 0, start: {id: a, cpu: hog}}", "job 'a' started twice"),
    ("  - {at: 2, start: {id: a, cpu: hog}}\n  - {at: 1, stop: {id: a}}", "is before the previous event"),
    ("  - {at: 1, stop: {id: a}}", "job 'a' is not running at 1.0s"),
    ("  - {at: 0, start: {id: a, cpu: hog, cpu_gbps: 3}}", "give exactly one of cpu"),
    ("  - {at: 0, fault: {counters: Weird}}", "expected Unavailable, Error, Unassigned or null"),
    ("  - {at: 0, explode: {}}", "unknown action 'explode'"),
    ("  - {at: 0, fault: {nvml_call: {call: teleport, code: 3}}}", "events[0].fault.nvml_call.call: 'teleport'"),
    ("  - {at: 0, fault: {nvml_call: {call: processes, code: 0}}}", "expected an NVML return code 1..999"),
    ("  - {at: 0, fault: {nvml_call: {call: processes, code: 3, gpu: 99}}}", "99 is not a GPU index"),
    ("  - {at: 0, fault: {nvml_call: processes}}", "expected {call: NAME"),
])
def test_scenario_errors_name_the_event_and_key(events, error):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(BASE + events, "s.yaml")
    assert error in str(e.value) and str(e.value).startswith("s.yaml")


def test_scenario_top_level_errors():
    with pytest.raises(ScenarioError, match="missing key"):
        parse_scenario("events: []", "s.yaml")
    with pytest.raises(ScenarioError, match="node.profile 'sparc'"):
        parse_scenario("duration_s: 1\nnode: {profile: sparc}\nevents: []", "s.yaml")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        parse_scenario("duration_s: [", "s.yaml")


@st.composite
def scenarios(draw):
    n = draw(st.integers(0, 8))
    lines, t = [], 0.0
    for i in range(n):
        t += round(draw(st.floats(0, 5)), 2)
        if draw(st.booleans()):
            lines.append(f"  - {{at: {t:.2f}, start: {{id: g{i}, model: {draw(st.sampled_from(sorted(MODELS)))}, gpu: "
                         f"{draw(st.integers(0, 3))}}}}}")
        else:
            lines.append(f"  - {{at: {t:.2f}, start: {{id: c{i}, cpu_gbps: {draw(st.floats(0, 100)):.2f}}}}}")
    return "seed: 3\nduration_s: 60\nnode: {gpus: 4}\nevents:\n" + ("\n".join(lines) if lines else "  []"), n


@given(scenarios())
def test_generated_scenarios_parse_completely(case):
    text, n = case
    s = parse_scenario(text.replace("events:\n  []", "events: []"))
    assert len(s.events) == n and len(s.jobs) == n
    assert [e.at for e in s.events] == sorted(e.at for e in s.events)


@given(st.floats(0, 1), st.floats(0, 1))
def test_contention_is_monotonic_and_bounded(a, b):
    lo, hi = sorted((a, b))
    assert 0 <= contention(lo) <= contention(hi) <= 1


def test_models_behave_as_coda_reports():
    saturated = 1.0
    for name in ("BiDAF", "Transformer"):  # NLP: at least a 50 % drop
        m = MODELS[name]
        assert gpu_utilisation(m, saturated) <= 0.5 * m.solo_util + 1e-9
    for name in ("VGG16", "InceptionV3", "ResNet-50"):  # insensitive
        m = MODELS[name]
        assert gpu_utilisation(m, saturated) >= 0.95 * m.solo_util
    alexnet, deepspeech, wavenet = MODELS["AlexNet"], MODELS["DeepSpeech"], MODELS["WaveNet"]
    assert gpu_utilisation(alexnet, saturated) < 0.9 * alexnet.solo_util  # AlexNet is affected
    assert deepspeech.sensitivity > wavenet.sensitivity  # DeepSpeech more than WaveNet
    assert max(MODELS.values(), key=lambda m: m.demand_gbps if m.category == "CV" else 0).name == "AlexNet"
    for m in MODELS.values():  # no contention below the knee
        assert gpu_utilisation(m, 0.5) == m.solo_util


@pytest.mark.fuse
def test_a_hog_slows_an_nlp_job_on_the_simulated_node_and_it_recovers_when_the_hog_stops():
    from nodesim.node import SimNode
    from nodesim.run import build_telemetry

    scenario = parse_scenario(
        "seed: 1\nduration_s: 60\nnode: {gpus: 2, peak_gbps: 8}\nevents:\n"
        "  - {at: 0, start: {id: bert, model: BiDAF, gpu: 0}}\n"
        "  - {at: 0.5, start: {id: hog, cpu: hog}}\n"
        "  - {at: 2.5, stop: {id: hog}}\n", "inline")
    solo = MODELS["BiDAF"].solo_util
    with SimNode(scenario) as sim:
        telemetry = build_telemetry(sim, process_events=False)
        try:
            def util_seen():
                sim.step()
                return telemetry.sample().jobs.get("sim:bert")

            slow = wait_for(lambda: (j := util_seen()) and j.gpu_util is not None and j.gpu_util < 0.6 * solo and j,
                            timeout=10, interval=0.1, what="the hog to slow the NLP job")
            assert slow.kind == "gpu" and slow.meta.category == "NLP"
            wait_for(lambda: (j := util_seen()) and sim.elapsed > 2.5 and j.gpu_util > 0.9 * solo,
                     timeout=10, interval=0.1, what="recovery after the hog stopped")
        finally:
            telemetry.close()
        groups = sim.open_resctrl().owned_groups()
    assert groups == []


def test_noded_sim_refuses_a_bad_scenario(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "  - {at: 0, start: {id: a, cpu: hog, colour: red}}\n")
    out = subprocess.run([sys.executable, "-m", "noded", "sim", "--scenario", str(bad)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "events[0].start: unknown key(s) ['colour']" in out.stderr


@pytest.mark.fuse
def test_adopted_processes_are_modelled_and_never_stopped(sleeper):
    """A job manager's processes (a one-host Slurm's jobs) adopted by the node: a CPU job's
    demand follows its CPUs, a GPU job's utilisation the contention; released, they run on."""
    from nodesim.node import SimNode
    from nodesim.scenario import JobSpec

    scenario = parse_scenario("seed: 1\nduration_s: 60\nnode: {gpus: 1, peak_gbps: 8}\nevents: []\n", "inline")
    hog, gpu = sleeper(), sleeper()
    cpus = sorted(os.sched_getaffinity(hog.pid))
    with SimNode(scenario) as sim:
        sim.adopt(JobSpec("gpu", model="BiDAF", gpu=0), gpu.pid)
        assert sim.step().gpu_util["gpu"] > 0.9 * MODELS["BiDAF"].solo_util
        sim.adopt(JobSpec("hog", cpu_gbps=16.0), hog.pid)
        with pytest.raises(ValueError, match="exists already"):
            sim.adopt(JobSpec("hog", cpu_gbps=1.0), hog.pid)
        slowed = wait_for(lambda: (s := sim.step()).gpu_util["gpu"] < 0.6 * MODELS["BiDAF"].solo_util and s,
                          timeout=10, interval=0.1, what="the adopted hog to slow the GPU job")
        if len(cpus) > 1:
            os.sched_setaffinity(hog.pid, cpus[:1])
            wait_for(lambda: sim.step().granted_gbps < 0.75 * slowed.granted_gbps, timeout=10, interval=0.1,
                     what="the hog's demand to follow its CPUs")
        sim.release("hog")
        sim.release("gpu")
        assert sim.step().running == ()
    assert hog.poll() is None and gpu.poll() is None
