"""The NVML sampler through NVIDIA's own pynvml wrappers, over the fake nvmlLib."""

import ctypes.util

import pynvml
import pytest

from noded.samplers.nvml import NvmlSampler
from noded.sim import fake_nvml as fake


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def gpus():
    gpus = fake.make_gpus(3)
    clock = Clock()
    lib = fake.FakeNvmlLib(gpus, clock=clock)
    lib.test_clock = clock
    fake.install(lib)
    yield gpus, lib
    fake.install(None)


def test_devices_and_their_fields(gpus):
    g, lib = gpus
    g[0].util_gpu, g[0].util_memory = 71, 30
    g[0].processes[4242] = fake.FakeProcess(4242, used_memory=3 << 30, sm_util=70)
    g[2].compute_mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    s = NvmlSampler().sample(0.0)
    assert s.available and s.driver_version == "550.54.15" and len(s.gpus) == 3
    d0 = s.gpus[0]
    assert d0.uuid == g[0].uuid and d0.name == "NVIDIA A100-SXM4-80GB"
    assert (d0.util_gpu, d0.util_memory, d0.memory_used) == (71, 30, 3 << 30)
    assert d0.pids() == {4242} and dict(d0.process_sm_util) == {4242: 70}
    assert s.gpus[2].compute_mode == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert s.gpus[1].processes == () and s.gpus[1].error is None


def test_mps_clients_are_listed_and_the_server_marked(gpus):
    g, _ = gpus
    g[1].mps_server_pid = 900
    g[1].mps_clients = {11: fake.FakeProcess(11, sm_util=30), 12: fake.FakeProcess(12, sm_util=20)}
    d1 = NvmlSampler().sample(0.0).gpus[1]
    by_pid = {p.pid: p for p in d1.processes}
    assert by_pid[900].mps_server and by_pid[11].mps_client and by_pid[12].mps_client
    # NVML credits the clients' work to the server process.
    assert dict(d1.process_sm_util) == {900: 50}


def test_process_utilisation_not_found_keeps_the_last_samples(gpus):
    g, lib = gpus
    g[0].processes[7] = fake.FakeProcess(7, sm_util=55)
    sampler = NvmlSampler()
    assert dict(sampler.sample(0.0).gpus[0].process_sm_util) == {7: 55}
    g[0].processes[7].sm_util = 10
    # Same driver timestamp: NVML answers NotFound (no new samples); the last ones stand.
    assert dict(sampler.sample(0.0).gpus[0].process_sm_util) == {7: 55}
    lib.test_clock.t += 0.5
    assert dict(sampler.sample(0.0).gpus[0].process_sm_util) == {7: 10}


def test_a_gpu_lost_mid_run_is_marked_and_the_others_still_read(gpus):
    g, _ = gpus
    sampler = NvmlSampler()
    assert not any(d.lost for d in sampler.sample(0.0).gpus)
    g[1].lost = True
    s = sampler.sample(1.0)
    assert s.gpus[1].lost and s.gpus[1].error == "GpuIsLost" and s.gpus[1].util_gpu is None
    assert s.gpus[0].uuid == g[0].uuid and s.gpus[2].util_gpu == 0


def test_unsupported_and_forbidden_fields_are_missing_not_fatal(gpus):
    g, _ = gpus
    g[0].faults["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    g[0].faults["nvmlDeviceGetComputeRunningProcesses_v3"] = pynvml.NVML_ERROR_NO_PERMISSION
    g[0].memory_total = 16 << 30
    d0 = NvmlSampler().sample(0.0).gpus[0]
    assert d0.util_gpu is None and d0.memory_total == 16 << 30 and not d0.lost
    assert "GetUtilizationRates: NotSupported" in d0.error and "NoPermission" in d0.error


def test_driver_not_loaded_then_loaded_retries_at_its_own_pace(gpus):
    _, lib = gpus
    lib.driver_loaded = False
    sampler = NvmlSampler(retry_s=30)
    s = sampler.sample(0.0)
    assert not s.available and s.reason == "NVIDIA driver not loaded" and s.gpus == ()
    lib.driver_loaded = True
    assert not sampler.sample(10.0).available  # not retried before retry_s
    assert lib.calls["nvmlInitWithFlags"] == 1
    assert sampler.sample(31.0).available


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this host has a real NVML")
def test_no_nvml_library_at_all_makes_a_cpu_only_node():
    fake.install(None)  # pynvml will try to load libnvidia-ml.so.1 for real
    s = NvmlSampler().sample(0.0)
    assert not s.available and "NVML library not found" in s.reason and s.gpus == ()
