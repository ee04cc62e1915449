"""The simulated GPUs in shared memory, as the stand-in ``libnvidia-ml.so.1`` reads them.

The layout is defined once, in ``native/nvml/simnvml.h``; the ctypes structures here mirror
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
VERSION = 1
MAX_GPUS = 16
MAX_PROCS = 64
MAX_SAMPLES = 256
TEXT = 96
ENV = "NODED_SIM_NVML"

#: simnvml.h's enum simnvml_call, in order, with the C entry points each covers
CALLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("init", ("nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags")),
    ("count", ("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2")),
    ("handle", ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID")),
    ("index", ("nvmlDeviceGetIndex",)),
    ("uuid", ("nvmlDeviceGetUUID",)),
    ("name", ("nvmlDeviceGetName",)),
    ("utilization", ("nvmlDeviceGetUtilizationRates",)),
    ("memory", ("nvmlDeviceGetMemoryInfo",)),
    ("processes", ("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3")),
    ("mps_processes", ("nvmlDeviceGetMPSComputeRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses_v3")),
    ("process_utilization", ("nvmlDeviceGetProcessUtilization",)),
    ("get_compute_mode", ("nvmlDeviceGetComputeMode",)),
    ("set_compute_mode", ("nvmlDeviceSetComputeMode",)),
    ("compute_capability", ("nvmlDeviceGetCudaComputeCapability",)),
    ("driver_version", ("nvmlSystemGetDriverVersion",)),
)
CALL_INDEX = {name: i for i, (name, _) in enumerate(CALLS)}
N_CALLS = len(CALLS)


class Process(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("used_memory", ctypes.c_uint64)]


class Sample(ctypes.Structure):
    _fields_ = [("timestamp_us", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("sm_util", ctypes.c_uint32),
                ("mem_util", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class Gpu(ctypes.Structure):
    _fields_ = [
        ("uuid", ctypes.c_char * TEXT), ("name", ctypes.c_char * TEXT),
        ("memory_total", ctypes.c_uint64), ("memory_reserved", ctypes.c_uint64),
        ("util_gpu", ctypes.c_uint32), ("util_memory", ctypes.c_uint32),
        ("cc_major", ctypes.c_uint32), ("cc_minor", ctypes.c_uint32),
        ("lost", ctypes.c_uint32), ("nprocs", ctypes.c_uint32), ("mps_server_pid", ctypes.c_uint32),
        ("nmps", ctypes.c_uint32), ("nsamples", ctypes.c_uint32), ("pad", ctypes.c_uint32),
        ("fault", ctypes.c_uint32 * N_CALLS), ("slow_ms", ctypes.c_uint32 * N_CALLS),
        ("procs", Process * MAX_PROCS), ("mps", Process * MAX_PROCS), ("samples", Sample * MAX_SAMPLES),
    ]


class Published(ctypes.Structure):
    _fields_ = [
        ("driver_loaded", ctypes.c_uint32), ("gpu_count", ctypes.c_uint32), ("driver_version", ctypes.c_char * 32),
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
            N_CALLS, VERSION)


class LayoutMismatch(RuntimeError):
    pass


def check_layout(library: str) -> None:
    """Raises LayoutMismatch where the compiled library's layout is not this mirror's."""
    lib = ctypes.CDLL(library)
    out = (ctypes.c_ulonglong * 32)()
    n = lib.simnvml_layout(out, 32)
    theirs = tuple(out[i] for i in range(n))
    if theirs != layout():
        raise LayoutMismatch(f"{library} has layout {theirs}; noded/sim/nvml_shm.py mirrors {layout()}")


# -- what the writer publishes


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
    faults: dict[str, int] = field(default_factory=dict)  # call name (CALLS) -> NVML return code
    slow_ms: dict[str, int] = field(default_factory=dict)


@dataclass
class NodeState:
    gpus: list[GpuState]
    driver_loaded: bool = True
    driver_version: str = "550.54.15"
    faults: dict[str, int] = field(default_factory=dict)
    slow_ms: dict[str, int] = field(default_factory=dict)


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
        _calls(state.faults, p.fault)
        _calls(state.slow_ms, p.slow_ms)
        for i, g in enumerate(state.gpus):
            out = p.gpus[i]
            out.uuid, out.name = _text(g.uuid, TEXT), _text(g.name, TEXT)
            out.memory_total, out.memory_reserved = g.memory_total, g.memory_reserved
            out.util_gpu, out.util_memory = g.util_gpu, g.util_memory
            out.cc_major, out.cc_minor = g.compute_capability
            out.lost = int(g.lost)
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
