"""monitoring/: the Prometheus rules and the Grafana dashboards.

Static checks (promtool, the dashboards' JSON, every metric name against noded's metric
contract), and one live run: the demo daemon on the simulated node, scraped by Debian's
real Prometheus with the rules loaded, every dashboard query and every rule expression
evaluated through its HTTP API.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
import urllib.request

import pytest
import yaml

from support.waiting import wait_for
from support.paths import REPO_ROOT
from support.system import popen_noded

ROOT = REPO_ROOT
MON = os.path.join(ROOT, "monitoring")
RULES = os.path.join(MON, "prometheus", "noded-rules.yml")
RULE_TESTS = os.path.join(MON, "prometheus", "noded-rules.test.yml")
SCRAPE_EXAMPLE = os.path.join(MON, "prometheus", "scrape-example.yml")
DASHBOARDS = [os.path.join(MON, "grafana", "noded-host.json"), os.path.join(MON, "grafana", "noded-fleet.json")]
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed")

# noded's metric contract (issue #12): name -> type. Counters are named with _total;
# histograms are referenced through _bucket, _sum and _count.
CONTRACT = {
    "noded_build_info": "gauge",
    "noded_eliminator_paused": "gauge",
    "noded_ticks_total": "counter",
    "noded_tick_overruns_total": "counter",
    "noded_tick_failures_total": "counter",
    "noded_throttle_actions_total": "counter",
    "noded_admission_decisions_total": "counter",
    "noded_actuator_errors_total": "counter",
    "noded_sampler_errors_total": "counter",
    "noded_tick_duration_seconds": "histogram",
    "noded_sampler_duration_seconds": "histogram",
    "noded_sampler_cpu_seconds_total": "counter",
    "noded_node_memory_bandwidth_peak_bytes_per_second": "gauge",
    "noded_contention_threshold_ratio": "gauge",
    "noded_colocation_jobs": "gauge",
    "noded_mps_up": "gauge",
    "noded_sampler_success": "gauge",
    "noded_inputs_missing": "gauge",
    "noded_nvml_available": "gauge",
    "noded_node_memory_bandwidth_bytes_per_second": "gauge",
    "noded_node_memory_bandwidth_ratio": "gauge",
    "noded_contention_triggered": "gauge",
    "noded_gpu_utilization_ratio": "gauge",
    "noded_state_writable": "gauge",
    "noded_job_memory_bandwidth_bytes_per_second": "gauge",
    "noded_job_throttle_level": "gauge",
    "noded_job_monitoring": "gauge",
    "noded_job_gpu_utilization_ratio": "gauge",
    "noded_job_gpu_baseline_known": "gauge",
    "noded_job_gpu_baseline_ratio": "gauge",
    "noded_override_active": "gauge",
    "noded_resctrl_rmids_capacity": "gauge",
    "noded_resctrl_rmids_used_by_noded": "gauge",
    "noded_resctrl_closids_capacity": "gauge",
    "noded_resctrl_closids_used_by_noded": "gauge",
    # right-sizing (issue #13): exported only where rightsize.sources names a source
    "noded_job_cpus": "gauge",
    "noded_job_cpus_target": "gauge",
    "noded_job_cpus_optimal": "gauge",
    "noded_job_sizing_state": "gauge",
    "noded_job_cpus_lent": "gauge",
    "noded_cpus_lent": "gauge",
    "noded_rightsize_probes_total": "counter",
    "noded_rightsize_sized_total": "counter",
    "process_cpu_seconds_total": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
}
# The series right-sizing exports (the demo runs without it: the live tests check the
# queries that read them against a right-sizing run instead).
RIGHTSIZING_SERIES = {name for name in CONTRACT if name.startswith(("noded_job_cpus", "noded_job_sizing_state",
                                                                    "noded_cpus_lent", "noded_rightsize_"))}
# Prometheus's own series.
PROMETHEUS_SERIES = {"up", "ALERTS"}
# Optional: dcgm-exporter's, where it is scraped by the same Prometheus (one dashboard
# panel compares it with noded's reading; it is empty without dcgm-exporter).
OPTIONAL_DCGM = {"DCGM_FI_DEV_GPU_UTIL"}


def contract_names() -> set[str]:
    names = set()
    for name, kind in CONTRACT.items():
        names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
    return names


GOLDEN = os.path.join(ROOT, "tests", "golden", "metrics.txt")
TARGET_LABELS = {"instance", "job"}  # what Prometheus adds to every scraped series


def exported() -> dict[str, set[str]]:
    """What noded exports, from tests/golden/metrics.txt (which guards the exposition):
    series name -> its label names."""
    out = {}
    with open(GOLDEN) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            m = re.fullmatch(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", line.strip())
            assert m, f"{GOLDEN}: {line!r}"
            out[m.group(1)] = set(filter(None, m.group(2).split(",")))
    return out


def exported_names() -> set[str]:
    return set(exported())


def matcher_labels(selector: str) -> set[str]:
    return set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*"(?:\\.|[^"\\])*"', selector))


# -- PromQL: the metric selectors in an expression ------------------------------------

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "atan2", "inf", "nan"}
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_TOKEN = re.compile(r"""
    (?P<ws>\s+|\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<number>[0-9.][0-9.eE+\-a-zA-Z]*)
  | (?P<brace>\{)
  | (?P<bracket>\[[^\]]*\])
  | (?P<other>.)
