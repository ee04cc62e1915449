"""SIGTERM with 100 throttled jobs: how long `noded run` takes to put the node back and exit.

Each run starts `noded run --sim` on a simulated node with 100 CPU jobs whose bandwidth
is over a per-job cap, so every one of them is throttled (MBA: their monitoring groups
moved into noded's level groups); once a tick shows all 100 throttled, noded gets
SIGTERM and the time to its exit is measured (release every throttle, remove every
group, stop the servers, tear the simulated node down). The baseline, in the same
command: the same node with the cap off (nothing throttled), stopped the same way.
Target (issue #11): under 2 s in every run (systemd's TimeoutStopSec is 15 s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

JOBS = 100


def write_inputs(workdir: str, capped: bool) -> tuple[str, str]:
    scenario = os.path.join(workdir, "scenario.yaml")
    lines = [f"  - {{at: 0, start: {{id: c{i}, cpu_gbps: 0.1}}}}" for i in range(JOBS)]
    with open(scenario, "w") as f:
        f.write("seed: 1\nduration_s: 600\nnode: {gpus: 2, peak_gbps: 50}\nevents:\n" + "\n".join(lines) + "\n")
    config = os.path.join(workdir, "config.yaml")
    with open(config, "w") as f:
        f.write("tick_s: 0.2\nmetrics: {port: 0}\n"
                f"contention: {{cpu_job_cap_gbps: {0.05 if capped else 'null'}, settle_s: 0.2}}\n")
    return scenario, config


def one_run(scenario: str, config: str, capped: bool, timeout: float = 120.0) -> float:
    # noded's log goes to a file, and its stdout is drained to the end: a pipe nobody reads
    # fills (100 jobs' change lines are tens of KB) and blocks noded on its next write.
    err = tempfile.TemporaryFile("w+")
    p = subprocess.Popen([sys.executable, "-m", "noded", "run", "--sim", scenario, "--config", config],
                         stdout=subprocess.PIPE, stderr=err, text=True)

    def stderr_tail() -> str:
        err.seek(0)
        return err.read()[-2000:]

    try:
        deadline = time.monotonic() + timeout
        seen = ""
        for line in p.stdout:
            seen = line
            jobs = re.findall(r"c\d+\[cpu\] +[\d.]+ GB/s( L\d)?", line)
            if line.startswith("t=") and len(jobs) == JOBS and all(bool(j) == capped for j in jobs):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"bench.shutdown: no tick with all {JOBS} jobs as wanted within {timeout}s")
        else:
            raise SystemExit(f"bench.shutdown: noded ended early: {seen}{stderr_tail()}")
        threading.Thread(target=p.stdout.read, daemon=True).start()  # the rest of its output
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=timeout)
        elapsed = time.monotonic() - t0
        if code != 0:
            raise SystemExit(f"bench.shutdown: noded exited {code}: {stderr_tail()}")
        return elapsed
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        err.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--baseline-runs", type=int, default=5)
    ap.add_argument("--json", default="bench/out/shutdown.json")
    args = ap.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="noded-bench-shutdown-") as workdir:
        for name, capped, runs in (("100 throttled (MBA)", True, args.runs),
                                   ("baseline: 100 unthrottled", False, args.baseline_runs)):
            scenario, config = write_inputs(workdir, capped)
            results[name] = [one_run(scenario, config, capped) for _ in range(runs)]
            print(f"  {name}: done ({runs} runs)", file=sys.stderr, flush=True)
    base = statistics.median(results["baseline: 100 unthrottled"])
    print(f"SIGTERM -> exit of `noded run --sim`, {JOBS} CPU jobs (simulated node, MBA)")
    print(f"  {'':28} {'runs':>5} {'median s':>9} {'max s':>7} {'under 2 s':>10} {'ratio':>6}")
    for name, times in results.items():
        under = sum(t < 2.0 for t in times)
        print(f"  {name:28} {len(times):5d} {statistics.median(times):9.3f} {max(times):7.3f} "
              f"{under:>6d}/{len(times):<3d} {statistics.median(times) / base:6.2f}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "shutdown", "jobs": JOBS, "seconds": results,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
