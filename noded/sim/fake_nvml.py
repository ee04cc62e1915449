"""A stand-in for libnvidia-ml.so.1 at the boundary pynvml calls into.

pynvml loads the C library into the module global ``pynvml.nvmlLib`` and looks
functions up on it by name. ``FakeNvmlLib`` is such an object: each C function is
a Python callable that fills the same ctypes structures the driver fills (through
``byref`` arguments and string buffers) and returns NVML's return codes, so
NVIDIA's own wrappers, structs and exception classes run unchanged.

The GPUs it shows are ``FakeGpu`` records a workload model (``noded.sim``) or a
test updates; faults are injected per GPU and per function.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pynvml

SUCCESS = pynvml.NVML_SUCCESS
ERROR_STRINGS = {
    pynvml.NVML_SUCCESS: b"Success",
    pynvml.NVML_ERROR_UNINITIALIZED: b"Uninitialized",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: b"Invalid Argument",
    pynvml.NVML_ERROR_NOT_SUPPORTED: b"Not Supported",
    pynvml.NVML_ERROR_NO_PERMISSION: b"Insufficient Permissions",
    pynvml.NVML_ERROR_NOT_FOUND: b"Not Found",
    pynvml.NVML_ERROR_INSUFFICIENT_SIZE: b"Insufficient Size",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: b"Driver Not Loaded",
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: b"NVML Shared Library Not Found",
    pynvml.NVML_ERROR_GPU_IS_LOST: b"GPU is lost",
    pynvml.NVML_ERROR_UNKNOWN: b"Unknown Error",
}
_HANDLE_BASE = 0x1000  # fake handle "addresses"; pynvml never dereferences a handle


@dataclass
class FakeProcess:
    pid: int
    used_memory: int = 1 << 30
    sm_util: int = 0  # percent, as per-process utilisation samples report it
    mem_util: int = 0


@dataclass
class FakeGpu:
    index: int
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total: int = 80 * (1 << 30)
    util_gpu: int = 0
    util_memory: int = 0
    compute_mode: int = pynvml.NVML_COMPUTEMODE_DEFAULT
    compute_capability: tuple[int, int] = (8, 0)
    processes: dict[int, FakeProcess] = field(default_factory=dict)
    # Under MPS the driver sees one server process; the clients are listed apart.
    mps_server_pid: int | None = None
    mps_clients: dict[int, FakeProcess] = field(default_factory=dict)
    lost: bool = False
    # C function name -> return code to fail with
    faults: dict[str, int] = field(default_factory=dict)


class _CFunction:
    """A callable with a settable ``restype``, as ctypes function pointers have."""

    def __init__(self, fn: Callable[..., Any]):
        self._fn = fn
        self.restype = ctypes.c_int
        self.argtypes = None

    def __call__(self, *args):
        return self._fn(*args)


def _out(arg):
    """The ctypes object behind a byref() argument."""
    return arg._obj


class FakeNvmlLib:
    def __init__(self, gpus: list[FakeGpu], *, driver_version: str = "550.54.15",
                 driver_loaded: bool = True, clock: Callable[[], float] = time.time):
        self.gpus = gpus
        self.driver_version = driver_version
        self.driver_loaded = driver_loaded
        self.clock = clock  # wall clock in seconds, as NVML's sample timestamps are
        self.lock = threading.RLock()
        self.init_count = 0
        self.calls: dict[str, int] = {}
        self._functions: dict[str, _CFunction] = {}
        self.missing: set[str] = set()  # functions this "driver" lacks (FunctionNotFound)

    # -- the lookup pynvml does (getattr on the CDLL)
    def __getattr__(self, name: str) -> _CFunction:
        if name.startswith("_") or name in self.__dict__.get("missing", set()):
            raise AttributeError(name)
        impl = getattr(type(self), "c_" + name, None)
        if impl is None:
            raise AttributeError(name)
        fn = self._functions.get(name)
        if fn is None:
            fn = _CFunction(lambda *a, _impl=impl, _name=name: self._call(_name, _impl, a))
            self._functions[name] = fn
        return fn

    def _call(self, name: str, impl, args) -> int | bytes:
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in ("nvmlErrorString", "nvmlInitWithFlags", "nvmlInit_v2"):
                return impl(self, *args)
            if self.init_count == 0:
                return pynvml.NVML_ERROR_UNINITIALIZED
            return impl(self, *args)

    def _gpu(self, handle, fn: str) -> tuple[FakeGpu | None, int]:
        index = ctypes.cast(handle, ctypes.c_void_p).value - _HANDLE_BASE
        if not 0 <= index < len(self.gpus):
            return None, pynvml.NVML_ERROR_INVALID_ARGUMENT
        gpu = self.gpus[index]
        if gpu.lost:
            return None, pynvml.NVML_ERROR_GPU_IS_LOST
        if fn in gpu.faults:
            return None, gpu.faults[fn]
        return gpu, SUCCESS

    # -- library
    def c_nvmlErrorString(self, result):
        return ERROR_STRINGS.get(result, b"Unknown Error")

    def c_nvmlInitWithFlags(self, flags):
        if not self.driver_loaded:
            return pynvml.NVML_ERROR_DRIVER_NOT_LOADED
        self.init_count += 1
        return SUCCESS

    def c_nvmlShutdown(self):
        self.init_count = max(0, self.init_count - 1)
        return SUCCESS

    def c_nvmlSystemGetDriverVersion(self, buf, size):
        buf.value = self.driver_version.encode()
        return SUCCESS

    # -- devices
    def c_nvmlDeviceGetCount_v2(self, count):
        _out(count).value = len(self.gpus)
        return SUCCESS

    def c_nvmlDeviceGetHandleByIndex_v2(self, index, device):
        i = index.value
        if not 0 <= i < len(self.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if self.gpus[i].lost:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        ptr = _out(device)
        ctypes.cast(ctypes.pointer(ptr), ctypes.POINTER(ctypes.c_void_p)).contents.value = _HANDLE_BASE + i
        return SUCCESS

    def c_nvmlDeviceGetHandleByUUID(self, uuid, device):
        wanted = uuid.value.decode()
        for gpu in self.gpus:
            if gpu.uuid == wanted:
                if gpu.lost:
                    return pynvml.NVML_ERROR_GPU_IS_LOST
                ptr = _out(device)
                ctypes.cast(ctypes.pointer(ptr), ctypes.POINTER(ctypes.c_void_p)).contents.value = _HANDLE_BASE + gpu.index
                return SUCCESS
        return pynvml.NVML_ERROR_NOT_FOUND

    def c_nvmlDeviceGetIndex(self, handle, index):
        gpu, rc = self._gpu(handle, "nvmlDeviceGetIndex")
        if gpu:
            _out(index).value = gpu.index
        return rc

    def c_nvmlDeviceGetUUID(self, handle, buf, size):
        gpu, rc = self._gpu(handle, "nvmlDeviceGetUUID")
        if gpu:
            buf.value = gpu.uuid.encode()
        return rc

    def c_nvmlDeviceGetName(self, handle, buf, size):
        gpu, rc = self._gpu(handle, "nvmlDeviceGetName")
        if gpu:
            buf.value = gpu.name.encode()
        return rc

    def c_nvmlDeviceGetUtilizationRates(self, handle, util):
        gpu, rc = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        if gpu:
            _out(util).gpu = gpu.util_gpu
            _out(util).memory = gpu.util_memory
        return rc

    def c_nvmlDeviceGetMemoryInfo(self, handle, mem):
        gpu, rc = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        if gpu:
            procs = list(gpu.processes.values()) + list(gpu.mps_clients.values())
            used = min(gpu.memory_total, sum(p.used_memory for p in procs))
            m = _out(mem)
            m.total, m.used, m.free = gpu.memory_total, used, gpu.memory_total - used
        return rc

    def c_nvmlDeviceGetComputeMode(self, handle, mode):
        gpu, rc = self._gpu(handle, "nvmlDeviceGetComputeMode")
        if gpu:
            _out(mode).value = gpu.compute_mode
        return rc

    def c_nvmlDeviceSetComputeMode(self, handle, mode):
        gpu, rc = self._gpu(handle, "nvmlDeviceSetComputeMode")
        if gpu:
            if mode.value not in (0, 2, 3):
                return pynvml.NVML_ERROR_INVALID_ARGUMENT
            gpu.compute_mode = mode.value
        return rc

    def c_nvmlDeviceGetCudaComputeCapability(self, handle, major, minor):
        gpu, rc = self._gpu(handle, "nvmlDeviceGetCudaComputeCapability")
        if gpu:
            _out(major).value, _out(minor).value = gpu.compute_capability
        return rc

    def _process_list(self, procs: list[FakeProcess], count, array) -> int:
        # NVML's two-call protocol: a short buffer answers INSUFFICIENT_SIZE with the count.
        n = len(procs)
        if array is None or _out(count).value < n:
            _out(count).value = n
            return SUCCESS if n == 0 else pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, p in enumerate(procs):
            array[i].pid = p.pid
            array[i].usedGpuMemory = p.used_memory
            array[i].gpuInstanceId = 0xFFFFFFFF
            array[i].computeInstanceId = 0xFFFFFFFF
        _out(count).value = n
        return SUCCESS

    def c_nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count, array):
        gpu, rc = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses_v3")
        if not gpu:
            return rc
        procs = list(gpu.processes.values())
        if gpu.mps_server_pid is not None:
            server_mem = sum(c.used_memory for c in gpu.mps_clients.values())
            procs.append(FakeProcess(gpu.mps_server_pid, server_mem))
        return self._process_list(procs, count, array)

    def c_nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle, count, array):
        gpu, rc = self._gpu(handle, "nvmlDeviceGetMPSComputeRunningProcesses_v3")
        if not gpu:
            return rc
        return self._process_list(list(gpu.mps_clients.values()), count, array)

    def c_nvmlDeviceGetProcessUtilization(self, handle, samples, count, last_seen):
        gpu, rc = self._gpu(handle, "nvmlDeviceGetProcessUtilization")
        if not gpu:
            return rc
        now_us = int(self.clock() * 1e6)
        # The driver samples every few milliseconds; anything newer than last_seen is new.
        if now_us <= last_seen.value:
            return pynvml.NVML_ERROR_NOT_FOUND
        rows = [(p.pid, p.sm_util, p.mem_util) for p in gpu.processes.values()]
        if gpu.mps_server_pid is not None:
            # Under MPS the driver attributes all client work to the server process.
            rows.append((gpu.mps_server_pid, min(100, sum(c.sm_util for c in gpu.mps_clients.values())),
                         min(100, sum(c.mem_util for c in gpu.mps_clients.values()))))
        if not rows:
            return pynvml.NVML_ERROR_NOT_FOUND
        if samples is None or _out(count).value < len(rows):
            _out(count).value = len(rows)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (pid, sm, mem) in enumerate(rows):
            s = samples[i]
            s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil = pid, now_us, sm, mem, 0, 0
        _out(count).value = len(rows)
        return SUCCESS


def install(lib: FakeNvmlLib | None) -> None:
    """Make pynvml call into ``lib`` (None: back to loading the real library).

    pynvml caches the function pointers it looked up; the cache is cleared so
    the next call finds the new library's functions.
    """
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()


def make_gpus(count: int, name: str = "NVIDIA A100-SXM4-80GB") -> list[FakeGpu]:
    return [FakeGpu(i, f"GPU-{0x5e3a0000 + i:08x}-6f1c-4b2e-9d7a-{0xc0ffee000000 + i:012x}", name)
            for i in range(count)]