""", re.X | re.S)


def _matchers_end(expr: str, start: int) -> int:
    """Index just past the '}' that closes the '{' at ``start`` (strings skipped)."""
    i = start + 1
    while expr[i] != "}":
        if expr[i] in "\"'`":
            m = _TOKEN.match(expr, i)
            i = m.end()
        else:
            i += 1
    return i + 1


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, selector text) for each vector selector in a PromQL expression.
    A small lexer, enough for the expressions in monitoring/: names not followed by '('
    (functions, aggregations) nor keywords, label lists after by/on/... skipped."""
    tokens: list[tuple[str, str, int, int]] = []
    i = 0
    while i < len(expr):
        m = _TOKEN.match(expr, i)
        kind = m.lastgroup
        end = _matchers_end(expr, i) if kind == "brace" else m.end()
        if kind != "ws":
            tokens.append((kind, expr[i:end], i, end))
        i = end
    out = []
    skip_list = False
    for n, (kind, text, start, end) in enumerate(tokens):
        nxt = tokens[n + 1] if n + 1 < len(tokens) else ("", "", 0, 0)
        if skip_list:  # inside by (...) / on (...)
            if text == ")":
                skip_list = False
            continue
        if kind == "ident" and text.lower() in _KEYWORDS:
            if text in _GROUPING and nxt[1] == "(":
                skip_list = True
            continue
        if kind == "ident" and nxt[1] != "(" and nxt[1] not in ("by", "without"):  # not sum by (...) (...)
            out.append((text, text + (nxt[1] if nxt[0] == "brace" else "")))
        elif kind == "brace" and (n == 0 or tokens[n - 1][0] != "ident"):
            out.append(("", text))  # {__name__=...}: not used in monitoring/
    return out


def test_the_lexer_finds_selectors_and_skips_functions_labels_and_strings():
    expr = ('sum by (instance, job) (rate(noded_ticks_total{instance="h:1", x=~"a}b"}[5m] offset 1h))\n'
            '  / on (instance) group_left (gpu) max without (source) (noded_job_gpu_baseline_ratio) > bool 0.5\n'
            'or label_replace(up == 0, "reason", "down", "", "") unless vector(0) # a comment noded_x')
    assert selectors(expr) == [("noded_ticks_total", 'noded_ticks_total{instance="h:1", x=~"a}b"}'),
                               ("noded_job_gpu_baseline_ratio", "noded_job_gpu_baseline_ratio"), ("up", "up")]
    assert matcher_labels('x{instance="$instance", job_id=~"a\\"b", kind!="k"}') == {"instance", "job_id", "kind"}


# -- what the files hold -------------------------------------------------------------

def load_rules() -> list[dict]:
    with open(RULES) as f:
        return [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]


def load_dashboards() -> dict[str, dict]:
    out = {}
    for path in DASHBOARDS:
        with open(path) as f:
            out[os.path.basename(path)] = json.load(f)
    return out


def panels(board: dict) -> list[dict]:
    out = []
    for p in board["panels"]:
        out.append(p)
        out += p.get("panels", [])  # a collapsed row keeps its panels inside
    return out


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(where, expression, kind) for every query in both dashboards: kind 'panel' or 'variable'."""
    out = []
    for name, board in load_dashboards().items():
        for p in panels(board):
            for t in p.get("targets", []):
                out.append((f"{name}: {p['title']} ({t.get('refId')})", t.get("expr", ""), "panel"))
        for v in board["templating"]["list"]:
            if v["type"] == "query":
                q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                out.append((f"{name}: variable {v['name']}", q, "variable"))
    return out


@functools.cache
def rightsizing_names() -> frozenset[str]:
    """Right-sizing's series and the recording rules made from them."""
    names = set(RIGHTSIZING_SERIES)
    for r in load_rules():
        if "record" in r and any(name in names for name, _ in selectors(r["expr"])):
            names.add(r["record"])
    return frozenset(names)


def reads_rightsizing(expr: str) -> bool:
    return any(name in rightsizing_names() for name, _ in selectors(expr))


