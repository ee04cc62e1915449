"""The simulated node's GPU jobs on their core curves (issue #13): simulated cores from the
real CPUs a job's process has, GPU utilisation on the curve, iteration times reported
through noded's report socket by the job's own process."""

import os
import random
import shutil
import statistics
import tempfile

import pytest

from support.rebuild import rebuilt
from noded.rightsize.curves import MODEL_CURVES
from nodesim import reporter
from nodesim.node import SimNode
from nodesim.scenario import ScenarioError, load_scenario, parse_scenario
from nodesim.workload import MODELS
from support.waiting import wait_for
from support.paths import REPO_ROOT

SCENARIOS = os.path.join(REPO_ROOT, "scenarios")
REAL = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(REAL) < 2, reason="slimming a job needs at least 2 CPUs")

#: AlexNet peaks at 4 cores (CODA IV-B1); on a node of 4 simulated cores a job on every
#: real CPU is at its optimum, and one real CPU is 4 / (real CPUs) simulated cores.
ALEXNET = "seed: 1\nduration_s: 600\nnode: {gpus: 1, cpus: 4}\nevents:\n  - {at: 0, start: {id: a, model: AlexNet%s}}\n"


def expected_util(sim, real_cpus):
    return MODELS["AlexNet"].solo_util * MODEL_CURVES["AlexNet"].share(sim.simulated_cores(real_cpus))


def test_every_simulated_model_has_a_core_curve():
    assert set(MODELS) <= set(MODEL_CURVES)
    for name, m in MODELS.items():
        assert MODEL_CURVES[name].category == m.category


def test_node_cpus_maps_real_cpus_proportionally():
    sim = SimNode(parse_scenario("duration_s: 1\nnode: {cpus: 64}\nevents: []", "s"))
    assert sim.real_cpus == len(REAL) and sim.cpus == 64
    assert sim.simulated_cores(len(REAL)) == 64  # every real CPU: the whole simulated host
    assert sim.simulated_cores(1) == pytest.approx(64 / len(REAL))  # the granularity: one real CPU
    default = SimNode(parse_scenario("duration_s: 1\nevents: []", "s"))
    assert default.cpus == len(REAL) and default.simulated_cores(1) == 1  # one simulated core per real CPU


def test_who_follows_the_curve():
    text = ("duration_s: 1\nnode: {gpus: 2%s}\nevents:\n  - {at: 0, start: {id: g, model: BiDAF}}\n"
            "  - {at: 0, start: {id: h, model: VGG16, gpu: 1, cpu_curve: %s}}\n  - {at: 0, start: {id: c, cpu: hog}}\n")
    without = parse_scenario(text % ("", "true"))
    curve = {j.id: j.cpu_curve for j in without.jobs.values()}
    assert curve == {"g": False, "h": True, "c": False}
    with_cpus = parse_scenario(text % (", cpus: 16", "false"))  # node.cpus: every GPU job, unless it says not
    assert (with_cpus.jobs["g"].cpu_curve, with_cpus.jobs["h"].cpu_curve) == (True, False)
    for name in ("contention.yaml", "demo.yaml"):  # the demo's and the tests' scenarios: as before
        s = load_scenario(os.path.join(SCENARIOS, name))
        assert s.node.cpus is None and not any(j.cpu_curve or j.reports for j in s.jobs.values()), name
    s = load_scenario(os.path.join(SCENARIOS, "rightsize.yaml"))
    assert s.node.cpus == 16 and all(j.cpu_curve for j in s.jobs.values() if j.is_gpu)
    assert {j.id for j in s.jobs.values() if j.reports} == {"alexnet", "bidaf"}


