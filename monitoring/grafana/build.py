"""Writes noded-host.json and noded-fleet.json, the Grafana dashboards for noded.

    python3 monitoring/grafana/build.py          # rewrite both files beside this script
    python3 monitoring/grafana/build.py --check  # exit 1 if the files differ from what it would write

The JSON files are what Grafana imports (Dashboards > New > Import, or a provisioning
directory); this script is where they are edited, so both dashboards keep one style:
a row per concern, stat panels for "now", time series for "how it went", units set,
the data source a ``${datasource}`` variable. tests/integration/test_monitoring.py checks that the
files match this script and runs every query against a real Prometheus.
"""

from __future__ import annotations

import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
HOST = 'instance="$instance"'


class Board:
    """Panels laid out left to right in rows of 24 columns."""

    def __init__(self):
        self.panels: list[dict] = []
        self.x = self.y = 0
        self.row_h = 0
        self._open_row: dict | None = None  # the row panels are added to now
        self._ids = 0

    def _place(self, w: int, h: int) -> dict:
        if self.x + w > 24:
            self.x, self.y = 0, self.y + self.row_h
            self.row_h = 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self, title: str, *, collapsed: bool = False) -> None:
        """A row; ``collapsed`` for a feature that is off by default (co-location,
        right-sizing): shut, its panels inside it, so a host without the feature shows one
        line instead of empty panels, and Grafana opens it where it is on."""
        if self._open_row is not None and self._open_row["collapsed"]:
            self.x, self.y = 0, self._open_row["gridPos"]["y"] + 1  # a shut row takes one line
        elif self.x:
            self.x, self.y = 0, self.y + self.row_h
        self._open_row = {"collapsed": collapsed, "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                          "id": self._next_id(), "panels": [], "title": title, "type": "row"}
        self.panels.append(self._open_row)
        self.y += 1
        self.row_h = 0

    def add(self, panel: dict, w: int, h: int) -> None:
        panel = {"datasource": DS, "gridPos": self._place(w, h), "id": self._next_id(), **panel}
        inside_shut_row = self._open_row is not None and self._open_row["collapsed"]
        (self._open_row["panels"] if inside_shut_row else self.panels).append(panel)

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, fmt: str = "time_series") -> dict:
    """A query; ``instant`` for the value now (tables: ``fmt="table"``, one row per series)."""
    t = {"datasource": DS, "editorMode": "code", "expr": expr, "legendFormat": legend or "__auto", "refId": ref,
         "format": fmt}
    t.update(instant=True, range=False) if instant else t.update(range=True)
    return t


def targets(*pairs: tuple[str, str]) -> list[dict]:
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def thresholds(*steps: tuple[str, float | None]) -> dict:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


def mapping(**values: tuple[str, str]) -> list[dict]:
    """Value mappings: mapping(**{"0": ("no", "green")})."""
    return [{"type": "value", "options": {k: {"text": text, "color": color, "index": i}
                                          for i, (k, (text, color)) in enumerate(values.items())}}]


def timeseries(title: str, description: str, tgts: list[dict], unit: str, *, min_=None, max_=None,
               stepped: bool = False, stack: bool = False, dashed: str | None = None, decimals=None) -> dict:
    custom = {"drawStyle": "line", "lineInterpolation": "stepAfter" if stepped else "linear", "lineWidth": 1,
              "fillOpacity": 20 if stack else 0, "showPoints": "never", "spanNulls": False,
              "stacking": {"mode": "normal" if stack else "none", "group": "A"}, "axisPlacement": "auto"}
    defaults = {"unit": unit, "color": {"mode": "palette-classic"}, "custom": custom}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if decimals is not None:
        defaults["decimals"] = decimals
    overrides = []
    if dashed:  # reference lines (peak, thresholds, baselines): dashed, never stacked
        overrides.append({"matcher": {"id": "byRegexp", "options": dashed}, "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
            {"id": "custom.fillOpacity", "value": 0}]})
    return {"type": "timeseries", "title": title, "description": description, "targets": tgts,
            "fieldConfig": {"defaults": defaults, "overrides": overrides},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title: str, description: str, tgts: list[dict], unit: str = "none", *, steps=None, mappings=None,
         text_mode: str = "auto", graph: bool = False, decimals=None, no_value: str | None = None) -> dict:
    """``no_value``: what it shows where its series does not exist (a feature that is off)."""
    defaults = {"unit": unit, "color": {"mode": "thresholds"},
                "thresholds": steps or thresholds(("green", None)), "mappings": mappings or []}
    if decimals is not None:
        defaults["decimals"] = decimals
    if no_value is not None:
        defaults["noValue"] = no_value
    return {"type": "stat", "title": title, "description": description, "targets": tgts,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "background", "graphMode": "area" if graph else "none", "justifyMode": "auto",
                        "orientation": "auto", "textMode": text_mode}}