def test_right_sizing_has_recording_rules_alerts_and_a_row_in_both_dashboards():
    assert len(RIGHTSIZING_SERIES) == 8
    rules = [r for r in load_rules() if reads_rightsizing(r["expr"])]
    assert sum("alert" in r for r in rules) >= 2 and sum("record" in r for r in rules) >= 2
    for name, board in load_dashboards().items():
        rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
        assert "Right-sizing" in rows, name
        # and every panel that reads right-sizing's series is in that row
        row = None
        for p in panels(board):
            if p["type"] == "row":
                row = p["title"]
            elif any(reads_rightsizing(t["expr"]) for t in p["targets"]):
                assert row == "Right-sizing", f"{name}: {p['title']}"


#: the rows of features that are off by default, and series only those features export
OFF_BY_DEFAULT_ROWS = {"Co-location (MPS)", "Right-sizing"}
COLOCATION_SERIES = {"noded_admission_decisions_total", "noded:admission_decisions:increase1h",
                     "noded_colocation_jobs", "noded_mps_up"}


def test_the_rows_of_features_off_by_default_are_shut_with_their_panels_inside():
    # Issue #26: on a host without co-location or right-sizing (the default) those rows were
    # open and empty. Shut, a row holds its panels in its own "panels" (Grafana's model) and
    # takes one line; every other row is open, and the next row starts on the line below.
    for name, board in load_dashboards().items():
        rows = [p for p in board["panels"] if p["type"] == "row"]
        assert OFF_BY_DEFAULT_ROWS <= {r["title"] for r in rows}, name
        for row in rows:
            shut = row["title"] in OFF_BY_DEFAULT_ROWS
            assert row["collapsed"] is shut, f"{name}: {row['title']}"
            assert bool(row["panels"]) is shut, f"{name}: {row['title']} (a shut row holds its panels, an open one none)"
        top = board["panels"]
        for row, following in zip(top, top[1:]):
            if row["type"] == "row" and row["collapsed"]:
                assert following["gridPos"]["y"] == row["gridPos"]["y"] + 1, f"{name}: after {row['title']}"
        row = None
        for p in panels(board):
            if p["type"] == "row":
                row = p["title"]
            elif any(n in COLOCATION_SERIES for t in p["targets"] for n, _ in selectors(t["expr"])):
                # in its row, or a tile of the "Now" row that says "off" rather than "No data"
                assert row == "Co-location (MPS)" or p["fieldConfig"]["defaults"].get("noValue") == "off", \
                    f"{name}: {p['title']}"


def label_values_metric(query: str) -> tuple[str, str]:
    """label_values(METRIC, LABEL) -> (METRIC, LABEL)."""
    m = re.fullmatch(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)", query)
    assert m, f"variable query {query!r} is not label_values(METRIC, LABEL)"
    return m.group(1), m.group(2)


# -- static checks ---------------------------------------------------------------------

