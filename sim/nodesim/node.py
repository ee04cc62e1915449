"""The simulated GPU node: the resctrl emulator, simulated GPUs behind a stand-in NVML
library, real placeholder processes for each job, and the workload model that ties
bandwidth to GPU speed.

Everything noded reads is real or emulated at the lowest boundary: jobs are real
processes (PIDs, /proc, resctrl tasks), bandwidth comes from the emulator's MBM
counters, GPU state from pynvml over the stand-in ``libnvidia-ml.so.1`` (``sim/nodesim/nvml_native``),
which reads what this node publishes in shared memory (``gpus.SimGpus``): any process
given ``nvml_env`` sees the same GPUs. ``gpus`` is the node's model of each GPU
(``gpus.SimGpu``); each ``step`` applies the scenario's due events, reads the
bandwidth the emulator granted, sets every GPU job's utilisation from it
(``workload.gpu_utilisation``) and publishes the GPUs (``publish``: a change to ``gpus``
made between steps is seen once published).

A GPU job that follows its core curve (``JobSpec.cpu_curve``) runs at that utilisation
times its model's curve share (``noded.rightsize.curves``) at the cores it has now: the
real CPUs its process may run on (its affinity, within its cpuset), mapped proportionally
onto the simulated host's ``node.cpus`` (``simulated_cores``). Its iteration times, where
it reports them (``JobSpec.reports``), come from the same curve (``nodesim.reporter``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from resctrl import Resctrl
from nodesim.resctrl_emulator import MountedEmulator

from noded.config import Config
from noded.jobs.discovery import JobDiscovery
from noded.jobs.model import JobMeta
from noded.rightsize.curves import MODEL_CURVES
from nodesim.gpus import SimGpus, SimProcess, make_gpus
from nodesim.mps_standin import _IMPORT_ROOT, write_launcher
from nodesim.parentdeath import die_with_parent
from nodesim.reporter import write_state
from nodesim.scenario import JobSpec, Scenario
from nodesim.workload import GB, MODELS, gpu_utilisation

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SimState:
    elapsed: float
    node_utilisation: float  # achieved / peak, the busiest L3 domain
    granted_gbps: float  # achieved over all domains
    gpu_util: dict[str, float]  # sim job id -> GPU utilisation set this step
    running: tuple[str, ...]
    cores: dict[str, float] = dataclasses.field(default_factory=dict)  # sim job id -> simulated cores (curve jobs)


def job_id(sim_id: str) -> str:
    return f"sim:{sim_id}"


def make_cpuset(path: str) -> str:
    """A cpuset cgroup (v1) at ``path`` with all of its parent's CPUs and memory nodes (one a
    process can join); returns ``path``."""
    parent = os.path.dirname(path)
    os.mkdir(path)
    for f in ("cpuset.cpus", "cpuset.mems"):
        with open(os.path.join(parent, f)) as src, open(os.path.join(path, f), "w") as dst:
            dst.write(src.read().strip() or "\n")
    return path


def _make_cpuset(parent: str, name: str) -> str:
    """A cpuset cgroup (v1) below ``parent`` with all of its parent's CPUs and memory nodes."""
    return make_cpuset(os.path.join(parent, name))


def _remove_cgroup(path: str) -> None:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("sim: cgroup %s not removed: %s", path, e)


class _Adopted:
    """A job's process that a job manager started (``SimNode.adopt``): the node models it
    but never stops it (its manager does), so it has a pid and nothing to kill or wait."""

    def __init__(self, pid: int):
        self.pid = pid

    def kill(self) -> None:
        pass

    def wait(self) -> None:
        pass


def _enter(cgroup: str | None) -> None:
    """In a job's child before exec: into its cgroup, and killed when the simulated node dies."""
    die_with_parent(signal.SIGKILL)
    if cgroup is not None:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


