"""Metrics exposition (golden names/types/labels/help, promtool), and the run/check-config CLI."""

import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from types import MappingProxyType, SimpleNamespace

import pytest

from support.waiting import ended, wait_for
from prometheus_client import generate_latest

from noded.loop.watching import Watch
from noded.actuators.cpusets import CpuSetResult
from noded.actuators.memsoft import MemoryResult
from noded.samplers.memcgroups import MemoryCgroup
from noded.actuators.plan import Applied
from noded.loop.overrides import Override
from resctrl import MbFlavour
from noded.colocation.view import ColocationView
from noded.config import Config
from noded.loop.control import ControlState
from noded.capping.service import CapState
from noded.loop.daemon import MemoryView, TickResult
from noded.loop.parts import Parts
from noded.jobs.model import JobMeta
from noded.loop.metrics import make_registry
from noded.policy.contention import Action, Decision
from noded.rightsize.memsplit import MemorySplit
from noded.rightsize.service import JobSizingView, RightsizeView
from noded.samplers.sample import JobSample, Sample
from noded.samplers import SamplerStatus
from noded.samplers.nvml import GpuProcess, GpuSample
from noded.samplers.resctrl import GroupsView, ResctrlFacts
from noded.loop.tickstats import TickStats
from support.paths import TESTS_DIR
from support.system import popen_noded

GOLDEN = os.path.join(TESTS_DIR, "golden", "metrics.txt")


def fixed_daemon():
    gpu = GpuSample(0, "GPU-5e3a0000", "A100", 40, 10, 1, 2, 0, (GpuProcess(11, 1),), ((11, 40),))
    jobs = {
        "sim:bert": JobSample("sim:bert", "registered", frozenset({11}), JobMeta(category="NLP"), "gpu",
                              ("GPU-5e3a0000",), 40.0, 0.5e9, "own"),
        "sim:hog": JobSample("sim:hog", "registered", frozenset({12}), JobMeta(), "cpu", (), None, 8e9, "own"),
    }
    sample = Sample(10.0, MappingProxyType(jobs), (gpu,), True, None, (0, 1),
                    MappingProxyType({0: 4.5e9, 1: 4.4e9}), ("gpu 1: GpuIsLost",),
                    (SamplerStatus("jobs", True, 0.004, None, 0.003), SamplerStatus("nvml", True, 0.001),
                     SamplerStatus("resctrl", False, 0.002, "OSError: gone")), True,
                    ResctrlFacts(1, 128, 7, MbFlavour.PERCENT,
                                 GroupsView(MappingProxyType({"noded-mba-1": frozenset({12})}),
                                            MappingProxyType({"noded-mba-1": {0: 80, 1: 80}}),
                                            MappingProxyType({"noded-job-bert": "", "noded-job-hog": "noded-mba-1"}))))
    action = Action("sim:hog", 0, 1, "node bandwidth 95% >= 75%", "contention")
    decision = Decision(MappingProxyType({"sim:hog": 1}), (action,), True, 0.95, ("sim:bert",), "")
    control = ControlState(SimpleNamespace(current=lambda: {
        "sim:hog": Override("sim:hog", 2, 1000, "maintenance", 0.0, None)}))
    control.record(10.0, [action], None)
    durations = {"sample": 0.01, "decide": 0.0001, "act": 0.002, "total": 0.0121}
    stats = TickStats()
    stats.tick(durations, [(st.name, st.ok, st.duration_s, st.cpu_s) for st in sample.samplers])
    stats.actuator_error("mba", "throttle")
    stats.tick_failed()
    bert = JobSizingView("sim:bert", "1000", "BERT", 32, "NLP", 1, "gpu_utilisation", "sized", "done", "searched", 2, 4,
                         None, 2, 3, "category", ((3, 40.0), (2, 41.0), (1, 30.0)), 0, None, 2, (1, 2),
                         "sized: 2 cores", None, True)
    rightsize = RightsizeView(MappingProxyType({"sim:bert": bert}), MappingProxyType({"sim:hog": (3,)}), (3,), (),
                              4, probes=3, sized=1)
    cpus = CpuSetResult((), MappingProxyType({"sim:bert": (1, 2), "sim:hog": (0, 3)}))
    bert_cg = MemoryCgroup("/sys/fs/cgroup/memory/bert", 1, str(3 << 30), 1 << 30, 2 << 30)
    memory = MemoryView(MemorySplit(MappingProxyType({"sim:bert": 4}), MappingProxyType({"sim:bert": 8}), 1 << 30,
                                    "optimal"),
                        MemoryResult((), MappingProxyType({"sim:bert": bert_cg}),
                                     MappingProxyType({"sim:bert": str(3 << 30)}), MappingProxyType({})))
    result = TickResult(7, 10.0, sample, decision, (Applied("sim:hog", 1, ("rename …",)),),
                        MappingProxyType(durations), "mba",
                        MappingProxyType({"sim:hog": 1}), None, MappingProxyType({"sim:bert": (80.0, "learned")}),
                        Config(peak_gbps_per_domain=10), 1, MappingProxyType({}),
                        ColocationView(MappingProxyType({"admit": 2, "refuse": 1}),
                                       MappingProxyType({"GPU-5e3a0000": 2}), "ok", "ΣC rule", 1),
                        control.snapshot(), stats.snapshot(), rightsize, cpus, memory,
                        (Watch("jobs", True, "2 jobs from sim"), Watch("gpus", True, "1 GPUs through NVML"),
                         Watch("resctrl", False, "resctrl unavailable")),
                        MappingProxyType({"sim:hog": CapState(6e9, "override", "an operator's cap", "noded", 6.1e9,
                                                              "30..40 (20 % at 40)", busy_threads=4)}))
    return SimpleNamespace(last=result, totals=result.totals, parts=Parts(None),
                           extra_info={"throttle": "mba", "dry_run": "false"},
                           liveness=SimpleNamespace(last_round_wall=1_700_000_000.5))


