"""The simulated GPUs in shared memory, as the stand-in ``libnvidia-ml.so.1`` reads them.

The layout is defined once, in ``nvml_native/simnvml.h``; the ctypes structures here mirror
it, and ``check_layout`` compares them with what the compiled library reports
(``simnvml_layout``) so a change on one side only fails loudly instead of reading garbage.

``SharedGpus`` is the writer: it creates the file (``NODED_SIM_NVML`` for every process that
should see the GPUs), and ``publish`` writes the whole node at once under a seqlock (``seq``
odd while writing), so a reader never sees half a tick. Per-process utilisation is kept as
the driver keeps it: a buffer of samples, each stamped when it was taken, only for processes
that used the GPU in the period (``record_samples``).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass, field
from typing import Iterable, Sequence

MAGIC = 0x4D49534445444F4E
VERSION = 2
MAX_GPUS = 16
MAX_PROCS = 64
MAX_SAMPLES = 256
TEXT = 96
ENV = "NODED_SIM_NVML"

#: simnvml.h's enum simnvml_call, in order, with the C entry points each covers
CALLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("init", ("nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags")),
    ("count", ("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2")),
    ("handle", ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID",
                "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetHandleByPciBusId_v2")),
    ("index", ("nvmlDeviceGetIndex",)),
    ("uuid", ("nvmlDeviceGetUUID",)),
    ("name", ("nvmlDeviceGetName",)),
    ("utilization", ("nvmlDeviceGetUtilizationRates",)),
    ("memory", ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2")),
    ("processes", ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
                   "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses",
                   "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v3",
                   "nvmlDeviceGetRunningProcessDetailList")),
    ("mps_processes", ("nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2",
                       "nvmlDeviceGetMPSComputeRunningProcesses_v3")),
    ("process_utilization", ("nvmlDeviceGetProcessUtilization",)),
    ("get_compute_mode", ("nvmlDeviceGetComputeMode",)),
    ("set_compute_mode", ("nvmlDeviceSetComputeMode",)),
    ("compute_capability", ("nvmlDeviceGetCudaComputeCapability",)),
    ("driver_version", ("nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion",
                        "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetNVMLVersion")),
    ("telemetry", ("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetPowerUsage",
                   "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetEnforcedPowerLimit",
                   "nvmlDeviceGetPowerManagementDefaultLimit", "nvmlDeviceGetPowerManagementLimitConstraints",
                   "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetFanSpeed", "nvmlDeviceGetFanSpeed_v2",
                   "nvmlDeviceGetNumFans", "nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo",
                   "nvmlDeviceGetPerformanceState", "nvmlDeviceGetPowerState", "nvmlDeviceGetCurrPcieLinkGeneration",
                   "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
                   "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetPciInfo_v3",
                   "nvmlDeviceGetSerial", "nvmlDeviceGetBAR1MemoryInfo", "nvmlDeviceGetPersistenceMode",
                   "nvmlDeviceGetDisplayMode", "nvmlDeviceGetDisplayActive", "nvmlDeviceIsMigDeviceHandle",
                   "nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetMigMode",
                   "nvmlDeviceGetDriverModel", "nvmlDeviceGetDriverModel_v2", "nvmlDeviceGetConfComputeMemSizeInfo",
                   "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization", "nvmlDeviceGetFieldValues")),
)
CALL_INDEX = {name: i for i, (name, _) in enumerate(CALLS)}
N_CALLS = len(CALLS)


class Process(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("used_memory", ctypes.c_uint64)]


class Sample(ctypes.Structure):
    _fields_ = [("timestamp_us", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("sm_util", ctypes.c_uint32),
                ("mem_util", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


HAS_FAN = 1 << 0
HAS_MIG = 1 << 1


class Telemetry(ctypes.Structure):
    _fields_ = [
        ("supported", ctypes.c_uint32), ("temperature_c", ctypes.c_uint32), ("fan_percent", ctypes.c_uint32),
        ("power_mw", ctypes.c_uint32), ("power_limit_mw", ctypes.c_uint32), ("power_default_limit_mw", ctypes.c_uint32),
        ("power_min_limit_mw", ctypes.c_uint32), ("power_max_limit_mw", ctypes.c_uint32),
        ("clock_mhz", ctypes.c_uint32 * 4), ("max_clock_mhz", ctypes.c_uint32 * 4),
        ("pcie_gen", ctypes.c_uint32), ("pcie_max_gen", ctypes.c_uint32), ("pcie_width", ctypes.c_uint32),
        ("pcie_max_width", ctypes.c_uint32), ("pcie_tx_kbps", ctypes.c_uint32), ("pcie_rx_kbps", ctypes.c_uint32),
        ("ecc_enabled", ctypes.c_uint32), ("persistence", ctypes.c_uint32), ("pstate", ctypes.c_uint32),
        ("encoder_util", ctypes.c_uint32), ("decoder_util", ctypes.c_uint32),
        ("pci_domain", ctypes.c_uint32), ("pci_bus", ctypes.c_uint32), ("pci_device", ctypes.c_uint32),
        ("pci_device_id", ctypes.c_uint32), ("pci_subsystem_id", ctypes.c_uint32), ("nvlink_count", ctypes.c_uint32), ("pad", ctypes.c_uint32),
        ("bar1_total", ctypes.c_uint64), ("energy_mj", ctypes.c_uint64), ("serial", ctypes.c_char * 32),
    ]


class Gpu(ctypes.Structure):
    _fields_ = [
        ("uuid", ctypes.c_char * TEXT), ("name", ctypes.c_char * TEXT),
        ("memory_total", ctypes.c_uint64), ("memory_reserved", ctypes.c_uint64),
        ("util_gpu", ctypes.c_uint32), ("util_memory", ctypes.c_uint32),
        ("cc_major", ctypes.c_uint32), ("cc_minor", ctypes.c_uint32),
        ("lost", ctypes.c_uint32), ("nprocs", ctypes.c_uint32), ("mps_server_pid", ctypes.c_uint32),
        ("nmps", ctypes.c_uint32), ("nsamples", ctypes.c_uint32), ("pad", ctypes.c_uint32),
        ("telemetry", Telemetry), ("fault", ctypes.c_uint32 * N_CALLS), ("slow_ms", ctypes.c_uint32 * N_CALLS),
        ("procs", Process * MAX_PROCS), ("mps", Process * MAX_PROCS), ("samples", Sample * MAX_SAMPLES),
    ]


class Published(ctypes.Structure):
    _fields_ = [
        ("driver_loaded", ctypes.c_uint32), ("gpu_count", ctypes.c_uint32), ("driver_version", ctypes.c_char * 32),
        ("nvml_version", ctypes.c_char * 32), ("cuda_driver_version", ctypes.c_uint32), ("pad", ctypes.c_uint32),
        ("fault", ctypes.c_uint32 * N_CALLS), ("slow_ms", ctypes.c_uint32 * N_CALLS), ("gpus", Gpu * MAX_GPUS),
    ]


class Driver(ctypes.Structure):
    _fields_ = [("compute_mode", ctypes.c_uint32 * MAX_GPUS)]


class Node(ctypes.Structure):
    _fields_ = [("magic", ctypes.c_uint64), ("version", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("seq", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("published", Published), ("driver", Driver)]


def layout() -> tuple[int, ...]:
    """The mirror's sizes and offsets, in simnvml_layout()'s order."""
    return (ctypes.sizeof(Node), Node.seq.offset, Node.published.offset, Node.driver.offset, ctypes.sizeof(Gpu),
            Published.gpus.offset, Gpu.fault.offset, Gpu.procs.offset, Gpu.samples.offset, ctypes.sizeof(Sample),
            Gpu.telemetry.offset, ctypes.sizeof(Telemetry), N_CALLS, VERSION)


class LayoutMismatch(RuntimeError):
    pass


def check_layout(library: str) -> None:
    """Raises LayoutMismatch where the compiled library's layout is not this mirror's."""
    lib = ctypes.CDLL(library)
    out = (ctypes.c_ulonglong * 32)()
    n = lib.simnvml_layout(out, 32)
    theirs = tuple(out[i] for i in range(n))
    if theirs != layout():
        raise LayoutMismatch(f"{library} has layout {theirs}; sim/nodesim/nvml_shm.py mirrors {layout()}")


# -- what the writer publishes


@dataclass
class TelemetryState:
    """What monitoring tools read besides utilisation and memory (simnvml.h's struct
    simnvml_telemetry), in NVML's units. The defaults: an idle A100-SXM4-80GB."""

    fan: bool = False  # a dedicated fan (else NVML answers NOT_SUPPORTED)
    mig: bool = True  # MIG mode can be queried (disabled)
    temperature_c: int = 32
    fan_percent: int = 0
    power_mw: int = 60_000
    power_limit_mw: int = 400_000
    power_default_limit_mw: int = 400_000
    power_min_limit_mw: int = 100_000
    power_max_limit_mw: int = 400_000
    clock_mhz: tuple[int, int, int, int] = (210, 210, 1593, 585)  # graphics, SM, memory, video
    max_clock_mhz: tuple[int, int, int, int] = (1410, 1410, 1593, 1290)
    pcie_gen: int = 4
    pcie_max_gen: int = 4
    pcie_width: int = 16
    pcie_max_width: int = 16
    pcie_tx_kbps: int = 0
    pcie_rx_kbps: int = 0
    ecc_enabled: bool = True
    persistence: bool = True
    pstate: int = 0
    encoder_util: int = 0
    decoder_util: int = 0
    pci_domain: int = 0
    pci_bus: int = 0x07
    pci_device: int = 0
    pci_device_id: int = 0x20B210DE
    pci_subsystem_id: int = 0x147F10DE
    nvlink_count: int = 12
    bar1_total: int = 128 << 30
    energy_mj: int = 0
    serial: str = "1320221000000"


