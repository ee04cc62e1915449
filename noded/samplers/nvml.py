"""GPU telemetry through NVIDIA's pynvml (package nvidia-ml-py).

Every device is read on its own: a lost GPU, a call the device does not support
or a permission error marks that device (or that field) missing and the others
are still read. A missing library makes the node CPU-only; a library whose driver is not
loaded (a GPU host at boot) leaves which jobs hold GPUs unknown. Either until a later init
succeeds (retried after 1 s, then backing off to ``retry_s``).

With ``deadline_s`` every call is made in a worker thread and the tick waits that long at
most: a hung driver makes NVML missing (processes unknown), never a stopped tick
(``mps.deadline.DeadlineWorker``).

Which processes hold a GPU decides which jobs are GPU jobs, so a process list that could
not be read is said (``processes_known``), never taken as "no processes": then a job not
seen on a GPU is of unknown kind, not a CPU job to throttle. The same when NVML, once seen
with GPUs, stops answering. A driver older than pynvml (a missing ``_v3`` entry point:
pynvml raises ``NVMLLibraryMismatchError``, which is not an ``NVMLError``) is such a failure.

Per-process utilisation is NVML's buffer of samples, each stamped when the driver took it,
and only for processes that used the GPU in the period; ``NOT_FOUND`` means nothing newer
than the last call. A process's figure is the mean of its samples since the last call; with
none, its last figure holds for ``hold_s`` (wall clock, against the samples' own stamps),
after which a process the GPU lists is idle: 0, not its last busy figure for ever.
Utilisation outside 0..100 (seen on real drivers) is clamped.
"""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass
from typing import Callable

import pynvml

from mps.deadline import DeadlineWorker, StillRunning

# A process utilisation sample's fields, read through the structure's own ctypes fields:
# pynvml's structures answer every attribute through a __getattribute__ of Python's (it
# decodes bytes; these are numbers), five times the cost, for some 30 samples a GPU a tick.
_SAMPLE_PID = pynvml.c_nvmlProcessUtilizationSample_t.pid.__get__
_SAMPLE_STAMP = pynvml.c_nvmlProcessUtilizationSample_t.timeStamp.__get__
_SAMPLE_SM = pynvml.c_nvmlProcessUtilizationSample_t.smUtil.__get__

# A process list's rows, read the same way: pynvml turns each into a "friendly object" (an
# object of Python's with every field copied through getattr and setattr), half of this
# sampler's own CPU for some 6 processes a GPU a tick.
_INFO_PID = pynvml.c_nvmlProcessInfo_v3_t.pid.__get__
_INFO_MEMORY = pynvml.c_nvmlProcessInfo_v3_t.usedGpuMemory.__get__
#: what the driver puts for a process's memory it cannot tell (WDDM on Windows, say)
_MEMORY_NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value

log = logging.getLogger(__name__)

#: how long a process's last per-process sample stands without a newer one (seconds)
HOLD_S = 3.0


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory: int | None
    mps_client: bool = False  # listed by nvmlDeviceGetMPSComputeRunningProcesses
    mps_server: bool = False  # the MPS server, which NVML credits with its clients' work


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str | None
    name: str | None
    util_gpu: int | None  # percent of time a kernel ran, over the driver's sample period
    util_memory: int | None
    memory_used: int | None
    memory_total: int | None
    compute_mode: int | None
    processes: tuple[GpuProcess, ...] = ()
    # pid -> SM utilisation percent from the newest per-process sample
    process_sm_util: tuple[tuple[int, int], ...] = ()
    error: str | None = None  # why the device (or part of it) could not be read
    lost: bool = False
    processes_known: bool = True  # False: its process lists could not be read (not "none")

    def pids(self) -> set[int]:
        return {p.pid for p in self.processes}


@dataclass(frozen=True)
class NvmlSample:
    available: bool
    reason: str | None  # why NVML is unavailable (library or driver missing, …)
    driver_version: str | None
    gpus: tuple[GpuSample, ...]
    # False where some GPU's processes are unknown, or NVML stopped answering after it had
    # shown GPUs: which jobs hold GPUs is then not known
    processes_known: bool = True


def _err(e: Exception) -> str:
    if isinstance(e, pynvml.NVMLLibraryMismatchError):
        return "LibraryMismatch (the driver is older than pynvml: an entry point it needs is missing)"
    return type(e).__name__.replace("NVMLError_", "")


