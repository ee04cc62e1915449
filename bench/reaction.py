"""Time from the node crossing the bandwidth threshold to the schemata write that
throttles the hog, in ticks and milliseconds, at a 1 s and a 100 ms tick, on the
simulated node. Baseline: the tick period itself (a reaction of 1 tick = ratio 1).

    python -m bench.reaction [--repeat 3]
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

SCENARIO = """seed: 1
duration_s: 3600
node: {profile: intel, gpus: 2, peak_gbps: 8}
events:
  - {at: 0, start: {id: bert, model: BiDAF, gpu: 0}}
  - {at: HOG, start: {id: hog, cpu: hog}}
"""


def one_run(tick: float) -> tuple[int, float]:
    hog_at = max(2.0, 4 * tick)
    with tempfile.TemporaryDirectory() as state, \
            daemon_on_sim(SCENARIO.replace("HOG", str(hog_at)), tick=tick, state_dir=state, settle_s=tick,
                          hold_s=10 * tick) as (sim, daemon, config):
        crossed = None
        next_t = time.monotonic()
        for _ in range(int((hog_at + 30 * max(tick, 0.2)) / tick)):
            r = daemon.tick()
            if crossed is None and (r.decision.node_share or 0) >= config.contention.threshold:
                crossed = (r.tick, r.t)
            write = next((a for a in r.applied if any("schemata" in w for w in a.writes)), None)
            if crossed and write:
                return r.tick - crossed[0], (time.monotonic() - crossed[1]) * 1e3
            next_t += tick
            time.sleep(max(0.0, next_t - time.monotonic()))  # the loop's own fixed rate
        raise RuntimeError("the hog was never throttled")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="bench/out/reaction.json")
    args = ap.parse_args(argv)
    rows = {}
    for tick in (1.0, 0.1):
        runs = [one_run(tick) for _ in range(args.repeat)]
        rows[tick] = runs
    print(f"threshold crossing -> schemata write ({args.repeat} runs each, simulated node, NLP job + hog)")
    print(f"  {'tick':>6} {'ticks (median)':>15} {'ms (median)':>12} {'ratio to tick':>14}")
    out = {}
    for tick, runs in rows.items():
        ticks = statistics.median(r[0] for r in runs)
        ms = statistics.median(r[1] for r in runs)
        out[str(tick)] = {"ticks": [r[0] for r in runs], "ms": [r[1] for r in runs]}
        print(f"  {tick * 1e3:5.0f}ms {ticks:15.1f} {ms:12.1f} {ms / (tick * 1e3):14.2f}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "reaction", "runs": out,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
