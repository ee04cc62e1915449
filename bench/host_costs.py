"""What a real host's kernel and GPU driver cost noded beyond what the simulated node can
show: the terms bench.daemon_cost's host estimate cannot measure without the hardware.

* MBM counters: on a host the kernel reads a counter from an MSR on a CPU of the
  counter's L3 domain (an IPI in older kernels, work queued on that CPU in current ones,
  unless it is nohz_full), which a plain kernfs file (a cgroup's) does not. Every
  ``mbm_total_bytes`` of every group under the mount is read as noded reads them each
  tick (os.open, one os.pread, os.close), ``--passes`` times, and as many cgroup files the
  same way (the baseline, in this process): CPU and wall per read, and what the
  difference adds to noded's tick for its reads (``--noded-reads``; 202 at 8 GPUs x 100
  jobs on two domains).
* NVML: the calls noded's sampler makes per GPU each tick (bench.bare_tick's), through
  the real driver, CPU per GPU and tick, against the stand-in library's figure from
  bench.daemon_cost's JSON where it is there (``--daemon-cost``).

Either part is skipped, saying why, where its hardware is missing; with neither, it
exits non-zero. Read-only; needs read access to the mount (root on most hosts).

    python -m bench.host_costs [--resctrl /sys/fs/resctrl] [--passes 50]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import time

import pynvml

from bench.bare_tick import mbm_files, nvml_calls

#: cgroup files as the kernfs baseline, the first pattern that matches anything
KERNFS_PATTERNS = ("/sys/fs/cgroup/cpuset/cpuset.*", "/sys/fs/cgroup/cpuset.*", "/sys/fs/cgroup/*/cpuset.*",
                   "/sys/fs/cgroup/cgroup.*")


def time_reads(paths: list[str], passes: int) -> tuple[float, float]:
    """(CPU s, wall s) per read, medians over ``passes`` passes over ``paths``."""
    cpu, wall = [], []
    for _ in range(passes):
        c0, t0 = time.thread_time(), time.perf_counter()
        for p in paths:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.pread(fd, 64, 0)
            except OSError:  # "Unavailable"/"Error" counters answer EIO: still a read's cost
                pass
            finally:
                os.close(fd)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(cpu) / len(paths), statistics.median(wall) / len(paths)


def kernfs_files(patterns: tuple[str, ...], n: int) -> list[str] | None:
    for pattern in patterns:
        found = sorted(f for f in glob.glob(pattern) if os.path.isfile(f) and os.access(f, os.R_OK))
        if found:
            return [found[i % len(found)] for i in range(n)]
    return None


def counter_costs(args) -> tuple[dict | None, str | None]:
    """The counters' part: (result, None), or (None, why it was skipped)."""
    if not os.path.isdir(os.path.join(args.resctrl, "mon_data")):
        return None, (f"{args.resctrl} has no mon_data: no resctrl with memory-bandwidth monitoring mounted there "
                      "(mount -t resctrl resctrl /sys/fs/resctrl on a host with RDT)")
    counters = mbm_files(args.resctrl)
    if not counters:
        return None, f"no mbm_total_bytes under {args.resctrl} (MBM not supported?)"
    baseline = kernfs_files(tuple(args.kernfs or KERNFS_PATTERNS), len(counters))
    if baseline is None:
        return None, f"no cgroup file to compare with (looked for {', '.join(args.kernfs or KERNFS_PATTERNS)})"
    mbm_cpu, mbm_wall = time_reads(counters, args.passes)
    kfs_cpu, kfs_wall = time_reads(baseline, args.passes)
    return {"resctrl": args.resctrl, "files": len(counters), "kernfs_example": baseline[0],
            "per_read_us": {"mbm_cpu": mbm_cpu * 1e6, "mbm_wall": mbm_wall * 1e6,
                            "kernfs_cpu": kfs_cpu * 1e6, "kernfs_wall": kfs_wall * 1e6},
            "noded_reads": args.noded_reads,
            "noded_extra_cpu_ms_per_tick": (mbm_cpu - kfs_cpu) * args.noded_reads * 1e3}, None


