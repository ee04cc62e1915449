"""Cost of one full sampling tick with 8 GPUs and 100 jobs, per component, against
bare baselines measured in the same run: reading the same MBM files with a plain
open/read loop, and the same pynvml calls without noded's sampler around them.

    python -m bench.tick_cost [--jobs 100] [--gpus 8] [--ticks 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import pynvml

from noded.jobs import JobDiscovery, JobMonitor
from noded.samplers.bandwidth import BandwidthSampler
from noded.samplers.nvml import NvmlSampler
from noded.sim import fake_nvml
from noded.telemetry import Telemetry
from resctrl import Resctrl
from resctrl.emulator import MountedEmulator


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--json", default="bench/out/tick_cost.json")
    args = ap.parse_args(argv)
    procs = []
    gpus = fake_nvml.make_gpus(args.gpus)
    fake_nvml.install(fake_nvml.FakeNvmlLib(gpus))
    with MountedEmulator("intel", extra_args=["--num-rmids", str(args.jobs + 16)]) as emu:
        rc = Resctrl.open(emu.root, mounts=emu.mounts_file)
        discovery = JobDiscovery([])
        monitor = JobMonitor(rc, clock=time.monotonic)
        bandwidth = BandwidthSampler(rc, monitor)
        monitor.on_removed = bandwidth.forget
        telemetry = Telemetry(discovery, monitor, NvmlSampler(), bandwidth, process_events=False)
        try:
            for i in range(args.jobs):
                p = subprocess.Popen(["sleep", "infinity"])
                procs.append(p)
                discovery.register(p.pid, f"job-{i}")
                emu.control.set_demand(p.pid, 1e8)
                if i % 2 == 0:  # half of them GPU jobs, spread over the GPUs
                    gpus[i % args.gpus].processes[p.pid] = fake_nvml.FakeProcess(p.pid, sm_util=30)
            telemetry.sample()  # first tick creates the groups and moves the tasks
            per: dict[str, list[float]] = {"jobs": [], "nvml": [], "resctrl": [], "total": []}
            for _ in range(args.ticks):
                t0 = time.perf_counter()
                s = telemetry.sample()
                per["total"].append(time.perf_counter() - t0)
                for st in s.samplers:
                    per[st.name].append(st.duration_s)
            assert len(s.jobs) == args.jobs and s.node_bandwidth_total_bps is not None
            paths = [os.path.join(g.path, "mon_data", f"mon_L3_{d:02d}", "mbm_total_bytes")
                     for g in [rc.root_group(), *monitor.groups().values()] for d in rc.caps.domains]
            base = {"resctrl": timed(lambda: bare_mbm(paths), args.ticks),
                    "jobs": timed(bare_proc_scan, args.ticks),
                    "nvml": timed(lambda: bare_nvml(args.gpus), args.ticks)}
        finally:
            telemetry.close()
            for p in procs:
                p.kill()
                p.wait()
            fake_nvml.install(None)
    med = {k: statistics.median(v) for k, v in per.items()}
    bmed = {k: statistics.median(v) for k, v in base.items()}
    print(f"sampling tick: {args.jobs} jobs ({args.jobs // 2} on GPUs), {args.gpus} GPUs, resctrl emulator "
          f"(2 L3 domains), fake NVML; {args.ticks} ticks, median")
    print(f"  {'component':<10} {'median ms':>10} {'baseline ms':>12} {'ratio':>7}  baseline")
    labels = {"resctrl": f"open+read the same {len(paths)} MBM files", "nvml": "the same pynvml calls, bare",
              "jobs": "read every /proc/PID/stat once"}
    for k in ("jobs", "nvml", "resctrl", "total"):
        b = bmed.get(k)
        print(f"  {k:<10} {med[k] * 1e3:10.2f} {b * 1e3 if b else float('nan'):12.2f} "
              f"{med[k] / b if b else float('nan'):7.2f}  {labels.get(k, '')}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "tick_cost", "jobs": args.jobs, "gpus": args.gpus, "ticks": args.ticks,
                   "median_s": med, "baseline_median_s": bmed,
                   "ratios": {k: med[k] / bmed[k] for k in bmed},
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