@dataclass
class GpuState:
    """One simulated GPU as published (values as the node wants them seen, unclamped)."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total: int = 80 << 30
    memory_reserved: int = 531 << 20  # what a driver keeps for itself on an idle A100
    util_gpu: int = 0
    util_memory: int = 0
    compute_capability: tuple[int, int] = (8, 0)
    lost: bool = False
    processes: Sequence[tuple[int, int]] = ()  # (pid, used memory)
    mps_server_pid: int | None = None
    mps_clients: Sequence[tuple[int, int]] = ()
    telemetry: TelemetryState = field(default_factory=TelemetryState)
    faults: dict[str, int] = field(default_factory=dict)  # call name (CALLS) -> NVML return code
    slow_ms: dict[str, int] = field(default_factory=dict)


@dataclass
class NodeState:
    gpus: list[GpuState]
    driver_loaded: bool = True
    driver_version: str = "550.54.15"
    nvml_version: str = "12.550.54.15"  # the CUDA major the driver ships with, then the driver's version
    cuda_driver_version: int = 12040  # CUDA 12.4, what driver 550.54.15 supports (1000 * major + 10 * minor)
    faults: dict[str, int] = field(default_factory=dict)
    slow_ms: dict[str, int] = field(default_factory=dict)


def _telemetry(t: TelemetryState, out: Telemetry) -> None:
    out.supported = (HAS_FAN if t.fan else 0) | (HAS_MIG if t.mig else 0)
    for name in ("temperature_c", "fan_percent", "power_mw", "power_limit_mw", "power_default_limit_mw",
                 "power_min_limit_mw", "power_max_limit_mw", "pcie_gen", "pcie_max_gen", "pcie_width",
                 "pcie_max_width", "pcie_tx_kbps", "pcie_rx_kbps", "pstate", "encoder_util", "decoder_util",
                 "pci_domain", "pci_bus", "pci_device", "pci_device_id", "pci_subsystem_id", "nvlink_count", "bar1_total",
                 "energy_mj"):
        setattr(out, name, int(getattr(t, name)))
    out.ecc_enabled, out.persistence = int(t.ecc_enabled), int(t.persistence)
    out.clock_mhz[:] = [int(v) for v in t.clock_mhz]
    out.max_clock_mhz[:] = [int(v) for v in t.max_clock_mhz]
    out.serial = _text(t.serial, 32)


def _calls(values: dict[str, int], out) -> None:
    for name, v in values.items():
        out[CALL_INDEX[name]] = int(v)  # KeyError names a call that does not exist


def _text(value: str, size: int) -> bytes:
    raw = value.encode()
    if len(raw) >= size:
        raise ValueError(f"{value[:40]!r}... is longer than {size - 1} bytes")
    return raw


class SharedGpus:
    """The writer of the shared node file at ``path`` (created, mode 0644: every process
    reads it, only root's may set compute modes through it)."""

    def __init__(self, path: str):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, ctypes.sizeof(Node))
            self._map = mmap.mmap(fd, ctypes.sizeof(Node), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.node = Node.from_buffer(self._map)
        self.node.seq = 0
        self.node.size = ctypes.sizeof(Node)
        self.node.version = VERSION
        self._samples: list[list[tuple[int, int, int, int]]] = [[] for _ in range(MAX_GPUS)]
        self._staged = Published()
        self.node.magic = MAGIC  # last: a reader that sees the magic sees a whole header

    def record_samples(self, index: int, t_us: int, rows: Iterable[tuple[int, int, int]]) -> None:
        """Per-process samples taken at ``t_us`` on GPU ``index``: (pid, sm %, memory %), only
        for processes that used the GPU (the driver records nothing for an idle one)."""
        buf = self._samples[index]
        buf.extend((t_us, pid, sm, mem) for pid, sm, mem in rows if sm or mem)
        del buf[:-MAX_SAMPLES]

    def publish(self, state: NodeState) -> None:
        if len(state.gpus) > MAX_GPUS:
            raise ValueError(f"{len(state.gpus)} GPUs; the shared node holds at most {MAX_GPUS}")
        p = self._staged
        ctypes.memset(ctypes.addressof(p), 0, ctypes.sizeof(p))
        p.driver_loaded = int(state.driver_loaded)
        p.gpu_count = len(state.gpus)
        p.driver_version = _text(state.driver_version, 32)
        p.nvml_version = _text(state.nvml_version, 32)
        p.cuda_driver_version = state.cuda_driver_version
        _calls(state.faults, p.fault)
        _calls(state.slow_ms, p.slow_ms)
        for i, g in enumerate(state.gpus):
            out = p.gpus[i]
            out.uuid, out.name = _text(g.uuid, TEXT), _text(g.name, TEXT)
            out.memory_total, out.memory_reserved = g.memory_total, g.memory_reserved
            out.util_gpu, out.util_memory = g.util_gpu, g.util_memory
            out.cc_major, out.cc_minor = g.compute_capability
            out.lost = int(g.lost)
            _telemetry(g.telemetry, out.telemetry)
            for n_attr, arr, procs in (("nprocs", out.procs, g.processes), ("nmps", out.mps, g.mps_clients)):
                procs = list(procs)[:MAX_PROCS]
                setattr(out, n_attr, len(procs))
                for k, (pid, mem) in enumerate(procs):
                    arr[k].pid, arr[k].used_memory = pid, mem
            out.mps_server_pid = g.mps_server_pid or 0
            samples = self._samples[i]
            out.nsamples = len(samples)
            for k, (t, pid, sm, mem) in enumerate(samples):
                s = out.samples[k]
                s.timestamp_us, s.pid, s.sm_util, s.mem_util = t, pid, sm, mem
            _calls(g.faults, out.fault)
            _calls(g.slow_ms, out.slow_ms)
        node = self.node
        node.seq += 1  # odd: readers retry until the copy below is whole
        ctypes.memmove(ctypes.addressof(node.published), ctypes.addressof(p), ctypes.sizeof(p))
        node.seq += 1

    def set_compute_mode(self, index: int, mode: int) -> None:
        """The node's own setting (a scenario, a test): as if root had set it through NVML."""
        self.node.driver.compute_mode[index] = mode

    def compute_mode(self, index: int) -> int:
        """The compute mode a root process set through the library (0 DEFAULT until then)."""
        return int(self.node.driver.compute_mode[index])

    def close(self) -> None:
        node, self.node = self.node, None
        del node
        self._map.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
