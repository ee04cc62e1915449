"""Simulated GPUs: the model of each (``SimGpu``), published to every process's NVML.

A host's processes see its GPUs through the driver's ``libnvidia-ml.so.1``; here they see
these through the stand-in library (``nvml_native/``), which reads what ``SimGpus.publish``
writes into shared memory (``nvml_shm``). The simulated node (or a test) changes the
models, then publishes; a change is seen by NVML's callers once published. A compute mode
is NVML's to set (root, through the library): ``compute_mode`` reads what is in force, and
a mode set on a model here is published as if root had set it. What monitoring tools read
besides (temperature, power, clocks, ...) comes from each GPU's board (``boards.Board``),
driven by the utilisation published.

``install`` makes this process's pynvml load the library as a host's pynvml loads the
driver's, for a daemon running in the simulator's own process (``noded run --sim``) and
for tests; any other process needs only ``env``.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pynvml

from nodesim.boards import Board, board_spec
from nodesim.nvml_lib import library_dir, library_path
from nodesim.nvml_shm import CALLS, ENV, GpuState, NodeState, SharedGpus

#: a C entry point -> the call its faults are injected into (``SimGpu.faults`` is keyed by the former)
CALL_OF = {fn: call for call, fns in CALLS for fn in fns}


@dataclass
class SimProcess:
    pid: int
    used_memory: int = 1 << 30
    sm_util: int = 0  # percent in the last period: the driver keeps a sample only where > 0
    mem_util: int = 0


@dataclass
class SimGpu:
    index: int
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total: int = 80 * (1 << 30)
    util_gpu: int = 0
    util_memory: int = 0
    compute_mode: int = pynvml.NVML_COMPUTEMODE_DEFAULT
    compute_capability: tuple[int, int] = (8, 0)
    processes: dict[int, SimProcess] = field(default_factory=dict)
    # Under MPS the driver sees one server process; the clients are listed apart.
    mps_server_pid: int | None = None
    mps_clients: dict[int, SimProcess] = field(default_factory=dict)
    lost: bool = False
    # C function name -> the NVML return code it fails with
    faults: dict[str, int] = field(default_factory=dict)
    # C function name -> how long each call of it takes (ms): a driver slow or hung on this GPU
    slow_ms: dict[str, int] = field(default_factory=dict)


def make_gpus(count: int, name: str = "NVIDIA A100-SXM4-80GB") -> list[SimGpu]:
    return [SimGpu(i, f"GPU-{0x5e3a0000 + i:08x}-6f1c-4b2e-9d7a-{0xc0ffee000000 + i:012x}", name)
            for i in range(count)]


def install(lib) -> None:
    """Make pynvml call into ``lib`` (a loaded library; None: back to loading the system's).
    pynvml caches the function pointers it looked up: the cache is cleared."""
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()


class SimGpus:
    """The GPUs of a simulated node, published at ``path`` (a new file)."""

    def __init__(self, path: str, gpus: list[SimGpu], *, wall_clock: Callable[[], float] = time.time,
                 variant: str = "current"):
        self.models = gpus
        # each GPU's board: temperature, power, clocks as its model's follow its utilisation
        self._boards = [Board(board_spec(g.name), i, wall_clock()) for i, g in enumerate(gpus)]
        self.variant = variant  # which build of the library other processes load (nvml_lib.VARIANTS)
        self.shared = SharedGpus(path)
        self.wall_clock = wall_clock  # NVML stamps its samples by the wall clock
        self.driver_loaded = True  # False: nvmlInit fails DRIVER_NOT_LOADED
        # node-wide calls (init, count, handle lookups, driver version): call name -> return
        # code it fails with, or how long it takes (ms)
        self.faults: dict[str, int] = {}
        self.slow_ms: dict[str, int] = {}
        self.lock = threading.RLock()  # held while publishing: change the models under it from other threads
        self._publisher: tuple[threading.Thread, threading.Event] | None = None
        self._modes = [g.compute_mode for g in gpus]
        for i, g in enumerate(gpus):
            self.shared.set_compute_mode(i, g.compute_mode)
        self.publish()

    # the models, as a list
    def __getitem__(self, index: int) -> SimGpu:
        return self.models[index]

    def __len__(self) -> int:
        return len(self.models)

    def __iter__(self) -> Iterator[SimGpu]:
        return iter(self.models)

    @property
    def path(self) -> str:
        return self.shared.path

    @property
    def env(self) -> dict[str, str]:
        """What another process needs to see these GPUs through pynvml."""
        return {"LD_LIBRARY_PATH": library_dir(self.variant), ENV: self.shared.path}

    def compute_mode(self, index: int) -> int:
        """The GPU's compute mode in force (as NVML says it)."""
        return self.shared.compute_mode(index)

    def publish(self) -> None:
        """The models as they are now, to every process's NVML; with one sample per busy
        process taken now (a mode set on a model goes out, one set through NVML comes back)."""
        with self.lock:
            self._publish()

    def _publish(self) -> None:
        now_s = self.wall_clock()
        now_us = int(now_s * 1e6)
        states = []
        for i, g in enumerate(self.models):
            if g.compute_mode != self._modes[i]:
                self.shared.set_compute_mode(i, g.compute_mode)
            g.compute_mode = self._modes[i] = self.shared.compute_mode(i)
            rows = [(p.pid, p.sm_util, p.mem_util) for p in g.processes.values()]
            if g.mps_server_pid is not None:  # the driver credits the clients' work to the server
                rows.append((g.mps_server_pid, min(100, sum(c.sm_util for c in g.mps_clients.values())),
                             min(100, sum(c.mem_util for c in g.mps_clients.values()))))
            self.shared.record_samples(i, now_us, rows)
            states.append(GpuState(
                g.uuid, g.name, g.memory_total, util_gpu=g.util_gpu, util_memory=g.util_memory,
                compute_capability=g.compute_capability, lost=g.lost,
                telemetry=self._boards[i].step(g.util_gpu, g.util_memory, now_s),
                processes=[(p.pid, p.used_memory) for p in g.processes.values()],
                mps_server_pid=g.mps_server_pid, mps_clients=[(p.pid, p.used_memory) for p in g.mps_clients.values()],
                faults={CALL_OF[fn]: code for fn, code in g.faults.items()},
                slow_ms={CALL_OF[fn]: ms for fn, ms in g.slow_ms.items()}))
        self.shared.publish(NodeState(states, driver_loaded=self.driver_loaded, faults=dict(self.faults),
                                      slow_ms=dict(self.slow_ms)))

    def keep_publishing(self, period_s: float = 0.25) -> None:
        """Publish every ``period_s`` until ``close`` (for a node nothing steps: the driver
        samples busy processes all the time)."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(period_s):
                self.publish()

        thread = threading.Thread(target=run, name="sim-gpus", daemon=True)
        self._publisher = (thread, stop)
        thread.start()

    def install(self) -> None:
        """This process's pynvml reads these GPUs through the stand-in library."""
        os.environ[ENV] = self.shared.path
        lib = ctypes.CDLL(library_path(self.variant))
        while lib.nvmlShutdown() == pynvml.NVML_SUCCESS:
            pass  # an earlier node's initialisation in this process: the next init maps this one
        install(lib)

    def close(self) -> None:
        if self._publisher is not None:
            thread, stop = self._publisher
            stop.set()
            thread.join()
            self._publisher = None
        if pynvml.nvmlLib is not None and os.environ.get(ENV) == self.shared.path:
            install(None)
        self.shared.close()
