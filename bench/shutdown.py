"""SIGTERM with 100 throttled jobs: how long noded takes to put the node back and exit.

Each run starts a simulated node (``noded sim-node``, its own process) with 100 CPU jobs
whose bandwidth is over a per-job cap, and noded beside it as a host runs it (``noded
run --config``), so every job is throttled (MBA: its monitoring group moved into one of
noded's level groups); once noded's metrics show all 100 throttled, the daemon gets
SIGTERM and the time to its exit is measured (release every throttle, remove every
group, stop the servers): the daemon's alone. The node is torn down after, untimed in
the table (its median is said below it). The baseline, in the same command: the same
node with the cap off (nothing throttled), the daemon stopped the same way.
Target (issue #11): under 2 s in every run (systemd's TimeoutStopSec is 15 s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys

from nodesim.launch import node_and_daemon

JOBS = 100
LEVEL = re.compile(r'^noded_job_throttle_level\{job_id="([^"]+)",method="([^"]*)"\} (\S+)$', re.M)
MEASURED = re.compile(r'^noded_job_memory_bandwidth_bytes_per_second\{job_id="([^"]+)"', re.M)


def inputs(capped: bool) -> tuple[str, str]:
    lines = [f"  - {{at: 0, start: {{id: c{i}, cpu_gbps: 0.1}}}}" for i in range(JOBS)]
    scenario = "seed: 1\nduration_s: 600\nnode: {gpus: 2, peak_gbps: 50}\nevents:\n" + "\n".join(lines) + "\n"
    config = ("tick_s: 0.2\nmetrics: {address: 127.0.0.1, port: 0}\n"
              f"contention: {{cpu_job_cap_gbps: {0.05 if capped else 'null'}, settle_s: 0.2}}\n")
    return scenario, config


def as_wanted(text: str, capped: bool) -> bool:
    """Every job seen, measured, and throttled (capped) or not (baseline)."""
    found = LEVEL.findall(text)
    levels = {job: float(level) for job, _, level in found}
    measured = set(MEASURED.findall(text))
    jobs = {f"cgroup:c{i}" for i in range(JOBS)}
    return (jobs <= measured and jobs <= set(levels) and all((levels[j] > 0) == capped for j in jobs)
            and (not capped or {method for _, method, _ in found} == {"mba"}))


def one_run(capped: bool, timeout: float = 120.0) -> tuple[float, float]:
    """(the daemon's SIGTERM -> exit, then the node's), seconds."""
    scenario, config = inputs(capped)
    with node_and_daemon(scenario, config, prefix="noded-bench-shutdown-") as (node, daemon, _):
        daemon.wait_until(f"a tick with all {JOBS} jobs {'throttled' if capped else 'measured, none throttled'}",
                          lambda text: as_wanted(text, capped), timeout=timeout)
        code, daemon_s = daemon.stop()
        if code != 0:
            raise SystemExit(f"bench.shutdown: noded exited {code}: {open(daemon.log).read()[-2000:]}")
        _, node_s = node.stop()
    return daemon_s, node_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--baseline-runs", type=int, default=5)
    ap.add_argument("--json", default="bench/out/shutdown.json")
    args = ap.parse_args(argv)
    results, node_s = {}, []
    for name, capped, runs in (("100 throttled (MBA)", True, args.runs),
                               ("baseline: 100 unthrottled", False, args.baseline_runs)):
        results[name] = []
        for _ in range(runs):
            d, n = one_run(capped)
            results[name].append(d)
            node_s.append(n)
        print(f"  {name}: done ({runs} runs)", file=sys.stderr, flush=True)
    base = statistics.median(results["baseline: 100 unthrottled"])
    print(f"SIGTERM -> exit of the daemon (`noded run --config`, a process of its own), {JOBS} CPU jobs "
          "(simulated node, MBA)")
    print(f"  {'':28} {'runs':>5} {'median s':>9} {'max s':>7} {'under 2 s':>10} {'ratio':>6}")
    for name, times in results.items():
        under = sum(t < 2.0 for t in times)
        print(f"  {name:28} {len(times):5d} {statistics.median(times):9.3f} {max(times):7.3f} "
              f"{under:>6d}/{len(times):<3d} {statistics.median(times) / base:6.2f}")
    print(f"  not counted: the simulated node's own teardown after the daemon's exit, median "
          f"{statistics.median(node_s):.3f} s ({len(node_s)} runs)")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "shutdown", "jobs": JOBS, "seconds": results, "node_teardown_s": node_s,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
