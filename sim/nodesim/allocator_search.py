"""Core searches on curves nobody tuned them to, and on the catalogue's paper shapes.

**Generated curves (the default, issue #23).** ``--curves`` curves drawn by
``nodesim.curvegen`` (every class in turn: stairs, dips, plateaus, cliffs, slow
slopes, linear, peaks, flat, mixtures, CODA's knee), each on 8 and 16 cores and at a window
noise of 0, 3 and 8 % (the largest error of one measurement window's mean; per-iteration
jitter of 1-5 % on top), driven through ``begin_job``/``feed`` as the daemon drives them,
one GPU, no category, no history. For each method, per class and overall: the share of runs
whose true throughput is within 3 % of the oracle's (the fewest cores within 3 % of the best
true throughput), the median and worst found/oracle throughput, median found/oracle cores,
steps and probing time (simulated seconds with the best at 1 iteration/s). Then drift: the
same curves changing to another drawn curve (1.25-2x faster or slower at its best) two
minutes after the first sizing ended: the windows from the change until a new probe starts,
and the re-sizing's time over the first's. Last line: ``within 3 % of oracle: P % of runs,
worst W, median steps S`` for the default method.

    python -m bench.allocator_search [--curves 500] [--seed 0] [--out bench/out/allocator_search.json]

``--seed`` is the first curve's number (curves ``seed .. seed + curves - 1``, each job's
noise seeded by its curve's number): the same generator on draws nobody looked at.

**The catalogue (``--catalogue``).** Each run sizes one simulated GPU job: the allocator asks
for a core count, the job reports noisy iteration times from its curve
(``noded.rightsize.curves``), a signal window (``noded.rightsize.signal``) measures until
the mean is steady, and the allocator decides the next step. Simulated time passes with every iteration, so the probe time is what the
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

    python -m bench.allocator_search --catalogue [--runs 20] [--max-cores 14] [--multi-gpus 4]
                                     [--multi-max-cores 28] [--out bench/out/allocator_catalogue.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
import sys
from dataclasses import asdict

from noded.rightsize.jobsizing import begin_job, feed
from noded.rightsize.sizing import CODA, SYNERGY, AllocatorConfig, JobSpec, Probe, Sized
from nodesim import curvegen
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


def catalogue(args) -> int:
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


GENERATED_CORES = (8, 16)
GENERATED_NOISE = (0.0, 0.03, 0.08)
#: the drift runs: the curve changes this long after the first sizing ended (re-probes
#: started before it are false alarms)
CHANGE_AFTER_S = 1800.0
#: and is watched this long after the change
WATCH_S = 1800.0


def generated_methods() -> dict[str, AllocatorConfig]:
    """CODA's greedy search (today's, kept beside the new one) and every other method."""
    from noded.rightsize import allocator
    out = {"coda": AllocatorConfig(method=CODA)}
    for name in allocator.METHODS:
        if name not in (CODA, SYNERGY):
            out[name] = AllocatorConfig(method=name)
    return out


def default_method() -> str:
    return AllocatorConfig().method


class GeneratedJob:
    """One generated job run through begin_job/feed: each window's mean is off by a factor
    drawn when the window opens (``curve.window_noise``), each iteration jittered."""

    def __init__(self, curve: curvegen.GeneratedCurve, config: AllocatorConfig, seed: int,
                 history: HistoryView | None = None, model: str | None = None, *, spec: JobSpec | None = None,
                 rng: random.Random | None = None):
        self.curve, self.config = curve, config
        self.rng = rng or random.Random(f"job:{seed}")
        self.now = 0.0
        self.factor = curve.window_factor(self.rng)
        self.spec = spec or JobSpec(f"gen:{curve.name}", curve.max_cores, 1, owner="bench", model=model or curve.name)
        self.out, self.sizing = begin_job(self.spec, history, config, self.now)
        self.windows = 0  # windows ended (probing and passive)

    def tick(self) -> Probe | Sized | None:
        """One iteration at the cores the job has now; the request when one came."""
        cores = self.sizing.state.cores
        dt = self.curve.at(self.now).iteration_time(cores, self.factor, self.rng)
        self.now += dt
        step, self.sizing, measured = feed(self.sizing, [(self.now, dt)], self.now, self.config)
        if measured is not None or step is not None:
            self.windows += 1
            self.factor = self.curve.window_factor(self.rng)
        if step is not None:
            self.out = step
        return step

    def size(self, limit_s: float = 36000.0) -> Sized:
        while isinstance(self.out, Probe) and self.now < limit_s:
            self.tick()
        return self.out


def generated_run(curve: curvegen.GeneratedCurve, config: AllocatorConfig, seed: int) -> dict:
    job = GeneratedJob(curve, config, seed)
    sized = job.size()
    oracle = curve.oracle()
    found_tp, oracle_tp = curve.share(sized.cores), curve.share(oracle)
    return {"shape": curve.shape, "cores_max": curve.max_cores, "noise": curve.window_noise, "seed": seed,
            "cores": sized.cores, "oracle": oracle, "tp_ratio": found_tp / oracle_tp,
            "cores_ratio": sized.cores / oracle, "steps": sized.steps, "probe_s": job.now,
            "within": found_tp >= (1 - curvegen.ORACLE_WITHIN) * oracle_tp}


def drift_run(curve: curvegen.GeneratedCurve, config: AllocatorConfig, seed: int) -> dict:
    """Size, then change the curve CHANGE_AFTER_S later: windows until a new probe, and the
    re-sizing's time over the first sizing's."""
    job = GeneratedJob(curve, config, seed)
    job.size()
    first_s = job.now
    changed = dataclasses.replace(curve, change_after_s=first_s + CHANGE_AFTER_S)
    job.curve = changed
    false_alarms = 0
    while job.now < changed.change_after_s:
        if isinstance(job.tick(), Probe):
            false_alarms += 1
            job.size()
    windows_at_change, change_t = job.windows, job.now
    before_cores = job.sizing.state.cores
    after = changed.after
    moved = abs(after.peak * after.share(before_cores) / curve.share(before_cores) - 1) > 2 * curvegen.ORACLE_WITHIN
    noticed_after = None
    while job.now < change_t + WATCH_S:
        step = job.tick()
        if isinstance(step, Probe) and noticed_after is None:
            noticed_after = job.windows - windows_at_change
            break
    resize_s = None
    if noticed_after is not None:
        job.out = job.out if isinstance(job.out, Probe) else step
        job.size(change_t + WATCH_S + 36000)
        if isinstance(job.out, Sized):
            resize_s = job.now - change_t
    held = job.sizing.state.cores
    return {"shape": curve.shape, "noise": curve.window_noise, "noticed_windows": noticed_after,
            "first_s": first_s, "resize_s": resize_s, "moved": moved, "false_alarms": false_alarms,
            "within_after": after.share(held) >= (1 - curvegen.ORACLE_WITHIN) * after.share(after.oracle())}


def _q(values: list[float], fn) -> float:
    return fn(values) if values else float("nan")


def summarise(runs: list[dict]) -> dict:
    return {"runs": len(runs), "within_share": sum(r["within"] for r in runs) / len(runs),
            "tp_median": statistics.median(r["tp_ratio"] for r in runs), "tp_worst": min(r["tp_ratio"] for r in runs),
            "cores_median": statistics.median(r["cores_ratio"] for r in runs),
            "steps_median": statistics.median(r["steps"] for r in runs), "steps_max": max(r["steps"] for r in runs),
            "probe_s_median": statistics.median(r["probe_s"] for r in runs),
            "probe_s_p95": _p95([r["probe_s"] for r in runs]), "probe_s_max": max(r["probe_s"] for r in runs)}


def _p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def seeds(first: int, count: int) -> range:
    """The curves' numbers: ``count`` from ``first``."""
    return range(first, first + count)