class _ProcessList:
    """One of NVML's process lists of a device as (pid, used memory or None) pairs, by
    pynvml's own protocol: a first call for the count, then the list into an array twice as
    large and 5 more (processes start between the calls); any status but success raised as
    pynvml raises it, an entry point the driver lacks as its ``NVMLLibraryMismatchError``.
    Named as pynvml's function is (the sampler's errors say which list failed)."""

    def __init__(self, name: str, entry_point: str):
        self.__name__ = name
        self.entry_point = entry_point

    def __call__(self, handle) -> list[tuple[int, int | None]]:
        try:
            fn = pynvml._nvmlGetFunctionPointer(self.entry_point)
        except pynvml.NVMLError_FunctionNotFound:
            raise pynvml.NVMLLibraryMismatchError(f"{self.entry_point} is not in the NVML library") from None
        count = ctypes.c_uint(0)
        ret = fn(handle, ctypes.byref(count), None)
        if ret == pynvml.NVML_SUCCESS:
            return []
        if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            raise pynvml.NVMLError(ret)
        count.value = count.value * 2 + 5
        rows = (pynvml.c_nvmlProcessInfo_v3_t * count.value)()
        ret = fn(handle, ctypes.byref(count), rows)
        if ret != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(ret)
        out = []
        for i in range(count.value):
            memory = _INFO_MEMORY(rows[i])
            out.append((_INFO_PID(rows[i]), None if memory == _MEMORY_NOT_AVAILABLE else memory))
        return out


_compute_processes = _ProcessList("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v3")
_mps_processes = _ProcessList("nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v3")


def _percent(value: int | None) -> int | None:
    return None if value is None else min(100, max(0, int(value)))


