"""The contention scenario on the simulated node: the resctrl emulator with MBA, the
fake NVML, and the workload model of ``nodesim.workload`` (CODA's findings) setting
the victim's GPU utilisation from the bandwidth the emulator grants. The victim is
the CODA model of its shape (decode: AlexNet, tokenise: Transformer) and its process
is the real victim workload; the stressor is a CPU job demanding a share of the peak. Each
job runs in a cpuset cgroup of its own, and noded runs as a host runs it, a process of its
own configured as ``noded sim-node`` configures one (``noded_run.NodedRun``)."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import dataclasses
import json
import os

from noded.config import Config
from nodesim.node import SimNode
from nodesim.scenario import Event, JobSpec, NodeSpec, Scenario
from nodesim.sim_node import LABELS, daemon_config, find_cpuset_root, write_labels

from .noded_run import SCENARIO_CONTENTION, NodedRun, outcome

#: the CODA model each victim stands for on the simulated node
MODEL_OF = {"decode": "AlexNet", "tokenise": "Transformer"}
PEAK_GBPS = 20.0  # per L3 domain
DOMAINS = 2  # the intel profile's


def contention_scenario(victim: str, share: float | None, warmup_s: float, seconds: float) -> Scenario:
    jobs = {"victim": JobSpec("victim", model=MODEL_OF[victim], gpu=0,
                              command=(sys.executable, "-m", "bench.victims", victim))}
    events = [Event(0.0, "start", {"id": "victim"})]
    if share is not None:
        # A CPU job's demand is spread over the domains: share x peak on each.
        jobs["stressor"] = JobSpec("stressor", cpu_gbps=share * PEAK_GBPS * DOMAINS)
        events.append(Event(warmup_s, "start", {"id": "stressor"}))
    return Scenario(warmup_s + seconds, tuple(events), NodeSpec("intel", 1, PEAK_GBPS), seed=7, tick_s=0.25,
                    name=f"contention {victim} {share}", jobs=jobs)


class SimulatedNode:
    name = "simulated node (resctrl emulator, MBA)"
    unit = "GPU utilisation, %"  # what the victim column measures
    key = "sim"

    def __init__(self, victim: str, tick_s: float = 0.5):
        self.victim_name = victim
        self.tick_s = tick_s
        self.peak_gbps = PEAK_GBPS * DOMAINS  # the whole node: the table compares node bandwidth with it

    def run_cell(self, share: float | None, with_noded: bool, warmup_s: int, seconds: int, progress=None) -> dict:
        scenario = contention_scenario(self.victim_name, share, warmup_s, seconds)
        states = []
        with tempfile.TemporaryDirectory(prefix="noded-bench-sim-") as scratch, \
                SimNode(scenario, cpuset_root=find_cpuset_root(), workdir=scratch) as sim:
            os.chmod(scratch, 0o755)
            noded = None
            labels = os.path.join(scratch, LABELS)
            write_labels(sim, labels)
            if with_noded:
                base = json.loads(json.dumps(dataclasses.asdict(
                    Config(tick_s=self.tick_s, contention=SCENARIO_CONTENTION))))
                noded = NodedRun(daemon_config(sim, base, scratch), sim.nvml_env, scratch).start()
            try:
                shown, labelled = 0, dict(sim.labels)
                while not sim.finished:
                    state = sim.step()
                    if sim.labels != labelled:  # a job started: noded learns what it is, as from sim-node
                        write_labels(sim, labels)
                        labelled = dict(sim.labels)
                    if state.elapsed >= warmup_s + 1.0:  # the first second beside the stressor is its ramp
                        states.append(state)
                    if progress and int(state.elapsed) > shown:
                        shown = int(state.elapsed)
                        progress(min(shown, int(scenario.duration_s)), int(scenario.duration_s))
                    time.sleep(scenario.tick_s)  # the simulation runs in real time
            finally:
                if noded is not None:
                    noded.stop()
        util = statistics.mean(s.gpu_util["victim"] for s in states if "victim" in s.gpu_util)
        return {"victim": round(util, 2), "node_gbps": round(statistics.mean(s.granted_gbps for s in states), 2),
                **outcome(noded)}

    def close(self) -> None:
        pass

    def __enter__(self) -> "SimulatedNode":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
