"""GPU telemetry through NVIDIA's pynvml (package nvidia-ml-py).

Every device is read on its own: a lost GPU, a call the device does not support
or a permission error marks that device (or that field) missing and the others
are still read. A missing library or driver makes the whole node CPU-only until
a later init succeeds (retried at most every ``retry_s``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pynvml

log = logging.getLogger(__name__)


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

    def pids(self) -> set[int]:
        return {p.pid for p in self.processes}


@dataclass(frozen=True)
class NvmlSample:
    available: bool
    reason: str | None  # why NVML is unavailable (library or driver missing, …)
    driver_version: str | None
    gpus: tuple[GpuSample, ...]


def _err(e: pynvml.NVMLError) -> str:
    return type(e).__name__.replace("NVMLError_", "")


class NvmlSampler:
    name = "nvml"

    def __init__(self, retry_s: float = 30.0):
        self.retry_s = retry_s
        self._initialised = False
        self._unavailable: str | None = None
        self._next_init = float("-inf")
        self._driver: str | None = None
        self._last_seen_us: dict[int, int] = {}  # device index -> newest sample timestamp
        self._sm_util: dict[int, dict[int, int]] = {}  # device index -> pid -> last SM util

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
                log.warning("nvml=unavailable reason=%r; running as a CPU-only node", reason)
            self._unavailable = reason
            self._next_init = now + self.retry_s
            return False
        self._initialised = True
        if self._unavailable:
            log.info("nvml=available after: %s", self._unavailable)
        self._unavailable = None
        try:
            self._driver = pynvml.nvmlSystemGetDriverVersion()
        except pynvml.NVMLError:
            self._driver = None
        return True

    def sample(self, now: float) -> NvmlSample:
        if not self._ensure_init(now):
            return NvmlSample(False, self._unavailable, None, ())
        count = pynvml.nvmlDeviceGetCount()
        return NvmlSample(True, None, self._driver, tuple(self._sample_device(i) for i in range(count)))

    def _sample_device(self, index: int) -> GpuSample:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            name = pynvml.nvmlDeviceGetName(handle)
        except pynvml.NVMLError as e:
            return GpuSample(index, None, None, None, None, None, None, None,
                             error=_err(e), lost=isinstance(e, pynvml.NVMLError_GpuIsLost))
        errors: list[str] = []

        def field(fn, *args):
            try:
                return fn(handle, *args)
            except pynvml.NVMLError_GpuIsLost:
                raise
            except pynvml.NVMLError as e:
                errors.append(f"{fn.__name__.removeprefix('nvmlDevice')}: {_err(e)}")
                return None

        try:
            util = field(pynvml.nvmlDeviceGetUtilizationRates)
            mem = field(pynvml.nvmlDeviceGetMemoryInfo)
            mode = field(pynvml.nvmlDeviceGetComputeMode)
            compute = field(pynvml.nvmlDeviceGetComputeRunningProcesses) or []
            mps = field(pynvml.nvmlDeviceGetMPSComputeRunningProcesses) or []
            sm = self._process_utilisation(index, handle, errors)
        except pynvml.NVMLError_GpuIsLost:
            self._sm_util.pop(index, None)
            return GpuSample(index, uuid, name, None, None, None, None, None, error="GpuIsLost", lost=True)
        mps_pids = {p.pid for p in mps}
        procs = [GpuProcess(p.pid, p.usedGpuMemory, mps_server=bool(mps_pids) and p.pid not in mps_pids)
                 for p in compute if p.pid not in mps_pids]
        procs += [GpuProcess(p.pid, p.usedGpuMemory, mps_client=True) for p in mps]
        return GpuSample(
            index, uuid, name,
            util.gpu if util else None, util.memory if util else None,
            mem.used if mem else None, mem.total if mem else None, mode,
            tuple(procs), tuple(sorted(sm.items())), "; ".join(errors) or None,
        )

    def _process_utilisation(self, index: int, handle, errors: list[str]) -> dict[int, int]:
        last = self._sm_util.setdefault(index, {})
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, self._last_seen_us.get(index, 0))
        except pynvml.NVMLError_NotFound:
            return dict(last)  # no new samples since last time: the last ones still stand
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError as e:
            errors.append(f"GetProcessUtilization: {_err(e)}")
            return {}
        newest = self._last_seen_us.get(index, 0)
        fresh: dict[int, int] = {}
        for s in samples:
            newest = max(newest, s.timeStamp)
            fresh[s.pid] = s.smUtil
        self._last_seen_us[index] = newest
        self._sm_util[index] = fresh
        return dict(fresh)

    def close(self) -> None:
        if self._initialised:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
            self._initialised = False
