"""The frozen picture of the node that one tick's policy decides on.

``build_sample`` is pure: it joins what the samplers returned (jobs, NVML,
bandwidth) into per-job facts: is it a GPU job, on which GPUs, how busy, how much
memory bandwidth. What could not be measured is None and named in ``missing``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from noded.jobs.kubepods import PodIdentity
from noded.jobs.model import Job, JobMeta
from noded.samplers.mongroups import MonitorReport
from noded.samplers import SamplerStatus
from noded.samplers.bandwidth import BandwidthSample
from noded.samplers.cpus import CpuPlacement
from noded.samplers.memcgroups import MemoryReading
from noded.samplers.resctrl import ResctrlFacts
from noded.samplers.nvml import GpuSample, NvmlSample

GPU = "gpu"
CPU = "cpu"
# neither seen on a GPU nor known not to be: some GPU's processes could not be read
# (nothing throttles such a job, nothing sizes it)
UNKNOWN = "unknown"


@dataclass(frozen=True)
class JobSample:
    id: str
    source: str
    pids: frozenset[int]
    meta: JobMeta
    kind: str  # gpu | cpu
    gpus: tuple[str, ...]  # UUIDs of the GPUs it holds a context on
    gpu_util: float | None  # percent, mean over its GPUs; None when unknown
    bandwidth_bps: float | None  # over all L3 domains; None when unknown
    monitoring: str  # own | shared | none
    cgroup: str | None = None  # the job's cgroup directory, where it has one
    # noded's control groups holding the job's tasks, as resctrl lists them now
    # (empty: none of noded's; None: not known, e.g. resctrl is not mounted)
    ctrl_groups: frozenset[str] | None = None
    cpus: CpuPlacement | None = None  # where its CPUs are set now (hosts that halve cores)
    mon_parent: str | None = None  # the control group its own monitoring group is in ("" = the root)
    pod: PodIdentity | None = None  # a Kubernetes pod's identity, from its cgroup
    # how old ``bandwidth_bps`` is: seconds since its counters were read (0.0: read this
    # tick; more where a quiet node's thin tick carried it), and the seconds it is a mean
    # over (None: not known, e.g. its first rate, since its group's start)
    bandwidth_age_s: float = 0.0
    bandwidth_window_s: float | None = None


@dataclass(frozen=True)
class Sample:
    t: float  # monotonic seconds
    jobs: Mapping[str, JobSample]
    gpus: tuple[GpuSample, ...]
    nvml_available: bool
    nvml_reason: str | None
    domains: tuple[int, ...]
    node_bandwidth_bps: Mapping[int, float | None]  # per L3 domain
    missing: tuple[str, ...]
    samplers: tuple[SamplerStatus, ...]
    # False when the jobs could not be discovered: ``jobs`` is then empty and means
    # "unknown", never "none"; nothing may be decided or changed about jobs.
    jobs_known: bool = True
    resctrl: ResctrlFacts | None = None  # None: no resctrl mounted
    # (stage, job id, why) for each job whose part of sampling failed this tick: that job
    # held as it was, every other job sampled (stage: monitor, its monitoring group's sync;
    # cpus, where its CPUs are)
    job_errors: tuple[tuple[str, str, str], ...] = ()
    # the job sources discovery read ("kind root" each): none, and no job, is a noded that watches no job
    job_sources: tuple[str, ...] = ()
    # the memory cgroups of the jobs right-sizing's memory is for (None: memory is not sized)
    memory: MemoryReading | None = None
    # every job's bandwidth is its rate over the last tick alone: False on a quiet node's
    # thin tick (each job's mean since its last read) and on the first tick after one
    job_bandwidth_current: bool = True

    @property
    def node_bandwidth_total_bps(self) -> float | None:
        values = list(self.node_bandwidth_bps.values())
        return None if not values or any(v is None for v in values) else sum(values)


@dataclass(frozen=True)
class _GpuShares:
    """What splitting one GPU's time among its jobs reads, gathered once a tick per GPU
    (not once per job on it)."""

    per_pid: dict[int, int]  # pid -> SM utilisation % (per-process samples)
    clients: tuple[int, ...]  # MPS clients
    server: int | None  # the MPS server
    holders: frozenset[int]  # every process on it but the MPS server
    util_gpu: int | None

    @classmethod
    def of(cls, gpu: GpuSample) -> "_GpuShares":
        return cls(dict(gpu.process_sm_util), tuple(p.pid for p in gpu.processes if p.mps_client),
                   next((p.pid for p in gpu.processes if p.mps_server), None),
                   frozenset(p.pid for p in gpu.processes if not p.mps_server), gpu.util_gpu)


def _job_gpu_util(pids: frozenset[int], gpu: _GpuShares) -> float | None:
    """A job's share of one GPU's time.

    Per-process SM samples where the job's own processes have them; under MPS the
    driver credits all client work to the server, so the server's utilisation is
    split evenly among the MPS clients on that GPU. If nothing per-process exists
    and the job is alone on the device, the device's utilisation is the job's.
    """
    per_pid = gpu.per_pid
    own = [per_pid[p] for p in pids if p in per_pid]
    if own:
        return float(sum(own))
    clients = gpu.clients
    if any(p in pids for p in clients):
        total = per_pid.get(gpu.server) if gpu.server is not None else None
        if total is None:
            total = gpu.util_gpu
        return None if total is None else total * sum(p in pids for p in clients) / len(clients)
    if gpu.holders and gpu.holders <= pids and gpu.util_gpu is not None:
        return float(gpu.util_gpu)
    return None


def _gpus_held(jobs: Mapping[str, Job], gpus: tuple[GpuSample, ...] | list[GpuSample]) -> dict[str, list[GpuSample]]:
    """job id -> the GPUs any of its processes is on, in the GPUs' order. From each GPU
    process to the jobs holding it (a process may be in a cgroup job and a registered
    tree both), so the cost follows the processes, not jobs x GPUs a tick."""
    if not gpus:
        return {}
    on_gpu = {pid for g in gpus for pid in g.pids()}
    jobs_of: dict[int, list[str]] = {}
    for job in jobs.values():
        for pid in on_gpu.intersection(job.pids):
            jobs_of.setdefault(pid, []).append(job.id)
    held: dict[str, list[GpuSample]] = {}
    for g in gpus:
        for job_id in {j for pid in g.pids() for j in jobs_of.get(pid, ())}:
            held.setdefault(job_id, []).append(g)
    return held


def _ctrl_groups(job: Job, resctrl: ResctrlFacts | None) -> frozenset[str] | None:
    if resctrl is None:
        return None
    # A control group's task list holds its monitoring groups' tasks too.
    return frozenset(n for n, tids in resctrl.groups.ctrl_tasks.items() if tids & job.pids)


def build_sample(
    t: float,
    jobs: Mapping[str, Job] | None,
    monitor: MonitorReport | None,
    nvml: NvmlSample | None,
    bandwidth: BandwidthSample | None,
    samplers: tuple[SamplerStatus, ...] = (),
    *,
    resctrl: ResctrlFacts | None = None,
    cpus: Mapping[str, CpuPlacement] | None = None,
    cpus_unreadable: Mapping[str, str] = MappingProxyType({}),  # job -> why its CPUs could not be read
    unavailable: tuple[str, ...] = (),
    job_sources: tuple[str, ...] = (),
) -> Sample:
    gpus = nvml.gpus if nvml else ()
    if nvml is not None:
        processes_known = nvml.processes_known
    else:  # NVML off (a CPU-only node), unless its sampler failed this tick
        processes_known = not any(s.name == "nvml" and not s.ok for s in samplers)
    out: dict[str, JobSample] = {}
    held_by = _gpus_held(jobs or {}, gpus)
    # looked up once, not once a job: this loop runs for every job every tick
    monitoring = monitor.monitoring if monitor else MappingProxyType({})
    groups = monitor.groups if monitor else MappingProxyType({})
    job_bps = bandwidth.job_bps if bandwidth is not None else {}
    ages = bandwidth.job_age_s if bandwidth is not None else {}
    windows = bandwidth.job_window_s if bandwidth is not None else {}
    cpus = cpus or {}
    no_gpu_kind = CPU if processes_known else UNKNOWN
    # each GPU's, once a tick (by the sample's identity: nothing here assumes indexes are unique)
    shares = {id(g): _GpuShares.of(g) for g in gpus} if held_by else {}
    for job in (jobs or {}).values():
        held = held_by.get(job.id, ())
        util = None
        if held:
            utils = [_job_gpu_util(job.pids, shares[id(g)]) for g in held]
            util = None if None in utils else sum(utils) / len(utils)
        rates = job_bps.get(job.id)
        bw = None if rates is None or None in rates.values() else sum(rates.values())
        group = groups.get(job.id)
        out[job.id] = JobSample(
            job.id, job.source, job.pids, job.meta, GPU if held else no_gpu_kind,
            tuple(g.uuid or f"index-{g.index}" for g in held) if held else (), util, bw,
            monitoring.get(job.id, "none"), job.cgroup,
            _ctrl_groups(job, resctrl), cpus.get(job.id),
            group.parent.name if group is not None else None,
            pod=job.pod, bandwidth_age_s=ages.get(job.id, 0.0), bandwidth_window_s=windows.get(job.id),
        )
    return Sample(
        t, MappingProxyType(out), tuple(gpus), bool(nvml and nvml.available), nvml.reason if nvml else None,
        bandwidth.domains if bandwidth else (), MappingProxyType(dict(bandwidth.node_bps) if bandwidth else {}),
        _missing(samplers, nvml, bandwidth, unavailable), samplers, jobs is not None, resctrl,
        _job_errors(monitor, cpus_unreadable), tuple(job_sources),
        job_bandwidth_current=bandwidth.jobs_current if bandwidth is not None else True,
    )


def _missing(samplers: tuple[SamplerStatus, ...], nvml: NvmlSample | None, bandwidth: BandwidthSample | None,
             unavailable: tuple[str, ...]) -> tuple[str, ...]:
    """What this tick could not see, each named: failed samplers, NVML, each GPU, counters."""
    missing: list[str] = [f"sampler {s.name}: {s.error}" for s in samplers if not s.ok] + list(unavailable)
    if nvml is not None and not nvml.available:
        missing.append(f"nvml: {nvml.reason}")
    missing += [f"gpu {g.index}: {g.error}" for g in (nvml.gpus if nvml else ()) if g.error]
    if bandwidth is not None:
        missing += bandwidth.missing
    return tuple(missing)


def _job_errors(monitor: MonitorReport | None, cpus_unreadable: Mapping[str, str]) -> tuple[tuple[str, str, str], ...]:
    """The jobs whose own part of sampling failed (each held, the others sampled): its
    monitoring group's sync; its CPUs, where the sampler was asked for them and could not
    read them (a job whose CPUs nothing may change this tick is not asked: not an error)."""
    out = [("monitor", job, why) for job, why in sorted(monitor.errors.items())] if monitor else []
    out += [("cpus", job, f"its CPUs could not be read: {why}") for job, why in sorted(cpus_unreadable.items())]
    return tuple(out)
