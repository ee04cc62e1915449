"""bench.scenario's plumbing on tiny runs: the contention matrix on this machine's real
cpusets and on the simulated node, calibrate, and what they leave behind (nothing)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

from bench.scenario.contention import describe_actions, table
from bench.scenario.plot import figure
from bench.scenario.cpuset_node import CpusetNode, find_cpuset_root
from noded.commands.wiring import with_node_peak
from noded.config import Config
from nodesim.node import SimNode
from nodesim.scenario import ScenarioError, parse_scenario
from support.calibrating import calibrate_small
from support.waiting import wait_for

pytestmark = pytest.mark.fuse

try:
    CPUSET_ROOT = find_cpuset_root()
except RuntimeError:
    CPUSET_ROOT = None
needs_cpusets = pytest.mark.skipif(CPUSET_ROOT is None or not os.access(CPUSET_ROOT, os.W_OK)
                                   or len(os.sched_getaffinity(0)) < 2,
                                   reason="needs a writable cpuset hierarchy and 2 CPUs")


def mounts_under(directory: str) -> list[str]:
    """The mount points at or below ``directory``: what a run whose scratch space it is left
    mounted (another process's mounts, a running `make demo`'s, are elsewhere)."""
    top = os.path.realpath(directory)
    with open("/proc/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    return [p for p in points if p == top or p.startswith(top + "/")]


def bench_cgroups() -> set[str]:
    return {d for d in os.listdir(CPUSET_ROOT) if d.startswith("noded-bench-")} if CPUSET_ROOT else set()


def leftovers_of(node: CpusetNode) -> list[str]:
    """What this node made and left: its own cpuset subtree, mounts in its scratch directory."""
    subtree = [node.cpusets.base] if os.path.exists(node.cpusets.base) else []
    return subtree + mounts_under(node.tmp.name)


@needs_cpusets
@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(300)
def test_a_tiny_contention_run_writes_its_table_json_and_plot_and_leaves_nothing(tmp_path):
    out = tmp_path / "results"
    # the run's temporary directories, so its mounts are told from others': short, since the
    # emulator's control socket lies below it and AF_UNIX paths end at 107 bytes
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="noded-scn-"))
    cgroups_before = bench_cgroups()
    p = subprocess.run([sys.executable, "-m", "bench.scenario", "contention", "--nodes", "cpusets,sim", "--shares",
                        "100", "--seconds", "2", "--warmup", "1", "--peak-gbps", "5", "--out", str(out)],
                       env={**os.environ, "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stderr
    data = json.loads((out / "contention.json").read_text())
    assert data["command"].startswith("python -m bench.scenario contention --nodes cpusets,sim")
    assert [n["key"] for n in data["nodes"]] == ["cpusets", "sim"]
    for node in data["nodes"]:
        cells = node["cells"]
        assert [(c["share"], c["noded"]) for c in cells] == [(None, False), (1.0, False), (1.0, True)]
        assert cells[0]["victim_normalised"] == 1.0 and all(c["victim"] > 0 for c in cells)
        assert cells[2]["throttle"] == ("cores" if node["key"] == "cpusets" else "mba")
        assert cells[2]["noded_cpu_share"] > 0 and cells[1]["noded_cpu_share"] is None
    assert (out / "contention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "this machine (real cpusets, core halving)" in p.stdout and "simulated node" in p.stdout
    assert "[3/3] sim: stressor 100%, noded on" in p.stderr  # progress, one line per step off a terminal
    assert mounts_under(str(scratch)) == [] and bench_cgroups() - cgroups_before == set()
    shutil.rmtree(scratch)


@needs_cpusets
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_noded_halves_the_stressors_real_cpuset_and_gives_it_back():
    with CpusetNode("tokenise", 3.0, victim_cpus="1", stressor_cpus="0-1", stressor_threads=2, size_mib=64) as node:
        # One second alone is enough: the solo rate only scales the GPU utilisation the
        # victim's pace is fed as, its baseline (learnt in the next cell's warmup) and its
        # contended value alike.
        node.run_cell(None, False, warmup_s=1, seconds=1)
        assert node.solo_rate > 0
        # The stressor takes CPU 1 from the victim: noded sees the GPU job slow at a
        # saturated node and halves the stressor's cpuset, a real cgroup write. The cell
        # ends when the halving is there (a tick or two after the stressor's first report),
        # at the latest after the 8 s the fixed cell took before.
        cell = node.run_cell(1.0, True, warmup_s=2, seconds=8, until=lambda: node.cpusets.cpus("stressor") == "0")
        assert [a["kind"] for a in cell["actions"]][:1] == ["throttle"], cell
        assert cell["stressor_cpus_at_end"] == "0"
        assert node.cpusets.cpus("stressor") == "0-1"  # restored when noded stopped
        assert 0 < cell["noded_cpu_share"] < 1  # the daemon's own, a process of its own
    assert leftovers_of(node) == []


def test_calibrate_writes_where_noded_reads(tmp_path):
    _, cal = calibrate_small(["bench.scenario", "calibrate"], str(tmp_path))
    assert cal.command == f"python -m bench.scenario calibrate --seconds 2 --size 32 --state-dir {tmp_path}"
    assert with_node_peak(Config(state_dir=str(tmp_path)))[0].peak_gbps_per_domain == cal.peak_gbps_per_domain


@pytest.mark.parametrize("args, message", [
    (["contention", "--nodes", "gpu"], "--nodes: unknown node(s) ['gpu']"),
    (["contention", "--shares", "0,50"], "each share must be in (0, 100]"),
    (["contention", "--seconds", "1"], "--seconds must be at least 2"),
    (["calibrate", "--seconds", "1"], "--seconds must be at least 2"),
])
def test_bad_arguments_are_refused_by_name(args, message):
    p = subprocess.run([sys.executable, "-m", "bench.scenario", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and message in p.stderr


def test_the_table_normalises_to_the_victim_alone_and_names_noded_actions():
    result = {"node": "n", "unit": "samples/s", "peak_gbps": 10.0, "victim_solo": 100.0, "cells": [
        {"share": None, "noded": False, "victim_normalised": 1.0, "node_gbps": 1.0, "node_share_of_peak": 0.1,
         "actions": [], "throttle": None},
        {"share": 1.0, "noded": True, "victim_normalised": 0.95, "node_gbps": 7.0, "node_share_of_peak": 0.7,
         "actions": [{"t": 2.5, "job": "cgroup:stressor", "kind": "throttle", "from": 0, "to": 1, "reason": "x"}],
         "throttle": "cores", "noded_cpu_share": 0.012}]}
    text = table(result)
    assert "alone 100; node peak 10.0 GB/s" in text
    assert "      none   off        1.00       1.0     10%         -  -" in text
    assert "    100%    on        0.95       7.0     70%      1.2%  halved cores at 2.5s" in text
    assert describe_actions([], "mba") == "none" and describe_actions([], None) == "-"


def _cell(share, noded, victim, node_share, actions=()):
    return {"share": share, "noded": noded, "victim_normalised": victim, "node_gbps": 1.0,
            "node_share_of_peak": node_share, "actions": list(actions), "throttle": "mba" if noded else None}


THROTTLED = {"t": 3.5, "job": "cgroup:stressor", "kind": "throttle", "from": 0, "to": 1, "reason": "x"}


def test_each_panel_names_what_its_node_measures_and_a_cell_without_action_says_why():
    # Issue #26: the simulated node's panel read "tokenise victim" where that node measures
    # the GPU job's utilisation, and a cell where noded took no action said nothing of why.
    results = [{"node": "this machine", "unit": "samples/s", "cells": [
                    _cell(None, False, 1.0, 0.02), _cell(0.5, False, 0.42, 0.51), _cell(0.5, True, 0.41, 0.51),
                    _cell(1.0, False, 0.39, 0.77), _cell(1.0, True, 0.94, 0.53, [THROTTLED])]},
               {"node": "simulated node", "unit": "GPU utilisation, %", "cells": [
                    _cell(None, False, 1.0, 0.02), _cell(0.5, False, 1.0, 0.52), _cell(0.5, True, 1.0, 0.52),
                    _cell(1.0, False, 0.45, 1.0), _cell(1.0, True, 0.95, 0.64, [THROTTLED])]}]
    fig = figure(results, "tokenise", threshold=0.75)
    mine, sim = fig.axes[:2]
    assert "samples/s" in mine.get_ylabel() and "tokenise victim" in mine.get_ylabel()
    assert "GPU utilisation" in sim.get_ylabel() and "tokenise victim" not in sim.get_ylabel()
    for ax, share in ((mine, "51%"), (sim, "52%")):
        half, full = [t.get_text() for t in ax.get_xticklabels()]
        assert "no action" in half and f"node {share} of peak" in half and "< 75% threshold" in half, half
        assert full == "100%", full  # noded acted there: nothing to explain
    text = table({"node": "n", "unit": "samples/s", "peak_gbps": 10.0, "victim_solo": 100.0,
                  "cells": results[0]["cells"]}, threshold=0.75)
    assert "none: node at 51% of peak, under the 75% threshold" in text


def test_a_sim_job_runs_its_command_as_its_process():
    scenario = parse_scenario("duration_s: 5\nnode: {gpus: 1}\nevents:\n"
                              "  - {at: 0, start: {id: v, model: AlexNet, gpu: 0, command: [sleep, '31']}}\n")
    assert scenario.jobs["v"].command == ("sleep", "31")
    with SimNode(scenario) as sim:
        sim.step()
        pid = sim.procs["v"].pid
        wait_for(lambda: open(f"/proc/{pid}/cmdline").read() == "sleep\x0031\x00", what="the command running")
        assert pid in sim.gpus[0].processes  # on its GPU, as a placeholder would be


@pytest.mark.parametrize("command, message", [
    ("''", "empty command"),
    ("[1, 2]", "expected a command line"),
    ("'a \"b'", "No closing quotation"),
])
def test_a_bad_command_is_refused_by_event_and_key(command, message):
    with pytest.raises(ScenarioError, match=message) as e:
        parse_scenario(f"duration_s: 5\nevents:\n  - {{at: 0, start: {{id: v, cpu: hog, command: {command}}}}}\n",
                       "s.yaml")
    assert "s.yaml: events[0].start.command" in str(e.value)


@needs_cpusets
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_on_a_host_with_resctrl_the_cpuset_node_uses_it_and_mba(emulator):
    host = emulator("intel")  # stands in for a host's own resctrl mount, MBA included
    with CpusetNode("tokenise", 5.0, victim_cpus="1", stressor_cpus="0-1", stressor_threads=1, size_mib=32,
                    resctrl=(host.root, host.mounts_file)) as node:
        assert node.emu is None and "resctrl at" in node.name
        # no cell of the victim alone: its solo rate scales only the GPU utilisation fed to
        # noded, and what this looks at (the method noded throttles by, scraped at the cell's
        # end) does not depend on it, nor on the cell's length: one report of the victim's
        cell = node.run_cell(0.25, True, warmup_s=1, seconds=1)
        assert cell["throttle"] == "mba"
    assert leftovers_of(node) == []
