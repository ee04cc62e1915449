"""Right-sizing made visible (issue #13, item 7): its metrics from the tick's result, the
`nodectl size` controls through a real admin socket, `nodectl explain` showing the curve
measured and why the size; then the same on the simulated node's daemon."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from types import MappingProxyType, SimpleNamespace

import pytest
from prometheus_client import generate_latest

from support.admin import nodectl_run
from noded.loop.health import Liveness
from noded.actuators.cpusets import CpuSetResult
from noded.config import Config, RightsizeConfig
from noded.loop.daemon import TickResult
from noded.loop.tickstats import Totals
from noded.loop.metrics import make_registry
from noded.policy.contention import Decision
from noded.rightsize.service import PINNED, PROBING, SIZED, STOPPED, RightSizing
from noded.samplers.sample import CPU
from test_rightsize_daemon import affinity, needs_two_cpus, node, run  # noqa: F401 (node: the fixture)
from test_rightsize_service import Loop, Node, sized

CONFIG = RightsizeConfig(sources=("registered",), lend_to=("registered",), warmup_s=0.0, reserve_per_gpu=4)


class Registry:
    """What make_registry reads of a daemon."""

    def __init__(self, last, rightsize=True):
        self.last, self.extra_info = last, {}
        self.totals = last.totals if last is not None else Totals()  # the loop's counters, as the daemon keeps them
        self.liveness = Liveness()  # the loop not started: no noded_last_tick_timestamp_seconds
        self.parts = SimpleNamespace(telemetry=None, colocation=None, rightsize=object() if rightsize else None,
                                     report_budget=None)


def sized_node():
    """A GPU job sized on a table node of 16 CPUs, and a CPU job borrowing the GPU array's idle CPUs."""
    node = Node()
    node.start("c:batch", kind=CPU, cpus=range(16))
    node.start("g", cpus=range(16))
    rs = RightSizing(CONFIG, None, clock=lambda: node.t)
    loop = Loop(node, rs)
    loop.until(sized("g"))
    loop.tick()
    return node, rs, loop


def tick_result(node, rs, loop):
    """The daemon's result of that tick: the view and what the owner left each job."""
    sample = node.sample()
    have = {j: len(v["cpus"]) for j, v in node.jobs.items()}
    return TickResult(9, node.t, sample, Decision(MappingProxyType({}), (), False, 0.2, (), ""), (),
                      MappingProxyType({}), "mba", MappingProxyType({}), config=Config(peak_gbps_per_domain=10),
                      rightsize=rs.view(have, loop.plan),
                      cpus=CpuSetResult((), MappingProxyType({j: loop.plan.cpus_of(j) for j in loop.plan.jobs})))


def value(text, series):
    m = re.search("^" + re.escape(series) + r" (\S+)$", text, re.M)
    assert m, f"{series} not in the exposition"
    return float(m.group(1))


def test_metrics_of_a_sized_job_and_a_borrower_come_from_the_tick_result():
    node, rs, loop = sized_node()
    r = tick_result(node, rs, loop)
    text = generate_latest(make_registry(Registry(r))).decode()
    lent = len(loop.plan.lent)
    assert lent == 10  # 16 CPUs, all the GPU array (4 x 4 GPUs); the job has 6
    assert value(text, 'noded_job_cpus{job_id="g",role="gpu"}') == 6
    assert value(text, 'noded_job_cpus{job_id="c:batch",role="cpu"}') == lent
    assert value(text, 'noded_job_cpus_target{job_id="g"}') == 6
    assert value(text, 'noded_job_cpus_optimal{job_id="g"}') == 6
    assert value(text, 'noded_job_sizing_state{job_id="g",state="sized"}') == 1
    assert value(text, 'noded_job_cpus_lent{job_id="c:batch"}') == lent
    assert value(text, "noded_cpus_lent") == lent
    assert value(text, "noded_rightsize_sized_total") == 1
    assert value(text, "noded_rightsize_probes_total") == r.rightsize.probes >= 3
    # pinned: no answer, its state says so
    rs.pin("g", 3, 0, "hold")
    loop.tick()
    text = generate_latest(make_registry(Registry(tick_result(node, rs, loop)))).decode()
    assert value(text, 'noded_job_sizing_state{job_id="g",state="pinned"}') == 1
    assert value(text, 'noded_job_cpus_target{job_id="g"}') == 3
    assert "noded_job_cpus_optimal{" not in text


def test_no_rightsize_series_where_it_is_off_and_counters_at_0_before_the_first_tick():
    node, rs, loop = sized_node()
    r = tick_result(node, rs, loop)
    text = generate_latest(make_registry(Registry(replace(r, rightsize=None, cpus=None), rightsize=False))).decode()
    assert "noded_job_cpus" not in text and "noded_rightsize_" not in text and "noded_cpus_lent" not in text
    text = generate_latest(make_registry(Registry(None))).decode()
    assert value(text, "noded_rightsize_probes_total") == 0 and value(text, "noded_rightsize_sized_total") == 0


@pytest.fixture
def served(admin_socket):
    node, rs, loop = sized_node()
    s = admin_socket(tick_result(node, rs, loop), rightsize=rs)
    return s, node, rs, loop


