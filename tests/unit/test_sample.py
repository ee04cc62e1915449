"""build_sample joins jobs, GPUs and bandwidth into per-job facts (pure)."""

from noded.jobs.model import Job
from noded.samplers.mongroups import MonitorReport
from noded.samplers.sample import CPU, GPU, build_sample
from noded.samplers import SamplerStatus
from noded.samplers.bandwidth import BandwidthSample
from noded.samplers.nvml import GpuProcess, GpuSample, NvmlSample


def gpu(index, procs=(), sm=(), util=None):
    return GpuSample(index, f"GPU-{index}", "A100", util, 0, 0, 1, 0, tuple(procs), tuple(sm))


def job(jid, *pids):
    return Job(jid, "registered", frozenset(pids))


def test_gpu_jobs_cpu_jobs_and_their_utilisation():
    jobs = {"a": job("a", 1, 2), "b": job("b", 3), "c": job("c", 4)}
    nvml = NvmlSample(True, None, "550", (
        gpu(0, [GpuProcess(2, 1)], [(2, 60)], util=60),
        gpu(1, [GpuProcess(4, 1)], util=45),  # no per-process samples: alone on the device
    ))
    bw = BandwidthSample((0, 1), {0: 5e9, 1: 4e9}, {"a": {0: 1e9, 1: 2e9}, "b": {0: 3e9, 1: None}}, ())
    s = build_sample(10.0, jobs, MonitorReport({"a": "own", "b": "own", "c": "shared"}, {}, (), False), nvml, bw)
    assert s.jobs["a"].kind == GPU and s.jobs["a"].gpus == ("GPU-0",) and s.jobs["a"].gpu_util == 60
    assert s.jobs["a"].bandwidth_bps == 3e9
    assert s.jobs["b"].kind == CPU and s.jobs["b"].bandwidth_bps is None  # one domain unknown
    assert s.jobs["c"].kind == GPU and s.jobs["c"].gpu_util == 45 and s.jobs["c"].monitoring == "shared"
    assert s.node_bandwidth_total_bps == 9e9 and s.missing == ()


def test_mps_clients_share_the_servers_utilisation():
    jobs = {"x": job("x", 11), "y": job("y", 12), "z": job("z", 13)}
    procs = [GpuProcess(900, 1, mps_server=True), GpuProcess(11, 1, mps_client=True),
             GpuProcess(12, 1, mps_client=True), GpuProcess(13, 1, mps_client=True)]
    nvml = NvmlSample(True, None, "550", (gpu(0, procs, [(900, 90)], util=90),))
    s = build_sample(0.0, jobs, None, nvml, None)
    assert [s.jobs[j].gpu_util for j in "xyz"] == [30, 30, 30]
    assert all(s.jobs[j].kind == GPU for j in "xyz")


def test_unknowns_are_none_and_named():
    jobs = {"a": job("a", 1)}
    shared = gpu(0, [GpuProcess(1, 1), GpuProcess(5, 1)], util=80)  # shared, no per-process samples
    lost = GpuSample(1, None, None, None, None, None, None, None, error="GpuIsLost", lost=True)
    nvml = NvmlSample(True, None, "550", (shared, lost))
    bw = BandwidthSample((0,), {0: None}, {}, ("node bandwidth on L3 domain 0",))
    s = build_sample(0.0, jobs, None, nvml, bw, (SamplerStatus("jobs", True, 0.01),
                                                  SamplerStatus("x", False, 0.0, "OSError: gone")))
    assert s.jobs["a"].gpu_util is None and s.node_bandwidth_total_bps is None
    assert s.missing == ("sampler x: OSError: gone", "gpu 1: GpuIsLost", "node bandwidth on L3 domain 0")


def test_cpu_only_node():
    s = build_sample(0.0, {"a": job("a", 1)}, None, NvmlSample(False, "NVML library not found", None, ()), None)
    assert s.jobs["a"].kind == CPU and not s.nvml_available and s.missing == ("nvml: NVML library not found",)


from hypothesis import given, settings, strategies as st

from support.examples import examples

_pids = st.frozensets(st.integers(1, 30), max_size=6)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_pids, min_size=1, max_size=6), st.lists(_pids, max_size=5))
def test_each_job_holds_exactly_the_gpus_one_of_its_processes_is_on_in_gpu_order(job_pids, gpu_pids):
    """A GPU is a job's when any of its processes is on it; processes shared between jobs
    (a registered tree inside a cgroup job) count for both. Against the definition, GPU by GPU."""
    jobs = {f"j{i}": job(f"j{i}", *pids) for i, pids in enumerate(job_pids)}
    gpus = tuple(gpu(i, [GpuProcess(p, 1) for p in sorted(pids)]) for i, pids in enumerate(gpu_pids))
    s = build_sample(0.0, jobs, None, NvmlSample(True, None, "550", gpus), None)
    for jid, j in jobs.items():
        expected = tuple(g.uuid for g in gpus if {p.pid for p in g.processes} & j.pids)
        assert s.jobs[jid].gpus == expected
        assert s.jobs[jid].kind == (GPU if expected else CPU)