def nvml_costs(args) -> tuple[dict | None, str | None]:
    """The driver's part: (result, None), or (None, why it was skipped)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return None, f"NVML unavailable ({type(e).__name__.replace('NVMLError_', '')}): no GPU driver here"
    try:
        gpus = pynvml.nvmlDeviceGetCount()
        if gpus == 0:
            return None, "NVML shows no GPU"
        last_seen: dict[int, int] = {}
        nvml_calls(last_seen)  # the first pass loads what the driver loads once
        times = []
        for _ in range(args.passes):
            c0 = time.thread_time()
            nvml_calls(last_seen)
            times.append(time.thread_time() - c0)
    finally:
        pynvml.nvmlShutdown()
    per_gpu_ms = statistics.median(times) / gpus * 1e3
    out = {"gpus": gpus, "cpu_ms_per_gpu_tick": per_gpu_ms, "stand_in_cpu_ms_per_gpu_tick": None}
    try:
        with open(args.daemon_cost) as f:
            dc = json.load(f)
        out["stand_in_cpu_ms_per_gpu_tick"] = dc["baseline_parts_cpu_s_per_tick"]["nvml"] / dc["gpus"] * 1e3
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        pass  # no figure of the stand-in's to compare with: said in the table
    return out, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.host_costs", description=__doc__.splitlines()[0])
    ap.add_argument("--resctrl", default="/sys/fs/resctrl")
    ap.add_argument("--passes", type=int, default=50)
    ap.add_argument("--noded-reads", type=int, default=202, help="counter reads noded makes a tick")
    ap.add_argument("--kernfs", action="append", help="glob of kernfs files for the baseline (repeatable)")
    ap.add_argument("--daemon-cost", default="bench/out/daemon_cost.json",
                    help="bench.daemon_cost's JSON, for the stand-in NVML's figure")
    ap.add_argument("--json", default="bench/out/host_costs.json")
    args = ap.parse_args(argv)
    if args.passes < 1:
        ap.error("--passes must be at least 1")
    counters, counters_skipped = counter_costs(args)
    nvml, nvml_skipped = nvml_costs(args)
    if counters is None and nvml is None:
        raise SystemExit(f"bench.host_costs: nothing to measure here: {counters_skipped}; {nvml_skipped}")
    result = {"benchmark": "host_costs", "passes": args.passes, "counters": counters, "nvml": nvml,
              "skipped": [s for s in (counters_skipped, nvml_skipped) if s],
              "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}}
    print(f"what this host's kernel and driver cost noded, {args.passes} passes (medians), kernel {platform.release()}")
    extra = 0.0
    if counters is not None:
        us = counters["per_read_us"]
        print(f"  {'per read, ' + str(counters['files']) + ' counters':<36} {'CPU us':>8} {'wall us':>8}")
        print(f"  {'MBM counters (mbm_total_bytes)':<36} {us['mbm_cpu']:8.2f} {us['mbm_wall']:8.2f}")
        print(f"  {'baseline: kernfs files (cgroup)':<36} {us['kernfs_cpu']:8.2f} {us['kernfs_wall']:8.2f}")
        ratio = us["mbm_cpu"] / us["kernfs_cpu"] if us["kernfs_cpu"] > 0 else float("inf")
        print(f"  ratio counter / kernfs file (CPU): {ratio:.2f}; for noded's {counters['noded_reads']} reads a tick: "
              f"{counters['noded_extra_cpu_ms_per_tick']:+.2f} ms of its CPU beyond kernfs files'")
        extra += counters["noded_extra_cpu_ms_per_tick"]
    else:
        print(f"  MBM counters: skipped: {counters_skipped}")
    if nvml is not None:
        stand_in = nvml["stand_in_cpu_ms_per_gpu_tick"]
        line = (f"  NVML, noded's calls per GPU a tick ({nvml['gpus']} GPUs): {nvml['cpu_ms_per_gpu_tick']:.3f} ms of CPU")
        if stand_in is not None:
            more = (nvml["cpu_ms_per_gpu_tick"] - stand_in) * nvml["gpus"]
            line += f"; the stand-in library {stand_in:.3f} ({args.daemon_cost}): {more:+.2f} ms a tick for these GPUs"
            extra += more
        else:
            line += f"; no stand-in figure to compare with ({args.daemon_cost} missing)"
        print(line)
    else:
        print(f"  NVML: skipped: {nvml_skipped}")
    print(f"  add to bench.daemon_cost's host estimate: {extra:+.2f} ms a tick (the parts measured here)")
    result["add_to_estimate_ms_per_tick"] = extra
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
