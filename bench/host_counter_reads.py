"""What one MBM counter read costs on this host's resctrl, against a kernfs file's: the
term bench.daemon_cost's host estimate cannot measure without RDT.

On a host the kernel reads a counter from an MSR on a CPU of the counter's L3 domain (an
IPI in older kernels, work queued on that CPU in current ones, unless it is nohz_full),
which a plain kernfs file (a cgroup's) does not. This reads every ``mbm_total_bytes`` of
every group under the mount, as noded reads them each tick (os.open, one os.pread,
os.close), ``--passes`` times, and as many cgroup files the same way (the baseline in the
same process): CPU per read (this thread's) and wall per read, and what the difference
adds to noded's tick for its reads (``--noded-reads``; 202 at 8 GPUs x 100 jobs on two
domains). Read-only; needs read access to the mount (root on most hosts).

    python -m bench.host_counter_reads [--resctrl /sys/fs/resctrl] [--passes 50]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import time

from bench.bare_tick import mbm_files

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


def kernfs_files(patterns: tuple[str, ...], n: int) -> list[str]:
    for pattern in patterns:
        found = sorted(f for f in glob.glob(pattern) if os.path.isfile(f) and os.access(f, os.R_OK))
        if found:
            return [found[i % len(found)] for i in range(n)]
    raise SystemExit(f"bench.host_counter_reads: no cgroup file to compare with (looked for {', '.join(patterns)})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.host_counter_reads", description=__doc__.splitlines()[0])
    ap.add_argument("--resctrl", default="/sys/fs/resctrl")
    ap.add_argument("--passes", type=int, default=50)
    ap.add_argument("--noded-reads", type=int, default=202, help="counter reads noded makes a tick")
    ap.add_argument("--kernfs", action="append", help="glob of kernfs files for the baseline (repeatable)")
    ap.add_argument("--json", default="bench/out/host_counter_reads.json")
    args = ap.parse_args(argv)
    if args.passes < 1:
        ap.error("--passes must be at least 1")
    if not os.path.isdir(os.path.join(args.resctrl, "mon_data")):
        raise SystemExit(f"bench.host_counter_reads: {args.resctrl} has no mon_data: no resctrl with memory-bandwidth "
                         "monitoring mounted there (mount -t resctrl resctrl /sys/fs/resctrl on a host with RDT)")
    counters = mbm_files(args.resctrl)
    if not counters:
        raise SystemExit(f"bench.host_counter_reads: no mbm_total_bytes under {args.resctrl} (MBM not supported?)")
    baseline = kernfs_files(tuple(args.kernfs or KERNFS_PATTERNS), len(counters))
    mbm_cpu, mbm_wall = time_reads(counters, args.passes)
    kfs_cpu, kfs_wall = time_reads(baseline, args.passes)
    extra_ms = (mbm_cpu - kfs_cpu) * args.noded_reads * 1e3
    result = {"benchmark": "host_counter_reads", "resctrl": args.resctrl, "files": len(counters),
              "passes": args.passes, "kernfs_example": baseline[0],
              "per_read_us": {"mbm_cpu": mbm_cpu * 1e6, "mbm_wall": mbm_wall * 1e6,
                              "kernfs_cpu": kfs_cpu * 1e6, "kernfs_wall": kfs_wall * 1e6},
              "noded_reads": args.noded_reads, "noded_extra_cpu_ms_per_tick": extra_ms,
              "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}}
    print(f"counter reads on {args.resctrl}: {len(counters)} files, {args.passes} passes (medians), kernel "
          f"{platform.release()}")
    print(f"  {'per read':<34} {'CPU us':>8} {'wall us':>8}")
    print(f"  {'MBM counters (mbm_total_bytes)':<34} {mbm_cpu * 1e6:8.2f} {mbm_wall * 1e6:8.2f}")
    print(f"  {'baseline: kernfs files (cgroup)':<34} {kfs_cpu * 1e6:8.2f} {kfs_wall * 1e6:8.2f}")
    ratio = mbm_cpu / kfs_cpu if kfs_cpu > 0 else float("inf")
    print(f"  ratio counter / kernfs file (CPU): {ratio:.2f}")
    print(f"  what a counter read costs beyond a kernfs file's, for noded's {args.noded_reads} reads a tick: "
          f"{extra_ms:+.2f} ms of its CPU (add to bench.daemon_cost's host estimate)")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