def table(title: str, description: str, expr: str, columns: dict[str, str], unit: str = "none") -> dict:
    """An instant query as a table; ``columns``: label -> header, in order (others hidden)."""
    shown = [c for c in columns if c != "Value"] + ["Value"]
    return {"type": "table", "title": title, "description": description,
            "targets": [target(expr, instant=True, fmt="table")],
            "fieldConfig": {"defaults": {"unit": unit, "custom": {"align": "auto"}}, "overrides": []},
            "options": {"showHeader": True, "footer": {"show": False, "reducer": ["sum"], "fields": ""}},
            "transformations": [{"id": "filterFieldsByName", "options": {"include": {"names": shown}}},
                                {"id": "organize", "options": {
                                    "indexByName": {name: i for i, name in enumerate(shown)},
                                    "renameByName": {**columns, "Value": columns.get("Value", "value")}}}]}


def bargauge(title: str, description: str, tgt: dict, unit: str, steps: dict, *, max_=None) -> dict:
    defaults = {"unit": unit, "min": 0, "color": {"mode": "thresholds"}, "thresholds": steps}
    if max_ is not None:
        defaults["max"] = max_
    return {"type": "bargauge", "title": title, "description": description, "targets": [tgt],
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True,
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}}


def datasource_var() -> dict:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
            "regex": "", "skipUrlSync": False}


def query_var(name: str, label: str, query: str) -> dict:
    return {"name": name, "label": label, "type": "query", "datasource": DS, "definition": query,
            "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 2,
            "regex": "", "skipUrlSync": False, "sort": 1}


