"""Prometheus metrics from the last tick's result, on a private registry.

A scrape reads one immutable ``TickResult`` (swapped whole each tick) and nothing
else: the control state (overrides, pause, action counts) and everything counted
since start (duration histograms, failed writes, failed samplers and ticks) are
snapshots the tick took. So a scrape needs no lock, never touches hardware and
never sees a half-made tick. Before the first tick only the build info and the
counters (at 0) are there.

Names are ``noded_<subsystem>_<name>_<unit>``; per-job series carry ``job_id`` (a
``job`` label would be renamed ``exported_job`` by Prometheus); GPU series carry the
labels ``gpu`` (index as a string) and ``UUID`` as dcgm-exporter writes them, so the
two join in PromQL, with utilisation as a ratio 0..1 (dcgm's is percent). Counters
exist from the first scrape with every label set noded knows, so ``rate()`` and
``increase()`` see their first increment.
"""

from __future__ import annotations

import math
import platform
from typing import Callable, Iterable, Iterator, Mapping, TypeVar

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    InfoMetricFamily)
from prometheus_client.utils import floatToGoString

from noded.util.buildinfo import revision as build_revision
from noded.util.buildinfo import version as build_version
from noded.util.journal import escaped

from noded.loop.control import ControlSnapshot
from noded.loop.daemon import JOB_ERROR_STAGES as _JOB_ERROR_STAGES
from noded.loop.daemon import Daemon, TickResult
from noded.rightsize.service import STATES as SIZING_STATES
from noded.loop.tickstats import BUCKETS, Histogram, Totals

K = TypeVar("K")

#: (action, cause) pairs the policy and operators' overrides produce (see policy.contention)
ACTIONS: tuple[tuple[str, str], ...] = (
    ("throttle", "contention"), ("throttle", "cap"), ("throttle", "override"),
    ("release", "calm"), ("release", "override"), ("release", "override_ended"), ("release", "gpu_job"),
    ("release", "exempt"), ("release", "inputs_missing"), ("release", "capped"),
)
#: results of a co-location admission (colocation.service)
ADMISSION_RESULTS = ("admit", "refuse")
#: (actuator, operation) of a failed change: a throttle level up or down (mba, cores), a
#: level's control group left in place (mba remove), an original value not recorded or
#: forgotten (cores record), an MPS control daemon that failed and was restarted or did
#: not start (mps), a soft memory limit not written or its original not recorded (memory)
ACTUATOR_OPERATIONS: tuple[tuple[str, str], ...] = (
    ("mba", "throttle"), ("mba", "release"), ("mba", "remove"), ("cores", "throttle"), ("cores", "release"),
    ("cores", "record"), ("mps", "restart"), ("mps", "start"), ("memory", "write"), ("memory", "record"),
)
#: the samplers a tick runs (telemetry.Telemetry.sample)
SAMPLERS = ("resctrl_groups", "jobs", "cpus", "nvml", "resctrl", "memory")
#: the stages of a tick (daemon.Daemon.tick)
STAGES = ("sample", "decide", "act", "total")
#: where one job's part of a tick can fail alone, that job held (daemon.JOB_ERROR_STAGES)
JOB_ERROR_STAGES = tuple(sorted(_JOB_ERROR_STAGES))


def _with_zeros(known: Iterable[K], seen: Mapping[K, float]) -> dict[K, float]:
    """Every known key at 0, and what was counted (keys not known included)."""
    return {**{k: 0 for k in known}, **seen}


def _ratio(percent: float | None) -> float | None:
    """A driver's percent as a ratio 0..1; out-of-range values clamped, NaN left out."""
    if percent is None or math.isnan(percent):
        return None
    return min(1.0, max(0.0, percent / 100.0))