@pytest.mark.parametrize("node, start, error", [
    ("cpus: 0", "cpu: hog", "s.yaml: node.cpus must be an integer 1..4096 (the simulated host's CPUs), got 0"),
    ("cpus: 2.5", "cpu: hog", "s.yaml: node.cpus must be an integer 1..4096"),
    ("cpus: true", "cpu: hog", "s.yaml: node.cpus must be an integer 1..4096"),
    ("cpus: many", "cpu: hog", "s.yaml: node.cpus must be an integer 1..4096"),
    ("cpus: 5000", "cpu: hog", "s.yaml: node.cpus must be an integer 1..4096"),
    ("cpus: 8", "cpu: hog, cpu_curve: true", "s.yaml: events[0].start.cpu_curve: only a GPU job (model)"),
    ("cpus: 8", "cpu_gbps: 3, reports: true", "s.yaml: events[0].start.reports: only a GPU job (model)"),
    ("gpus: 1", "model: BiDAF, cpu_curve: often",
     "s.yaml: events[0].start.cpu_curve: expected true or false, got 'often'"),
    ("gpus: 1", "model: BiDAF, reports: 1", "s.yaml: events[0].start.reports: expected true or false, got 1"),
    ("gpus: 1", "model: BiDAF, reports: true", "s.yaml: events[0].start.reports: iteration times come from the job's "
                                               "core curve"),
    ("cpus: 8", "model: BiDAF, cpu_curve: false, reports: true", "events[0].start.reports: iteration times come"),
    ("cpus: 8", "model: BiDAF, reports: true, command: [sleep, '9']", "events[0].start.reports: the reporter is the "
                                                                      "job's process"),
])
def test_curve_keys_are_checked_by_event_and_key(node, start, error):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(f"duration_s: 5\nnode: {{{node}}}\nevents:\n  - {{at: 0, start: {{id: a, {start}}}}}\n",
                       "s.yaml")
    assert error in str(e.value)


def test_the_reporter_draws_from_the_curve_and_reads_only_whole_states(tmp_path):
    path = str(tmp_path / "state.json")
    assert reporter.read_state(path) is None
    (tmp_path / "state.json").write_text("{not json")
    assert reporter.read_state(path) is None
    reporter.write_state(path, 2.0, 0.5)
    assert reporter.read_state(path) == (2.0, 0.5)
    rng = random.Random(3)
    times = [reporter.iteration_time("AlexNet", 2.0, 0.5, rng) for _ in range(400)]
    mean = 1 / MODEL_CURVES["AlexNet"].throughput(2.0) / 0.5  # half speed under contention: twice as long
    assert statistics.mean(times) == pytest.approx(mean, rel=0.01)
    assert reporter.main(["x", "GPT-9", "1"]) == 2


def _util_at(sim, sim_id="a"):
    state = sim.step()
    return state.gpu_util[sim_id], state.cores[sim_id]


@pytest.mark.fuse
@needs_two_cpus
def test_a_gpu_job_slimmed_through_its_affinity_runs_slower_on_its_curve_and_recovers():
    """noded slims a job without a cpuset of its own through the affinity of its threads."""
    from nodesim.run import build_telemetry

    with SimNode(parse_scenario(ALEXNET % ", cpu_curve: true", "inline")) as sim:
        telemetry = build_telemetry(sim, process_events=False)
        try:
            util, cores = _util_at(sim)
            pid = sim.procs["a"].pid
            assert cores == 4 and util == pytest.approx(expected_util(sim, len(REAL)), abs=3)
            # noded reads the mean of NVML's samples since its last read: read these first
            assert telemetry.sample().jobs["sim:a"].gpu_util == pytest.approx(util, abs=1)
            os.sched_setaffinity(pid, {REAL[0]})
            util, cores = _util_at(sim)
            assert cores == pytest.approx(4 / len(REAL))
            assert util == pytest.approx(expected_util(sim, 1), abs=3) and util < 0.7 * MODELS["AlexNet"].solo_util
            seen = telemetry.sample().jobs["sim:a"]
            assert seen.kind == "gpu" and seen.gpu_util == pytest.approx(util, abs=1)  # what noded reads through NVML
            os.sched_setaffinity(pid, set(REAL))
            util, cores = _util_at(sim)
            assert cores == 4 and util == pytest.approx(expected_util(sim, len(REAL)), abs=3)
            assert telemetry.sample().jobs["sim:a"].gpu_util == pytest.approx(util, abs=1)
        finally:
            telemetry.close()


