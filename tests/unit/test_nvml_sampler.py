"""The NVML sampler through NVIDIA's own pynvml over the stand-in libnvidia-ml.so.1 (loaded
in this process as a host loads the real one), the simulated GPUs in shared memory."""

import ctypes.util

import pynvml
import pytest

from noded.samplers.sample import CPU, GPU, UNKNOWN, build_sample
from noded.samplers import SamplerStatus
from noded.samplers.nvml import NvmlSampler
from noded.jobs.model import Job
from nodesim import gpus as simgpus
from support.nvml import T0, Clock, load, uuid

GIB = 1 << 30


def us(t):
    return int(t * 1e6)


def test_devices_and_their_fields(nvml_node):
    g = nvml_node.state.gpus
    g[0].util_gpu, g[0].util_memory, g[0].processes = 71, 30, [(4242, 3 * GIB)]
    nvml_node.record_samples(0, us(T0 - 0.5), [(4242, 70, 20)])
    nvml_node.publish(nvml_node.state)
    s = NvmlSampler(wall_clock=Clock()).sample(0.0)
    assert s.available and s.driver_version == "550.54.15" and len(s.gpus) == 3 and s.processes_known
    d0 = s.gpus[0]
    assert d0.uuid == uuid(0) and d0.name == "NVIDIA A100-SXM4-80GB"
    assert (d0.util_gpu, d0.util_memory) == (71, 30)
    assert d0.memory_used == 3 * GIB + g[0].memory_reserved  # a real GPU's used is never 0
    assert d0.pids() == {4242} and dict(d0.process_sm_util) == {4242: 70}
    assert s.gpus[1].processes == () and s.gpus[1].error is None and s.gpus[1].memory_used > 0


def test_mps_clients_are_listed_and_the_server_marked(nvml_node):
    g = nvml_node.state.gpus
    g[1].mps_server_pid, g[1].mps_clients = 900, [(11, GIB), (12, GIB)]
    nvml_node.record_samples(1, us(T0 - 0.2), [(900, 50, 10)])  # the driver credits the clients' work to the server
    nvml_node.publish(nvml_node.state)
    d1 = NvmlSampler(wall_clock=Clock()).sample(0.0).gpus[1]
    by_pid = {p.pid: p for p in d1.processes}
    assert by_pid[900].mps_server and by_pid[11].mps_client and by_pid[12].mps_client
    assert dict(d1.process_sm_util) == {900: 50}


def test_process_lists_are_read_whole_with_memory_the_driver_cannot_tell_as_none(nvml_node):
    # noded reads NVML's process lists through the structures' own fields (not pynvml's
    # friendly objects): every row of a long list, and the driver's "not available" for a
    # process's memory (2**64 - 1) as None, never as 16 EiB used
    g = nvml_node.state.gpus
    g[0].processes = [(1000 + i, (i + 1) * GIB) for i in range(40)] + [(77, 2**64 - 1)]
    g[1].mps_server_pid, g[1].mps_clients = 900, [(11, 2**64 - 1), (12, GIB)]
    nvml_node.publish(nvml_node.state)
    s = NvmlSampler(wall_clock=Clock()).sample(0.0)
    d0, d1 = s.gpus[0], s.gpus[1]
    assert {p.pid: p.used_memory for p in d0.processes} == {**{1000 + i: (i + 1) * GIB for i in range(40)}, 77: None}
    assert {(p.pid, p.used_memory, p.mps_client) for p in d1.processes if p.pid != 900} == {(11, None, True),
                                                                                             (12, GIB, True)}
    assert d0.error is None and d1.error is None and s.processes_known


