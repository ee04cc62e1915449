"""Admission end to end on the simulated node with the MPS stand-in, and the
reservation lifecycle."""

import os
import sys
from types import MappingProxyType

import pynvml
import pytest

from noded.admin import nodectl
from noded.colocation.admission import ColocationRule
from noded.colocation.profiles import JobProfile
from noded.colocation.service import Colocation
from noded.jobs.model import JobMeta
from noded.sample import JobSample, Sample
from noded.samplers.nvml import GpuSample

STANDIN = os.path.join(os.path.dirname(sys.executable), "nvidia-cuda-mps-control-standin")

PROFILES = """
VGG11: {64: {C: 12.0e6, M: 10.0e6, window_us: 1.0e6}}
SE-Net: {64: {C: 15.0e6, M: 11.0e6, window_us: 1.0e6}}
ResNet-18: {64: {C: 18.0e6, M: 12.0e6, window_us: 1.0e6}}
ResNet-50: {256: {C: 38.0e6, M: 30.0e6, window_us: 1.0e6}}
"""


@pytest.mark.fuse
def test_admission_on_the_simulated_node_under_mps(tmp_path, capsys):
    from test_eliminator import Harness

    from noded.admin.overrides import OverrideStore
    from noded.admin.server import AdminServer
    from noded.app import build_colocation

    (tmp_path / "profiles.yaml").write_text(PROFILES)
    h = Harness(tmp_path, "  []", gpus=1)
    try:
        import dataclasses

        from noded.config import ColocationConfig, MpsConfig

        config = dataclasses.replace(h.config, runtime_dir=str(tmp_path / "run"), colocation=ColocationConfig(
            enabled=True, profiles=str(tmp_path / "profiles.yaml"), threshold_c=60.0,
            mps=MpsConfig(control=STANDIN, log_dir=str(tmp_path / "mpslog"))))
        h.daemon.colocation = build_colocation(config, h.daemon.clock)
        gpu = h.sim.gpus[0]
        assert gpu.compute_mode == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
        h.tick()
        server = AdminServer(str(tmp_path / "noded.sock"), h.daemon, OverrideStore(str(tmp_path / "st"), lambda: 0.0),
                             group=None).start()
        admit = lambda job, model, bs: (nodectl.main(["--socket", server.path, "admit", "--job", job, "--model", model,
                                                      "--batch-size", str(bs)]), capsys.readouterr().out)
        code, out = admit("slurm:1", "VGG11", 64)
        assert code == 0 and f"export CUDA_VISIBLE_DEVICES={gpu.uuid}" in out
        assert f"export CUDA_MPS_PIPE_DIRECTORY={tmp_path}/run/mps" in out and "ACTIVE_THREAD_PERCENTAGE=100" in out
        assert "GPU 0 is free" in out
        code, out = admit("slurm:2", "SE-Net", 64)
        assert code == 0 and "becomes 27.0 <= 60 with 2 jobs" in out and "ACTIVE_THREAD_PERCENTAGE=50" in out
        code, out = admit("slurm:3", "ResNet-50", 256)  # the high-occupancy one
        assert code == nodectl.ADMIT_REFUSED and "would be 65.0 > threshold 60" in out
        code, out = admit("slurm:4", "ResNet-18", 64)
        assert code == 0 and "with 3 jobs" in out
        code, out = admit("slurm:5", "VGG11", 64)
        assert code == nodectl.ADMIT_REFUSED and "every GPU already holds 3 jobs" in out
        code, out = admit("slurm:6", "GPT-9", 8)
        assert code == nodectl.ADMIT_REFUSED and "no profile for GPT-9 at batch size 8" in out
        # The profile can come with the request instead, read by nodectl from an ncu export.
        ncu = tmp_path / "tiny.csv"
        ncu.write_text('"ID","gpu__time_duration.sum","sm__warps_active.avg.pct_of_peak_sustained_active",'
                       '"dram__throughput.avg.pct_of_peak_sustained_elapsed"\n"","usecond","%","%"\n"0","10","5","5"\n')
        h.daemon.colocation.release("slurm:4")
        code = nodectl.main(["--socket", server.path, "--json", "admit", "--job", "slurm:7", "--model", "tiny",
                             "--batch-size", "8", "--profile", str(ncu)])
        out = capsys.readouterr().out
        assert code == 0 and '"n_jobs_after": 3' in out and f"{ncu} (sent by uid 0)" in out
        server.stop()
        pipe = h.daemon.colocation.mps.pipe_dir
        h.daemon.shutdown()
        assert gpu.compute_mode == pynvml.NVML_COMPUTEMODE_DEFAULT and not os.path.exists(pipe)
    finally:
        h.sim.stop()


def sample_with(*job_ids):
    gpu = GpuSample(0, "GPU-a", "A100", 0, 0, 0, 1, 0)
    jobs = {j: JobSample(j, "registered", frozenset({1}), JobMeta(), "gpu", ("GPU-a",), 10.0, None, "own")
            for j in job_ids}
    return Sample(0.0, MappingProxyType(jobs), (gpu,), True, None, (), MappingProxyType({}), (), ())


def test_a_reservation_lasts_while_its_job_runs():
    now = [0.0]
    service = Colocation(ColocationRule(), {}, mps=None, clock=lambda: now[0])
    p = JobProfile("m", 8, 10e6, 5e6, 1e6, "test")
    assert service.admit("j", sample_with(), model="m", batch_size=8, profile=p).admit
    assert not service.admit("j", sample_with(), model="m", batch_size=8, profile=p).admit  # once only
    service.tick(sample_with("j"))  # it started
    service.tick(sample_with("j"))
    assert [r.job for r in service.reservations()] == ["j"]
    service.tick(sample_with())  # it ended
    assert service.reservations() == []
    assert service.admit("k", sample_with(), model="m", batch_size=8, profile=p).admit
    now[0] += 601  # never appeared
    service.tick(sample_with())
    assert service.reservations() == [] and service.decisions == {"admit": 2, "refuse": 1}
