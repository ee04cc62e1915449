"""A hog running before noded starts: ticks until it is throttled.

CODA's trigger needs a GPU job's uncontended utilisation, which noded learns only
while the node is quiet; a hog already running at noded's start kept the GPU job at
35 % with nothing throttled. Now noded keeps baselines in its state directory (per
job, and per model from this host's history). Each run, on the simulated node:

1. history: an NLP job (BiDAF) alone, until noded has learned its baseline; clean stop;
2. restart: noded starts again on the same state directory beside a hog already
   running and a new BiDAF job; ticks are counted from the first that sees the node's
   bandwidth and both jobs, to the hog's first throttle.

Baseline, in the same command: step 2 with an empty state directory (no history):
the hog is never throttled (counted up to a limit). Target (issue #11): 5 ticks.

    python -m bench.hog_from_start [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

from bench.sim_daemon import daemon_on_sim

TICK = 0.25
LIMIT = 40  # ticks counted before "never"
NODE = "seed: 1\nduration_s: 3600\nnode: {profile: intel, gpus: 2, peak_gbps: 8}\nevents:\n"
ALONE = NODE + "  - {at: 0, start: {id: bert, model: BiDAF, gpu: 0}}\n"
HOG_FROM_START = NODE + ("  - {at: 0, start: {id: hog, cpu: hog}}\n"
                         "  - {at: 0, start: {id: bert2, model: BiDAF, gpu: 0}}\n")


def ticks(scenario_text: str, state: str, until) -> int | None:
    """Tick noded on a fresh simulated node until ``until(result)`` or LIMIT ticks after
    the node and its jobs are first seen; the ticks counted, or None."""
    with daemon_on_sim(scenario_text, tick=TICK, state_dir=state, settle_s=TICK, hold_s=4 * TICK) as (_, daemon, _c):
        seen = None
        next_t = time.monotonic()
        for n in range(400):
            r = daemon.tick()
            ready = r.decision.node_share is not None and all(
                j.gpu_util is not None for j in r.sample.jobs.values() if j.kind == "gpu") and r.sample.jobs
            if seen is None and ready:
                seen = n
            if seen is not None and until(r):
                return n - seen + 1
            if seen is not None and n - seen >= LIMIT:
                return None
            next_t += TICK
            time.sleep(max(0.0, next_t - time.monotonic()))  # the loop's own fixed rate
        return None


def one_run(with_history: bool) -> int | None:
    with tempfile.TemporaryDirectory() as state:
        if with_history:
            learned = ticks(ALONE, state, lambda r: r.baselines.get("sim:bert", (0, ""))[1] == "learned")
            if learned is None:
                raise SystemExit("bench.hog_from_start: the NLP job's baseline was never learned")
        return ticks(HOG_FROM_START, state, lambda r: "sim:hog" in r.levels)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default="bench/out/hog_from_start.json")
    args = ap.parse_args(argv)
    rows = {"this host's history of the model": [one_run(True) for _ in range(args.runs)],
            "baseline: no history": [one_run(False) for _ in range(max(1, args.runs // 2))]}
    print(f"hog running before noded starts: ticks to the first throttle (tick {TICK * 1e3:.0f} ms, simulated node, "
          f"BiDAF + hog; 'never' = none within {LIMIT} ticks)")
    print(f"  {'':34} {'runs':>5} {'ticks (each run)':>24} {'within 5':>9}")
    for name, runs in rows.items():
        each = " ".join("never" if t is None else str(t) for t in runs)
        within = sum(t is not None and t <= 5 for t in runs)
        print(f"  {name:34} {len(runs):5d} {each:>24} {within:>5d}/{len(runs)}")
    done = [t for t in rows["this host's history of the model"] if t is not None]
    if done:
        print(f"  median with history: {statistics.median(done):g} ticks")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "hog_from_start", "tick_s": TICK, "limit_ticks": LIMIT, "ticks": rows,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