def test_an_idle_process_is_idle_once_its_last_sample_is_older_than_the_hold(nvml_node):
    g = nvml_node.state.gpus
    g[0].processes = [(7, GIB), (8, GIB)]
    nvml_node.record_samples(0, us(T0 - 0.6), [(7, 50, 1), (8, 0, 0)])  # 8 is idle: the driver keeps no sample
    nvml_node.record_samples(0, us(T0 - 0.1), [(7, 60, 1)])
    nvml_node.publish(nvml_node.state)
    clock = Clock()
    sampler = NvmlSampler(wall_clock=clock, hold_s=3.0)
    assert dict(sampler.sample(0.0).gpus[0].process_sm_util) == {7: 55, 8: 0}  # the period's mean
    clock.t += 1.0  # nothing new (NOT_FOUND): within the hold the last figure stands
    assert dict(sampler.sample(1.0).gpus[0].process_sm_util) == {7: 55, 8: 0}
    clock.t += 3.0  # ... and past it the job is idle, not busy for ever
    assert dict(sampler.sample(4.0).gpus[0].process_sm_util) == {7: 0, 8: 0}
    nvml_node.record_samples(0, us(clock.t - 0.1), [(7, 20, 1)])
    nvml_node.publish(nvml_node.state)
    assert dict(sampler.sample(5.0).gpus[0].process_sm_util) == {7: 20, 8: 0}


def test_utilisation_out_of_range_is_clamped(nvml_node):
    nvml_node.state.gpus[0].util_gpu, nvml_node.state.gpus[0].util_memory = 104, 4294967295
    nvml_node.state.gpus[0].processes = [(7, GIB)]
    nvml_node.record_samples(0, us(T0), [(7, 130, 0)])
    nvml_node.publish(nvml_node.state)
    d0 = NvmlSampler(wall_clock=Clock()).sample(0.0).gpus[0]
    assert (d0.util_gpu, d0.util_memory, dict(d0.process_sm_util)) == (100, 100, {7: 100})


def test_a_gpu_lost_mid_run_is_marked_and_the_others_still_read(nvml_node):
    sampler = NvmlSampler(wall_clock=Clock())
    assert not any(d.lost for d in sampler.sample(0.0).gpus)
    nvml_node.state.gpus[1].lost = True
    nvml_node.publish(nvml_node.state)
    s = sampler.sample(1.0)
    assert s.gpus[1].lost and s.gpus[1].error == "GpuIsLost" and s.gpus[1].util_gpu is None
    assert s.gpus[0].uuid == uuid(0) and s.gpus[2].util_gpu == 0
    assert not s.processes_known  # whatever ran on the lost GPU is not known


def test_who_a_gpu_is_is_asked_once_an_init_and_again_after_it_was_lost(nvml_node):
    # A handle names one device until nvmlShutdown: its UUID and name are asked at the first
    # sample, not three calls a GPU every tick. A faulty name call after that is never made;
    # once the GPU was lost, who it is is asked again.
    sampler = NvmlSampler(wall_clock=Clock())
    assert sampler.sample(0.0).gpus[0].name == "NVIDIA A100-SXM4-80GB"
    nvml_node.state.gpus[0].faults = {"name": pynvml.NVML_ERROR_UNKNOWN, "uuid": pynvml.NVML_ERROR_UNKNOWN}
    nvml_node.publish(nvml_node.state)
    d0 = sampler.sample(1.0).gpus[0]
    assert (d0.uuid, d0.name, d0.error) == (uuid(0), "NVIDIA A100-SXM4-80GB", None)
    nvml_node.state.gpus[0].lost = True
    nvml_node.publish(nvml_node.state)
    assert sampler.sample(2.0).gpus[0].lost
    nvml_node.state.gpus[0].lost = False
    nvml_node.publish(nvml_node.state)
    d0 = sampler.sample(3.0).gpus[0]
    assert d0.uuid is None and d0.error is not None  # asked again: the faulty calls answer now
    nvml_node.state.gpus[0].faults = {}
    nvml_node.publish(nvml_node.state)
    assert sampler.sample(4.0).gpus[0].uuid == uuid(0)


