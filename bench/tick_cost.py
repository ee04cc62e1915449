"""Cost of one daemon tick with 8 GPUs and 100 jobs, per sampler and per stage
(sample, decide, act, export), against bare baselines measured in the same run:
reading the same MBM files with a plain open/read loop, one /proc scan, and the
same pynvml calls without noded's sampler around them.

    python -m bench.tick_cost [--jobs 100] [--gpus 8] [--ticks 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import pynvml
from prometheus_client import generate_latest

from noded.app import build_daemon
from noded.config import Config, MetricsConfig, ResctrlConfig
from noded.metrics import make_registry
from noded.sim.node import SimNode
from noded.sim.scenario import parse_scenario


def bare_mbm(paths: list[str]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            f.read()


def bare_proc_scan() -> None:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    f.read()
            except FileNotFoundError:
                pass


def bare_nvml(count: int) -> None:
    for i in range(count):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        pynvml.nvmlDeviceGetUUID(h)
        pynvml.nvmlDeviceGetUtilizationRates(h)
        pynvml.nvmlDeviceGetMemoryInfo(h)
        pynvml.nvmlDeviceGetComputeRunningProcesses(h)


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def scenario_text(jobs: int, gpus: int) -> str:
    models = ["BiDAF", "ResNet-50", "Transformer", "VGG16", "AlexNet", "WaveNet", "DeepSpeech", "InceptionV3"]
    lines = []
    for i in range(jobs):
        if i % 2 == 0:
            lines.append(f"  - {{at: 0, start: {{id: g{i}, model: {models[i % len(models)]}, gpu: {i % gpus}}}}}")
        else:
            lines.append(f"  - {{at: 0, start: {{id: c{i}, cpu_gbps: 0.1}}}}")
    return (f"seed: 1\nduration_s: 3600\nnode: {{profile: intel, gpus: {gpus}, peak_gbps: 50}}\n"
            "events:\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--json", default="bench/out/tick_cost.json")
    args = ap.parse_args(argv)
    scenario = parse_scenario(scenario_text(args.jobs, args.gpus), "bench")
    order = ("resctrl_groups", "jobs", "nvml", "resctrl", "sample", "decide", "act", "export", "tick")
    stages: dict[str, list[float]] = {k: [] for k in order}
    with SimNode(scenario, emulator_args=["--num-rmids", str(args.jobs + 16)]) as sim, \
            tempfile.TemporaryDirectory() as state:
        sim.step()
        config = Config(tick_s=0.1, peak_gbps_per_domain=50, state_dir=state, metrics=MetricsConfig(port=0),
                        resctrl=ResctrlConfig(root=sim.emu.root, mounts=sim.emu.mounts_file))
        daemon = build_daemon(config, discovery=sim.discovery).daemon
        registry = make_registry(daemon)
        try:
            daemon.tick()  # the first tick makes the groups and moves the tasks
            for _ in range(args.ticks):
                t0 = time.perf_counter()
                r = daemon.tick()
                t1 = time.perf_counter()
                generate_latest(registry)
                t2 = time.perf_counter()
                for st in r.sample.samplers:
                    stages[st.name].append(st.duration_s)
                for k, v in r.durations.items():
                    if k in stages:  # "total" is the tick without the scrape: "tick" below has both
                        stages[k].append(v)
                stages["export"].append(t2 - t1)
                stages["tick"].append(t2 - t0)
            assert len(r.sample.jobs) == args.jobs and r.sample.node_bandwidth_total_bps is not None, r.sample.missing
            groups = [sim.open_resctrl().root_group().path] + [g.path for g in daemon.telemetry.monitor.groups().values()]
            paths = [os.path.join(g, "mon_data", f"mon_L3_{d:02d}", "mbm_total_bytes")
                     for g in groups for d in sim.domains]
            base = {"resctrl": timed(lambda: bare_mbm(paths), args.ticks),
                    "jobs": timed(bare_proc_scan, args.ticks),
                    "nvml": timed(lambda: bare_nvml(args.gpus), args.ticks)}
        finally:
            daemon.shutdown()
    base["sample"] = [a + b + c for a, b, c in zip(base["resctrl"], base["jobs"], base["nvml"])]
    med = {k: statistics.median(v) for k, v in stages.items()}
    bmed = {k: statistics.median(v) for k, v in base.items()}
    labels = {"resctrl": f"open+read the same {len(paths)} MBM files", "jobs": "read every /proc/PID/stat once",
              "nvml": "the same pynvml calls, bare", "sample": "the three baselines together (not the group listing)"}
    print(f"daemon tick: {args.jobs} jobs ({args.jobs // 2} on GPUs), {args.gpus} GPUs, resctrl emulator "
          f"(2 L3 domains), fake NVML; {args.ticks} ticks, median")
    print(f"  {'stage':<14} {'median ms':>10} {'baseline ms':>12} {'ratio':>7}  baseline")
    for k in order:
        b = bmed.get(k)
        print(f"  {k:<14} {med[k] * 1e3:10.2f} " + (f"{b * 1e3:12.2f} {med[k] / b:7.2f}  {labels[k]}" if b else
                                                         f"{'':>12} {'':>7}"))
    print(f"  the whole tick is {med['tick'] / 0.1:.0%} of a 100 ms period")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "tick_cost", "jobs": args.jobs, "gpus": args.gpus, "ticks": args.ticks,
                   "median_s": med, "baseline_median_s": bmed, "ratios": {k: med[k] / bmed[k] for k in bmed},
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
