"""The metrics contract, through real scrapes: counters from the first scrape, histograms
that grow with ticks, ``job_id`` (never ``job``), the resctrl capacity split, noded's own
process, failed writes and failed ticks counted, and a collector that reads one tick
result and nothing live."""

import math
import os
import threading
import time
import urllib.request
from types import MappingProxyType, SimpleNamespace

import pytest
from prometheus_client import generate_latest

from support.waiting import wait_for
from noded.loop.overrides import Override
from noded.colocation.admission import ColocationRule
from noded.colocation.service import Colocation
from noded.config import Config
from noded.loop.control import ControlState
from noded.loop.daemon import Daemon, TickResult
from noded.loop.parts import Parts
from noded.jobs.model import JobMeta
from noded.loop.health import Liveness
from noded.loop.metrics import (ACTIONS, ACTUATOR_OPERATIONS, ADMISSION_RESULTS, JOB_ERROR_STAGES, SAMPLERS, STAGES,
                           NodedCollector, make_registry)
from noded.policy.contention import Decision
from noded.samplers.sample import JobSample, Sample
from noded.samplers import SamplerStatus
from noded.samplers.nvml import GpuSample
from noded.server.budget import METRICS
from noded.server.metrics_http import MetricsServer
from support.metrics import parse, value


def http_scrape(server):
    return urllib.request.urlopen(server.url, timeout=5).read().decode()


@pytest.fixture
def serve():
    servers = []

    def start(daemon):
        s = MetricsServer(make_registry(daemon), "127.0.0.1", 0, METRICS).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def assert_every_counter_at_zero(values, *, colocation):
    for action, cause in ACTIONS:
        assert value(values, "noded_throttle_actions_total", action=action, cause=cause) == 0
    for actuator, operation in ACTUATOR_OPERATIONS:
        assert value(values, "noded_actuator_errors_total", actuator=actuator, operation=operation) == 0
    for sampler in SAMPLERS:
        assert value(values, "noded_sampler_errors_total", sampler=sampler) == 0
        assert value(values, "noded_sampler_duration_seconds_count", sampler=sampler) == 0
        assert value(values, "noded_sampler_cpu_seconds_total", sampler=sampler) == 0
    for stage in STAGES:
        assert value(values, "noded_tick_duration_seconds_count", stage=stage) == 0
        assert value(values, "noded_tick_duration_seconds_bucket", stage=stage, le="+Inf") == 0
    for result in ADMISSION_RESULTS:
        assert ((("noded_admission_decisions_total", frozenset({("result", result)})) in values) == colocation)
        if colocation:
            assert value(values, "noded_admission_decisions_total", result=result) == 0
    assert value(values, "noded_tick_failures_total") == 0
    for stage in JOB_ERROR_STAGES:
        assert value(values, "noded_tick_job_errors_total", stage=stage) == 0


def test_before_the_first_tick_a_scrape_has_the_build_info_and_every_counter_at_zero(tmp_path, serve):
    daemon = Daemon(Config(state_dir=str(tmp_path / "state")),
                    Parts(None, colocation=Colocation(ColocationRule(), {}, mps=None, clock=time.monotonic)))
    values, types = parse(http_scrape(serve(daemon)))
    assert_every_counter_at_zero(values, colocation=True)
    noded = {name for name in types if name.startswith("noded_")}
    assert noded == {"noded_build_info", "noded_throttle_method", "noded_dry_run", "noded_throttle_actions", "noded_admission_decisions", "noded_ticks",
                     "noded_tick_overruns", "noded_tick_failures", "noded_tick_job_errors", "noded_actuator_errors",
                     "noded_sampler_errors",
                     "noded_tick_duration_seconds", "noded_sampler_duration_seconds",
                     "noded_sampler_cpu_seconds", "noded_process_events", "noded_process_events_dropped",
                     "noded_process_events_unattributed",
                     "noded_reports_dropped"}
    assert types["noded_tick_duration_seconds"] == types["noded_sampler_duration_seconds"] == "histogram"
    assert value(values, "process_open_fds") > 0 and value(values, "process_resident_memory_bytes") > 0
    assert {"process_cpu_seconds", "process_max_fds", "process_start_time_seconds"} <= set(types)


