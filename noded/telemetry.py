"""One tick's sampling: jobs, their monitoring groups, GPUs, bandwidth -> a Sample.

``Telemetry`` owns the samplers and the state they need between ticks (the last
jobs seen, which jobs have ever been GPU jobs). New processes reported by the
process-events connector are placed in their job's monitoring group at once;
the periodic discovery in every tick catches whatever the events missed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Callable

from .jobs.discovery import JobDiscovery
from .jobs.model import Job
from .jobs.monitoring import JobMonitor, MonitorReport
from .jobs.procevents import ProcessEvents
from .sample import GPU, Sample, build_sample
from .samplers import SamplerStatus, run_sampler
from .samplers.bandwidth import BandwidthSampler
from .samplers.nvml import NvmlSampler

log = logging.getLogger(__name__)


class _JobsSampler:
    name = "jobs"

    def __init__(self, discovery: JobDiscovery, monitor: JobMonitor):
        self.discovery = discovery
        self.monitor = monitor

    def sample(self, now: float) -> tuple[dict[str, Job], MonitorReport]:
        jobs = self.discovery.discover()
        return jobs, self.monitor.sync(jobs)


class Telemetry:
    def __init__(self, discovery: JobDiscovery, monitor: JobMonitor, nvml: NvmlSampler | None,
                 bandwidth: BandwidthSampler | None, *, clock: Callable[[], float] = time.monotonic,
                 process_events: bool = True):
        self.discovery = discovery
        self.monitor = monitor
        self.nvml = nvml
        self.bandwidth = bandwidth
        self.clock = clock
        self._jobs_sampler = _JobsSampler(discovery, monitor)
        self._known: dict[str, Job] = {}
        self._ever_gpu: set[str] = set()
        self._lock = threading.Lock()
        self.events: ProcessEvents | None = None
        if process_events:
            self.events = ProcessEvents(self._on_new_process)
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

    def sample(self) -> Sample:
        now = self.clock()
        statuses: list[SamplerStatus] = []
        jobs_report, st = run_sampler(self._jobs_sampler, now, self.clock)
        statuses.append(st)
        jobs, report = jobs_report if jobs_report else (None, None)
        if jobs is not None:
            with self._lock:
                self._known = dict(jobs)
        nvml = None
        if self.nvml is not None:
            nvml, st = run_sampler(self.nvml, now, self.clock)
            statuses.append(st)
        bandwidth = None
        if self.bandwidth is not None:
            bandwidth, st = run_sampler(self.bandwidth, now, self.clock)
            statuses.append(st)
        sample = build_sample(now, jobs, report, nvml, bandwidth, tuple(statuses))
        return self._sticky_gpu_jobs(sample)

    def _sticky_gpu_jobs(self, sample: Sample) -> Sample:
        # A job seen holding a GPU stays a GPU job even while NVML cannot see it
        # (a lost GPU, a failed read): it must never be mistaken for a CPU job.
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