class NvmlSampler:
    name = "nvml"

    def __init__(self, retry_s: float = 30.0, *, wall_clock: Callable[[], float] = time.time, hold_s: float = HOLD_S,
                 deadline_s: float | None = None):
        self.retry_s = retry_s
        self._retry_in = 1.0  # the first retry of a failed init comes soon (a driver loading at boot)
        # None: NVML is called in the caller's thread; else in a worker's, waited for this long
        self.deadline_s = deadline_s
        self._worker = DeadlineWorker("noded-nvml") if deadline_s is not None else None
        self._worker_cpu_taken = 0.0
        self.wall_clock = wall_clock  # NVML stamps its samples in wall-clock microseconds
        self.hold_s = hold_s
        self._seen_gpus = False  # NVML has shown GPUs here: not answering is then not "no GPUs"
        self._initialised = False
        self._unavailable: str | None = None
        self._no_library = False  # the last init failed for want of the library itself
        self._next_init = float("-inf")
        self._driver: str | None = None
        self._last_seen_us: dict[int, int] = {}  # device index -> newest sample timestamp
        # device index -> pid -> (SM utilisation %, stamp of its newest sample, µs)
        self._sm_util: dict[int, dict[int, tuple[int, int]]] = {}
        # device index -> (handle, UUID, name): what a handle names is fixed while NVML stays
        # initialised (its handles are valid until nvmlShutdown), so each is asked once an
        # init, not three calls a GPU a tick; forgotten at an init, a shutdown, and for a
        # device lost (asked again next tick)
        self._identity: dict[int, tuple[object, str, str]] = {}

    def _ensure_init(self, now: float) -> bool:
        if self._initialised:
            return True
        if now < self._next_init:
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            reason = {"LibraryNotFound": "NVML library not found (no NVIDIA driver installed?)",
                      "DriverNotLoaded": "NVIDIA driver not loaded"}.get(_err(e), f"nvmlInit failed: {_err(e)}")
            if reason != self._unavailable:
                log.warning("nvml=unavailable reason=%r; %s", reason, "running as a CPU-only node"
                            if isinstance(e, pynvml.NVMLError_LibraryNotFound) else "which jobs hold GPUs is unknown")
            self._unavailable = reason
            # A library without a driver is a GPU host whose driver is not up (yet): its GPU
            # jobs are there, unseen. Only a host without the library is taken as CPU-only.
            self._no_library = isinstance(e, pynvml.NVMLError_LibraryNotFound)
            self._next_init = now + min(self._retry_in, self.retry_s)
            self._retry_in = min(self._retry_in * 2, self.retry_s)
            return False
        self._initialised = True
        self._identity.clear()
        self._retry_in = 1.0
        if self._unavailable:
            log.info("nvml=available after: %s", self._unavailable)
        self._unavailable = None
        try:
            self._driver = pynvml.nvmlSystemGetDriverVersion()
        except pynvml.NVMLError:
            self._driver = None
        return True

    def take_worker_cpu_s(self) -> float:
        """CPU seconds NVML's calls took in the worker thread since the last take, a call in
        flight so far included: each second is counted once, in the tick that takes it, also
        for a call that outlived its deadline (0 without a worker: the calls then run in the
        caller's thread)."""
        if self._worker is None:
            return 0.0
        total = self._worker.cpu_s()
        taken, self._worker_cpu_taken = total - self._worker_cpu_taken, total
        return max(0.0, taken)

    def sample(self, now: float) -> NvmlSample:
        if self._worker is None or self.deadline_s is None:
            return self._sample(now)
        try:
            return self._worker.call(lambda: self._sample(now), self.deadline_s)
        except StillRunning as e:
            return NvmlSample(False, f"NVML has not answered for {e.running_s:.1f} s (a hung driver or GPU?)",
                              self._driver, (), processes_known=False)

    def _sample(self, now: float) -> NvmlSample:
        if not self._ensure_init(now):
            return NvmlSample(False, self._unavailable, None, (),
                              processes_known=self._no_library and not self._seen_gpus)
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            return NvmlSample(False, f"nvmlDeviceGetCount failed: {_err(e)}", self._driver, (),
                              processes_known=not self._seen_gpus)
        for index in [i for i in self._identity if i >= count]:
            del self._identity[index]
        gpus = tuple(self._sample_device(i) for i in range(count))
        self._seen_gpus = self._seen_gpus or bool(gpus)
        return NvmlSample(True, None, self._driver, gpus, all(g.processes_known for g in gpus))

    def _sample_device(self, index: int) -> GpuSample:
        identity = self._identity.get(index)
        if identity is None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                identity = (handle, pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle))
            except pynvml.NVMLError as e:
                return GpuSample(index, None, None, None, None, None, None, None,
                                 error=_err(e), lost=isinstance(e, pynvml.NVMLError_GpuIsLost), processes_known=False)
        handle, uuid, name = identity
        sample = self._sample_known(index, handle, uuid, name)
        if sample.lost:
            self._identity.pop(index, None)  # asked again next tick (the handle may be no more)
        else:
            self._identity[index] = identity
        return sample

    def _sample_known(self, index: int, handle, uuid: str, name: str) -> GpuSample:
        errors: list[str] = []
        failed: list[Exception] = []

        def field(fn, *args):
            try:
                return fn(handle, *args)
            except pynvml.NVMLError_GpuIsLost:
                raise
            except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as e:
                errors.append(f"{fn.__name__.removeprefix('nvmlDevice')}: {_err(e)}")
                failed.append(e)
                return None

        try:
            util = field(pynvml.nvmlDeviceGetUtilizationRates)
            mem = field(pynvml.nvmlDeviceGetMemoryInfo)
            mode = field(pynvml.nvmlDeviceGetComputeMode)
            compute = field(_compute_processes)
            known = compute is not None
            mps = field(_mps_processes)
            if mps is None and not isinstance(failed[-1], pynvml.NVMLError_NotSupported):
                known = False  # a GPU without MPS support has no clients; any other failure hides them
            sm = self._process_utilisation(index, handle, errors, [pid for pid, _ in compute or ()])
        except pynvml.NVMLError_GpuIsLost:
            self._sm_util.pop(index, None)
            return GpuSample(index, uuid, name, None, None, None, None, None, error="GpuIsLost", lost=True,
                             processes_known=False)
        compute, mps = compute or [], mps or []
        mps_pids = {pid for pid, _ in mps}
        procs = [GpuProcess(pid, memory, mps_server=bool(mps_pids) and pid not in mps_pids)
                 for pid, memory in compute if pid not in mps_pids]
        procs += [GpuProcess(pid, memory, mps_client=True) for pid, memory in mps]
        return GpuSample(
            index, uuid, name,
            _percent(util.gpu) if util else None, _percent(util.memory) if util else None,
            mem.used if mem else None, mem.total if mem else None, mode,
            tuple(procs), tuple(sorted(sm.items())), "; ".join(errors) or None, processes_known=known,
        )

    def _process_utilisation(self, index: int, handle, errors: list[str], listed: list[int]) -> dict[int, int]:
        """pid -> SM utilisation % (see the module's docstring); {} where the query fails."""
        last = self._sm_util.setdefault(index, {})
        seen = self._last_seen_us.get(index, 0)
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, seen)
        except pynvml.NVMLError_NotFound:
            samples = []  # nothing newer than the last call: no process used the GPU since
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError as e:
            errors.append(f"GetProcessUtilization: {_err(e)}")
            return {}
        fresh: dict[int, list[int]] = {}
        stamps: dict[int, int] = {}
        for s in samples:
            pid, stamp = _SAMPLE_PID(s), _SAMPLE_STAMP(s)
            if stamp <= seen:
                continue  # a driver that repeats an old sample: counted once
            fresh.setdefault(pid, []).append(_percent(_SAMPLE_SM(s)))
            if stamp > stamps.get(pid, 0):
                stamps[pid] = stamp
        if stamps:
            self._last_seen_us[index] = max(seen, *stamps.values())
        for pid, values in fresh.items():
            last[pid] = (round(sum(values) / len(values)), stamps[pid])
        horizon_us = int((self.wall_clock() - self.hold_s) * 1e6)
        for pid in [p for p, (_, t) in last.items() if t < horizon_us]:
            del last[pid]  # no sample for hold_s: idle since (bounded: only recent pids are kept)
        out = {pid: 0 for pid in listed}  # listed on the GPU, no recent sample: idle
        out.update({pid: util for pid, (util, _) in last.items()})
        return out

    def close(self) -> None:
        """NVML shut down (once: a second close, as a second shutdown makes, does nothing)."""
        if self._worker is not None and self._worker.stopped:
            return
        if self._worker is None or self.deadline_s is None:
            self._shutdown()
            return
        try:
            self._worker.call(self._shutdown, self.deadline_s)
        except StillRunning as e:  # a hung call holds the driver: the process's exit ends it
            log.warning("nvml=not-shut-down reason=%r", str(e))
        self._worker.stop()

    def _shutdown(self) -> None:
        if self._initialised:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
            self._initialised = False
            self._identity.clear()