def test_unsupported_and_forbidden_fields_are_missing_not_fatal(nvml_node):
    g = nvml_node.state.gpus
    g[0].faults = {"utilization": pynvml.NVML_ERROR_NOT_SUPPORTED, "processes": pynvml.NVML_ERROR_NO_PERMISSION}
    g[0].memory_total = 16 * GIB
    g[2].faults = {"mps_processes": pynvml.NVML_ERROR_NOT_SUPPORTED}  # no MPS there: no clients either
    nvml_node.publish(nvml_node.state)
    s = NvmlSampler(wall_clock=Clock()).sample(0.0)
    d0 = s.gpus[0]
    assert d0.util_gpu is None and d0.memory_total == 16 * GIB and not d0.lost
    assert "GetUtilizationRates: NotSupported" in d0.error and "NoPermission" in d0.error
    assert not d0.processes_known and s.gpus[2].processes_known and not s.processes_known


def test_a_driver_older_than_pynvml_is_a_failed_process_list_not_a_crash(nvml_node):
    load("no_v3")
    nvml_node.state.gpus[0].processes = [(7, GIB)]
    nvml_node.publish(nvml_node.state)
    s = NvmlSampler(wall_clock=Clock()).sample(0.0)
    d0 = s.gpus[0]
    assert not d0.processes_known and not s.processes_known and "LibraryMismatch" in d0.error
    assert d0.util_gpu == 0 and d0.uuid == uuid(0)  # the rest of the device is still read


def test_a_driver_not_loaded_leaves_the_gpu_jobs_unknown_and_is_retried_soon_then_less_often(nvml_node):
    # A GPU host whose driver is not up yet (noded started first at boot): its GPU jobs are
    # there, unseen; taking them for CPU jobs would throttle them blind.
    nvml_node.state.driver_loaded = False
    nvml_node.publish(nvml_node.state)
    sampler = NvmlSampler(retry_s=30, wall_clock=Clock())
    s = sampler.sample(0.0)
    assert not s.available and s.reason == "NVIDIA driver not loaded" and s.gpus == ()
    assert not s.processes_known
    nvml_node.state.driver_loaded = True
    nvml_node.publish(nvml_node.state)
    assert sampler.sample(1.0).available  # retried a second later


def test_init_retries_back_off_from_one_second_to_retry_s(nvml_node):
    nvml_node.state.driver_loaded = False
    nvml_node.publish(nvml_node.state)
    sampler = NvmlSampler(retry_s=5, wall_clock=Clock())
    sampler.sample(0.0)
    nvml_node.state.driver_loaded = True
    nvml_node.publish(nvml_node.state)
    assert not sampler.sample(0.9).available and sampler.sample(1.0).available  # the first retry after 1 s
    sampler.close()
    nvml_node.state.driver_loaded = False
    nvml_node.publish(nvml_node.state)
    sampler = NvmlSampler(retry_s=5, wall_clock=Clock())
    for t in (0.0, 1.0, 3.0, 7.0, 12.0):  # tried at each: 1, 2, 4 s apart, then retry_s
        assert not sampler.sample(t).available
    nvml_node.state.driver_loaded = True
    nvml_node.publish(nvml_node.state)
    assert not sampler.sample(16.9).available and sampler.sample(17.0).available


def test_a_count_that_fails_after_gpus_were_seen_leaves_the_processes_unknown(nvml_node):
    sampler = NvmlSampler(wall_clock=Clock())
    assert sampler.sample(0.0).processes_known
    nvml_node.state.faults = {"count": pynvml.NVML_ERROR_UNKNOWN}
    nvml_node.publish(nvml_node.state)
    s = sampler.sample(1.0)
    assert not s.available and "nvmlDeviceGetCount failed: Unknown" in s.reason and not s.processes_known


