"""Reading every job's processes once a tick, on this host's real cgroup v1 cpuset
hierarchy: discovery with its small subtrees held open (``noded.jobs.heldsubtrees``)
against the same discovery walking each job's subtree by path (the walk of
``noded.jobs.cgroups.read_subtree_procs``, what every tick did before), in one process.

Two shapes of 100 jobs, each job's cgroups holding one sleeping process: a job of one
cgroup (the simulated node's, and ``bench.daemon_cost``'s), and a Slurm job's (job,
step_batch, step_0, step_0/task_0: four cgroups, two processes). CPU time of this thread
(``time.thread_time``) per discovery, the median of ``--repeat`` rounds of 100.

    python -m bench.job_reads [--jobs 100] [--repeat 7] [--json bench/out/job_reads.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import time
import uuid

from nodesim.node import make_cpuset
from noded.jobs import CgroupSource, JobDiscovery
from noded.jobs.cgroups import read_subtree_procs

CPUSET = "/sys/fs/cgroup/cpuset"
SHAPES = {"one cgroup": ("",), "Slurm job/steps/task": ("", "/step_batch", "/step_0", "/step_0/task_0")}
PROCS_IN = {"one cgroup": ("",), "Slurm job/steps/task": ("/step_batch", "/step_0/task_0")}


class WalkEachTick:
    """Discovery's reader as it was: every job's subtree walked by path, each tick."""

    held = 0

    def read(self, path: str, most: int | None = None, *, hold_procs: bool = False):
        return read_subtree_procs(path, most)

    def verify(self, paths) -> None:
        pass

    def retain(self, paths) -> None:
        pass




def lay_out(base: str, shape: str, jobs: int) -> tuple[list[str], list[subprocess.Popen]]:
    made, procs = [], []
    for rel in ("", "/slurm", "/slurm/uid_0"):
        make_cpuset(base + rel)
        made.append(base + rel)
    for i in range(jobs):
        job = f"{base}/slurm/uid_0/job_{i}"
        for rel in SHAPES[shape]:
            make_cpuset(job + rel)
            made.append(job + rel)
        for rel in PROCS_IN[shape]:
            p = subprocess.Popen(["sleep", "3600"])
            procs.append(p)
            with open(f"{job}{rel}/cgroup.procs", "w") as f:
                f.write(str(p.pid))
    return made, procs


def per_discovery_ms(discovery: JobDiscovery, jobs: int, repeat: int) -> list[float]:
    assert len(discovery.discover()) == jobs  # and held, where it holds
    out = []
    for _ in range(repeat):
        t0 = time.thread_time()
        for _ in range(100):
            discovery.discover()
        out.append((time.thread_time() - t0) / 100 * 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", default="bench/out/job_reads.json")
    args = ap.parse_args(argv)
    if not os.access(CPUSET, os.W_OK):
        print(f"job_reads: skipped: {CPUSET} (a writable cgroup v1 cpuset hierarchy) is not here")
        return 0
    rows = {}
    for shape in SHAPES:
        base = f"{CPUSET}/noded-bench-{uuid.uuid4().hex[:8]}"
        made, procs = [], []
        try:
            made, procs = lay_out(base, shape, args.jobs)
            source = CgroupSource.create("slurm", base)
            held = JobDiscovery([source])
            walk = JobDiscovery([source])
            walk.held = WalkEachTick()  # type: ignore[assignment]  (the same discovery, reading as before)
            times = {"walk": [], "held": []}
            for _ in range(2):  # in turns
                times["walk"] += per_discovery_ms(walk, args.jobs, args.repeat)
                times["held"] += per_discovery_ms(held, args.jobs, args.repeat)
            rows[shape] = {k: statistics.median(v) for k, v in times.items()}
            rows[shape]["held_jobs"] = held.held.held
            held.held.close()
        finally:
            for p in procs:
                p.send_signal(signal.SIGKILL)
                p.wait()
            for path in reversed(made):
                for _ in range(100):
                    try:
                        os.rmdir(path)
                        break
                    except OSError:
                        time.sleep(0.01)  # a killed process leaves its cgroup a moment later
    print(f"Reading {args.jobs} jobs' processes once (one discovery), CPU ms of this thread, median of "
          f"{2 * args.repeat} x 100, real cgroup v1 cpuset hierarchy")
    print(f"  {'shape':<22} {'walked by path':>15} {'held open':>10} {'ratio':>6}  jobs held")
    for shape, r in rows.items():
        print(f"  {shape:<22} {r['walk']:15.2f} {r['held']:10.2f} {r['held'] / r['walk']:6.2f}  {r['held_jobs']}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "job_reads", "jobs": args.jobs, "repeat": args.repeat, "ms_per_discovery": rows,
                   "ratio_held_over_walk": {s: r["held"] / r["walk"] for s, r in rows.items()},
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
