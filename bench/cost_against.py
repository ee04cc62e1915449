"""noded's own CPU against an earlier revision's, on this machine, in one command.

``python -m bench.cost_against REV`` checks REV out in a temporary git worktree (its stand-in
NVML built there), then runs ``bench.daemon_cost`` of REV and of this checkout in turns,
``--rounds`` times each (REV first in each round), each in its own process with its own code.
The machine's speed and load move between runs (a VM's by 1.6-1.9x over days here), so a
figure from another day is no baseline: the ratio of the two, run in turns, is the result.
It prints each run's figures (noded as measured, and the two host estimates, ms a tick) and the
ratio of the means, this checkout's over REV's; JSON in ``--json``. Needs root and FUSE, as
``bench.daemon_cost`` does; about 100 s a run at the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the stand-in NVML's builder, by where the tree keeps the simulation (before and after issue #25's moves)
NVML_BUILDERS = (("sim/nodesim/nvml_lib.py", "nodesim.nvml_lib"), ("noded/sim/nvml_lib.py", "noded.sim.nvml_lib"))
FIGURES = (("as measured", ("ms_per_tick", "noded")),
           ("host, by the sampler", ("host_estimate_by_sampler_ms_per_tick", "noded")),
           ("host, by the baseline", ("host_estimate_ms_per_tick", "noded")))


def python_path(tree: str) -> str:
    return tree + (os.pathsep + os.path.join(tree, "sim") if os.path.isdir(os.path.join(tree, "sim")) else "")


def build_nvml(tree: str) -> None:
    module = next((m for f, m in NVML_BUILDERS if os.path.exists(os.path.join(tree, f))), None)
    if module is None:
        raise SystemExit(f"bench.cost_against: no stand-in NVML builder in {tree}")
    subprocess.run([sys.executable, "-m", module], cwd=tree, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": python_path(tree)})


def run_cost(tree: str, out: str, seconds: float) -> dict:
    done = subprocess.run([sys.executable, "-m", "bench.daemon_cost", "--seconds", f"{seconds:g}",
                           "--node-seconds", "5", "--json", out], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": python_path(tree)})
    if done.returncode != 0:
        raise SystemExit(f"bench.cost_against: bench.daemon_cost in {tree} exited {done.returncode}:\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


def figure(result: dict, path: tuple[str, str]) -> float:
    return result[path[0]][path[1]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cost_against", description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the earlier revision (anything git rev-parse takes)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0, help="each bench.daemon_cost window")
    ap.add_argument("--json", default="bench/out/cost_against.json")
    args = ap.parse_args(argv)
    # a SIGTERM (a timeout's, an operator's) ends it as Ctrl-C does: the worktree removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.strip()
    here = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    scratch = tempfile.mkdtemp(prefix="noded-cost-against-")
    tree = os.path.join(scratch, "tree")
    subprocess.run(["git", "worktree", "add", "--detach", "-q", tree, rev], cwd=REPO, check=True)
    runs: dict[str, list[dict]] = {"then": [], "now": []}
    try:
        build_nvml(tree)
        for i in range(args.rounds):
            for side, where in (("then", tree), ("now", REPO)):
                r = run_cost(where, os.path.join(scratch, f"{side}-{i}.json"), args.seconds)
                runs[side].append(r)
                print(f"  round {i + 1} {side:4} ({rev if side == 'then' else here}): "
                      + ", ".join(f"{name} {figure(r, path):.1f}" for name, path in FIGURES)
                      + f" ms a tick; load average {r['loadavg_start'][0]:.2f}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO, check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    table = {}
    print(f"noded's own CPU, ms a tick (bench.daemon_cost, {args.rounds} runs each, in turns): {here} against {rev}")
    print(f"  {'figure':24} {rev:>12} {here:>12}  ratio")
    for name, path in FIGURES:
        then = statistics.mean(figure(r, path) for r in runs["then"])
        now = statistics.mean(figure(r, path) for r in runs["now"])
        table[name] = {"then": then, "now": now, "ratio": now / then}
        print(f"  {name:24} {then:12.1f} {now:12.1f}  {now / then:.2f}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "cost_against", "then": rev, "now": here, "rounds": args.rounds,
                   "figures": table, "runs": runs}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