def dashboard(uid: str, title: str, description: str, board: Board, variables: list[dict],
              links: list[dict]) -> dict:
    return {
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": links,
        "liveNow": False,
        "panels": board.panels,
        "refresh": "30s",
        "schemaVersion": 38,
        "style": "dark",
        "tags": ["noded", "gpu", "memory-bandwidth"],
        "templating": {"list": variables},
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


YES_NO_BAD = mapping(**{"0": ("no", "green"), "1": ("yes", "red")})
UP_DOWN = mapping(**{"0": ("down", "red"), "1": ("up", "green")})
SHARE_STEPS = thresholds(("green", None), ("yellow", 0.6), ("red", 0.75))  # noded's default thresholds


def host() -> dict:
    b = Board()
    b.row("Now")
    b.add(stat("Busiest L3 domain", "Memory bandwidth of the busiest L3 domain as a share of the configured peak. "
               "Colours use noded's default thresholds (release 60 %, throttle 75 %).",
               targets((f"noded:node_memory_bandwidth:ratio_max{{{HOST}}}", "busiest domain")),
               "percentunit", steps=SHARE_STEPS, graph=True), 3, 4)
    b.add(stat("GPU job slowed by contention", "noded_contention_triggered: the node is over its throttle "
               "threshold and a GPU job is below its baseline.",
               targets((f"noded_contention_triggered{{{HOST}}}", "")), mappings=YES_NO_BAD,
               steps=thresholds(("green", None), ("red", 1))), 3, 4)
    b.add(stat("Jobs throttled", "CPU jobs noded holds back now (policy and operator overrides).",
               targets((f"noded:jobs_throttled:count{{{HOST}}}", "")),
               steps=thresholds(("green", None), ("orange", 1)), decimals=0), 3, 4)
    b.add(stat("Eliminator", "Paused by an operator (`nodectl pause`): nothing new is throttled.",
               targets((f"noded_eliminator_paused{{{HOST}}}", "")),
               mappings=mapping(**{"0": ("running", "green"), "1": ("paused", "orange")})), 3, 4)
    b.add(stat("State writable", "At 0 noded cannot record originals and changes nothing new.",
               targets((f"noded_state_writable{{{HOST}}}", "")),
               mappings=mapping(**{"0": ("NO", "red"), "1": ("yes", "green")})), 3, 4)
    b.add(stat("Inputs missing", "Inputs noded could not measure in its last tick (`nodectl status` names them).",
               targets((f"noded_inputs_missing{{{HOST}}}", "")),
               steps=thresholds(("green", None), ("red", 1)), decimals=0), 3, 4)
    b.add(stat("NVML", "Whether NVML answers; 0 on a CPU-only host is expected.",
               targets((f"noded_nvml_available{{{HOST}}}", "")), mappings=UP_DOWN), 3, 4)
    b.add(stat("MPS", "The MPS control daemon (only where co-location is on; \"off\" otherwise).",
               targets((f"noded_mps_up{{{HOST}}}", "")), mappings=UP_DOWN, no_value="off"), 3, 4)

    b.row("Memory bandwidth")
    b.add(timeseries(
        "Node bandwidth per L3 domain", "Each L3 domain's memory bandwidth (MBM) against the configured peak "
        "and the throttle and release thresholds (dashed).",
        targets((f"noded_node_memory_bandwidth_bytes_per_second{{{HOST}}}", "domain {{domain}}"),
                (f"noded_node_memory_bandwidth_peak_bytes_per_second{{{HOST}}}", "peak"),
                (f"noded_contention_threshold_ratio{{{HOST}}}\n  * on (instance, job) group_left\n"
                 f"noded_node_memory_bandwidth_peak_bytes_per_second{{{HOST}}}", "{{threshold}} threshold")),
        "Bps", min_=0, dashed="^(peak|.* threshold)$"), 12, 8)
    b.add(timeseries(
        "Busiest domain, share of peak", "What noded compares with its thresholds: at or over the throttle "
        "threshold with a GPU job slowed, it throttles; below the release threshold for hold_s, it releases.",
        targets((f"noded:node_memory_bandwidth:ratio_max{{{HOST}}}", "busiest domain"),
                (f"noded_contention_threshold_ratio{{{HOST}}}", "{{threshold}} threshold")),
        "percentunit", min_=0, dashed=".* threshold$"), 12, 8)
    b.add(timeseries(
        "Memory bandwidth per job", "Each job's bandwidth (MBM), stacked: the total is what the jobs pull.",
        targets((f"noded_job_memory_bandwidth_bytes_per_second{{{HOST}}}", "{{job_id}} ({{kind}})")),
        "Bps", min_=0, stack=True), 12, 8)
    b.add(timeseries(
        "Throttle level per throttled job", "Level in force (1 = mildest of contention.mba_levels, or cores "
        "halved once); jobs at level 0 are not drawn. `nodectl explain JOB_ID` says why.",
        targets((f"noded_job_throttle_level{{{HOST}}} > 0", "{{job_id}} ({{method}})")),
        "none", min_=0, stepped=True, decimals=0), 12, 8)

    b.row("GPUs")
    b.add(timeseries(
        "GPU utilisation", "Per GPU, in percent as dcgm-exporter's DCGM_FI_DEV_GPU_UTIL (same gpu and UUID labels).",
        targets((f"noded:gpu_utilization:percent{{{HOST}}}", "GPU {{gpu}}")), "percent", min_=0, max_=100), 8, 8)
    b.add(timeseries(
        "GPU jobs: utilisation and baseline", "Each GPU job's utilisation and its uncontended baseline (dashed; "
        "source: learned by this run, the job's own from before a restart, or the model's history on this host).",
        targets((f"noded:job_gpu_utilization:percent{{{HOST}}}", "{{job_id}} on GPU {{gpu}}"),
                (f"noded:job_gpu_baseline:percent{{{HOST}}}", "{{job_id}} baseline ({{source}})")),
        "percent", min_=0, max_=100, dashed=".* baseline .*"), 8, 8)
    b.add(timeseries(
        "GPU jobs: share of baseline", "Utilisation over baseline: 100 % is unslowed; noded acts when a job "
        "drops more than contention.gpu_drop_margin below it while the node is over the threshold.",
        targets((f"noded:job_gpu_utilization:ratio_of_baseline{{{HOST}}}", "{{job_id}} on GPU {{gpu}}")),
        "percentunit", min_=0), 8, 8)
    b.add(stat("Baseline known", "A GPU job without a baseline cannot be seen slowing down, so it is not "
               "protected until the node has been quiet (or this host has run its model before).",
               targets((f"noded_job_gpu_baseline_known{{{HOST}}}", "{{job_id}}")),
               mappings=mapping(**{"0": ("unknown", "orange"), "1": ("known", "green")}), text_mode="value_and_name"),
          12, 5)
    b.add(timeseries(
        "dcgm-exporter and noded (optional)", "DCGM_FI_DEV_GPU_UTIL for this host's GPUs (matched by UUID) beside "
        "noded's reading. Empty unless dcgm-exporter is scraped by the same Prometheus.",
        targets((f"DCGM_FI_DEV_GPU_UTIL\n  and on (UUID)\nnoded_gpu_utilization_ratio{{{HOST}}}", "dcgm GPU {{gpu}}"),
                (f"noded:gpu_utilization:percent{{{HOST}}}", "noded GPU {{gpu}}")),
        "percent", min_=0, max_=100), 12, 5)

    b.row("Throttling and overrides")
    b.add(timeseries(
        "Throttle and release steps by cause", "Steps noded takes per minute, by action and cause "
        "(noded_throttle_actions_total).",
        targets((f"sum by (action, cause) (rate(noded_throttle_actions_total{{{HOST}}}[$__rate_interval])) * 60",
                 "{{action}} ({{cause}})")),
        "opm", min_=0), 12, 8)
    b.add(table("Operator overrides in force", "Set with `nodectl throttle|exempt`; they win over the policy "
                "until they expire or are released.",
                f"noded_override_active{{{HOST}}}", {"job_id": "job", "kind": "kind", "uid": "set by uid"}), 12, 8)

    b.row("Co-location (MPS)", collapsed=True)
    b.add(timeseries(
        "Admission decisions", "`nodectl admit` decisions per minute by result.",
        targets((f"sum by (result) (rate(noded_admission_decisions_total{{{HOST}}}[$__rate_interval])) * 60",
                 "{{result}}")), "opm", min_=0), 8, 8)
    b.add(stat("Admissions in the time range", "Admitted and refused over the dashboard's time range.",
               targets((f"sum by (result) (increase(noded_admission_decisions_total{{{HOST}}}[$__range]))",
                        "{{result}}")), decimals=0, text_mode="value_and_name"), 4, 8)
    b.add(timeseries(
        "Jobs admitted per GPU", "Jobs noded admitted onto each GPU (colocation.max_jobs_per_gpu at most).",
        targets((f"noded_colocation_jobs{{{HOST}}}", "{{UUID}}")), "none", min_=0, stepped=True, decimals=0), 6, 8)
    b.add(timeseries(
        "MPS control daemon", "1 while it answers; noded's supervisor restarts it with backoff.",
        targets((f"noded_mps_up{{{HOST}}}", "MPS up")), "none", min_=0, max_=1, stepped=True), 6, 8)

    b.row("Right-sizing", collapsed=True)
    b.add(stat("GPU jobs by sizing state", "GPU jobs right-sizing sizes, by state: probing (searching), sized, "
               "limited (sized at what the node had), pinned or stopped by an operator (`nodectl size`). "
               "Empty where rightsize.sources is empty.",
               targets((f"noded:rightsize_jobs:count{{{HOST}}}", "{{state}}")), decimals=0,
               text_mode="value_and_name"), 8, 5)
    b.add(stat("CPUs lent", "GPU-array CPUs lent to CPU jobs (rightsize.lend_to) now; taken back at once when a "
               "GPU job needs them.", targets((f"noded_cpus_lent{{{HOST}}}", "")), decimals=0), 4, 5)
    b.add(stat("GPU jobs off target", "Sized GPU jobs holding a number of CPUs other than right-sizing's target: "
               "the node is short, no plan could be made, or writes fail (NodedRightsizeOffTarget after 10 "
               "minutes).", targets((f"noded:rightsize_jobs_off_target:count{{{HOST}}}", "")),
               steps=thresholds(("green", None), ("orange", 1)), decimals=0), 4, 5)
    b.add(stat("Probes per answer (1 h)", "Steps a search took over the last hour: CODA's take 3-4, an answer "
               "confirmed from history 1.", targets((f"noded:rightsize_probes_per_answer:ratio1h{{{HOST}}}", "")),
               decimals=1), 4, 5)
    b.add(table("GPU jobs' sizing now", "Each sized GPU job's state; `nodectl explain JOB_ID` shows its curve.",
                f"noded_job_sizing_state{{{HOST}}} == 1", {"job_id": "job", "state": "state"}), 4, 5)
    b.add(timeseries(
        "GPU jobs: CPUs, target and answer", "CPUs each sized GPU job holds, what right-sizing asks for now (the "
        "probe's or the answer's) and the answer once found (both dashed).",
        targets((f"noded_job_cpus{{{HOST}, role=\"gpu\"}}", "{{job_id}} has"),
                (f"noded_job_cpus_target{{{HOST}}}", "{{job_id}} target"),
                (f"noded_job_cpus_optimal{{{HOST}}}", "{{job_id}} answer")),
        "none", min_=0, stepped=True, decimals=0, dashed=".* (target|answer)$"), 12, 8)
    b.add(timeseries(
        "CPUs lent to CPU jobs", "GPU-array CPUs each CPU job has on loan (stacked; borrowers may share a CPU), "
        "and the node's total lent (dashed).",
        targets((f"noded_job_cpus_lent{{{HOST}}}", "{{job_id}}"), (f"noded_cpus_lent{{{HOST}}}", "lent")),
        "none", min_=0, stepped=True, stack=True, decimals=0, dashed="^lent$"), 12, 8)
    b.add(timeseries(
        "Probes and answers", "Probes begun and answers found per minute (journal lines `probe` and `size`).",
        targets((f"rate(noded_rightsize_probes_total{{{HOST}}}[$__rate_interval]) * 60", "probes"),
                (f"rate(noded_rightsize_sized_total{{{HOST}}}[$__rate_interval]) * 60", "answers")),
        "opm", min_=0), 12, 8)
    b.add(timeseries(
        "CPU jobs' CPUs", "CPUs each CPU job has (its own CPU-array share, plus lent CPUs, less contention "
        "halving).", targets((f"noded_job_cpus{{{HOST}, role=\"cpu\"}}", "{{job_id}}")),
        "none", min_=0, stepped=True, decimals=0), 12, 8)

    b.row("noded: loop and samplers")
    b.add(timeseries(
        "Tick duration by stage (p50, p99)", "From the noded_tick_duration_seconds histogram. A tick longer than "
        "tick_s is an overrun.",
        targets((f"histogram_quantile(0.5, sum by (stage, le) "
                 f"(rate(noded_tick_duration_seconds_bucket{{{HOST}}}[$__rate_interval])))", "{{stage}} p50"),
                (f"histogram_quantile(0.99, sum by (stage, le) "
                 f"(rate(noded_tick_duration_seconds_bucket{{{HOST}}}[$__rate_interval])))", "{{stage}} p99")),
        "s", min_=0), 8, 8)
    b.add(timeseries(
        "Sampler duration (p99)", "From the noded_sampler_duration_seconds histogram.",
        targets((f"histogram_quantile(0.99, sum by (sampler, le) "
                 f"(rate(noded_sampler_duration_seconds_bucket{{{HOST}}}[$__rate_interval])))", "{{sampler}}")),
        "s", min_=0), 8, 8)
    b.add(timeseries(
        "Ticks and overruns", "Ticks per second, and those that took longer than tick_s.",
        targets((f"rate(noded_ticks_total{{{HOST}}}[$__rate_interval])", "ticks"),
                (f"rate(noded_tick_overruns_total{{{HOST}}}[$__rate_interval])", "overruns")),
        "short", min_=0), 8, 8)
    b.add(timeseries(
        "Samplers succeeding", "1 when the sampler succeeded in the last tick (noded_sampler_success).",
        targets((f"noded_sampler_success{{{HOST}}}", "{{sampler}}")), "none", min_=0, max_=1, stepped=True), 8, 8)
    b.add(timeseries(
        "Inputs missing", "Inputs noded could not measure; it never throttles on missing data and releases "
        "every throttle after contention.missing_release_s.",
        targets((f"noded_inputs_missing{{{HOST}}}", "inputs missing")), "none", min_=0, stepped=True, decimals=0),
          8, 8)
    b.add(timeseries(
        "Errors", "Actuator errors (retried next tick), failed ticks, sampler errors, per minute.",
        targets((f"sum by (actuator, operation) (rate(noded_actuator_errors_total{{{HOST}}}[$__rate_interval])) * 60",
                 "{{actuator}} {{operation}}"),
                (f"rate(noded_tick_failures_total{{{HOST}}}[$__rate_interval]) * 60", "failed ticks"),
                (f"sum by (sampler) (rate(noded_sampler_errors_total{{{HOST}}}[$__rate_interval])) * 60",
                 "sampler {{sampler}}")),
        "opm", min_=0), 8, 8)
    b.add(timeseries(
        "RMIDs and CLOSIDs held by noded", "Share of the host's resctrl IDs noded's groups hold. Without RMIDs "
        "new jobs are monitored together.",
        targets((f"noded:resctrl_rmids:ratio_used{{{HOST}}}", "RMIDs"),
                (f"noded:resctrl_closids:ratio_used{{{HOST}}}", "CLOSIDs")), "percentunit", min_=0, max_=1), 8, 8)
    b.add(timeseries(
        "Jobs by monitoring mode", "own: the job's own monitoring group; other modes mean it shares one.",
        targets((f"count by (mode) (noded_job_monitoring{{{HOST}}} == 1)", "{{mode}}")),
        "none", min_=0, stepped=True, decimals=0), 8, 8)
    b.add(stat("noded build", "Version and source revision of the running noded, and the throttle method this "
               "run uses (a dry run: noded_dry_run).",
               targets((f"noded_build_info{{{HOST}}} * on (instance, job) group_left (method) "
                        f"noded_throttle_method{{{HOST}}}", "{{version}} ({{revision}}), throttle {{method}}")),
               text_mode="name"), 8, 8)

    b.row("noded: process")
    b.add(timeseries(
        "CPU", "CPU time noded uses (100 % = one core).",
        targets((f"rate(process_cpu_seconds_total{{{HOST}}}[$__rate_interval])", "cpu")), "percentunit", min_=0),
          8, 7)
    b.add(timeseries(
        "Resident memory", "noded's resident set size.",
        targets((f"process_resident_memory_bytes{{{HOST}}}", "rss")), "bytes", min_=0), 8, 7)
    b.add(timeseries(
        "Open file descriptors", "Open descriptors and the limit (dashed; the unit sets LimitNOFILE=16384).",
        targets((f"process_open_fds{{{HOST}}}", "open"), (f"process_max_fds{{{HOST}}}", "limit")),
        "short", min_=0, dashed="^limit$"), 8, 7)

    variables = [datasource_var(), query_var("instance", "Host", "label_values(noded_build_info, instance)")]
    links = [{"title": "noded fleet", "type": "link", "url": "/d/noded-fleet/noded-fleet", "icon": "dashboard",
              "keepTime": True, "includeVars": False, "asDropdown": False, "tags": [], "targetBlank": False,
              "tooltip": ""}]
    return dashboard("noded-host", "noded / host", "One GPU host: memory bandwidth contention, what noded "
                     "throttles, GPU jobs against their baselines, co-location, and noded's own health.",
                     b, variables, links)


def fleet() -> dict:
    b = Board()
    up = 'up{job="$job"}'
    b.row("Fleet now")
    b.add(stat("noded up", "Targets of the scrape job that answered.", targets((f"sum({up})", "")),
               decimals=0), 4, 4)
    b.add(stat("noded down", "Targets of the scrape job that did not answer (NodedDown after 5 minutes).",
               targets((f"sum(1 - {up})", "")), steps=thresholds(("green", None), ("red", 1)), decimals=0), 4, 4)
    b.add(stat("Hosts over threshold", "Hosts whose busiest L3 domain is at or over its throttle threshold.",
               targets(("sum(noded:node_over_threshold:bool)", "")),
               steps=thresholds(("green", None), ("orange", 1)), decimals=0), 4, 4)
    b.add(stat("Hosts with a GPU job slowed", "Over threshold with a GPU job below its baseline "
               "(noded_contention_triggered).", targets(("sum(noded_contention_triggered)", "")),
               steps=thresholds(("green", None), ("red", 1)), decimals=0), 4, 4)
    b.add(stat("Jobs throttled", "CPU jobs held back across the fleet.",
               targets(("sum(noded:jobs_throttled:count)", "")), decimals=0), 4, 4)
    b.add(stat("noded alerts firing", "Firing alerts from noded-rules.yml.",
               targets(('sum(ALERTS{alertname=~"Noded.*", alertstate="firing"}) or vector(0)', "")),
               steps=thresholds(("green", None), ("red", 1)), decimals=0), 4, 4)

    b.row("Contention across hosts")
    b.add(timeseries(
        "Hosts over threshold", "Hosts at or over their throttle threshold, and those where a GPU job is slowed.",
        targets(("sum(noded:node_over_threshold:bool)", "over threshold"),
                ("sum(noded_contention_triggered)", "GPU job slowed")), "none", min_=0, decimals=0), 12, 8)
    b.add(bargauge(
        "Top contended hosts (time over threshold)", "Share of the dashboard's time range each host spent at or "
        "over its throttle threshold; the ten highest.",
        target("topk(10, avg_over_time(noded:node_over_threshold:bool[$__range]))", "{{instance}}", instant=True),
        "percentunit", thresholds(("green", None), ("yellow", 0.05), ("red", 0.25)), max_=1), 12, 8)
    b.add(timeseries(
        "Busiest domain, share of peak (top 10 hosts)", "The ten hosts with the busiest L3 domain at each instant.",
        targets(("topk(10, noded:node_memory_bandwidth:ratio_max)", "{{instance}}")), "percentunit", min_=0), 12, 8)
    b.add(bargauge(
        "Busiest domain now (top 10 hosts)", "Share of peak now; colours at noded's default thresholds.",
        target("topk(10, noded:node_memory_bandwidth:ratio_max)", "{{instance}}", instant=True),
        "percentunit", SHARE_STEPS, max_=1), 12, 8)

    b.row("Throttling and GPU jobs")
    b.add(table("Throttled jobs", "Every job held back now, by host. Open the host dashboard for the history.",
                "noded_job_throttle_level > 0",
                {"instance": "host", "job_id": "job", "method": "method", "Value": "level"}), 12, 8)
    b.add(timeseries(
        "Jobs throttled per host", "Hosts holding jobs back.",
        targets(("noded:jobs_throttled:count", "{{instance}}")), "none", min_=0, stepped=True, decimals=0), 12, 8)
    b.add(timeseries(
        "Throttle and release steps by cause", "Across the fleet, per minute.",
        targets(("sum by (action, cause) (noded:throttle_actions:rate5m) * 60", "{{action}} ({{cause}})")),
        "opm", min_=0), 12, 8)
    b.add(timeseries(
        "GPU jobs below 90 % of their baseline, per host", "Jobs that contention (or anything else) slows.",
        targets(("sum by (instance) (noded:job_gpu_utilization:ratio_of_baseline < bool 0.9)", "{{instance}}")),
        "none", min_=0, decimals=0), 12, 8)

    b.row("Right-sizing", collapsed=True)
    b.add(timeseries(
        "GPU jobs by sizing state", "Across the fleet (hosts where rightsize.sources is set).",
        targets(("sum by (state) (noded:rightsize_jobs:count)", "{{state}}")), "none", min_=0, stepped=True,
        decimals=0), 8, 8)
    b.add(timeseries(
        "CPUs lent per host (top 10)", "GPU-array CPUs lent to CPU jobs.",
        targets(("topk(10, noded_cpus_lent)", "{{instance}}")), "none", min_=0, stepped=True, decimals=0), 8, 8)
    b.add(timeseries(
        "GPU jobs off target, and probes per answer", "Per host: sized GPU jobs not holding their target "
        "(NodedRightsizeOffTarget after 10 minutes), and the steps a search took over the last hour (dashed).",
        targets(("noded:rightsize_jobs_off_target:count", "{{instance}} off target"),
                ("noded:rightsize_probes_per_answer:ratio1h", "{{instance}} probes per answer")),
        "none", min_=0, dashed=".* probes per answer$"), 8, 8)

    b.row("Co-location (MPS)", collapsed=True)
    b.add(timeseries(
        "Admission decisions in the last hour", "Across the fleet, by result.",
        targets(("sum by (result) (noded:admission_decisions:increase1h)", "{{result}}")), "none", min_=0), 16, 8)
    b.add(stat("MPS down", "Hosts with co-location on whose MPS control daemon does not answer.",
               targets(("sum(1 - noded_mps_up)", "")), steps=thresholds(("green", None), ("red", 1)), decimals=0),
          8, 8)

    b.row("noded's health")
    b.add(timeseries(
        "Ticks overrunning (top 10 hosts)", "Share of ticks that took longer than tick_s (NodedTickOverruns over "
        "10 % for 15 minutes).",
        targets(("topk(10, noded:tick_overruns:ratio_rate5m)", "{{instance}}")), "percentunit", min_=0), 12, 8)
    b.add(timeseries(
        "Slowest ticks (whole tick, top 10 hosts)", "Hosts whose ticks take longest: p99 and, dashed, p50.",
        targets(('topk(10, noded:tick_duration_seconds:p99_5m{stage="total"})', "{{instance}} p99"),
                ('topk(10, noded:tick_duration_seconds:p50_5m{stage="total"})', "{{instance}} p50")),
        "s", min_=0, dashed=".* p50$"), 12, 8)
    b.add(timeseries(
        "Slowest samplers (p99, top 10)", "The samplers that take longest, by host.",
        targets(("topk(10, noded:sampler_duration_seconds:p99_5m)", "{{instance}} {{sampler}}")), "s", min_=0), 12, 8)
    b.add(timeseries(
        "Hosts where noded cannot act", "Hosts with inputs missing (no throttling on missing data), with the "
        "state directory unwritable (nothing new throttled), or paused by an operator.",
        targets(("sum(noded_inputs_missing > bool 0)", "inputs missing"),
                ("sum(1 - noded_state_writable)", "state unwritable"),
                ("sum(noded_eliminator_paused)", "paused")), "none", min_=0, decimals=0), 24, 7)

    b.row("Alerts")
    b.add(table("noded alerts firing and pending", "From noded-rules.yml, by host.",
                'sum by (alertname, alertstate, severity, instance) (ALERTS{alertname=~"Noded.*"})',
                {"alertname": "alert", "alertstate": "state", "severity": "severity", "instance": "host",
                 "Value": "series"}), 16, 8)
    b.add(timeseries(
        "noded alerts over time", "Alerts by name and state.",
        targets(('count by (alertname, alertstate) (ALERTS{alertname=~"Noded.*"})', "{{alertname}} {{alertstate}}")),
        "none", min_=0, stepped=True, decimals=0), 8, 8)
    b.add(table("noded versions", "Hosts per noded version, source revision and throttle method.",
                "count by (version, revision, method) "
                "(noded_build_info * on (instance, job) group_left (method) noded_throttle_method)",
                {"version": "version", "revision": "revision", "method": "throttle", "Value": "hosts"}), 24, 6)

    variables = [datasource_var(), query_var("job", "Scrape job", "label_values(noded_build_info, job)")]
    links = [{"title": "noded host", "type": "link", "url": "/d/noded-host/noded-host", "icon": "dashboard",
              "keepTime": True, "includeVars": False, "asDropdown": False, "tags": [], "targetBlank": False,
              "tooltip": ""}]
    return dashboard("noded-fleet", "noded / fleet", "All GPU hosts running noded: which are contended, who is "
                     "throttled, and noded's alerts.", b, variables, links)


def render(board: dict) -> str:
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"


def outputs() -> dict[str, str]:
    here = os.path.dirname(os.path.abspath(__file__))
    return {os.path.join(here, "noded-host.json"): render(host()),
            os.path.join(here, "noded-fleet.json"): render(fleet())}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, text in outputs().items():
        try:
            with open(path, encoding="utf-8") as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if same:
            continue
        if check:
            stale.append(path)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"wrote {path}")
    for path in stale:
        print(f"{path} differs from what {os.path.basename(__file__)} writes; run it", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