@needs_promtool
def test_promtool_checks_the_rules():
    p = subprocess.run([PROMTOOL, "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout and "WARNING" not in p.stdout + p.stderr


@needs_promtool
def test_promtool_unit_tests_of_the_rules_pass():
    p = subprocess.run([PROMTOOL, "test", "rules", os.path.basename(RULE_TESTS)], cwd=os.path.dirname(RULE_TESTS),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@needs_promtool
def test_the_scrape_example_is_a_valid_prometheus_config_with_the_rules():
    p = subprocess.run([PROMTOOL, "check", "config", SCRAPE_EXAMPLE], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(SCRAPE_EXAMPLE) as f:
        config = yaml.safe_load(f)
    assert config["rule_files"] == ["noded-rules.yml"]
    jobs = {s["job_name"]: s for s in config["scrape_configs"]}
    assert set(jobs) == {"noded", "dcgm"}
    # noded's default metrics port (config/noded.yaml) and dcgm-exporter's
    from noded.config import Config

    assert all(t.endswith(f":{Config().metrics.port}") for t in jobs["noded"]["static_configs"][0]["targets"])
    assert all(t.endswith(":9400") for t in jobs["dcgm"]["static_configs"][0]["targets"])


def test_every_alert_has_for_severity_and_annotations_naming_the_host():
    alerts = [r for r in load_rules() if "alert" in r]
    assert {a["alert"] for a in alerts} >= {
        "NodedNodeContendedGpuSlowed", "NodedBlind", "NodedThrottleHeldLong", "NodedMpsDown", "NodedTickOverruns",
        "NodedAdmissionRefusalsRising", "NodedStateUnwritable", "NodedDown", "NodedActuatorErrors",
        "NodedNotWatching", "NodedLoopStalled"}
    for a in alerts:
        assert re.fullmatch(r"\d+[mh]", a.get("for", "")), a["alert"]
        assert a["labels"]["severity"] in ("critical", "warning", "info"), a["alert"]
        assert set(a["annotations"]) == {"summary", "description", "runbook_url"}, a["alert"]
        for key in ("summary", "description"):
            assert "{{ $labels.instance }}" in a["annotations"][key], a["alert"]
        if selectors(a["expr"])[0][0].startswith("noded_job_"):  # a job's alert names the job
            assert "{{ $labels.job_id }}" in a["annotations"]["summary"], a["alert"]


def test_every_alert_links_its_own_section_of_the_runbook():
    """runbook_url: docs/runbook.md#<the alert's name in lower case>, a section that exists,
    and no section for an alert that does not."""
    with open(os.path.join(ROOT, "docs", "runbook.md")) as f:
        sections = re.findall(r"^## (\w+)$", f.read(), re.M)
    alerts = [r for r in load_rules() if "alert" in r]
    for a in alerts:
        assert a["annotations"]["runbook_url"] == f"docs/runbook.md#{a['alert'].lower()}", a["alert"]
    assert sorted(sections) == sorted(a["alert"] for a in alerts)


def test_the_unit_tests_cover_every_rule():
    with open(RULE_TESTS) as f:
        tests = yaml.safe_load(f)["tests"]
    alert_cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    expr_cases = [c["expr"] for t in tests for c in t.get("promql_expr_test", [])]
    for rule in load_rules():
        if "alert" in rule:
            mine = [c for c in alert_cases if c["alertname"] == rule["alert"]]
            assert any(c["exp_alerts"] for c in mine), f"{rule['alert']}: never shown firing"
            assert any(not c.get("exp_alerts") for c in mine), f"{rule['alert']}: never shown not firing"
        else:
            assert any(re.search(rf"(^|[^\w:]){re.escape(rule['record'])}($|[^\w:])", e) for e in expr_cases), \
                f"{rule['record']}: no promql_expr_test checks its value"


def test_the_dashboards_are_what_their_generator_writes():
    p = subprocess.run([sys.executable, os.path.join(MON, "grafana", "build.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_the_dashboards_are_valid_grafana_models():
    boards = load_dashboards()
    assert len({b["uid"] for b in boards.values()}) == len(boards)
    for name, board in boards.items():
        assert 36 <= board["schemaVersion"] <= 39, name
        assert board["id"] is None  # importable anywhere
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        ids = [p["id"] for p in panels(board)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        assert panels(board)[0]["type"] == "row", f"{name}: starts with a row"
        for p in panels(board):
            where = f"{name}: {p['title']}"
            gp = p["gridPos"]
            assert gp["x"] + gp["w"] <= 24 and gp["h"] > 0, where
            if p["type"] == "row":
                continue
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert p["description"], where
            assert p["targets"], where
            assert p["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), where
            for t in p["targets"]:
                assert t.get("expr", "").strip(), f"{where}: a target without an expr"
                assert t["datasource"] == p["datasource"], where
    host = boards["noded-host.json"]
    instance = {v["name"]: v for v in host["templating"]["list"]}["instance"]
    assert label_values_metric(instance["query"]["query"]) == ("noded_build_info", "instance")
    for p in panels(host):
        for t in p.get("targets", []):
            for name, sel in selectors(t["expr"]):
                if name not in OPTIONAL_DCGM:
                    assert 'instance="$instance"' in sel, f"host dashboard, {p['title']}: {sel} is not this host's"


def test_the_golden_exposition_holds_the_metric_contract():
    assert contract_names() <= exported_names(), contract_names() - exported_names()


def test_every_metric_name_is_exported_recorded_or_prometheus_own():
    recorded = {r["record"] for r in load_rules() if "record" in r}
    known = exported_names() | recorded | PROMETHEUS_SERIES | OPTIONAL_DCGM
    used = set()
    exprs = [(f"rule {r.get('alert') or r.get('record')}", r["expr"]) for r in load_rules()]
    for where, expr, kind in dashboard_queries():
        if kind == "variable":
            used.add(label_values_metric(expr)[0])
            assert label_values_metric(expr)[0] in known, where
        else:
            exprs.append((where, expr))
    for where, expr in exprs:
        found = selectors(expr)
        assert found, f"{where}: no metric in {expr!r}"
        for name, sel in found:
            assert name in known, f"{where}: {name} is neither exported by noded nor a recording rule"
            if name in exported():  # and it is selected by labels the series has
                assert matcher_labels(sel) <= exported()[name] | TARGET_LABELS, f"{where}: {sel}"
            used.add(name)
    # and each recording rule only from what noded exports or an earlier rule
    seen: set[str] = set()
    for r in load_rules():
        if "record" in r:
            for name, _ in selectors(r["expr"]):
                assert name in exported_names() | seen, f"{r['record']}: {name}"
            seen.add(r["record"])
    assert recorded <= used, f"recording rules nothing uses: {recorded - used}"


# -- live: the demo daemon, a real Prometheus, every query ------------------------------

NCU_TINY = ('"ID","gpu__time_duration.sum","sm__warps_active.avg.pct_of_peak_sustained_active",'
            '"dram__throughput.avg.pct_of_peak_sustained_elapsed"\n"","usecond","%","%"\n"0","10","5","5"\n')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeDcgmExporter:
    """dcgm-exporter's DCGM_FI_DEV_GPU_UTIL for the simulated GPUs (percent, labels gpu,
    UUID, device, modelName, Hostname), read from noded's own scrape: enough to show that
    the dashboards' dcgm panel joins noded's series on UUID."""

    def __init__(self, noded_url: str):
        from prometheus_client.parser import text_string_to_metric_families

        def render() -> bytes:
            text = urllib.request.urlopen(noded_url, timeout=5).read().decode()
            lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "noded_gpu_utilization_ratio":
                        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{s.labels["gpu"]}",UUID="{s.labels["UUID"]}",'
                                     f'device="nvidia{s.labels["gpu"]}",modelName="Simulated GPU",'
                                     f'Hostname="sim"}} {round(s.value * 100)}')
            return ("\n".join(lines) + "\n").encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                try:
                    body = render()
                except OSError:  # noded is stopping: a failed scrape, as an exporter would answer
                    self.send_error(503)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class PromAPI:
    def __init__(self, base: str):
        self.base = base

    def get(self, path: str, **params) -> dict:
        url = f"{self.base}{path}" + ("?" + urllib.parse.urlencode(params, doseq=True) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:  # 400/422: a bad query, with Prometheus's reason
            body = e.read()
            try:
                return json.loads(body)
            except ValueError:  # 503 while it starts: plain text
                return {"status": "error", "error": f"HTTP {e.code}: {body[:200]!r}"}

    def query(self, expr: str) -> dict:
        return self.get("/api/v1/query", query=expr)

    def has_data(self, expr: str) -> bool:
        r = self.query(expr)
        return r.get("status") == "success" and bool(r["data"]["result"])


def demo_inputs(tmp_path) -> tuple[str, str]:
    """The demo's config and scenario, for a test run. The config is
    scenarios/demo-config.yaml with co-location on (the MPS stand-in), everything it
    writes under tmp_path; the scenario is scenarios/contention.yaml with the hog starting
    at 8 s instead of 4 (a first start of co-location compiles its kernels, and the GPU
    jobs' baselines must be learned before the hog arrives), pushing until the end, and a
    quiet CPU job an operator will hold back."""
    with open(os.path.join(ROOT, "scenarios", "demo-config.yaml")) as f:
        config = yaml.safe_load(f)
    admin = tmp_path / "admin"
    admin.mkdir(mode=0o700)
    config["metrics"] = {"address": "127.0.0.1", "port": 0}
    config["admin"] = {"socket": str(admin / "noded.sock")}
    config["colocation"] = {"enabled": True, "mps": {
        "control": os.path.join(os.path.dirname(sys.executable), "nvidia-cuda-mps-control-standin"),
        "log_dir": str(tmp_path / "mpslog")}}
    with open(os.path.join(ROOT, "scenarios", "contention.yaml")) as f:
        scenario = yaml.safe_load(f)
    events = []
    for e in scenario["events"]:
        if "start" in e and e["start"]["id"] == "hog":
            events.append({**e, "at": 8})
        elif "set" not in e:  # the hog calming down: not in this run
            events.append(e)
    events.append({"at": 0, "start": {"id": "etl", "cpu_gbps": 0.5}})
    scenario.update(events=sorted(events, key=lambda e: e["at"]), duration_s=120)
    (tmp_path / "noded.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    return str(tmp_path / "noded.yaml"), str(tmp_path / "scenario.yaml")


def concrete(expr: str, instance: str) -> str:
    """A dashboard query as Grafana sends it: its variables replaced."""
    return (expr.replace("$__rate_interval", "10s").replace("$__range", "10m")
            .replace("$instance", instance).replace("$job", "noded"))


class Live:
    """noded on the simulated node, the dcgm stand-in and a real Prometheus scraping both
    with the rules loaded (see ``live``)."""

    def __init__(self, api: PromAPI, instance: str, nodectl, alive, output):
        self.api, self.instance, self.nodectl, self.alive, self.output = api, instance, nodectl, alive, output


@contextlib.contextmanager
def live(tmp_path, cfg: str, scenario: str):
    """Starts noded (``--sim scenario --config cfg``: the simulated node and the daemon, 110 s at most), the dcgm stand-in and
    Prometheus; yields a Live. On a clean exit stops them in order and asserts each stopped
    cleanly, that the emulator's mount is gone and that no process noded started is left."""
    (tmp_path / "tmp").mkdir(mode=0o700)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}  # the emulator's mount and the sim's scratch
    # the co-location kernels are in numba's cache before any test of this tier starts
    # (support.plugin waits for the run's compile): on a cold cache they take about ten
    # seconds, which would otherwise pass on the simulated node's clock
    out_path, err_path = tmp_path / "noded.out", tmp_path / "noded.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        noded = popen_noded(["run", "--sim", scenario, "--config", cfg,
                                  "--duration", "110"], cwd=ROOT, env=env, stdout=out, stderr=err)

    def noded_output() -> str:
        return f"noded's output:\n{out_path.read_text()[-3000:]}\n{err_path.read_text()[-3000:]}"

    def noded_alive() -> None:
        assert noded.poll() is None, f"noded exited ({noded.returncode}); {noded_output()}"

    prometheus = dcgm = None
    prom_log = open(tmp_path / "prometheus.log", "w")
    try:
        def metrics_url() -> str | None:
            noded_alive()
            m = re.search(r"^noded: metrics at (http://\S+/metrics)$", out_path.read_text(), re.M)
            return m and m.group(1)

        url = wait_for(metrics_url, timeout=60, interval=0.1, what="noded's metrics URL")
        instance = urllib.parse.urlsplit(url).netloc
        dcgm = FakeDcgmExporter(url)

        with open(SCRAPE_EXAMPLE) as f:
            prom_config = yaml.safe_load(f)
        prom_config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        prom_config["rule_files"] = [RULES]
        for job in prom_config["scrape_configs"]:
            job["static_configs"] = [{"targets": [instance if job["job_name"] == "noded" else dcgm.address]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
        port = free_port()
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=prom_log, stderr=subprocess.STDOUT)
        api = PromAPI(f"http://127.0.0.1:{port}")

        def prom_log_text() -> str:
            return (tmp_path / "prometheus.log").read_text()[-3000:]

        def up() -> bool:
            assert prometheus.poll() is None, f"prometheus exited:\n{prom_log_text()}"
            try:
                return api.has_data('up{job="noded"} == 1') and api.has_data('up{job="dcgm"} == 1')
            except OSError:
                return False

        wait_for(up, timeout=30, interval=0.2, what="Prometheus scraping noded and the dcgm stand-in")
        nodectl_argv = [os.path.join(os.path.dirname(sys.executable), "nodectl"), "--socket",
                        str(tmp_path / "admin" / "noded.sock")]

        def nodectl(*a) -> subprocess.CompletedProcess:
            return subprocess.run(nodectl_argv + list(a), capture_output=True, text=True, timeout=30)

        yield Live(api, instance, nodectl, noded_alive, noded_output)

        # Stop: Prometheus, the dcgm stand-in, then noded, which tears the simulated node down.
        prometheus.send_signal(signal.SIGTERM)
        assert prometheus.wait(30) == 0, prom_log_text()
        dcgm.stop()
        dcgm = None
        noded.send_signal(signal.SIGTERM)
        assert noded.wait(30) == 0, noded_output()
        assert "simulated node torn down" in out_path.read_text(), noded_output()
    finally:
        for proc in (prometheus, noded):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if dcgm is not None:
            dcgm.stop()
        prom_log.close()
    with open("/proc/mounts") as f:
        assert str(tmp_path) not in f.read(), "the emulator's mount is left behind"
    # Every process noded started (emulator, job placeholders, the MPS stand-in) inherited
    # TMPDIR under tmp_path: none may outlive it.
    try:
        wait_for(lambda: not processes_with_env(env["TMPDIR"]), timeout=10, what="noded's children to be gone")
    except AssertionError:
        raise AssertionError(f"left behind: {processes_with_env(env['TMPDIR'])}") from None


def rules_evaluated(api: PromAPI) -> list[str]:
    """Every rule loaded and evaluated once without error (problems, if not)."""
    def evaluated() -> list[dict]:
        rules = [r for g in api.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        return rules if all(r["health"] != "unknown" for r in rules) else []

    rules = wait_for(evaluated, timeout=10, interval=0.2, what="every rule evaluated once")
    assert len(rules) == len(load_rules())
    return [f"rule {r['name']}: health {r['health']}: {r.get('lastError')}" for r in rules if r["health"] != "ok"]


def until_answered(problems_now, timeout: float = 30.0) -> list[str]:
    """The problems left once every query answers, or those of the last look at the
    deadline. A recording rule over a rate has data only two scrapes and an evaluation
    after its input first had data, which a loaded machine delays past the moment the
    scenario's state was first seen; an error stays an error, and is reported."""
    last: list[str] = []

    def answered() -> bool:
        nonlocal last
        last = problems_now()
        return not last

    try:
        wait_for(answered, timeout=timeout, interval=1.0, what="every query answered")
    except AssertionError:
        pass  # what is still wrong is returned, and asserted by the caller
    return last


def queries_answered(api: PromAPI, instance: str, *, rightsizing: bool) -> list[str]:
    """Problems with the dashboards' queries, the rules and the README's queries: each must
    evaluate; those of the run's kind (right-sizing's, or the others when ``rightsizing``
    is False) must return data, and each alert's selectors must have data (in a right-sizing
    run: have had data in the last 10 minutes, for a state such as probing comes and goes)."""
    problems = []
    for where, expr, kind in dashboard_queries():
        if kind == "variable":
            metric, label = label_values_metric(expr)
            r = api.get(f"/api/v1/label/{label}/values", **{"match[]": metric})
            if not r.get("data"):
                problems.append(f"{where}: {expr} has no values")
            continue
        q = concrete(expr, instance)
        r = api.query(q)
        if r.get("status") != "success":
            problems.append(f"{where}: {r.get('error')}: {q}")
        elif not r["data"]["result"] and reads_rightsizing(expr) == rightsizing:
            problems.append(f"{where}: no data: {q}")
    for rule in load_rules():
        r = api.query(rule["expr"])
        name = rule.get("record") or rule.get("alert")
        if r.get("status") != "success":
            problems.append(f"rule {name}: {r.get('error')}")
        if reads_rightsizing(rule["expr"]) != rightsizing:
            continue
        if "record" in rule and not r["data"]["result"]:
            problems.append(f"rule {name}: no data")
        if "alert" in rule:
            for _, sel in selectors(rule["expr"]):
                if not api.has_data(f"last_over_time({sel}[10m])" if rightsizing else sel):
                    problems.append(f"rule {name}: no data for {sel}")
    # The README's queries: each evaluates; one that filters (`... > 0`) may be empty
    # here, but each series it reads has data; any other returns data.
    for q in readme_queries():
        r = api.query(q)
        if r.get("status") != "success":
            problems.append(f"README: {r.get('error')}: {q}")
        elif reads_rightsizing(q) != rightsizing:
            continue
        elif re.search(r"[<>]=?\s*[0-9.]+\s*$", q):
            problems += [f"README: no data for {sel} in {q}" for _, sel in selectors(q) if not api.has_data(sel)]
        elif not r["data"]["result"]:
            problems.append(f"README: no data: {q}")
    return problems


@pytest.mark.fuse
@pytest.mark.slow
@pytest.mark.skipif(not os.access(PROMETHEUS, os.X_OK), reason="prometheus (Debian package) is not installed")
def test_every_query_returns_data_from_a_real_prometheus_scraping_the_demo(tmp_path):
    """Every query but right-sizing's (the demo runs without it; the next test runs them)."""
    cfg, scenario = demo_inputs(tmp_path)
    (tmp_path / "tiny.csv").write_text(NCU_TINY)
    with live(tmp_path, cfg, scenario) as d:
        api = d.api
        # What an operator and a Slurm prolog would do: hold the quiet CPU job back, and
        # ask for co-location twice (one admitted with an ncu profile, one refused: no profile).
        wait_for(lambda: d.nodectl("throttle", "cgroup:etl", "--level", "1", "--ttl", "30m",
                                   "--reason", "test").returncode == 0, timeout=20, interval=0.2,
                 what="the etl override")
        # (admissions wait for MPS)
        wait_for(lambda: api.has_data("noded_mps_up == 1"), timeout=30, interval=0.2, what="MPS up")
        p = d.nodectl("admit", "--job", "slurm:100", "--model", "tiny", "--batch-size", "8",
                      "--profile", str(tmp_path / "tiny.csv"))
        assert p.returncode == 0, p.stdout + p.stderr
        p = d.nodectl("admit", "--job", "slurm:101", "--model", "GPT-9", "--batch-size", "8")
        assert p.returncode == 3, p.stdout + p.stderr

        # The scenario's contention: the hog slows the NLP job, noded throttles it and
        # holds it there; the policy's throttle makes NodedThrottleHeldLong pending.
        def contended() -> bool:
            d.alive()
            # the admission's series too: contention may be in force before the scrape after it
            return (api.has_data("max_over_time(noded_contention_triggered[5m]) == 1")
                    and api.has_data("noded_colocation_jobs == 1")
                    and api.has_data('noded_job_throttle_level{job_id="cgroup:hog"} > 0')
                    and api.has_data('ALERTS{alertname="NodedThrottleHeldLong", job_id="cgroup:hog"}'))

        try:
            wait_for(contended, timeout=60, interval=0.5, what="contention, a throttled hog, a pending alert and the admitted job scraped")
        except AssertionError as e:
            raise AssertionError(f"{e}; {d.output()}") from None

        problems = until_answered(lambda: rules_evaluated(api) + queries_answered(api, d.instance, rightsizing=False))
        # the documented join: noded's percent series against dcgm-exporter's, on UUID
        # (values only roughly equal: the two are scraped at different ticks)
        joined = api.query("noded:gpu_utilization:percent - on (UUID) DCGM_FI_DEV_GPU_UTIL")["data"]["result"]
        gpus = api.query("noded:gpu_utilization:percent")["data"]["result"]
        if not gpus or {s["metric"]["UUID"] for s in joined} != {s["metric"]["UUID"] for s in gpus}:
            problems.append(f"noded:gpu_utilization:percent does not join DCGM_FI_DEV_GPU_UTIL on UUID: {joined}")
        assert not problems, "\n".join(problems)


def rightsize_inputs(tmp_path) -> tuple[str, str]:
    """A right-sizing run: scenarios/demo-config.yaml with right-sizing on for the simulated
    node's jobs (their cgroups) and lending to them, short windows, everything it
    writes under tmp_path; scenarios/rightsize.yaml's first GPU job (AlexNet, reporting its
    iteration times) and its CPU job from the start. One GPU job so that it fits any host
    (a GPU job never shares a CPU with another; on 2 CPUs it is sized to 1 and lends the other)."""
    with open(os.path.join(ROOT, "scenarios", "demo-config.yaml")) as f:
        config = yaml.safe_load(f)
    admin = tmp_path / "admin"
    admin.mkdir(mode=0o700)
    config.update(tick_s=0.25, metrics={"address": "127.0.0.1", "port": 0}, admin={"socket": str(admin / "noded.sock")},
                  rightsize={"sources": ["cgroup"], "lend_to": ["cgroup"], "warmup_s": 0.5,
                             "max_window_s": 4.0})
    with open(os.path.join(ROOT, "scenarios", "rightsize.yaml")) as f:
        scenario = yaml.safe_load(f)
    gpu = next(e for e in scenario["events"] if "gpu" in e.get("start", {}))
    cpu = next(e for e in scenario["events"] if "cpu" in e.get("start", {}))
    assert gpu["start"]["model"] == "AlexNet"
    scenario.update(events=[gpu, {**cpu, "at": 0}], duration_s=120)
    (tmp_path / "noded.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    return str(tmp_path / "noded.yaml"), str(tmp_path / "scenario.yaml")


@pytest.mark.fuse
@pytest.mark.slow
@pytest.mark.skipif(not os.access(PROMETHEUS, os.X_OK), reason="prometheus (Debian package) is not installed")
def test_every_right_sizing_query_returns_data_from_a_real_prometheus_scraping_a_right_sizing_run(tmp_path):
    cfg, scenario = rightsize_inputs(tmp_path)
    with live(tmp_path, cfg, scenario) as d:
        api = d.api
        job = "cgroup:" + yaml.safe_load(open(scenario))["events"][0]["start"]["id"]

        def sized_and_lending() -> bool:
            d.alive()
            return (api.has_data(f'noded_job_sizing_state{{job_id="{job}", state="sized"}} == 1')
                    and api.has_data(f'noded_job_cpus_optimal{{job_id="{job}"}}')
                    and api.has_data("noded_job_cpus_lent > 0") and api.has_data("noded_cpus_lent > 0")
                    and api.has_data("noded:rightsize_probes_per_answer:ratio1h"))

        try:
            wait_for(sized_and_lending, timeout=60, interval=0.5, what=f"{job} sized and its idle CPUs lent")
            # An operator searches again (the probing state seen by Prometheus), and it is
            # sized again and lends again.
            p = d.nodectl("size", job, "--reprobe", "--reason", "test")
            assert p.returncode == 0, p.stdout + p.stderr
            wait_for(lambda: api.has_data(f'noded_job_sizing_state{{job_id="{job}", state="probing"}} == 1'),
                     timeout=30, interval=0.2, what=f"{job} probing again")
            wait_for(sized_and_lending, timeout=60, interval=0.5, what=f"{job} sized again")
        except AssertionError as e:
            raise AssertionError(f"{e}; {d.output()}") from None
        problems = until_answered(lambda: rules_evaluated(api) + queries_answered(api, d.instance, rightsizing=True))
        assert not problems, "\n".join(problems)


def readme_queries() -> list[str]:
    """The PromQL of the README's ```promql blocks, one query a line."""
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = re.findall(r"^```promql\n(.*?)^```", f.read(), re.M | re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_has_queries_and_each_reads_what_noded_exports_or_records():
    queries = readme_queries()
    assert len(queries) >= 5
    known = exported_names() | {r["record"] for r in load_rules() if "record" in r} | {"DCGM_FI_DEV_GPU_UTIL"}
    for q in queries:
        for name, _ in selectors(q):
            assert name in known, f"README query {q!r} reads {name}, which nothing exports or records"


def processes_with_env(value: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if value.encode() in f.read():
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        argv = c.read().replace(b"\0", b" ").decode(errors="replace")
                    found.append(f"{pid}: {argv}")
        except OSError:  # gone, or a kernel thread
            pass
    return found