def generated(args) -> int:
    methods = generated_methods()
    default = default_method()
    print(f"core search on {args.curves} generated curves (seeds {args.seed}..{args.seed + args.curves - 1}) x "
          f"cores {GENERATED_CORES} x window noise {', '.join(f'{n:.0%}' for n in GENERATED_NOISE)}; one GPU, no category, no history; "
          f"oracle: the fewest cores within {curvegen.ORACLE_WITHIN:.0%} of the best true throughput")
    print(f"  {'class':<11} {'method':<7} {'runs':>5} {'within':>6} {'tp med':>6} {'worst':>6} {'cores':>5} "
          f"{'steps':>5} {'max':>3} {'probe s':>7} {'p95 s':>6} {'max s':>6}")
    out = {"curves": args.curves, "seed": args.seed, "cores": GENERATED_CORES, "noise": GENERATED_NOISE,
           "methods": {}, "drift": {}}
    flat_cores = {}
    for name, config in methods.items():
        runs = [generated_run(curvegen.generate(seed, cores, noise), config, seed)
                for seed in seeds(args.seed, args.curves) for cores in GENERATED_CORES for noise in GENERATED_NOISE]
        # a shape no curve drew (fewer curves than shapes) has no row: no mean of nothing
        table = {shape: summarise([r for r in runs if r["shape"] == shape]) for shape in curvegen.CLASSES
                 if any(r["shape"] == shape for r in runs)}
        table["all"] = summarise(runs)
        for noise in GENERATED_NOISE:
            table[f"noise {noise:.0%}"] = summarise([r for r in runs if r["noise"] == noise])
        for label, row in table.items():
            print(f"  {label:<11} {name:<7} {row['runs']:>5} {row['within_share']:>6.1%} {row['tp_median']:>6.3f} "
                  f"{row['tp_worst']:>6.3f} {row['cores_median']:>5.2f} {row['steps_median']:>5g} "
                  f"{row['steps_max']:>3} {row['probe_s_median']:>7.0f} {row['probe_s_p95']:>6.0f} "
                  f"{row['probe_s_max']:>6.0f}")
        flat = [r for r in runs if r["shape"] == curvegen.FLAT]
        if flat:
            flat_cores[name] = (max(r["cores"] for r in flat), sum(r["cores"] <= 2 for r in flat) / len(flat),
                                {n: sum(r["cores"] <= 2 for r in flat if r["noise"] == n) /
                                 max(1, sum(r["noise"] == n for r in flat)) for n in GENERATED_NOISE},
                                statistics.median(r["cores"] for r in flat))
        out["methods"][name] = {"table": table, "runs": runs}
    print("  within: true throughput at the answer >= 97 % of the oracle's; tp: found/oracle throughput; cores: "
          "found/oracle cores (median); probe s: simulated seconds (median, 95th percentile, max), the best at 1 "
          "iteration/s")
    for name, (most, share, by_noise, median) in flat_cores.items():
        print(f"  flat curves, {name}: {share:.0%} of runs end at <= 2 cores ("
              f"{', '.join(f'{v:.0%} at {n:.0%} noise' for n, v in by_noise.items())}), median {median:g}, "
              f"at most {most}")
    drift_curves = max(1, args.curves // 5)
    for name, config in methods.items():
        runs = [drift_run(curvegen.generate(seed, cores, noise, change_after_s=math.inf), config, seed)
                for seed in seeds(args.seed, drift_curves) for cores in GENERATED_CORES for noise in GENERATED_NOISE]
        moved = [r for r in runs if r["moved"]]
        noticed = [r["noticed_windows"] for r in moved if r["noticed_windows"] is not None]
        ratio = [r["resize_s"] / r["first_s"] for r in runs if r["resize_s"] is not None]
        alarms = sum(r["false_alarms"] for r in runs)
        row = {"runs": len(runs), "moved": len(moved), "noticed": len(noticed),
               "noticed_within_3": sum(n <= 3 for n in noticed),
               "false_alarms_per_hour": alarms / (len(runs) * CHANGE_AFTER_S / 3600),
               "noticed_median": _q(noticed, statistics.median), "noticed_max": _q(noticed, max),
               "resize_over_first_median": _q(ratio, statistics.median), "resize_over_first_max": _q(ratio, max),
               "within_after": sum(r["within_after"] for r in runs) / len(runs)}
        out["drift"][name] = {"summary": row, "runs": runs}
        print(f"  drift, {name}: of {row['runs']} changes, {row['moved']} move the throughput at the answer by more "
              f"than {2 * curvegen.ORACLE_WITHIN:.0%}: {row['noticed']} noticed ({row['noticed_within_3']} within "
              f"3 windows; median {row['noticed_median']:g}, max {row['noticed_max']:g}); false alarms at rest: "
              f"{row['false_alarms_per_hour']:.2f} per hour; re-sized in "
              f"{row['resize_over_first_median']:.2f}x the first sizing's time (median; max "
              f"{row['resize_over_first_max']:.2f}x); within 3 % of the new oracle after: {row['within_after']:.1%}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(f"  wrote {args.out}")
    row = out["methods"][default]["table"]["all"] if default in out["methods"] else table["all"]
    print(f"within 3 % of oracle: {row['within_share'] * 100:.1f} % of runs, worst {row['tp_worst']:.2f}, "
          f"median steps {row['steps_median']:g}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.allocator_search", description=__doc__.splitlines()[0])
    ap.add_argument("--catalogue", action="store_true", help="the paper shapes of noded.rightsize.curves instead")
    ap.add_argument("--curves", type=int, default=500, help="generated curves (each on 8 and 16 cores, 3 noises)")
    ap.add_argument("--seed", type=int, default=0, help="the first generated curve's number (the seed base)")
    ap.add_argument("--runs", type=int, default=20, help="--catalogue: seeded runs per cell")
    ap.add_argument("--max-cores", type=int, default=14, help="--catalogue")
    ap.add_argument("--multi-gpus", type=int, default=4,
                    help="--catalogue: the models again on this many GPUs (0: not)")
    ap.add_argument("--multi-max-cores", type=int, default=28, help="--catalogue")
    ap.add_argument("--out", help="JSON (bench/out/allocator_search.json, or allocator_catalogue.json)")
    args = ap.parse_args(argv)
    if args.curves < 1:
        ap.error("--curves must be at least 1")
    if args.seed < 0:
        ap.error("--seed must be at least 0")
    if args.catalogue:
        args.out = args.out or "bench/out/allocator_catalogue.json"
        return catalogue(args)
    args.out = args.out or "bench/out/allocator_search.json"
    return generated(args)


if __name__ == "__main__":
    sys.exit(main())
