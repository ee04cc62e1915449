"""`noded sim --scenario FILE`: the simulated node on its own, with noded's telemetry
sampling it every tick and a line a second of what it sees."""

from __future__ import annotations

import sys
import threading
import time

from noded.samplers.mongroups import JobMonitor
from noded.samplers.nvml import NvmlSampler
from noded.samplers.resctrl import ResctrlSession
from noded.samplers.telemetry import Telemetry
from nodesim.node import SimNode
from nodesim.scenario import Scenario

GB = 1e9


def build_telemetry(sim: SimNode, *, process_events: bool = True) -> Telemetry:
    session = ResctrlSession.of(sim.open_resctrl())
    return Telemetry(sim.discovery, session, JobMonitor(session, clock=time.monotonic), NvmlSampler(),
                     process_events=process_events)


def _fmt(v: float | None, scale: float = 1.0, spec: str = "5.1f") -> str:
    return "    -" if v is None else format(v / scale, spec)


def print_tick(elapsed: float, sample, levels, out) -> None:
    """One line: node bandwidth, then each job's kind, bandwidth, GPU utilisation and throttle level."""
    node = sample.node_bandwidth_total_bps
    jobs = "  ".join(
        f"{j.id.removeprefix('sim:')}[{j.kind}] {_fmt(j.bandwidth_bps, GB, '.1f')} GB/s"
        + (f" util {_fmt(j.gpu_util, 1, '.0f')}%" if j.kind == "gpu" else "")
        + (f" L{levels[j.id]}" if levels.get(j.id) else "")
        for j in sorted(sample.jobs.values(), key=lambda j: j.id))
    print(f"t={elapsed:5.1f}s node {_fmt(node, GB)} GB/s  {jobs}"
          + (f"  missing: {'; '.join(sample.missing)}" if sample.missing else ""), file=out, flush=True)


def run_scenario(scenario: Scenario, out=sys.stdout, stop: threading.Event | None = None) -> int:
    stop = stop or threading.Event()
    with SimNode(scenario) as sim:
        telemetry = build_telemetry(sim)
        try:
            print(f"simulated node: {scenario.node.gpus} GPUs, resctrl emulator profile {scenario.node.profile!r}, "
                  f"peak {scenario.node.peak_gbps:g} GB/s per L3 domain; {scenario.name}", file=out)
            if telemetry.events is None:
                print("(process-events connector unavailable: polling only)", file=out)
            next_print = 0.0
            while not sim.finished and not stop.is_set():
                state = sim.step()
                sample = telemetry.sample()
                if state.elapsed >= next_print:
                    next_print += 1.0
                    print_tick(state.elapsed, sample, {}, out)
                stop.wait(scenario.tick_s)
        finally:
            telemetry.close()
    print("scenario done; placeholder processes stopped, monitoring groups removed, emulator unmounted.", file=out)
    return 0