def _histogram(name: str, doc: str, label: str, known: Iterable[str],
               seen: Mapping[str, Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=[label])
    for key, h in sorted(_with_zeros(known, seen).items()):
        h = h or Histogram()
        family.add_metric([key], [(floatToGoString(b), n) for b, n in zip(BUCKETS, h.buckets)]
                          + [("+Inf", h.count)], h.sum)
    return family


def _surrogate(c: str) -> bool:
    return "\ud800" <= c <= "\udfff"


def label_value(value: str) -> str:
    """A label value the exposition can encode, one to one: a job id is a cgroup's name,
    bytes that need not be UTF-8 (a lone surrogate in Python), and one such value would fail
    the whole scrape; each lone surrogate is written as its escape (``\\udcff`` for the byte
    0xff) and a backslash doubled only where it would read as one (``escaped``), so a
    name holding the text ``\\udcff`` is not the label of the name with the byte."""
    return escaped(value, _surrogate)


def _text_labels(family):
    """``family`` with every label value one the exposition can encode (``label_value``)."""
    for i, sample in enumerate(family.samples):
        if not all(v.isascii() and "\\" not in v for v in sample.labels.values()):
            labels = {k: label_value(v) for k, v in sample.labels.items()}
            family.samples[i] = sample._replace(labels=labels)
    return family


class NodedCollector:
    """Yields from the last tick's result only (``last`` returns it, or None before the
    first tick). ``colocation``, ``rightsize``: that service is on, so its counters exist
    from the start."""

    def __init__(self, last: Callable[[], TickResult | None], info: Mapping[str, str], *, colocation: bool = False,
                 rightsize: bool = False, totals: Callable[[], Totals] | None = None,
                 last_round: Callable[[], float | None] | None = None):
        self.last = last
        # the wall-clock time the loop's last round ended (None before the first): a hung
        # loop still serves its last result, and this standing still is how it shows
        self.last_round = last_round
        # the counters as of the loop's last round: a tick that raised publishes no result,
        # and its failure must be counted all the same (the last result's, where not given)
        self.totals = totals
        self.info = dict(info)
        self.colocation = colocation
        self.rightsize = rightsize

    def describe(self):
        return []  # collected lazily from the last tick; no hardware is touched at registration

    def collect(self):
        r = self.last()  # read once: everything below comes from this one result
        yield from self._build_and_mode()
        yield from map(_text_labels, self._counters(r, self.totals() if self.totals is not None else None))
        ended = self.last_round() if self.last_round is not None else None
        if ended is not None:
            stamp = GaugeMetricFamily("noded_last_tick_timestamp_seconds", "Wall-clock time (Unix seconds) the "
                                      "control loop's last round ended, its tick completed or failed; "
                                      "time() minus this is how long the loop has been stalled")
            stamp.add_metric([], ended)
            yield stamp
        if r is not None:
            yield from map(_text_labels, self._state(r, r.control))

    def _build_and_mode(self):
        """What was built (version, revision, Python: the same for the process's whole
        life), and apart from it how this run was started (throttle method, dry run):
        settings of a run are no build's, and a dashboard counts builds by their labels."""
        info = InfoMetricFamily("noded_build", "noded build information: the package's version, the source "
                                "revision it was built from (unknown where not known) and the Python running it")
        info.add_metric([], {"version": build_version(), "revision": build_revision(),
                             "python": platform.python_version()})
        yield info
        method = GaugeMetricFamily("noded_throttle_method", "The throttle this run uses (1 for it): mba, cores, or "
                                   "none (nothing can throttle here)", labels=["method"])
        method.add_metric([self.info.get("throttle", "none")], 1)
        yield method
        dry = GaugeMetricFamily("noded_dry_run", "1 when this run is a dry run (--dry-run: decisions are made and "
                                "logged, nothing is written)")
        dry.add_metric([], 1 if self.info.get("dry_run") == "true" else 0)
        yield dry

    def _counters(self, r: TickResult | None, totals: Totals | None):
        control = r.control if r is not None else ControlSnapshot()
        if totals is None:
            totals = r.totals if r is not None else Totals()
        colo = r.colocation if r is not None else None
        yield from self._decision_counters(r, control, colo)
        yield from self._tick_counters(r, totals)
        yield from self._error_counters(totals, colo)
        yield from self._time_counters(totals)

    def _decision_counters(self, r: TickResult | None, control: ControlSnapshot, colo):
        """Throttle steps, admission decisions and right-sizing's probes and answers."""
        actions = CounterMetricFamily("noded_throttle_actions", "Throttle and release steps taken, by cause",
                                      labels=["action", "cause"])
        for (kind, cause), n in sorted(_with_zeros(ACTIONS, control.actions).items()):
            actions.add_metric([kind, cause], n)
        yield actions
        if self.colocation or colo is not None:
            adm = CounterMetricFamily("noded_admission_decisions", "Co-location admission decisions",
                                      labels=["result"])
            for result, n in sorted(_with_zeros(ADMISSION_RESULTS, colo.decisions if colo else {}).items()):
                adm.add_metric([result], n)
            yield adm
        rs = r.rightsize if r is not None else None
        if self.rightsize or rs is not None:
            probes = CounterMetricFamily("noded_rightsize_probes", "Right-sizing probes begun (a GPU job given a "
                                         "number of cores to measure)")
            probes.add_metric([], rs.probes if rs is not None else 0)
            yield probes
            sized = CounterMetricFamily("noded_rightsize_sized", "Right-sizing answers found (a GPU job sized: "
                                        "searched, confirmed from history, or at the node's limit)")
            sized.add_metric([], rs.sized if rs is not None else 0)
            yield sized
            unkept = CounterMetricFamily("noded_rightsize_history_errors", "Right-sizing answers that could not be "
                                         "remembered (the state directory's rightsize.json could not be written)")
            unkept.add_metric([], rs.history_errors if rs is not None else 0)
            yield unkept

    @staticmethod
    def _tick_counters(r: TickResult | None, totals: Totals):
        """Ticks done, overrun and failed, and jobs held by an error in their part of one."""
        ticks = CounterMetricFamily("noded_ticks", "Control-loop ticks completed")
        ticks.add_metric([], r.tick if r is not None else 0)
        yield ticks
        overruns = CounterMetricFamily("noded_tick_overruns", "Ticks that took longer than the tick period")
        overruns.add_metric([], r.overruns if r is not None else 0)
        yield overruns
        failures = CounterMetricFamily("noded_tick_failures", "Ticks that raised an error (the loop went on; "
                                       "see the journal)")
        failures.add_metric([], totals.tick_failures)
        yield failures
        held = CounterMetricFamily("noded_tick_job_errors", "Jobs held by an error in their own part of a tick, by "
                                   "stage (monitor: its monitoring group's sync; cpus: reading where its CPUs are; act: "
                                   "its change); the other jobs went on (the journal says each once)", labels=["stage"])
        for stage, n in sorted(_with_zeros(JOB_ERROR_STAGES, totals.job_errors).items()):
            held.add_metric([stage], n)
        yield held

    @staticmethod
    def _error_counters(totals: Totals, colo):
        """Changes and sampler runs that failed."""
        errors = CounterMetricFamily("noded_actuator_errors", "Changes that failed: a throttle level up or down "
                                     "(mba, cores), a control group not removed (mba remove), an original not "
                                     "recorded (cores record), an MPS control daemon restarted or not started (mps), a "
                                     "soft memory limit not written or its original not recorded (memory)",
                                     labels=["actuator", "operation"])
        seen = dict(totals.actuator_errors)
        if colo is not None:
            seen[("mps", "restart")] = colo.mps_restarts
            seen[("mps", "start")] = colo.mps_start_failures
        for (actuator, operation), n in sorted(_with_zeros(ACTUATOR_OPERATIONS, seen).items()):
            errors.add_metric([actuator, operation], n)
        yield errors
        serr = CounterMetricFamily("noded_sampler_errors", "Sampler runs that failed (that part was missing "
                                   "from the tick)", labels=["sampler"])
        for name, n in sorted(_with_zeros(SAMPLERS, totals.sampler_errors).items()):
            serr.add_metric([name], n)
        yield serr

    @staticmethod
    def _time_counters(totals: Totals):
        """The time ticks, stages and samplers took."""
        yield _histogram("noded_tick_duration_seconds", "Time ticks spent in each stage (total: the whole tick)",
                         "stage", STAGES, totals.tick_durations)
        yield _histogram("noded_sampler_duration_seconds", "Time each sampler took per tick", "sampler", SAMPLERS,
                         totals.sampler_durations)
        cpu = CounterMetricFamily("noded_sampler_cpu_seconds", "CPU time each sampler took, in all (the tick's "
                                  "thread's; nvml's in its worker thread); all of noded's: process_cpu_seconds_total",
                                  labels=["sampler"])
        for name, seconds in sorted(_with_zeros(SAMPLERS, totals.sampler_cpu).items()):
            cpu.add_metric([name], seconds)
        yield cpu

    def _state(self, r: TickResult, control: ControlSnapshot):
        yield from self._control_gauges(r, control)
        yield from self._colocation_gauges(r)
        yield from self._sampler_gauges(r)
        yield from self._node_gauges(r)
        yield from self._job_gauges(r)
        yield from _cap_metrics(r)
        yield from self._baseline_gauges(r)
        yield from self._gpu_gauges(r.sample)
        yield from self._resctrl_gauges(r.sample.resctrl)
        if r.rightsize is not None:
            yield from self._rightsize(r)
        if r.memory is not None:
            yield from self._memory(r)
        yield from self._state_dir_gauges(r)

    @staticmethod
    def _control_gauges(r: TickResult, control: ControlSnapshot):
        """What operators decided (overrides, a pause) and the configured peak and thresholds."""
        cfg = r.config
        active = GaugeMetricFamily("noded_override_active", "Operator overrides in force (1 each), and who set them",
                                   labels=["job_id", "kind", "uid"])
        for o in control.overrides:
            active.add_metric([o.job, o.kind, str(o.set_by_uid)], 1.0)
        yield active
        paused = GaugeMetricFamily("noded_eliminator_paused", "1 while an operator has paused the eliminator")
        paused.add_metric([], 1.0 if control.paused else 0.0)
        yield paused
        if cfg is not None:
            peak = GaugeMetricFamily("noded_node_memory_bandwidth_peak_bytes_per_second",
                                     "Configured peak memory bandwidth of one L3 domain")
            peak.add_metric([], cfg.peak_bytes_per_domain)
            yield peak
            thr = GaugeMetricFamily("noded_contention_threshold_ratio", "Share of the peak at which contention is "
                                    "acted on, and below which throttles are released", labels=["threshold"])
            thr.add_metric(["throttle"], cfg.contention.threshold)
            thr.add_metric(["release"], cfg.contention.release_threshold)
            yield thr

    @staticmethod
    def _colocation_gauges(r: TickResult):
        """Jobs admitted per GPU, and whether the MPS control daemon answers."""
        colo = r.colocation
        if colo is not None:
            held = GaugeMetricFamily("noded_colocation_jobs", "Jobs admitted onto each GPU by noded",
                                     labels=["UUID"])
            for uuid, n in sorted(colo.jobs_per_gpu.items()):
                held.add_metric([uuid], n)
            yield held
            mps = GaugeMetricFamily("noded_mps_up", "1 while the MPS control daemon answers")
            mps.add_metric([], 1.0 if colo.mps_state == "ok" else 0.0)
            yield mps

    @staticmethod
    def _sampler_gauges(r: TickResult):
        """Whether each sampler succeeded, inputs missing, NVML, and what noded watches."""
        s = r.sample
        ok = GaugeMetricFamily("noded_sampler_success", "Whether the sampler succeeded in the last tick (1/0)",
                               labels=["sampler"])
        for st in s.samplers:
            ok.add_metric([st.name], 1.0 if st.ok else 0.0)
        yield ok
        missing = GaugeMetricFamily("noded_inputs_missing", "Inputs that could not be measured in the last tick")
        missing.add_metric([], len(s.missing))
        yield missing
        nvml = GaugeMetricFamily("noded_nvml_available", "Whether NVML answered (0 means a CPU-only view)")
        nvml.add_metric([], 1.0 if s.nvml_available else 0.0)
        yield nvml
        if r.watching:
            watched = GaugeMetricFamily("noded_watching", "1 while noded watches this input (jobs: a job source is "
                                        "configured and discovery works; gpus: NVML lists at least one GPU; resctrl: "
                                        "mounted), 0 while it does not (`nodectl status` says why)", labels=["what"])
            for w in r.watching:
                watched.add_metric([w.what], 1.0 if w.watching else 0.0)
            yield watched

    @staticmethod
    def _node_gauges(r: TickResult):
        """The node's bandwidth per domain, its busiest share of the peak, and contention."""
        s = r.sample
        node = GaugeMetricFamily("noded_node_memory_bandwidth_bytes_per_second",
                                 "Memory bandwidth of the node, per L3 domain (MBM)", labels=["domain"])
        for dom, v in sorted(s.node_bandwidth_bps.items()):
            if v is not None:
                node.add_metric([str(dom)], v)
        yield node
        share = GaugeMetricFamily("noded_node_memory_bandwidth_ratio",
                                  "Busiest L3 domain's bandwidth as a share of its peak")
        if r.decision.node_share is not None:
            share.add_metric([], r.decision.node_share)
        yield share
        contended = GaugeMetricFamily("noded_contention_triggered",
                                      "1 when node bandwidth is over the threshold and a GPU job is slowed")
        contended.add_metric([], 1.0 if r.decision.triggered else 0.0)
        yield contended

    @staticmethod
    def _job_gauges(r: TickResult):
        """Per job: its bandwidth, throttle level, monitoring mode and GPU utilisation."""
        s = r.sample
        jbw = GaugeMetricFamily("noded_job_memory_bandwidth_bytes_per_second", "Memory bandwidth of a job (MBM)",
                                labels=["job_id", "kind"])
        level = GaugeMetricFamily("noded_job_throttle_level", "Throttle level in force (0 = none)",
                                  labels=["job_id", "method"])
        mon = GaugeMetricFamily("noded_job_monitoring", "How a job's bandwidth is monitored (1 for its mode)",
                                labels=["job_id", "mode"])
        jutil = GaugeMetricFamily("noded_job_gpu_utilization_ratio", "GPU utilisation of a GPU job on a GPU (0..1)",
                                  labels=["job_id", "gpu", "UUID"])
        index = {g.uuid: g.index for g in s.gpus}
        for job_id, js in sorted(s.jobs.items()):
            if js.bandwidth_bps is not None:
                jbw.add_metric([job_id, js.kind], js.bandwidth_bps)
            level.add_metric([job_id, r.throttle_kind or "none"], r.levels.get(job_id, 0))
            mon.add_metric([job_id, js.monitoring], 1.0)
            util = _ratio(js.gpu_util)
            if util is not None:
                for uuid in js.gpus:
                    jutil.add_metric([job_id, str(index.get(uuid, "")), uuid], util)
        yield jbw
        yield level
        yield mon
        yield jutil

    @staticmethod
    def _baseline_gauges(r: TickResult):
        """Per GPU job: whether its uncontended utilisation is known, and its value and source."""
        s = r.sample
        known = GaugeMetricFamily("noded_job_gpu_baseline_known",
                                  "1 when a GPU job's uncontended utilisation is known (its slowdown can be seen)",
                                  labels=["job_id"])
        base = GaugeMetricFamily("noded_job_gpu_baseline_ratio",
                                 "A GPU job's uncontended utilisation (0..1), and where it came from (learned, job, "
                                 "model)", labels=["job_id", "source"])
        for job_id, js in sorted(s.jobs.items()):
            if js.kind == "gpu":
                known.add_metric([job_id], 1.0 if job_id in r.baselines else 0.0)
                if job_id in r.baselines:
                    value, source = r.baselines[job_id]
                    ratio = _ratio(value)
                    if ratio is not None:
                        base.add_metric([job_id, source], ratio)
        yield known
        yield base

    @staticmethod
    def _gpu_gauges(s):
        """Each GPU's utilisation."""
        gutil = GaugeMetricFamily("noded_gpu_utilization_ratio", "GPU utilisation (NVML, 0..1; dcgm-exporter's "
                                  "DCGM_FI_DEV_GPU_UTIL is this times 100)", labels=["gpu", "UUID"])
        for g in s.gpus:
            util = _ratio(g.util_gpu)
            if util is not None and g.uuid:
                gutil.add_metric([str(g.index), g.uuid], util)
        yield gutil

    @staticmethod
    def _resctrl_gauges(facts):
        """The RMIDs and CLOSIDs the hardware offers and noded holds."""
        if facts is not None and facts.num_rmids is not None:
            cap = GaugeMetricFamily("noded_resctrl_rmids_capacity",
                                    "RMIDs the hardware offers (monitoring IDs; the root group holds one)")
            cap.add_metric([], facts.num_rmids)
            yield cap
            used = GaugeMetricFamily("noded_resctrl_rmids_used_by_noded", "RMIDs held by noded's resctrl groups")
            used.add_metric([], facts.rmids_used_by_noded)
            yield used
        if facts is not None and facts.max_ctrl_groups:
            cap = GaugeMetricFamily("noded_resctrl_closids_capacity",
                                    "CLOSIDs the hardware offers (control groups; the root group holds one)")
            cap.add_metric([], facts.max_ctrl_groups + 1)
            yield cap
            used = GaugeMetricFamily("noded_resctrl_closids_used_by_noded", "CLOSIDs held by noded's control groups")
            used.add_metric([], len(facts.groups.ctrl_tasks))
            yield used

    @staticmethod
    def _state_dir_gauges(r: TickResult):
        """Whether originals can be recorded."""
        writable = GaugeMetricFamily("noded_state_writable",
                                     "1 while originals can be recorded in the state directory; at 0 noded changes "
                                     "nothing new")
        writable.add_metric([], 0.0 if r.state_unwritable else 1.0)
        yield writable


    @staticmethod
    def _rightsize(r: TickResult):
        """Right-sizing's series (where it is on): each job's CPUs now, each sized GPU job's
        target, answer and state, CPUs lent by the GPU array."""
        rs, s = r.rightsize, r.sample
        after = {**r.cpus.at_original, **r.cpus.cpus} if r.cpus is not None else {}
        cpus = GaugeMetricFamily("noded_job_cpus", "CPUs a job has now (after this tick's plan was applied; "
                                 "role: gpu, cpu, or unknown: a job not seen on a GPU while some GPU's processes are unreadable)", labels=["job_id", "role"])
        for job_id, js in sorted(s.jobs.items()):
            held = js.cpus.held() if js.cpus is not None else None
            n = len(after[job_id]) if job_id in after else (None if held is None else len(held))
            if n is not None:
                cpus.add_metric([job_id, js.kind], n)
        yield cpus
        target = GaugeMetricFamily("noded_job_cpus_target", "Cores right-sizing asks for a GPU job now (the probe's, "
                                   "or the answer's)", labels=["job_id"])
        optimal = GaugeMetricFamily("noded_job_cpus_optimal", "Cores right-sizing found best for a GPU job (once "
                                    "sized; absent while probing, pinned or stopped)", labels=["job_id"])
        state = GaugeMetricFamily("noded_job_sizing_state", "A GPU job's sizing (1 for its state: "
                                  + ", ".join(SIZING_STATES) + ")", labels=["job_id", "state"])
        for job_id, v in sorted(rs.jobs.items()):
            target.add_metric([job_id], v.target)
            if v.optimal is not None:
                optimal.add_metric([job_id], v.optimal)
            state.add_metric([job_id, v.state], 1.0)
        yield target
        yield optimal
        yield state
        lent = GaugeMetricFamily("noded_job_cpus_lent", "GPU-array CPUs a CPU job has on loan", labels=["job_id"])
        for job_id, borrowed in sorted(rs.borrowed.items()):
            lent.add_metric([job_id], len(borrowed))
        yield lent
        total = GaugeMetricFamily("noded_cpus_lent", "GPU-array CPUs lent to CPU jobs (the node's total)")
        total.add_metric([], len(rs.lent))
        yield total
        ok = GaugeMetricFamily("noded_rightsize_plan_ok", "1 when this tick made a plan of CPUs (or had nothing to "
                               "plan); 0 when none could be made (more sized GPU jobs than CPUs: the journal says why)")
        ok.add_metric([], 0.0 if rs.plan_error else 1.0)
        yield ok

    @staticmethod
    def _memory(r: TickResult):
        """Right-sizing's memory (where rightsize.memory.cache_gb is set): each job's cache
        share from the split, and the soft limit and memory its cgroup showed."""
        m = r.memory
        units = GaugeMetricFamily("noded_job_memory_cache_units", "Memory units of rightsize.memory.cache_gb the "
                                  "split gives a GPU job with a declared cache curve", labels=["job_id"])
        unit_bytes = GaugeMetricFamily("noded_memory_unit_bytes", "Bytes in one memory unit of the split")
        if m.split is not None:
            for job_id, n in sorted(m.split.units.items()):
                units.add_metric([job_id], n)
            unit_bytes.add_metric([], m.split.unit_bytes)
        yield units
        yield unit_bytes
        limit = GaugeMetricFamily("noded_job_memory_soft_limit_bytes", "A sized job's soft memory limit in force "
                                  "(memory.high, or the v1 soft limit; absent where unlimited)", labels=["job_id"])
        used = GaugeMetricFamily("noded_job_memory_bytes", "A sized job's memory as its cgroup counts it (kind: anon "
                                 "or file, i.e. page cache)", labels=["job_id", "kind"])
        if m.result is not None:
            for job_id, text in sorted(m.result.limits.items()):
                if text.isdigit() and int(text) < (1 << 62):  # v1 shows "no limit" as a huge number, v2 as max
                    limit.add_metric([job_id], int(text))
            for job_id, cg in sorted(m.result.cgroups.items()):
                used.add_metric([job_id, "anon"], cg.anon_bytes)
                used.add_metric([job_id, "file"], cg.file_bytes)
        yield limit
        yield used


#: why a report was dropped on the report socket: over its uid's budget, over its job's
REPORT_DROPS = ("uid", "job")


class TenantBudgetCollector:
    """What tenants' floods cost and what was dropped for it (issue #22): job directories
    per source and whether discovery's budget was reached, exec events dropped over their
    uid's budget, reports dropped. Each is an int or a tuple its owner swaps whole
    (discovery, the process-events thread, the report socket's thread), read as it is."""

    def __init__(self, discovery, events, reports):
        self.discovery = discovery  # a jobs.JobDiscovery (None: no telemetry): its cost, what it could not place
        self.events = events  # a jobs.procevents.ProcessEvents (None: not read here): exec events
        self.reports = reports  # the report socket's admin.server.ReportBudget (None: it does not listen)

    def describe(self):
        return []

    def collect(self):
        discovery = self.discovery
        dirs = GaugeMetricFamily("noded_job_source_dirs", "Job directories a job source's patterns match",
                                 labels=["source"])
        polled = GaugeMetricFamily("noded_job_source_polled_dirs", "Job directories discovery read in its last run "
                                   "(at most jobs.max_polled_per_source)", labels=["source"])
        capped = GaugeMetricFamily("noded_job_source_capped", "1 while a job source holds more directories than are "
                                   "read per tick: empty ones are read in turn, by owner", labels=["source"])
        costs = discovery.cost if discovery is not None else ()
        for cost in costs:
            dirs.add_metric([cost.source], cost.dirs)
            polled.add_metric([cost.source], cost.polled)
            capped.add_metric([cost.source], 1.0 if cost.capped else 0.0)
        if costs:  # from the first discovery on
            yield from map(_text_labels, (dirs, polled, capped))
        events = self.events
        # unlabelled counters: client_python's value= adds their one sample
        yield CounterMetricFamily("noded_process_events", "Exec events read from the kernel's connector",
                                  value=events.events if events is not None else 0)
        yield CounterMetricFamily("noded_process_events_dropped", "Exec events over their uid's budget "
                                  "(jobs.exec_events_per_uid): left to the next tick's discovery",
                                  value=events.dropped if events is not None else 0)
        yield CounterMetricFamily("noded_process_events_unattributed", "New processes placed in no job because "
                                  "their /proc/PID/cgroup is not the kernel's grammar (a forged record in a "
                                  "cgroup name) or could not be read",
                                  value=discovery.unattributed if discovery is not None else 0)
        budget = self.reports
        reports = CounterMetricFamily("noded_reports_dropped", "Reports dropped on the report socket: over the "
                                      "sender's uid's budget (unread) or the job's (admin.reports_per_*)",
                                      labels=["reason"])
        for reason, n in sorted(_with_zeros(REPORT_DROPS, budget.dropped if budget is not None else {}).items()):
            reports.add_metric([reason], n)
        yield _text_labels(reports)


def make_registry(daemon: Daemon) -> CollectorRegistry:
    """A private registry: noded's series from the daemon's last result, and noded's own
    process (CPU, memory, file descriptors, start time) as process_*."""
    registry = CollectorRegistry(auto_describe=False)
    parts = daemon.parts
    registry.register(NodedCollector(lambda: daemon.last, daemon.extra_info, colocation=parts.colocation is not None,
                                     rightsize=parts.rightsize is not None, totals=lambda: daemon.totals,
                                     last_round=lambda: daemon.liveness.last_round_wall))
    telemetry = parts.telemetry
    registry.register(TenantBudgetCollector(telemetry.discovery if telemetry is not None else None,
                                            telemetry.events if telemetry is not None else None,
                                            parts.report_budget))
    ProcessCollector(registry=registry)
    return registry


def _cap_metrics(r) -> Iterator[GaugeMetricFamily]:
    """Capped jobs (noded.capping): each one's cap and where it comes from, and what its
    holder measured over its last period (sub-second, between the ticks' readings)."""
    cap = GaugeMetricFamily("noded_job_bandwidth_cap_bytes_per_second", "A CPU job's bandwidth cap, by where it "
                            "comes from (override: nodectl cap; source default: jobs.sources[].cap_gbps; reserve: "
                            "contention.gpu_reserve_gbps)", labels=["job_id", "source"])
    measured = GaugeMetricFamily("noded_job_cap_measured_bytes_per_second", "A capped job's bandwidth over its "
                                 "holder's last period, by who steers it (noded, or kernel mba_MBps)",
                                 labels=["job_id", "mode"])
    unreachable = GaugeMetricFamily("noded_job_cap_unreachable", "1 when a job's cap is below what MBA's lowest "
                                    "value lets it move (then it is held on fewer cores)", labels=["job_id"])
    busy = GaugeMetricFamily("noded_job_cap_busy_threads", "A capped job's busy threads as its holder last counted "
                             "them (MBA limits each thread: the holder steers on that count's curve)",
                             labels=["job_id"])
    shared = GaugeMetricFamily("noded_job_cap_shared_closid", "1 while a capped job has no CLOSID of its own and "
                               "shares a group's MB value (held, but its own cap not steered: nodectl explain says "
                               "with whom)", labels=["job_id"])
    for job_id, c in sorted(r.caps.items()):
        cap.add_metric([job_id, c.source], c.cap_bps)
        shared.add_metric([job_id], 1.0 if c.shared_group is not None else 0.0)
        if c.measured_bps is not None:
            measured.add_metric([job_id, c.mode or "none"], c.measured_bps)
        unreachable.add_metric([job_id], 1.0 if c.unreachable else 0.0)
        if c.busy_threads is not None:
            busy.add_metric([job_id], c.busy_threads)
    yield cap
    yield measured
    yield unreachable
    yield busy
    yield shared