def test_nodectl_size_pins_stops_and_reprobes_through_the_admin_socket(served, capsys):
    s, node, rs, loop = served
    code, out, err = nodectl_run(s.path, "size", "g", "--cores", "3", "--reason", "hold it", capsys=capsys)
    assert code == 0 and err == "", err
    assert out == "g is pinned at 3 cores, no probing until --reprobe (reason: hold it); state pinned; it asked " \
                  "for 6 before; noded's next plan gives it 3\n"
    v = rs.view().jobs["g"]
    assert v.state == PINNED and v.target == 3 and v.control.reason == "hold it" and v.control.uid == os.getuid()
    loop.tick()
    assert len(node.jobs["g"]["cpus"]) == 3
    code, out, err = nodectl_run(s.path, "size", "g", "--reprobe", "--reason", "new data", capsys=capsys)
    assert code == 0 and out.startswith("g is probed again from 16 cores (reason: new data); state probing")
    assert rs.view().jobs["g"].state == PROBING
    code, out, err = nodectl_run(s.path, "--json", "size", "g", "--stop", capsys=capsys)
    got = json.loads(out)  # probing stopped: it keeps what it has
    assert code == 0 and got["state"] == STOPPED and got["control"] == "stop" and got["cores"] == 16
    assert rs.view().jobs["g"].state == STOPPED
    code, out, err = nodectl_run(s.path, "size", "g", "--reprobe", capsys=capsys)
    assert code == 0 and "(no reason given); state probing" in out
    loop.until(sized("g"))
    assert rs.view().jobs["g"].state == SIZED


def test_nodectl_size_errors_name_the_job_and_the_sized_jobs(served, admin_socket, capsys):
    s, node, rs, loop = served
    code, out, err = nodectl_run(s.path, "size", "c:batch", "--cores", "2", capsys=capsys)
    assert code == 1 and out == ""
    assert "job 'c:batch' is not being sized" in err and "the jobs sized now are g" in err
    assert "nodectl explain JOB" in err
    code, out, err = nodectl_run(s.path, "size", "g", "--cores", "17", capsys=capsys)
    assert code == 1 and "job 'g':" in err and "16" in err
    assert rs.view().jobs["g"].state == SIZED  # nothing changed
    with pytest.raises(SystemExit) as e:
        nodectl_run(s.path, "size", "g", "--cores", "2", "--stop", capsys=capsys)
    assert e.value.code == 2
    off = admin_socket(s.daemon.last)  # a server without right-sizing, over the same tick
    code, out, err = nodectl_run(off.path, "size", "g", "--stop", capsys=capsys)
    assert code == 1 and "right-sizing is not on on this node" in err


def test_explain_shows_the_curve_measured_and_why_the_size_and_what_a_cpu_job_borrowed(served, capsys):
    s, node, rs, loop = served
    code, out, err = nodectl_run(s.path, "explain", "g", capsys=capsys)
    assert code == 0 and err == ""
    v = s.daemon.last.rightsize.jobs["g"]
    assert "right-sizing: sized (phase sized), asks 6 of its 16 CPUs, found best 6" in out
    assert "cores -> throughput" in out
    for cores, throughput in v.points:
        assert re.search(rf"^\s+{cores} -> {throughput:.4g}", out, re.M), out
    assert re.search(r"^\s+6 -> 60\s+\(best\)$", out, re.M), out
    assert "sized at 6 cores (searched; best measured 60 at 6 cores)" in out
    code, out, err = nodectl_run(s.path, "--json", "explain", "g", capsys=capsys)
    z = json.loads(out)["sizing"]
    assert z["state"] == SIZED and z["optimal"] == 6 and z["points"] == [list(p) for p in v.points]
    assert z["plan_note"] == v.plan_note and z["planned"] == list(v.planned)
    code, out, err = nodectl_run(s.path, "explain", "c:batch", capsys=capsys)
    lent = loop.plan.lent
    assert code == 0 and f"borrows GPU-array CPUs {','.join(map(str, lent))}" in out
    code, out, err = nodectl_run(s.path, "--json", "explain", "c:batch", capsys=capsys)
    e = json.loads(out)
    assert e["sizing"] is None and e["borrowed_cpus"] == list(lent)


@pytest.mark.fuse
@needs_two_cpus
def test_the_simulated_nodes_daemon_exports_its_sizing_and_takes_a_pin(node, tmp_path, capsys):  # noqa: F811
    from noded.admin.server import AdminServer

    sim, daemon, clock = node
    run(sim, daemon, clock, lambda r: "sim:a" in r.rightsize.jobs and r.rightsize.jobs["sim:a"].state == SIZED
        and r.rightsize.borrowed, 30)
    text = generate_latest(make_registry(daemon)).decode()
    assert value(text, 'noded_job_sizing_state{job_id="sim:a",state="sized"}') == 1
    assert value(text, 'noded_job_cpus_optimal{job_id="sim:a"}') == 1
    assert value(text, 'noded_job_cpus{job_id="sim:a",role="gpu"}') == len(affinity(sim, "a")) == 1
    assert value(text, 'noded_job_cpus_lent{job_id="sim:c"}') == 1 and value(text, "noded_cpus_lent") == 1
    assert value(text, "noded_rightsize_sized_total") >= 1 and value(text, "noded_rightsize_probes_total") >= 2
    os.chmod(tmp_path, 0o755)
    server = AdminServer(str(tmp_path / "noded.sock"), daemon, group=None, timeout_s=2).start()
    try:
        code, out, err = nodectl_run(server.path, "explain", "sim:a", capsys=capsys)
        assert code == 0 and "cores -> throughput" in out and re.search(r"^\s+2 -> ", out, re.M), out + err
        code, out, err = nodectl_run(server.path, "size", "sim:a", "--cores", "2", "--reason", "test", capsys=capsys)
        assert code == 0 and "sim:a is pinned at 2 cores" in out, err
        run(sim, daemon, clock, lambda r: len(affinity(sim, "a")) == 2, 5)
        text = generate_latest(make_registry(daemon)).decode()
        assert value(text, 'noded_job_sizing_state{job_id="sim:a",state="pinned"}') == 1
        assert value(text, 'noded_job_cpus{job_id="sim:a",role="gpu"}') == 2
        assert value(text, "noded_cpus_lent") == 0
    finally:
        server.stop()
