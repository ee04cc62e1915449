"""The simulated GPU node: the resctrl emulator, the fake NVML, real placeholder
processes for each job, and the workload model that ties bandwidth to GPU speed.

Everything noded reads is real or emulated at the lowest boundary: jobs are real
processes (PIDs, /proc, resctrl tasks), bandwidth comes from the emulator's MBM
counters, GPU state from pynvml over ``FakeNvmlLib``. Each ``step`` applies the
scenario's due events, then reads the bandwidth the emulator granted and sets
every GPU job's utilisation from it (``workload.gpu_utilisation``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import subprocess
import time
from dataclasses import dataclass
from typing import Callable

from resctrl import Resctrl
from resctrl.emulator import MountedEmulator

from ..config import Config
from ..jobs.discovery import JobDiscovery
from ..jobs.model import JobMeta
from . import fake_nvml
from .mps_standin import write_launcher
from .scenario import JobSpec, Scenario
from .workload import GB, MODELS, gpu_utilisation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimState:
    elapsed: float
    node_utilisation: float  # achieved / peak, the busiest L3 domain
    granted_gbps: float  # achieved over all domains
    gpu_util: dict[str, float]  # sim job id -> GPU utilisation set this step
    running: tuple[str, ...]


def job_id(sim_id: str) -> str:
    return f"sim:{sim_id}"


class SimNode:
    def __init__(self, scenario: Scenario, *, clock: Callable[[], float] = time.monotonic,
                 emulator_args: list[str] | None = None, workdir: str | None = None):
        self.scenario = scenario
        self.clock = clock
        self.emulator_args = emulator_args or []
        self.workdir = workdir
        self.emu: MountedEmulator | None = None
        self.gpus: list[fake_nvml.FakeGpu] = []
        self.nvml: fake_nvml.FakeNvmlLib | None = None
        self.discovery = JobDiscovery([])
        self.procs: dict[str, subprocess.Popen] = {}
        self.demand_gbps: dict[str, float] = {}
        self._base_cpus: dict[str, int] = {}  # CPUs a CPU job started with
        self._granted_cpus: dict[str, int] = {}
        self._next = 0
        self._t0 = 0.0
        self._rng = random.Random(scenario.seed)
        self.domains: tuple[int, ...] = ()

    # -- lifecycle
    def start(self) -> "SimNode":
        node = self.scenario.node
        self.emu = MountedEmulator(node.profile, workdir=self.workdir,
                                   extra_args=["--peak-gbps", str(node.peak_gbps), *self.emulator_args]).start()
        self.gpus = fake_nvml.make_gpus(node.gpus)
        self.nvml = fake_nvml.FakeNvmlLib(self.gpus)
        fake_nvml.install(self.nvml)
        self.domains = self.open_resctrl().caps.domains
        self._t0 = self.clock()
        return self

    def configure(self, config: Config, scratch: str) -> Config:
        """``config`` pointed at this node: its emulator, its peak, state and runtime
        directories under ``scratch`` (a simulated run must not touch the host's), and
        the MPS stand-in as the control binary (its GPUs are fake: NVIDIA's MPS could not
        serve them), started through a launcher written into ``scratch``."""
        assert self.emu is not None
        mps = dataclasses.replace(config.colocation.mps, control=write_launcher(scratch))
        return dataclasses.replace(
            config, peak_gbps_per_domain=self.scenario.node.peak_gbps, state_dir=f"{scratch}/state",
            runtime_dir=f"{scratch}/run",
            resctrl=dataclasses.replace(config.resctrl, root=self.emu.root, mounts=self.emu.mounts_file),
            colocation=dataclasses.replace(config.colocation, mps=mps))

    def open_resctrl(self, **kw) -> Resctrl:
        assert self.emu is not None
        return Resctrl.open(self.emu.root, mounts=self.emu.mounts_file, **kw)

    def stop(self) -> None:
        for p in self.procs.values():
            p.kill()
        for p in self.procs.values():
            p.wait()
        self.procs.clear()
        fake_nvml.install(None)
        if self.emu is not None:
            self.emu.stop()
            self.emu = None

    def __enter__(self) -> "SimNode":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def elapsed(self) -> float:
        return self.clock() - self._t0

    @property
    def finished(self) -> bool:
        return self.elapsed >= self.scenario.duration_s

    # -- the scenario
    def _start_job(self, spec: JobSpec) -> None:
        argv = spec.command or ("sleep", "infinity")
        try:
            # Its own session, as a job on a host is: a Ctrl-C at noded's terminal is not for it.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            raise RuntimeError(f"sim job {spec.id}: cannot run {' '.join(argv)}: {e}") from None
        self.procs[spec.id] = proc
        self._base_cpus[spec.id] = self._granted_cpus[spec.id] = len(os.sched_getaffinity(proc.pid))
        model = MODELS.get(spec.model) if spec.model else None
        meta = JobMeta(category=model.category if model else None, model=spec.model, exempt=spec.exempt)
        self.discovery.register(proc.pid, job_id(spec.id), meta)
        self._set_demand(spec.id, model.demand_gbps if model else spec.cpu_gbps or 0.0)
        if model is not None:
            self.gpus[spec.gpu].processes[proc.pid] = fake_nvml.FakeProcess(proc.pid, sm_util=int(model.solo_util))
        log.info("sim: started %s pid=%d (%s)%s", spec.id, proc.pid, spec.model or f"CPU {spec.cpu_gbps} GB/s",
                 f": {' '.join(spec.command)}" if spec.command else "")

    def _set_demand(self, sim_id: str, gbps: float) -> None:
        assert self.emu is not None and self.emu.control is not None
        self.demand_gbps[sim_id] = gbps
        # A CPU job's bandwidth follows the cores it may run on (core halving).
        cores = self._granted_cpus.get(sim_id, 1) / self._base_cpus.get(sim_id, 1)
        # Spread over the L3 domains: a job's threads run on every socket.
        self.emu.control.set_demand(self.procs[sim_id].pid, gbps * cores * GB / max(1, len(self.domains)))

    def _follow_affinity(self) -> None:
        for sim_id, proc in self.procs.items():
            if self.scenario.jobs[sim_id].is_gpu:
                continue
            try:
                cpus = len(os.sched_getaffinity(proc.pid))
            except ProcessLookupError:
                continue
            if cpus != self._granted_cpus.get(sim_id):
                self._granted_cpus[sim_id] = cpus
                self._set_demand(sim_id, self.demand_gbps[sim_id])

    def _stop_job(self, sim_id: str) -> None:
        proc = self.procs.pop(sim_id)
        for gpu in self.gpus:
            gpu.processes.pop(proc.pid, None)
        proc.kill()
        proc.wait()
        self.demand_gbps.pop(sim_id, None)
        self._base_cpus.pop(sim_id, None)
        self._granted_cpus.pop(sim_id, None)
        log.info("sim: stopped %s", sim_id)

    def _fault(self, args: dict) -> None:
        assert self.emu is not None and self.emu.control is not None
        if "gpu_lost" in args:
            self.gpus[args["gpu_lost"]].lost = True
        elif "nvml_lost" in args:
            for gpu in self.gpus:
                gpu.lost = bool(args["nvml_lost"])
        elif "counters" in args:
            self.emu.control.set_counter_state(args["counters"])
        elif "domain_offline" in args:
            self.emu.control.set_domain_online(args["domain_offline"], False)
        elif "domain_online" in args:
            self.emu.control.set_domain_online(args["domain_online"], True)
        log.info("sim: fault %s", args)

    def _apply_due_events(self, elapsed: float) -> None:
        events = self.scenario.events
        while self._next < len(events) and events[self._next].at <= elapsed:
            ev = events[self._next]
            self._next += 1
            if ev.action == "start":
                self._start_job(self.scenario.jobs[ev.args["id"]])
            elif ev.action == "stop":
                self._stop_job(ev.args["id"])
            elif ev.action == "set":
                self._set_demand(ev.args["id"], ev.args["cpu_gbps"])
            elif ev.action == "fault":
                self._fault(ev.args)

    def step(self) -> SimState:
        """Apply due events, then set GPU utilisation from the bandwidth granted now."""
        assert self.emu is not None and self.emu.control is not None
        elapsed = self.elapsed
        self._apply_due_events(elapsed)
        self._follow_affinity()
        rates = self.emu.control.rates()
        per_domain = {d: sum(g.get(d, 0.0) for g in rates.values()) for d in self.domains}
        peak = self.scenario.node.peak_gbps * GB
        utilisation = max((r / peak for r in per_domain.values()), default=0.0)
        utils: dict[str, float] = {}
        for sim_id, proc in self.procs.items():
            spec = self.scenario.jobs[sim_id]
            if not spec.is_gpu:
                continue
            u = gpu_utilisation(MODELS[spec.model], utilisation) + self._rng.gauss(0.0, 0.5)
            u = max(0.0, min(100.0, u))
            utils[sim_id] = u
            gpu = self.gpus[spec.gpu]
            if proc.pid in gpu.processes:
                gpu.processes[proc.pid].sm_util = int(round(u))
        for gpu in self.gpus:
            gpu.util_gpu = min(100, sum(p.sm_util for p in gpu.processes.values()))
        return SimState(elapsed, utilisation, sum(per_domain.values()) / GB, utils, tuple(self.procs))