@pytest.mark.fuse
@needs_two_cpus
def test_a_gpu_job_slimmed_through_a_real_cpuset_follows_it(v1_cpuset):
    _, mkcg = v1_cpuset
    job_dir = mkcg("job")
    with SimNode(parse_scenario(ALEXNET % "", "inline")) as sim:  # node.cpus: every GPU job on its curve
        sim.step()
        with open(f"{job_dir}/cgroup.procs", "w") as f:
            f.write(str(sim.procs["a"].pid))
        with open(f"{job_dir}/cpuset.cpus", "w") as f:
            f.write(str(REAL[0]))
        util, cores = _util_at(sim)
        assert cores == pytest.approx(4 / len(REAL)) and util == pytest.approx(expected_util(sim, 1), abs=3)
        with open(f"{job_dir}/cpuset.cpus", "w") as f:
            f.write(",".join(map(str, REAL)))
        util, cores = _util_at(sim)
        assert cores == 4 and util == pytest.approx(expected_util(sim, len(REAL)), abs=3)


@pytest.mark.fuse
def test_jobs_without_the_curve_run_as_before():
    text = "seed: 1\nduration_s: 600\nnode: {gpus: 1}\nevents:\n  - {at: 0, start: {id: a, model: AlexNet}}\n"
    with SimNode(parse_scenario(text, "inline")) as sim:
        state = sim.step()
        os.sched_setaffinity(sim.procs["a"].pid, {REAL[0]})
        again = sim.step()
        assert state.cores == again.cores == {}
        for s in (state, again):
            assert s.gpu_util["a"] == pytest.approx(MODELS["AlexNet"].solo_util, abs=3)  # its cores change nothing


@pytest.mark.fuse
@needs_two_cpus
@pytest.mark.timeout(120)
def test_a_reporting_job_reports_the_curves_iteration_times_to_noded(tmp_path):
    from noded.admin.server import AdminServer
    from noded.commands.wiring import build_daemon
    from noded.colocation.admission import ColocationRule
    from noded.colocation.outcomes import Outcomes
    from noded.colocation.service import Colocation
    from noded.config import Config, MetricsConfig

    class Recorded(Outcomes):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.reports = []

        def report(self, job, seconds, peers):
            self.reports.append((job, seconds))
            super().report(job, seconds, peers)

    scratch = tempfile.mkdtemp(prefix="noded-sim-report-")  # short: a socket path has 108 bytes
    sim = SimNode(parse_scenario(ALEXNET % ", reports: true", "inline")).start()
    server = daemon = None
    try:
        # as `noded run --sim` does: noded's config pointed at the node, and its report socket
        config = sim.configure(Config(tick_s=0.25, metrics=MetricsConfig(port=0)), scratch)
        assert sim.report_socket == config.report_socket and config.report_socket.startswith(scratch)
        os.makedirs(config.runtime_dir, mode=0o755)
        daemon = build_daemon(config, discovery=sim.discovery).daemon
        outcomes = Recorded(str(tmp_path / "outcomes"))
        daemon = rebuilt(daemon, colocation=Colocation(ColocationRule(), {}, mps=None, clock=daemon.clock,
                                                       outcomes=outcomes))
        server = AdminServer(config.report_socket, daemon, group=None, reports_only=True).start()

        def reports_after(n):
            sim.step()
            daemon.tick()  # the job's pids in noded's last sample: its reports are taken
            return len(outcomes.reports) >= n

        wait_for(lambda: reports_after(6), timeout=30, interval=0.1, what="six reports at the optimum")
        pid = sim.procs["a"].pid
        assert {job for job, _ in outcomes.reports} == {"sim:a"}
        at_optimum = 1 / MODEL_CURVES["AlexNet"].throughput(4)
        assert statistics.median(s for _, s in outcomes.reports) == pytest.approx(at_optimum, rel=0.1)

        os.sched_setaffinity(pid, {REAL[0]})  # slimmed to one real CPU, as noded would
        sim.step()  # the state file says so before this returns
        n0 = len(outcomes.reports)  # at most the one iteration already under way is at the old cores
        wait_for(lambda: reports_after(n0 + 5), timeout=60, interval=0.1, what="five reports slimmed")
        slim = 1 / MODEL_CURVES["AlexNet"].throughput(sim.simulated_cores(1))
        assert statistics.median(s for _, s in outcomes.reports[n0 + 1:]) == pytest.approx(slim, rel=0.1)
        assert slim > 1.5 * at_optimum
    finally:
        if server is not None:
            server.stop()
        if daemon is not None:
            daemon.shutdown()
        sim.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    assert sim.scratch is None  # the jobs' state files went with the node