def no_job_label(values):
    return [name for name, labels in values if "job" in dict(labels)]


@pytest.mark.fuse
def test_a_scrape_of_the_simulated_node_counts_ticks_and_a_failed_write(tmp_path, serve):
    from support.eliminator import NLP_AND_HOG, Harness

    h = Harness(tmp_path, NLP_AND_HOG)
    try:
        # Someone else holds every CLOSID: noded's MBA control group cannot be made
        # (ENOSPC from the emulator, as from the kernel), so its throttle write fails.
        root = h.rc().root
        taken = 0
        while True:
            try:
                os.mkdir(os.path.join(root, f"other{taken}"))
            except OSError:
                break
            taken += 1
        server = serve(h.daemon)
        before, _ = parse(http_scrape(server))
        assert_every_counter_at_zero(before, colocation=False)
        for _ in range(3):
            h.tick()
        first, _ = parse(http_scrape(server))
        assert value(first, "noded_ticks_total") == 3
        assert value(first, "noded_tick_duration_seconds_count", stage="total") == 3
        r = h.until(lambda r: any(a.error for a in r.applied), 15, "a throttle write that fails")
        later, _ = parse(http_scrape(server))
        ticks = value(later, "noded_ticks_total")
        assert ticks == len(h.results) > 3
        for stage in STAGES:
            buckets = [(float(dict(k)["le"]), v) for (n, k), v in later.items()
                       if n == "noded_tick_duration_seconds_bucket" and dict(k)["stage"] == stage]
            assert [v for _, v in sorted(buckets)] == sorted(v for _, v in buckets)  # cumulative
            assert value(later, "noded_tick_duration_seconds_count", stage=stage) == ticks
            assert value(later, "noded_tick_duration_seconds_bucket", stage=stage, le="+Inf") == ticks
            for le in ("0.005", "0.1", "1.0", "10.0", "+Inf"):
                assert value(later, "noded_tick_duration_seconds_bucket", stage=stage, le=le) >= \
                    value(first, "noded_tick_duration_seconds_bucket", stage=stage, le=le)
        assert value(later, "noded_sampler_duration_seconds_count", sampler="jobs") == ticks
        # noded's own CPU by sampler: each that ran took some, NVML's in its worker thread
        for sampler in ("jobs", "resctrl", "nvml"):
            assert value(later, "noded_sampler_cpu_seconds_total", sampler=sampler) > 0
        failed = [a for res in h.results for a in res.applied if a.error]
        assert failed and "mkdir noded-mba-1" in failed[0].error
        assert value(later, "noded_actuator_errors_total", actuator="mba", operation="throttle") == len(failed)
        assert value(later, "noded_actuator_errors_total", actuator="mba", operation="release") == 0
        assert value(later, "noded_throttle_actions_total", action="throttle", cause="contention") >= 1
        # The job label is job_id everywhere: Prometheus would rename `job` to exported_job.
        assert no_job_label(later) == []
        assert ("noded_job_throttle_level", frozenset({("job_id", "sim:hog"), ("method", "mba")})) in later
        # RMIDs and CLOSIDs: what the hardware offers, and what noded holds.
        assert value(later, "noded_resctrl_rmids_capacity") == 128
        assert value(later, "noded_resctrl_rmids_used_by_noded") == len(r.sample.resctrl.groups.mon_parent) >= 2
        assert value(later, "noded_resctrl_closids_capacity") == taken + 1  # the root's and the others'
        assert value(later, "noded_resctrl_closids_used_by_noded") == 0
        assert value(later, "process_open_fds") > 0
    finally:
        h.stop()


class FlakyTelemetry:
    """Samples an empty node; ``fail`` makes the next sample raise (a bug in a tick), and
    the nvml sampler fails every other tick."""

    discovery = events = None  # what the metrics read of telemetry: none here

    def __init__(self):
        self.fail = threading.Event()
        self.n = 0

    def sample(self, quiet=None):
        if self.fail.is_set():
            self.fail.clear()
            raise RuntimeError("a bug in the sampler")
        self.n += 1
        statuses = (SamplerStatus("jobs", True, 0.0004), SamplerStatus("nvml", self.n % 2 == 0, 0.03, "NVMLError"))
        return Sample(float(self.n), MappingProxyType({}), (), False, "no NVML", (0,), MappingProxyType({0: 1e9}),
                      (), statuses)

    def close(self):
        pass