class SimNode:
    def __init__(self, scenario: Scenario, *, clock: Callable[[], float] = time.monotonic,
                 emulator_args: list[str] | None = None, workdir: str | None = None,
                 report_socket: str | None = None, cpuset_root: str | None = None):
        self.scenario = scenario
        #: a v1 cpuset hierarchy: each job's processes start in a cgroup of its own under
        #: ``cgroup_dir`` there (as a host's job manager starts them), its id then the one a
        #: ``cgroup`` job source gives it (``job_id``); None: registered process trees
        self.cpuset_root = cpuset_root
        self.cgroup_dir: str | None = None
        self.clock = clock
        self.emulator_args = emulator_args or []
        self.workdir = workdir
        self.emu: MountedEmulator | None = None
        self.gpus: SimGpus | None = None
        self.discovery = JobDiscovery([])
        self.procs: dict[str, subprocess.Popen | _Adopted] = {}
        self.specs: dict[str, JobSpec] = dict(scenario.jobs)  # the scenario's jobs and those adopted
        self.demand_gbps: dict[str, float] = {}
        self._base_cpus: dict[str, int] = {}  # CPUs a CPU job started with
        self._granted_cpus: dict[str, int] = {}
        #: the real CPUs this process may run on, and the simulated host's (``node.cpus``)
        self.real_cpus = len(os.sched_getaffinity(0))
        self.cpus = scenario.node.cpus or self.real_cpus
        self.cores: dict[str, float] = {}  # curve jobs: simulated cores they have now
        self._rates: dict[str, tuple[float, float]] = {}  # reporting jobs: (cores, rate) last written
        #: where reporting jobs send their iteration times (``configure`` sets noded's)
        self.report_socket = report_socket
        self.scratch: str | None = None  # the jobs' state files (reporters read theirs)
        self._next = 0
        self._t0 = 0.0
        self._rng = random.Random(scenario.seed)
        self.labels: dict[str, JobMeta] = {}  # job id -> what it is (a labels file for a separate noded)
        self.domains: tuple[int, ...] = ()
        self._last_moved: tuple[float, dict[int, float]] | None = None  # the emulator's, at the last step

    # -- lifecycle
    def start(self) -> "SimNode":
        node = self.scenario.node
        self.emu = MountedEmulator(node.profile, workdir=self.workdir,
                                   extra_args=["--peak-gbps", str(node.peak_gbps), *self.emulator_args]).start()
        self.domains = self.open_resctrl().caps.domains
        self.scratch = tempfile.mkdtemp(prefix="noded-sim-jobs-", dir=self.workdir)
        os.chmod(self.scratch, 0o755)  # the GPUs' file is every user's to read, as a driver's devices are
        self.gpus = SimGpus(os.path.join(self.scratch, "nvml.shm"), make_gpus(node.gpus), variant=node.nvml)
        if self.cpuset_root is not None:
            # named by this process: a later node removes it only once this one is gone
            self.cgroup_dir = _make_cpuset(self.cpuset_root,
                                           f"noded-sim-{os.getpid()}-{os.path.basename(self.scratch)[-8:]}")
        self.gpus.install()  # a daemon in this process reads them as a host's reads its driver
        self._t0 = self.clock()
        return self

    @property
    def nvml_env(self) -> dict[str, str]:
        """What another process needs to see these GPUs through pynvml."""
        assert self.gpus is not None
        return self.gpus.env

    def publish(self) -> None:
        """The GPUs as ``gpus`` has them now, to every process's NVML (each ``step`` does)."""
        assert self.gpus is not None
        self.gpus.publish()

    def configure(self, config: Config, scratch: str) -> Config:
        """``config`` pointed at this node: its emulator, its peak, state and runtime
        directories under ``scratch`` (a simulated run must not touch the host's), and
        the MPS stand-in as the control binary (its GPUs are fake: NVIDIA's MPS could not
        serve them), started through a launcher written into ``scratch``."""
        assert self.emu is not None
        mps = dataclasses.replace(config.colocation.mps, control=write_launcher(scratch))
        configured = dataclasses.replace(
            config, peak_gbps_per_domain=self.scenario.node.peak_gbps, state_dir=f"{scratch}/state",
            runtime_dir=f"{scratch}/run",
            resctrl=dataclasses.replace(config.resctrl, root=self.emu.root, mounts=self.emu.mounts_file),
            colocation=dataclasses.replace(config.colocation, mps=mps))
        self.report_socket = configured.report_socket  # reporting jobs report to this noded
        return configured

    def open_resctrl(self, **kw) -> Resctrl:
        assert self.emu is not None
        return Resctrl.open(self.emu.root, mounts=self.emu.mounts_file, **kw)

    def stop(self) -> None:
        for p in self.procs.values():
            p.kill()
        for p in self.procs.values():
            p.wait()
        self.procs.clear()
        if self.cgroup_dir is not None:
            for d in sorted(os.listdir(self.cgroup_dir)):
                if os.path.isdir(os.path.join(self.cgroup_dir, d)):
                    _remove_cgroup(os.path.join(self.cgroup_dir, d))
            _remove_cgroup(self.cgroup_dir)
            self.cgroup_dir = None
        if self.gpus is not None:
            self.gpus.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
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

    def job_id(self, sim_id: str) -> str:
        """The job's id as noded sees it: ``sim:ID``, or, in cgroups, ``cgroup:ID`` (a
        ``cgroup`` source rooted at the node's own cgroup, as `noded sim-node` configures)."""
        return job_id(sim_id) if self.cgroup_dir is None else f"cgroup:{sim_id}"

    # -- cores
    def simulated_cores(self, real_cpus: int) -> float:
        """The simulated cores a job with ``real_cpus`` real CPUs has: proportional, so one
        real CPU is ``node.cpus / real_cpus`` simulated cores (the granularity of a change)."""
        return real_cpus * self.cpus / self.real_cpus

    def state_file(self, sim_id: str) -> str:
        assert self.scratch is not None
        return os.path.join(self.scratch, f"{sim_id}.iteration.json")

    def _reporter(self, spec: JobSpec) -> tuple[tuple[str, ...], dict[str, str]]:
        """A reporting job's process: its argv and environment (its job id, noded's report socket)."""
        assert self.scratch is not None
        path = self.state_file(spec.id)
        write_state(path, self.simulated_cores(self.real_cpus), 1.0)  # before it starts: nothing to wait for
        self._rates[spec.id] = (self.simulated_cores(self.real_cpus), 1.0)
        env = dict(os.environ, NODED_JOB=self.job_id(spec.id),
                   # no noded configured: a socket nobody serves (reports are dropped), never the host's
                   NODED_REPORT_SOCKET=self.report_socket or os.path.join(self.scratch, "no-noded.sock"),
                   PYTHONPATH=os.pathsep.join(p for p in (_IMPORT_ROOT, os.environ.get("PYTHONPATH")) if p))
        return (sys.executable, "-m", "nodesim.reporter", path, spec.model, f"{self.scenario.seed}:{spec.id}"), env

    # -- the scenario
    def _start_job(self, spec: JobSpec) -> None:
        argv, env = spec.command or ("sleep", "infinity"), None
        if spec.reports:
            argv, env = self._reporter(spec)
        cgroup = _make_cpuset(self.cgroup_dir, spec.id) if self.cgroup_dir is not None else None
        try:
            # Its own session, as a job on a host is: a Ctrl-C at noded's terminal is not for it.
            # It starts in its job's cgroup, and dies with the simulated node.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True, env=env,
                                    preexec_fn=lambda: _enter(cgroup))
        except OSError as e:
            raise RuntimeError(f"sim job {spec.id}: cannot run {' '.join(argv)}: {e}") from None
        self._track(spec, proc)

    def adopt(self, spec: JobSpec, pid: int) -> None:
        """A job whose process a job manager started (a job of a one-host Slurm), modelled
        as the node's own from now on: its memory-bandwidth demand (a CPU job's following
        the CPUs it may run on), or, for a GPU job, its process on its GPU with the
        utilisation the node's contention leaves it. The node never stops it: ``release``
        forgets it, its manager ends it."""
        if spec.id in self.procs:
            raise ValueError(f"sim job {spec.id} exists already")
        if spec.cpu_curve or spec.reports or spec.command:
            raise ValueError(f"sim job {spec.id}: an adopted job has no core curve, reports or command of ours")
        self.specs[spec.id] = spec
        self._track(spec, _Adopted(pid))

    def release(self, sim_id: str) -> None:
        """An adopted job's end: the node forgets it (its process is its manager's)."""
        self._stop_job(sim_id)
        self.specs.pop(sim_id, None)

    def _track(self, spec: JobSpec, proc) -> None:
        self.procs[spec.id] = proc
        self._base_cpus[spec.id] = self._granted_cpus[spec.id] = len(os.sched_getaffinity(proc.pid))
        if spec.cpu_curve:
            self.cores[spec.id] = self.simulated_cores(self._base_cpus[spec.id])
        model = MODELS.get(spec.model) if spec.model else None
        meta = JobMeta(category=model.category if model else None, model=spec.model, exempt=spec.exempt)
        self.discovery.register(proc.pid, self.job_id(spec.id), meta)
        self.labels[self.job_id(spec.id)] = meta
        self._set_demand(spec.id, model.demand_gbps if model else spec.cpu_gbps or 0.0)
        if model is not None:
            self.gpus[spec.gpu].processes[proc.pid] = SimProcess(proc.pid, sm_util=int(model.solo_util))
        log.info("sim: started %s pid=%d (%s)%s%s", spec.id, proc.pid, spec.model or f"CPU {spec.cpu_gbps} GB/s",
                 f", {self.cores[spec.id]:g} of {self.cpus} simulated cores on its curve{', reporting'*spec.reports}"
                 if spec.cpu_curve else "", f": {' '.join(spec.command)}" if spec.command else "")

    def _set_demand(self, sim_id: str, gbps: float) -> None:
        assert self.emu is not None and self.emu.control is not None
        self.demand_gbps[sim_id] = gbps
        # A CPU job's bandwidth follows the cores it may run on (core halving).
        cores = self._granted_cpus.get(sim_id, 1) / self._base_cpus.get(sim_id, 1)
        # Spread over the L3 domains: a job's threads run on every socket.
        self.emu.control.set_demand(self.procs[sim_id].pid, gbps * cores * GB / max(1, len(self.domains)))

    def _follow_affinity(self) -> None:
        for sim_id, proc in self.procs.items():
            spec = self.specs[sim_id]
            if spec.is_gpu and not spec.cpu_curve:
                continue
            try:
                cpus = len(os.sched_getaffinity(proc.pid))
            except ProcessLookupError:
                continue
            if spec.is_gpu:
                self._granted_cpus[sim_id] = cpus
                self.cores[sim_id] = self.simulated_cores(cpus)
            elif cpus != self._granted_cpus.get(sim_id):
                self._granted_cpus[sim_id] = cpus
                self._set_demand(sim_id, self.demand_gbps[sim_id])

    def _stop_job(self, sim_id: str) -> None:
        proc = self.procs.pop(sim_id)
        for gpu in self.gpus:
            gpu.processes.pop(proc.pid, None)
        proc.kill()
        proc.wait()
        if self.cgroup_dir is not None:
            _remove_cgroup(os.path.join(self.cgroup_dir, sim_id))
        self.labels.pop(self.job_id(sim_id), None)
        self.demand_gbps.pop(sim_id, None)
        self._base_cpus.pop(sim_id, None)
        self._granted_cpus.pop(sim_id, None)
        self.cores.pop(sim_id, None)
        if self._rates.pop(sim_id, None) is not None:
            try:
                os.unlink(self.state_file(sim_id))
            except FileNotFoundError:
                pass
        log.info("sim: stopped %s", sim_id)

    def fault(self, args: dict) -> None:
        """One scenario fault, now (``args``: a checked ``fault:`` mapping)."""
        assert self.emu is not None and self.emu.control is not None
        if "gpu_lost" in args:
            self.gpus[args["gpu_lost"]].lost = True
        elif "nvml_lost" in args:
            for gpu in self.gpus:
                gpu.lost = bool(args["nvml_lost"])
        elif "nvml_call" in args:
            from nodesim.gpus import CALL_OF

            fault = args["nvml_call"]
            functions = [fn for fn, call in CALL_OF.items() if call == fault["call"]]
            gpus = [self.gpus[fault["gpu"]]] if fault.get("gpu") is not None else list(self.gpus)
            kind, value = ("slow_ms", fault["slow_ms"]) if "slow_ms" in fault else ("faults", fault.get("code"))
            if fault.get("gpu") is None:  # the node-wide calls too (init, count, handle lookups)
                node_wide = getattr(self.gpus, kind)
                if value is None:
                    node_wide.pop(fault["call"], None)
                else:
                    node_wide[fault["call"]] = value
            for gpu in gpus:
                for fn in functions:
                    if value is None:
                        getattr(gpu, kind).pop(fn, None)
                    else:
                        getattr(gpu, kind)[fn] = value
        elif "nvml_driver" in args:
            self.gpus.driver_loaded = args["nvml_driver"]
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
            elif ev.action == "change":
                self._change_model(ev.args["id"], ev.args["model"])
            elif ev.action == "fault":
                self.fault(ev.args)

    def _change_model(self, sim_id: str, model: str) -> None:
        """The job runs another model's curve from now on (its input or batch changed); its
        process, GPU and cgroup stay. A job that already ended is left alone."""
        if sim_id in self.specs:
            self.specs[sim_id] = dataclasses.replace(self.specs[sim_id], model=model)
            log.info("sim: %s now runs as %s", sim_id, model)

    def step(self) -> SimState:
        """Apply due events, then set GPU utilisation from the bandwidth granted now."""
        assert self.emu is not None and self.emu.control is not None
        elapsed = self.elapsed
        self._apply_due_events(elapsed)
        self._follow_affinity()
        per_domain = self._node_rates()
        peak = self.scenario.node.peak_gbps * GB
        utilisation = max((r / peak for r in per_domain.values()), default=0.0)
        utils: dict[str, float] = {}
        for sim_id, proc in self.procs.items():
            spec = self.specs[sim_id]
            if not spec.is_gpu:
                continue
            model = MODELS[spec.model]
            contended = gpu_utilisation(model, utilisation)
            if spec.cpu_curve:  # the model's speed at the cores it has (its peak at the optimum)
                u = contended * MODEL_CURVES[spec.model].share(self.cores[sim_id]) + self._rng.gauss(0.0, 0.5)
            else:
                u = contended + self._rng.gauss(0.0, 0.5)
            u = max(0.0, min(100.0, u))
            if spec.reports:
                self._report_state(sim_id, contended / model.solo_util)
            utils[sim_id] = u
            gpu = self.gpus[spec.gpu]
            if proc.pid in gpu.processes:
                gpu.processes[proc.pid].sm_util = int(round(u))
        for gpu in self.gpus:
            gpu.util_gpu = min(100, sum(p.sm_util for p in gpu.processes.values()))
        self.publish()
        return SimState(elapsed, utilisation, sum(per_domain.values()) / GB, utils, tuple(self.procs),
                        dict(self.cores))

    def _node_rates(self) -> dict[int, float]:
        """Each domain's bytes/s since the last step (NVML's utilisation is an average over its
        sample period, not a moment: a cap held by alternating MB values reads as its mean);
        at the first step, the rates of this moment."""
        assert self.emu is not None and self.emu.control is not None
        at, moved = self.emu.control.moved()
        last, self._last_moved = self._last_moved, (at, moved)
        if last is None or at <= last[0]:
            rates = self.emu.control.rates()
            return {d: sum(g.get(d, 0.0) for g in rates.values()) for d in self.domains}
        span = at - last[0]
        return {d: max(0.0, moved.get(d, 0.0) - last[1].get(d, 0.0)) / span for d in self.domains}

    def _report_state(self, sim_id: str, rate: float) -> None:
        """Tell a reporting job its cores and contention (written only when they changed)."""
        state = (self.cores[sim_id], round(rate, 4))
        if self._rates.get(sim_id) != state:
            self._rates[sim_id] = state
            write_state(self.state_file(sim_id), *state)
