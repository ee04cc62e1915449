"""Prometheus metrics from the last tick's result, on a private registry.

A scrape reads the control state (overrides, pause, decision counts) and the last
``TickResult``, swapped whole each tick; it never touches hardware or the loop's
internals. Names are ``noded_<subsystem>_<name>_<unit>``; GPU series carry the
labels ``gpu`` (index as a string) and ``UUID`` as dcgm-exporter writes them, so
the two join in PromQL.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Callable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from .control import ControlState
from .daemon import Daemon, TickResult


def _version() -> str:
    try:
        return metadata.version("noded")
    except metadata.PackageNotFoundError:
        return "unknown"


class NodedCollector:
    """Yields from the control state and the last tick's result only."""

    def __init__(self, control: ControlState, last: Callable[[], TickResult | None], info: Mapping[str, str]):
        self.control = control
        self.last = last
        self.info = dict(info)

    def describe(self):
        return []  # collected lazily from the last tick; no hardware is touched at registration

    def collect(self):
        info = InfoMetricFamily("noded_build", "noded build information")
        info.add_metric([], {"version": _version(), "python": platform.python_version(), **self.info})
        yield info
        actions = CounterMetricFamily("noded_throttle_actions", "Throttle and release steps taken, by cause",
                                      labels=["action", "cause"])
        for (kind, cause), n in sorted(self.control.actions_total().items()):
            actions.add_metric([kind, cause], n)
        yield actions
        active = GaugeMetricFamily("noded_override_active", "Operator overrides in force (1 each), and who set them",
                                   labels=["job", "kind", "uid"])
        store = self.control.overrides
        for o in sorted(store.current().values(), key=lambda o: o.job) if store else ():
            active.add_metric([o.job, o.kind, str(o.set_by_uid)], 1.0)
        yield active
        paused = GaugeMetricFamily("noded_eliminator_paused", "1 while an operator has paused the eliminator")
        paused.add_metric([], 1.0 if self.control.paused else 0.0)
        yield paused

        r = self.last()
        if r is None:
            return
        cfg = r.config
        ticks = CounterMetricFamily("noded_ticks", "Control-loop ticks completed")
        ticks.add_metric([], r.tick)
        yield ticks
        overruns = CounterMetricFamily("noded_tick_overruns", "Ticks that took longer than the tick period")
        overruns.add_metric([], r.overruns)
        yield overruns
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
        colo = r.colocation
        if colo is not None:
            adm = CounterMetricFamily("noded_admission_decisions", "Co-location admission decisions",
                                      labels=["result"])
            for result, n in sorted(colo.decisions.items()):
                adm.add_metric([result], n)
            yield adm
            held = GaugeMetricFamily("noded_colocation_jobs", "Jobs admitted onto each GPU by noded",
                                     labels=["UUID"])
            for uuid, n in sorted(colo.jobs_per_gpu.items()):
                held.add_metric([uuid], n)
            yield held
            mps = GaugeMetricFamily("noded_mps_up", "1 while the MPS control daemon answers")
            mps.add_metric([], 1.0 if colo.mps_state == "ok" else 0.0)
            yield mps

        s = r.sample
        dur = GaugeMetricFamily("noded_tick_duration_seconds", "Time the last tick spent in each stage",
                                labels=["stage"])
        for stage, v in r.durations.items():
            dur.add_metric([stage], v)
        yield dur
        ok = GaugeMetricFamily("noded_sampler_success", "Whether the sampler succeeded in the last tick (1/0)",
                               labels=["sampler"])
        sdur = GaugeMetricFamily("noded_sampler_duration_seconds", "Time the sampler took in the last tick",
                                 labels=["sampler"])
        for st in s.samplers:
            ok.add_metric([st.name], 1.0 if st.ok else 0.0)
            sdur.add_metric([st.name], st.duration_s)
        yield ok
        yield sdur
        missing = GaugeMetricFamily("noded_inputs_missing", "Inputs that could not be measured in the last tick")
        missing.add_metric([], len(s.missing))
        yield missing
        nvml = GaugeMetricFamily("noded_nvml_available", "Whether NVML answered (0 means a CPU-only view)")
        nvml.add_metric([], 1.0 if s.nvml_available else 0.0)
        yield nvml

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

        jbw = GaugeMetricFamily("noded_job_memory_bandwidth_bytes_per_second", "Memory bandwidth of a job (MBM)",
                                labels=["job", "kind"])
        level = GaugeMetricFamily("noded_job_throttle_level", "Throttle level in force (0 = none)",
                                  labels=["job", "method"])
        mon = GaugeMetricFamily("noded_job_monitoring", "How a job's bandwidth is monitored (1 for its mode)",
                                labels=["job", "mode"])
        jutil = GaugeMetricFamily("noded_job_gpu_utilization_ratio", "GPU utilisation of a GPU job on a GPU",
                                  labels=["job", "gpu", "UUID"])
        index = {g.uuid: g.index for g in s.gpus}
        for job_id, js in sorted(s.jobs.items()):
            if js.bandwidth_bps is not None:
                jbw.add_metric([job_id, js.kind], js.bandwidth_bps)
            level.add_metric([job_id, r.throttle_kind or "none"], r.levels.get(job_id, 0))
            mon.add_metric([job_id, js.monitoring], 1.0)
            if js.gpu_util is not None:
                for uuid in js.gpus:
                    jutil.add_metric([job_id, str(index.get(uuid, "")), uuid], js.gpu_util / 100.0)
        yield jbw
        yield level
        yield mon
        yield jutil
        known = GaugeMetricFamily("noded_job_gpu_baseline_known",
                                  "1 when a GPU job's uncontended utilisation is known (its slowdown can be seen)",
                                  labels=["job"])
        base = GaugeMetricFamily("noded_job_gpu_baseline_ratio",
                                 "A GPU job's uncontended utilisation, and where it came from (learned, job, model)",
                                 labels=["job", "source"])
        for job_id, js in sorted(s.jobs.items()):
            if js.kind == "gpu":
                known.add_metric([job_id], 1.0 if job_id in r.baselines else 0.0)
                if job_id in r.baselines:
                    value, source = r.baselines[job_id]
                    base.add_metric([job_id, source], value / 100.0)
        yield known
        yield base

        gutil = GaugeMetricFamily("noded_gpu_utilization_ratio", "GPU utilisation (NVML)", labels=["gpu", "UUID"])
        for g in s.gpus:
            if g.util_gpu is not None and g.uuid:
                gutil.add_metric([str(g.index), g.uuid], g.util_gpu / 100.0)
        yield gutil

        facts = s.resctrl
        if facts is not None and facts.num_rmids is not None:
            rmids = GaugeMetricFamily("noded_resctrl_rmids", "RMIDs: total, and used by noded's groups",
                                      labels=["state"])
            rmids.add_metric(["total"], facts.num_rmids)
            rmids.add_metric(["used_by_noded"], len(facts.groups.mon_parent) + len(facts.groups.ctrl_tasks))
            yield rmids
        if facts is not None and facts.max_ctrl_groups:
            closids = GaugeMetricFamily("noded_resctrl_closids", "CLOSIDs: usable by control groups, and used by noded",
                                        labels=["state"])
            closids.add_metric(["total"], facts.max_ctrl_groups)
            closids.add_metric(["used_by_noded"], len(facts.groups.ctrl_tasks))
            yield closids
        writable = GaugeMetricFamily("noded_state_writable",
                                     "1 while originals can be recorded in the state directory; at 0 noded changes "
                                     "nothing new")
        writable.add_metric([], 0.0 if r.state_unwritable else 1.0)
        yield writable


def make_registry(daemon: Daemon) -> CollectorRegistry:
    """A private registry over a daemon's control state and last result."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodedCollector(daemon.control, lambda: daemon.last, daemon.extra_info))
    return registry