def test_a_tick_that_raises_is_counted_in_the_next_result(tmp_path):
    telemetry = FlakyTelemetry()
    daemon = Daemon(Config(tick_s=0.02, state_dir=str(tmp_path / "state")), Parts(telemetry))
    stop = threading.Event()
    loop = threading.Thread(target=daemon.run, args=(stop,))
    loop.start()
    try:
        wait_for(lambda: daemon.last is not None and daemon.last.tick >= 2, what="two ticks")
        telemetry.fail.set()
        wait_for(lambda: daemon.last.totals.tick_failures == 1, what="the failure counted")
    finally:
        stop.set()
        loop.join(timeout=5)
    r = daemon.last
    values, _ = parse(generate_latest(make_registry(daemon)).decode())
    assert value(values, "noded_tick_failures_total") == r.totals.tick_failures == 1
    # every tick that completed was counted, the failed one not
    assert value(values, "noded_tick_duration_seconds_count", stage="sample") == r.tick == telemetry.n
    assert value(values, "noded_sampler_errors_total", sampler="nvml") == (telemetry.n + 1) // 2  # odd ticks
    assert value(values, "noded_sampler_errors_total", sampler="jobs") == 0
    assert value(values, "noded_sampler_duration_seconds_bucket", sampler="nvml", le="0.025") == 0
    assert value(values, "noded_sampler_duration_seconds_bucket", sampler="nvml", le="0.05") == telemetry.n
    assert value(values, "noded_sampler_duration_seconds_sum", sampler="nvml") == pytest.approx(0.03 * telemetry.n)


def result_with(control, gpus=(), jobs=None, baselines=None):
    sample = Sample(1.0, MappingProxyType(jobs or {}), tuple(gpus), True, None, (), MappingProxyType({}), (), ())
    return TickResult(1, 1.0, sample, Decision(MappingProxyType({}), (), False, None, (), ""), (),
                      MappingProxyType({}), "mba", MappingProxyType({}), None,
                      MappingProxyType(baselines or {}), Config(), 0, control=control.snapshot())


def test_the_collector_reads_the_tick_result_and_nothing_live():
    overrides = {"slurm:1": Override("slurm:1", 2, 1000, "maintenance", 0.0, None)}
    control = ControlState(SimpleNamespace(current=lambda: dict(overrides)))
    control.pause("maintenance")
    result = result_with(control)
    collector = NodedCollector(lambda: result, {"throttle": "mba"})  # nothing but the result to read
    # The live state moves on after the tick; the scrape shows the tick's.
    control.resume()
    overrides["slurm:2"] = Override("slurm:2", 0, 0, "", 0.0, None)
    families = {f.name: f for f in collector.collect()}
    assert families["noded_eliminator_paused"].samples[0].value == 1.0
    assert [(s.labels["job_id"], s.labels["kind"]) for s in families["noded_override_active"].samples] == \
        [("slurm:1", "throttle")]
    assert result.control.paused == "maintenance"
    with pytest.raises(AttributeError):
        result.control.paused = None  # frozen: a scrape cannot see it change


def test_gpu_utilisation_is_a_ratio_clamped_to_0_1_and_nan_is_left_out():
    gpus = [GpuSample(0, "GPU-a", "A100", 150, 0, 0, 1, 0), GpuSample(1, "GPU-b", "A100", -3, 0, 0, 1, 0),
            GpuSample(2, "GPU-c", "A100", math.nan, 0, 0, 1, 0), GpuSample(3, "GPU-d", "A100", 42, 0, 0, 1, 0)]
    jobs = {"slurm:1": JobSample("slurm:1", "registered", frozenset({1}), JobMeta(), "gpu", ("GPU-d",), 42.0,
                                 None, "own")}
    result = result_with(ControlState(), gpus, jobs, {"slurm:1": (120.0, "learned")})
    daemon = SimpleNamespace(last=result, totals=result.totals, extra_info={}, parts=Parts(None),
                             liveness=Liveness())
    values, _ = parse(generate_latest(make_registry(daemon)).decode())
    assert value(values, "noded_gpu_utilization_ratio", gpu="0", UUID="GPU-a") == 1.0
    assert value(values, "noded_gpu_utilization_ratio", gpu="1", UUID="GPU-b") == 0.0
    assert ("noded_gpu_utilization_ratio", frozenset({("gpu", "2"), ("UUID", "GPU-c")})) not in values
    assert value(values, "noded_gpu_utilization_ratio", gpu="3", UUID="GPU-d") == pytest.approx(0.42)
    assert value(values, "noded_job_gpu_utilization_ratio", job_id="slurm:1", gpu="3", UUID="GPU-d") == \
        pytest.approx(0.42)
    assert value(values, "noded_job_gpu_baseline_ratio", job_id="slurm:1", source="learned") == 1.0