def test_a_job_on_no_gpu_is_of_unknown_kind_while_some_gpu_hides_its_processes(nvml_node):
    nvml_node.state.gpus[0].processes = [(7, GIB)]
    nvml_node.state.gpus[1].faults = {"processes": pynvml.NVML_ERROR_UNKNOWN}
    nvml_node.publish(nvml_node.state)
    jobs = {"a": Job("a", "registered", frozenset({7})), "b": Job("b", "registered", frozenset({8}))}
    s = build_sample(0.0, jobs, None, NvmlSampler(wall_clock=Clock()).sample(0.0), None)
    assert s.jobs["a"].kind == GPU and s.jobs["b"].kind == UNKNOWN  # b may be on GPU 1: never throttled as CPU
    nvml_node.state.gpus[1].faults = {}
    nvml_node.publish(nvml_node.state)
    s = build_sample(0.0, jobs, None, NvmlSampler(wall_clock=Clock()).sample(0.0), None)
    assert s.jobs["b"].kind == CPU
    failed = build_sample(0.0, jobs, None, None, None, (SamplerStatus("nvml", False, 0.0, "boom"),))
    assert failed.jobs["b"].kind == UNKNOWN and failed.jobs["a"].kind == UNKNOWN


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this host has a real NVML")
def test_no_nvml_library_at_all_makes_a_cpu_only_node():
    simgpus.install(None)  # pynvml will try to load libnvidia-ml.so.1 for real
    s = NvmlSampler().sample(0.0)
    assert not s.available and "NVML library not found" in s.reason and s.gpus == () and s.processes_known


def test_a_deadline_worker_makes_one_call_at_a_time_and_hands_back_its_error():
    import threading

    from mps.deadline import DeadlineWorker, StillRunning

    worker = DeadlineWorker("test")
    assert worker.call(lambda: 7, 1.0) == 7
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0, 1.0)
    release, calls = threading.Event(), []

    def stuck():
        calls.append(1)
        release.wait(10)
        return "late"

    with pytest.raises(StillRunning):
        worker.call(stuck, 0.05)
    with pytest.raises(StillRunning):
        worker.call(lambda: calls.append(2), 5.0)  # answered at once: the stuck call is in the way
    assert calls == [1] and sum(t.name == "test" for t in threading.enumerate()) == 1
    release.set()
    from support.waiting import wait_for

    wait_for(lambda: _returns(worker), timeout=5, what="the worker free again")
    worker.stop()


def test_a_deadline_worker_counts_the_cpu_its_calls_take_in_its_own_thread_in_flight_too():
    import threading
    import time

    from support.waiting import wait_for
    from mps.deadline import DeadlineWorker, StillRunning

    def spin(seconds):
        until = time.thread_time() + seconds
        while time.thread_time() < until:
            pass
        return threading.get_ident()

    worker = DeadlineWorker("test-cpu")
    caller_before = time.thread_time()
    ident = worker.call(lambda: spin(0.05), 10.0)
    caller_took = time.thread_time() - caller_before
    assert ident != threading.get_ident()  # it ran elsewhere...
    assert worker.cpu_s() >= 0.05  # ...and its CPU is counted as the worker's
    assert caller_took < 0.05  # waiting took the caller (next to) none
    # a call past its deadline (a driver spinning) is counted while it runs, not only after
    done_before = worker.cpu_s()
    with pytest.raises(StillRunning):
        worker.call(lambda: spin(0.6), 0.01)
    wait_for(lambda: worker.cpu_s() - done_before >= 0.1, timeout=10, what="the call in flight's CPU counted")
    in_flight = worker.cpu_s()
    wait_for(lambda: _returns(worker), timeout=10, what="the spinning call to return")
    assert worker.cpu_s() >= max(in_flight, done_before + 0.6)  # never counted back
    worker.stop()


def _returns(worker) -> bool:
    from mps.deadline import StillRunning

    try:
        return worker.call(lambda: True, 1.0)
    except StillRunning:
        return False