def shape(exposition: str) -> str:
    """HELP/TYPE lines as they are; samples as name{label names}: what the golden file guards."""
    out = []
    for line in exposition.splitlines():
        if line.startswith("#"):
            out.append(line)
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ", line)
        labels = sorted(re.findall(r'([a-zA-Z_]+)="', m.group(3) or ""))
        out.append(f"{m.group(1)}{{{','.join(labels)}}}")
    return "\n".join(dict.fromkeys(out)) + "\n"


def test_exposition_matches_the_golden_file():
    text = generate_latest(make_registry(fixed_daemon())).decode()
    assert 'noded_gpu_utilization_ratio{UUID="GPU-5e3a0000",gpu="0"} 0.4' in text
    assert 'noded_job_throttle_level{job_id="sim:hog",method="mba"} 1.0' in text
    assert 'noded_throttle_actions_total{action="throttle",cause="contention"} 1.0' in text
    assert 'noded_override_active{job_id="sim:hog",kind="throttle",uid="1000"} 1.0' in text
    assert 'noded_actuator_errors_total{actuator="mps",operation="restart"} 1.0' in text
    assert 'noded_tick_duration_seconds_bucket{le="0.025",stage="total"} 1.0' in text
    assert 'noded_sampler_cpu_seconds_total{sampler="jobs"} 0.003' in text
    assert 'noded_sampler_cpu_seconds_total{sampler="cpus"} 0.0' in text  # every sampler, counted or not
    assert 'noded_job_cpus{job_id="sim:bert",role="gpu"} 2.0' in text
    assert 'noded_job_sizing_state{job_id="sim:bert",state="sized"} 1.0' in text
    assert 'noded_job_memory_soft_limit_bytes{job_id="sim:bert"} 3.221225472e+09' in text
    assert "noded_last_tick_timestamp_seconds 1.7000000005e+09" in text
    assert 'noded_watching{what="jobs"} 1.0' in text and 'noded_watching{what="resctrl"} 0.0' in text
    assert 'noded_job_bandwidth_cap_bytes_per_second{job_id="sim:hog",source="override"} 6e+09' in text
    assert 'noded_job_cap_measured_bytes_per_second{job_id="sim:hog",mode="noded"} 6.1e+09' in text
    if os.environ.get("NODED_UPDATE_GOLDEN"):
        with open(GOLDEN, "w") as f:
            f.write(shape(text))
    with open(GOLDEN) as f:
        assert shape(text) == f.read()