def colocation_node_exposition(tmp_path) -> bytes:
    """A real scrape (HTTP) of a daemon on the simulated node with a GPU and co-location on
    (MPS through the stand-in), one job admitted and one refused: the co-location series
    are there (the promtool test lints this)."""
    import dataclasses

    from support.mps import STANDIN
    from support.eliminator import Harness

    from noded.colocation.profiles import JobProfile
    from noded.colocation.setup import build_colocation
    from noded.config import ColocationConfig, MpsConfig

    h = Harness(tmp_path, "  []", gpus=1)
    server = service = None
    try:
        config = dataclasses.replace(h.config, runtime_dir=str(tmp_path / "run"), colocation=ColocationConfig(
            enabled=True, mps=MpsConfig(control=STANDIN, log_dir=str(tmp_path / "mpslog"))))
        service = build_colocation(config, h.daemon.clock)  # MPS started, or nothing left if it raised
        h.rebuild(colocation=service)
        server = MetricsServer(make_registry(h.daemon), "127.0.0.1", 0, METRICS).start()
        before, _ = parse(http_scrape(server))
        assert_every_counter_at_zero(before, colocation=True)
        wait_for(lambda: service.mps_state == "ok", timeout=30, what="MPS up")
        r = h.tick()
        profile = JobProfile("m", 8, 10e6, 5e6, 1e6, "test")
        assert service.admit("slurm:1", r.sample, model="m", batch_size=8, profile=profile).admit
        assert not service.admit("slurm:1", r.sample, model="m", batch_size=8, profile=profile).admit  # twice
        h.tick()
        body = http_scrape(server)
    finally:
        if server is not None:
            server.stop()
        if service is not None:
            service.close()  # before the node goes, whatever failed (the daemon's stop closes it again: safe)
        h.stop()
    values, _ = parse(body)
    uuid = h.sim.gpus[0].uuid
    assert value(values, "noded_admission_decisions_total", result="admit") == 1
    assert value(values, "noded_admission_decisions_total", result="refuse") == 1
    assert value(values, "noded_colocation_jobs", UUID=uuid) == 1
    assert value(values, "noded_mps_up") == 1
    assert value(values, "noded_actuator_errors_total", actuator="mps", operation="restart") == 0
    assert value(values, "noded_gpu_utilization_ratio", gpu="0", UUID=uuid) <= 1
    assert no_job_label(values) == []
    return body.encode()


def literal_args(path, func, index):
    """The string constants (and module constants named) at argument ``index`` of every
    call to ``func`` (a function, or a method of that name) in a module's source."""
    import ast
    import importlib

    module = importlib.import_module(path)
    found = set()
    for node in ast.walk(ast.parse(open(module.__file__).read())):
        if isinstance(node, ast.Call) and len(node.args) > index and \
                (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == func:
            for leaf in ast.walk(node.args[index]):
                if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
                    found.add(leaf.value)
                elif isinstance(leaf, ast.Name) and isinstance(getattr(module, leaf.id, None), str):
                    found.add(getattr(module, leaf.id))
    return found


def test_every_cause_and_sampler_in_the_code_has_its_counters_from_the_start():
    causes = literal_args("noded.policy.contention", "set_level", 2)
    assert causes and causes <= {cause for _, cause in ACTIONS}, causes
    samplers = literal_args("noded.samplers.telemetry", "run", 0)
    assert samplers and samplers == set(SAMPLERS), samplers
