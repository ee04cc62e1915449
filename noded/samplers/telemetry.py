"""One tick's sampling: the resctrl mount, jobs, their monitoring groups, where their
CPUs are, GPUs, bandwidth -> a Sample.

``Telemetry`` owns the samplers and the state they need between ticks (the last
jobs seen, which jobs have ever been GPU jobs). New processes reported by the
process-events connector are placed in their job's monitoring group at once;
the periodic discovery in every tick catches whatever the events missed.

A part that cannot be read is missing, never empty: when discovery fails the
Sample says the jobs are unknown (``jobs_known``), and nothing that depends on
knowing every job (removing ended jobs' groups, forgetting GPU jobs) happens.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Callable, Iterable

from noded.jobs.discovery import JobDiscovery
from noded.jobs.model import Job
from noded.samplers.mongroups import JobMonitor
from noded.jobs.procevents import DEFAULT_PER_UID, ProcessEvents
from noded.samplers.sample import GPU, Sample, build_sample
from noded.samplers import SamplerStatus, run_sampler
from noded.samplers.bandwidth import BandwidthSampler, QuietRead
from noded.samplers.cpus import CpuPlacementSampler
from noded.samplers.memcgroups import MemoryCgroupSampler
from noded.samplers.missing import MissingInputs
from noded.samplers.nvml import NvmlSampler
from noded.samplers.resctrl import ResctrlSession, read_facts

log = logging.getLogger(__name__)


class Telemetry:
    def __init__(self, discovery: JobDiscovery, session: ResctrlSession, monitor: JobMonitor,
                 nvml: NvmlSampler | None, *, cpus: CpuPlacementSampler | None = None,
                 memory: MemoryCgroupSampler | None = None, memory_jobs: Callable[[Sample], Iterable[str]] = lambda s: (),
                 clock: Callable[[], float] = time.monotonic, process_events: bool = True,
                 exec_events_per_uid: int = DEFAULT_PER_UID):
        self.discovery = discovery
        self.session = session
        self.monitor = monitor
        self.nvml = nvml
        self.cpus = cpus
        # the memory cgroups of the jobs right-sizing's memory is for (``memory_jobs``: which,
        # once the sample knows each job's kind)
        self.memory, self.memory_jobs = memory, memory_jobs
        self.bandwidth = BandwidthSampler(monitor, clock=clock)
        self.clock = clock
        self.missing = MissingInputs()  # each input missing: logged when it goes and when it is back
        self._known: dict[str, Job] = {}
        self._ever_gpu: set[str] = set()
        self._lock = threading.Lock()
        self.events: ProcessEvents | None = None
        if process_events:
            self.events = ProcessEvents(self._on_new_process, per_uid=exec_events_per_uid)
            if not self.events.start():
                self.events = None

    def _on_new_process(self, pid: int) -> None:
        with self._lock:
            known = dict(self._known)
        job = self.discovery.job_of_new_process(pid, known)
        if job is None:
            return
        with self._lock:
            self._known[job.id] = job
        self.monitor.add_process(job, pid)

    def sample(self, quiet: QuietRead | None = None) -> Sample:
        """This tick's Sample. ``quiet``: nothing is throttled, capped or overridden, so a
        quiet node's job counters may be read every few ticks (noded.samplers.bandwidth);
        None: every counter this tick."""
        now = self.clock()
        statuses: list[SamplerStatus] = []

        def run(name, read):
            value, status = run_sampler(name, read, self.clock)
            statuses.append(status)
            return value

        rc = self.session.refresh()
        unavailable = () if rc is not None else (f"resctrl: {self.session.unavailable}",)
        facts = run("resctrl_groups", lambda: read_facts(self.session, rc)) if rc is not None else None
        jobs = run("jobs", self.discovery.discover)
        if jobs is not None:
            unavailable += tuple(f"job {j}: cgroup unreadable ({why})"
                                 for j, why in sorted(self.discovery.unreadable.items()))
            unavailable += tuple(f"job {j}: cgroup partly read, its processes found there used ({why})"
                                 for j, why in sorted(self.discovery.partial.items()))
            unavailable += tuple(f"job source directory {d}: cannot be looked into ({why}): jobs new below it unseen"
                                 for d, why in sorted(self.discovery.unlisted.items()))
        report = None
        if jobs is not None:
            with self._lock:
                self._known = dict(jobs)
            if rc is None or facts is not None:  # a failed listing must not look like "no groups"
                report = self.monitor.sync(jobs, facts.groups if facts else None)
        cpus = run("cpus", lambda: self.cpus.sample(jobs)) if self.cpus is not None and jobs is not None else None
        if cpus is not None:
            unavailable += tuple(f"job {j}: cpuset tree partly read, the part read used ({why})"
                                 for j, why in sorted(self.cpus.partial.items()))
        nvml = None
        if self.nvml is not None:
            nvml = run("nvml", lambda: self.nvml.sample(now))
            # its calls ran in NVML's worker thread: their CPU is that thread's
            statuses[-1] = replace(statuses[-1], cpu_s=statuses[-1].cpu_s + self.nvml.take_worker_cpu_s())
        bandwidth = None
        if rc is not None and rc.caps.mon is not None:
            groups = report.groups if report is not None else self.monitor.groups()
            bandwidth = run("resctrl", lambda: self.bandwidth.sample(
                rc, self.session.generation, groups, quiet, report.removed if report is not None else ()))
        sample = build_sample(now, jobs, report, nvml, bandwidth, tuple(statuses), resctrl=facts, cpus=cpus,
                              cpus_unreadable=self.cpus.unreadable if cpus is not None else {},
                              unavailable=unavailable,
                              job_sources=tuple(f"{s.kind} {s.root}" for s in self.discovery.sources))
        sample = self._sticky_gpu_jobs(sample)
        if self.memory is not None and sample.jobs_known:
            jobs = {j: sample.jobs[j] for j in self.memory_jobs(sample)}
            memory = run("memory", lambda: self.memory.sample(jobs))
            sample = replace(sample, memory=memory, samplers=tuple(statuses))
        # every failed sampler too: memory's ran after the Sample's missing was made
        self.missing.update(sample.missing + tuple(f"sampler {s.name}: {s.error}" for s in statuses if not s.ok), now)
        return sample

    def _sticky_gpu_jobs(self, sample: Sample) -> Sample:
        # A job seen holding a GPU stays a GPU job even while NVML cannot see it
        # (a lost GPU, a failed read): it must never be mistaken for a CPU job.
        if sample.jobs_known:
            self._ever_gpu &= set(sample.jobs)
        fixed = {}
        for job_id, js in sample.jobs.items():
            if js.kind == GPU:
                self._ever_gpu.add(job_id)
            elif job_id in self._ever_gpu:
                js = replace(js, kind=GPU)
            fixed[job_id] = js
        return replace(sample, jobs=type(sample.jobs)(fixed))

    def close(self) -> None:
        if self.events is not None:
            self.events.stop()
        if self.nvml is not None:
            self.nvml.close()
        self.monitor.close()
