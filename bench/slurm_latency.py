"""noded under a real one-host Slurm (Debian's slurm-wlm, tests/slurm's harness): the time
from `sbatch` of a memory-bandwidth hog to noded throttling it, and what noded's Prolog
adds to a job's start.

* **sbatch -> throttle**: a labelled GPU job runs (BiDAF on the simulated node's GPU) with
  its uncontended baseline known; a hog (16 GB/s, 2 CPUs) is submitted; timed: until it
  runs (its process in Slurm's cgroup), until noded lists it, until noded throttles it
  (its cpuset halved). noded with its production defaults (tick 1 s, contention defaults).
* **Prolog**: the shipped Prolog's wall time, measured by its wrapper in slurmd, per job
  kind: a plain job (no "noded:" in its comment: the shell fast path), a labelled one
  (Python, `label` request), one asking for a shared GPU (`label` and `admit`, the MPS
  environment file). Baseline in the same run: the same wrapper with the hook off (what
  the wrapper itself costs). Jobs one at a time (no Prologs overlapping).

    python -m bench.slurm_latency [--hog-trials 5] [--prolog-trials 20]

Needs root, Slurm (make system-deps), /dev/fuse. Writes bench/out/slurm_latency.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "slurm"))  # the one-host Slurm harness

SLEEPER = "#!/bin/sh\nexec sleep 600\n"
KINDS = {  # prolog mode, the job's comment
    "baseline (hook off)": ("off", "noded: model=BiDAF batch_size=32"),
    "plain job": ("on", "nightly run"),
    "labelled job": ("on", "noded: model=BiDAF batch_size=32 category=NLP"),
    "share=mps job": ("on", "noded: model=BiDAF batch_size=32 share=mps"),
}


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def hog_to_throttle(node, trials: int) -> list[dict]:
    from slurm_cluster import wait_for

    gpu = node.slurm.sbatch("-c", "1", "--comment", "noded: model=BiDAF batch_size=32 category=NLP",
                            "-o", "/dev/null", script=SLEEPER)
    node.adopt("gpu", gpu, model="BiDAF", gpu=0)
    wait_for(lambda: (node.noded_job(f"slurm:{gpu}") or {}).get("kind") == "gpu"
             and node.ask("explain", job=f"slurm:{gpu}")["baseline"] is not None, 60, what="the GPU job's baseline")
    out = []
    for i in range(trials):
        t0 = time.monotonic()
        hog = node.slurm.sbatch("-c", "2", "-o", "/dev/null", script=SLEEPER)
        node.adopt(f"hog{i}", hog, cpu_gbps=16.0)  # as soon as its process is in Slurm's cgroup
        running = time.monotonic() - t0
        wait_for(lambda: node.noded_job(f"slurm:{hog}"), 60, what=f"noded to list slurm:{hog}", interval=0.01)
        seen = time.monotonic() - t0
        wait_for(lambda: (node.noded_job(f"slurm:{hog}") or {}).get("level", 0) >= 1, 120, what=f"slurm:{hog} throttled",
                 interval=0.01)
        throttled = time.monotonic() - t0
        out.append({"running_s": running, "seen_s": seen, "throttled_s": throttled})
        node.release(f"hog{i}")
        node.slurm.scancel(hog)
        wait_for(lambda: not node.slurm.job_cgroups(hog), 60, what=f"job {hog} gone")
        # the next hog meets an uncontended node again: the GPU job back above its baseline
        wait_for(lambda: (j := node.noded_job(f"slurm:{gpu}")) and not any(
            x["level"] for x in node.ask("jobs")) and node.ask("status")["node"]["contention"] is False and j,
            120, what="the node calm again", interval=0.1)
    node.release("gpu")
    node.slurm.scancel(gpu)
    return out


def prolog_times(node, trials: int) -> dict[str, list[float]]:
    from slurm_cluster import wait_for

    times: dict[str, list[float]] = {k: [] for k in KINDS}
    starts: dict[str, list[float]] = {k: [] for k in KINDS}
    for i in range(trials):
        for kind, (mode, comment) in KINDS.items():  # interleaved: drift hits every kind alike
            node.set_prolog_mode(mode)
            out = os.path.join(node.dir, f"start-{i}.out")
            t0 = time.time()
            j = node.slurm.sbatch("-c", "1", "--comment", comment, "-o", out, script="#!/bin/sh\ndate +%s.%N\n")
            m, ns = wait_for(lambda: node.prolog_time(j), 60, what=f"job {j}'s Prolog", interval=0.01)
            assert m == mode, (m, mode)
            times[kind].append(ns / 1e6)
            wait_for(lambda: node.slurm.state(j) in ("COMPLETED", ""), 60, what=f"job {j} done", interval=0.02)
            with open(out) as f:
                starts[kind].append(float(f.read().strip()) - t0)
            os.unlink(out)
    return times, starts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hog-trials", type=int, default=5)
    ap.add_argument("--prolog-trials", type=int, default=20)
    args = ap.parse_args(argv)
    import slurm_cluster
    from slurm_node import SlurmNode

    why = slurm_cluster.missing()
    if why:
        raise SystemExit(f"bench.slurm_latency: {why}")
    workdir = tempfile.mkdtemp(prefix="bench-slurm-")
    try:
        with SlurmNode(workdir, tick_s=1.0, contention={}, timed_prolog=True) as node:
            hog = hog_to_throttle(node, args.hog_trials)
            prolog, starts = prolog_times(node, args.prolog_trials)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    base = percentile(prolog["baseline (hook off)"], 0.5)
    print(f"noded under a one-host Slurm (slurm-wlm 22.05, {os.cpu_count()} CPUs): sbatch of a hog -> throttle, "
          f"{args.hog_trials} trials (noded tick 1 s, contention defaults)")
    print(f"  {'step':<28}{'median s':>10}{'max s':>9}")
    for key, label in (("running_s", "sbatch -> running"), ("seen_s", "sbatch -> listed by noded"),
                       ("throttled_s", "sbatch -> throttled")):
        xs = [t[key] for t in hog]
        print(f"  {label:<28}{statistics.median(xs):>10.2f}{max(xs):>9.2f}")
    print(f"Prolog wall time in slurmd, {args.prolog_trials} jobs per kind, one at a time (interleaved)")
    print(f"  {'job':<22}{'p50 ms':>8}{'p95 ms':>8}{'max ms':>8}{'added p95 ms':>14}{'submit->start p50 s':>21}")
    for kind, xs in prolog.items():
        added = percentile(xs, 0.95) - base
        print(f"  {kind:<22}{percentile(xs, 0.5):>8.1f}{percentile(xs, 0.95):>8.1f}{max(xs):>8.1f}"
              f"{added:>14.1f}{statistics.median(starts[kind]):>21.2f}")
    print(f"  added = p95 minus the baseline's median ({base:.1f} ms: the wrapper's own two `date` forks)")
    os.makedirs(os.path.join(REPO, "bench", "out"), exist_ok=True)
    path = os.path.join(REPO, "bench", "out", "slurm_latency.json")
    with open(path, "w") as f:
        json.dump({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                   "hog_to_throttle": hog, "prolog_ms": prolog, "submit_to_start_s": starts}, f, indent=1)
    print(f"  wrote {os.path.relpath(path, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
