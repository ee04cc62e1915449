"""CODA's core search against Synergy's binary search, on every curve of the catalogue.

Each run sizes one simulated GPU job: the allocator asks for a core count, the job reports
noisy iteration times from its curve (``noded.rightsize.curves``), a signal window
(``noded.rightsize.signal``) measures until the mean is steady, and the allocator decides
the next step. Simulated time passes with every iteration, so the probe time is what the
search would cost a real job at that curve's speed and noise (warm-ups included).

Methods: ``coda`` (CODA V-B2, a step down kept when not measurably worse), ``coda-strict``
(the paper's rule: a step down kept only when it improves), ``synergy`` (Synergy 3.1:
binary search from the maximum for the fewest cores within 10 % of the best). A job on one
GPU may use up to 14 cores (one socket of CODA's Xeon Gold 6132 nodes, III-A) and starts
from the paper's defaults for its category (4 when it has none). The eight models are also
run on ``--multi-gpus`` GPUs (4) with up to ``--multi-max-cores`` (28, CODA's whole node),
where ``coda`` steps one core per GPU and ``coda-1core`` one core (the paper's step, its
jobs being single-GPU). Each cell is ``--runs`` seeded runs; ``found/opt`` is the true
throughput at the cores found over the true best, ``exact`` the share of runs that found
the best core count, ``hist`` the median steps of the next job of the same owner, model and
batch size (it starts at the answer).

    python -m bench.allocator_search [--runs 20] [--max-cores 14] [--multi-gpus 4] [--multi-max-cores 28]
                                     [--out bench/out/allocator_search.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from dataclasses import asdict

from noded.rightsize.allocator import (CODA, SYNERGY, AllocatorConfig, JobSpec, Probe, Sized, begin_job, feed)
from noded.rightsize.curves import BENCH_CURVES, MODEL_CURVES, CoreCurve
from noded.rightsize.history import HistoryView, Remembered

#: CODA Table II: profiling steps per model
PAPER_STEPS = {"AlexNet": 4, "VGG16": 4, "InceptionV3": 3, "ResNet-50": 3, "BiDAF": 4, "Transformer": 3,
               "WaveNet": 3, "DeepSpeech": 3}
METHODS = {"coda": AllocatorConfig(method=CODA), "coda-strict": AllocatorConfig(method=CODA, fewer_if_equal=False),
           "synergy": AllocatorConfig(method=SYNERGY)}
#: on several GPUs: the step per GPU against the paper's step of one core
MULTI_METHODS = {"coda": METHODS["coda"], "coda-1core": AllocatorConfig(method=CODA, step_per_gpu=False),
                 "synergy": METHODS["synergy"]}
#: a search is "as good" as another when its throughput is within this share
TIE = 0.005


def size_job(curve: CoreCurve, spec: JobSpec, config: AllocatorConfig, rng: random.Random,
             history: HistoryView | None = None) -> tuple[Sized, float]:
    """Run one sizing to its end on the simulated job; (answer, simulated seconds it took)."""
    now = 0.0
    out, sizing = begin_job(spec, history, config, now)
    while isinstance(out, Probe):
        step = None
        while step is None:
            dt = curve.iteration_time(out.cores, rng, spec.gpus)
            now += dt
            step, sizing, _ = feed(sizing, [(now, dt)], now, config)
        out = step
    return out, now


def run_cell(curve: CoreCurve, name: str, config: AllocatorConfig, runs: int, max_cores: int, gpus: int = 1) -> dict:
    best = curve.best(max_cores, gpus)
    ratios, steps, seconds, cores = [], [], [], []

    def spec():
        return JobSpec(f"bench:{curve.name}", max_cores, gpus, category=curve.category, owner="bench",
                       model=curve.name)

    for seed in range(runs):
        sized, took = size_job(curve, spec(), config, random.Random(seed))
        ratios.append(curve.share(sized.cores, gpus) / curve.share(best, gpus))
        steps.append(sized.steps)
        seconds.append(took)
        cores.append(sized.cores)
    # the next job of the same owner, model and batch size starts at the answer (median run's)
    answer = statistics.median_low(cores)
    remembered = Remembered("bench", curve.name, None, curve.category, gpus, answer, curve.throughput(answer, gpus),
                            "iteration_time")
    view = HistoryView({("bench", curve.name, None): remembered}, {})
    again = [size_job(curve, spec(), config, random.Random(1000 + seed), view)[0].steps for seed in range(runs)]
    return {"curve": curve.name, "gpus": gpus, "method": name, "best_cores": best,
            "just_enough_cores": curve.just_enough(max_cores, 0.03, gpus),
            "steps_median": statistics.median(steps), "steps_max": max(steps),
            "probe_s_median": statistics.median(seconds), "probe_s_max": max(seconds),
            "cores_median": statistics.median(cores), "found_over_opt_mean": statistics.fmean(ratios),
            "found_over_opt_min": min(ratios), "optimum_found": sum(c == best for c in cores) / runs,
            "steps_with_history_median": statistics.median(again),
            "paper_steps": PAPER_STEPS.get(curve.name) if gpus == 1 else None}


def best_answer(cells: list[dict]) -> str:
    """The highest found/opt; within TIE of each other, the one with less probe time."""
    top = max(c["found_over_opt_mean"] for c in cells)
    close = [c for c in cells if c["found_over_opt_mean"] >= top - TIE]
    return min(close, key=lambda c: c["probe_s_median"])["method"]


def fastest(cells: list[dict]) -> str:
    """The least median probe time; on a tie, the higher found/opt."""
    return min(cells, key=lambda c: (round(c["probe_s_median"]), -c["found_over_opt_mean"]))["method"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.allocator_search", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--max-cores", type=int, default=14)
    ap.add_argument("--multi-gpus", type=int, default=4, help="the models again on this many GPUs (0: not)")
    ap.add_argument("--multi-max-cores", type=int, default=28)
    ap.add_argument("--out", default="bench/out/allocator_search.json")
    args = ap.parse_args(argv)
    signal = METHODS["coda"].signal
    print(f"core search: CODA (V-B2) vs Synergy binary search (3.1); {args.runs} seeded runs per cell, "
          f"max {args.max_cores} cores, iteration-time signal (steady at +-{signal.tolerance:.0%} "
          f"with {signal.confidence:.0%} confidence, {signal.min_samples}..{signal.max_window_s:.0f} s windows, "
          f"{signal.warmup_s:.0f} s warm-up)")
    print(f"  {'curve':<14} {'method':<11} {'best':>4} {'cores':>5} {'steps':>5} {'max':>3} {'paper':>5} "
          f"{'probe s':>7} {'max s':>6} {'found/opt':>9} {'worst':>6} {'exact':>5} {'hist':>4}")
    results, wins = [], {}
    table = [(curve, 1, args.max_cores, METHODS) for curve in (*MODEL_CURVES.values(), *BENCH_CURVES.values())]
    if args.multi_gpus > 1:
        table += [(curve, args.multi_gpus, args.multi_max_cores, MULTI_METHODS) for curve in MODEL_CURVES.values()]
    for curve, gpus, max_cores, methods in table:
        if gpus > 1 and curve is next(iter(MODEL_CURVES.values())):
            print(f"  on {gpus} GPUs, at most {max_cores} cores (coda: a step of one core per GPU; coda-1core: "
                  f"one core)")
        cells = [run_cell(curve, name, config, args.runs, max_cores, gpus) for name, config in methods.items()]
        for c in cells:
            paper = "" if c["paper_steps"] is None or c["method"] == "synergy" else str(c["paper_steps"])
            label = curve.name if gpus == 1 else f"{curve.name} x{gpus}"
            print(f"  {label:<14} {c['method']:<11} {c['best_cores']:>4} {c['cores_median']:>5g} "
                  f"{c['steps_median']:>5g} {c['steps_max']:>3} {paper:>5} {c['probe_s_median']:>7.0f} "
                  f"{c['probe_s_max']:>6.0f} {c['found_over_opt_mean']:>9.3f} {c['found_over_opt_min']:>6.3f} "
                  f"{c['optimum_found']:>5.0%} {c['steps_with_history_median']:>4g}")
        wins[curve.name if gpus == 1 else f"{curve.name} x{gpus}"] = {"best_answer": best_answer(cells),
                                                                       "fastest": fastest(cells)}
        results.extend(cells)
    for what, says in (("best_answer", "best answer (highest found/opt; within 0.5 %, less probe time)"),
                       ("fastest", "fastest search (least median probe time)")):
        print(f"  {says}:")
        for method in {**METHODS, **MULTI_METHODS}:
            names = [n for n, w in wins.items() if w[what] == method]
            print(f"    {method:<11} {len(names):>2}: {', '.join(names) or '-'}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"runs": args.runs, "max_cores": args.max_cores, "signal": asdict(signal),
                   "methods": {n: {k: v for k, v in asdict(c).items() if k != "signal"}
                               for n, c in {**METHODS, **MULTI_METHODS}.items()},
                   "cells": results, "winners": wins}, f, indent=1)
    print(f"  wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