def scrape_of_the_simulated_node_with_colocation(tmp_path):
    from test_metrics import colocation_node_exposition

    return colocation_node_exposition(tmp_path)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
@pytest.mark.parametrize("exposition", [
    pytest.param(lambda tmp_path: generate_latest(make_registry(fixed_daemon())), id="fixed"),
    pytest.param(scrape_of_the_simulated_node_with_colocation, id="simulated-node-colocation", marks=pytest.mark.fuse),
])
def test_promtool_accepts_the_exposition(tmp_path, exposition):
    text = exposition(tmp_path)
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
    assert p.returncode == 0 and p.stdout.strip() == b"" and p.stderr.strip() == b"", p.stdout + p.stderr


def test_check_config(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("tick_s: 0.5\ncontention: {threshold: 0.8}\n")
    bad.write_text("tick_s: 0.5\ncontention:\n  treshold: 0.8\n")
    run = lambda f: subprocess.run([sys.executable, "-m", "noded", "check-config", str(f)], capture_output=True,
                                   text=True, timeout=60)
    assert run(good).returncode == 0
    p = run(bad)
    assert p.returncode == 1 and f"{bad}:3: contention.treshold: unknown key" in p.stderr


@pytest.mark.fuse
def test_noded_run_on_the_simulated_node_prints_the_metrics_url_first_and_stops_clean(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick_s: 0.25\nmetrics: {port: 0}\ncontention: {hold_s: 1, settle_s: 0.25}\n")
    p = popen_noded(["run", "--sim", "scenarios/contention.yaml", "--config",
                          str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        url = re.fullmatch(r"noded: metrics at (http://127\.0\.0\.1:\d+/metrics)\n", first).group(1)

        def scrape() -> str:
            return urllib.request.urlopen(url, timeout=5).read().decode()

        def throttled() -> str | None:
            text = scrape()
            return text if re.search(r'noded_job_throttle_level{job_id="cgroup:hog",method="mba"} [1-9]', text) else None

        body = wait_for(throttled, timeout=60, interval=0.25, what="the hog throttled, in the metrics")
        assert "noded_node_memory_bandwidth_bytes_per_second" in body
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        assert "noded: stopped; throttles released, groups removed.\nnoded: simulated node torn down.\n" in out
    finally:
        ended(p)


@pytest.mark.fuse
@pytest.mark.parametrize("profile", ["intel", "no-mba"])
def test_dry_run_decides_and_logs_each_write_once_but_writes_nothing(tmp_path, caplog, profile):
    import logging

    from support.eliminator import NLP_AND_HOG, Harness

    h = Harness(tmp_path, NLP_AND_HOG, profile=profile, dry_run=True)
    try:
        with caplog.at_level(logging.INFO, logger="noded.actuators"):
            r = h.until(lambda r: r.applied, 15, "a throttle decision")
            hog = next(iter(r.sample.jobs["sim:hog"].pids))
            affinity = os.sched_getaffinity(hog)
            for _ in range(8):
                h.tick()
        first = r.applied[0].writes[0]
        assert first.startswith("mkdir noded-mba-1; schemata MB=" if profile == "intel" else "sched_setaffinity(")
        assert h.rc().list_ctrl_groups() == [] and os.sched_getaffinity(hog) == affinity
        assert not (tmp_path / "state").exists()  # no originals, no baselines, not even the directory
        would = [rec.message for rec in caplog.records if "would write" in rec.message]
        levels = {a.to_level for a in h.actions() if a.job == "sim:hog"}
        assert len(would) == len(levels), would  # each planned change once, not once a tick
        assert all(r.levels == {} for r in h.results)  # nothing is in force
    finally:
        h.stop()


def test_the_shipped_config_documents_the_real_defaults():
    from noded.config import Config, load_config

    assert load_config("config/noded.yaml") == Config()
