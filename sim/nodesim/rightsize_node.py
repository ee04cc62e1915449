"""Right-sizing on one node: GPU-proportional cores against noded against an oracle.

A discrete-time simulation (1 s ticks) of a node with 8 GPUs and ``--cores`` cores (64 by
default: 8 per GPU). GPU jobs of five owners (CODA's cluster was shared by four companies and
one institute, Sec. III-A) arrive at random, each a model of ``noded.rightsize.curves``
(CODA Table II's speeds) on 1, 2 or 4 GPUs, run for a fixed time (20-90 minutes) and leave;
arrivals stop after ``--hours`` and the run goes on until the last job ends. The GPU
schedule (first come, first served, a later job starts when it fits) is the same for every
scheme, so the schemes differ only in each job's cores and each job is compared with itself.
A backlog of CPU jobs larger than the node (two jobs: ``batch``, whose source may borrow,
and ``etl``, whose source may not) takes whatever cores the GPU jobs leave.

* ``proportional``: every GPU job gets cores x gpus / 8 (rounded down), CPU jobs the shares
  of idle GPUs.
* ``noded``: each GPU job is sized by the allocator (CODA V-B, ``begin_job``/``feed``): the
  job reports noisy iteration times from its curve at the cores it has, a signal window
  measures each probe until steady, so probing costs the simulated time it would. Answers
  are remembered per owner, model and batch size (``SizingHistory``, in memory); the GPU
  array is sized from them (``reserve_from_history``). Each tick ``cpuplan.plan`` decides
  every job's CPUs: GPU jobs at their probe or answer, the idle GPU array lent to ``batch``.
  A job may be sized up to twice its GPU-proportional share, which it is given as
  ``JobSpec.share``: the allocator's floor phase measures an answer below it once at the
  share (Synergy Sec. 4.2). When the plan gives a probing job fewer cores than the probe
  asks (the node is short: other jobs' shares first), the bench tells the allocator
  (``limit_job``) and the probe is cut to what the plan gave, as the daemon would.
* ``no floor phase``: the same without ``share`` (the allocator's search alone).
* ``oracle``: the exact split (``solve_split``, Synergy-OPT) over the true curves of the jobs
  running, every floor kept; what it leaves goes to the CPU jobs.
* ``noded, coda``: ``noded`` with CODA's greedy search (the default before issue #23).

Then the same on curves nobody tuned the search to (issue #23): ``--curves`` curves drawn by
``nodesim.curvegen`` on 8 and 16 cores at a window noise of 0, 3 and 8 %, each sized
three times by a job of the same owner and model: with no history, again from the answer
remembered (the job unchanged), and once more after the job changed to another drawn curve
(another class, 1.25-2x faster or slower: the remembered answer is stale and must be
overturned). Per method: within 3 % of the oracle, the worst found/oracle throughput, the
steps and the probing time (the best at 1 iteration/s).

Per scheme: GPU job progress (each job's iterations over its own under ``proportional``,
averaged over jobs), mean GPU utilisation over busy GPU-seconds (the curves' utilisation,
solo utilisations of the simulated node's models), CPU jobs' core-seconds (and how many of
them were lent GPU-array cores), probing steps and time per job. The last line is noded's
progress over the oracle's.

    python -m bench.rightsize [--quick] [--seed N] [--cores 64] [--hours H] [--curves 100] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from nodesim.allocator_search import GeneratedJob
from noded.rightsize.jobsizing import begin_job, feed, limit_job
from noded.rightsize.sizing import CODA, FLOOR, AllocatorConfig, JobSpec, Probe, Sized
from nodesim import curvegen
from noded.rightsize.history import HistoryView
from noded.rightsize.history import Remembered
from noded.rightsize.signal import ITERATION_TIME
from noded.rightsize.cpuplan import CpuJob, GpuJob, NodeView, PlanConfig, plan, reserve_from_history
from noded.rightsize.curves import MODEL_CURVES
from noded.rightsize.history import SizingHistory
from noded.rightsize.split import JobCurve, proportional_share, solve_split
from noded.stores.securedir import SecureDir
from nodesim.workload import MODELS

GPUS = 8
#: CODA's abstract: its GPU utilisation gain, cluster-wide, from all three of its parts
CODA_GAIN = 0.208
#: who submits what: (model, batch size); the institute runs any model
OWNERS = {
    "speech-co": (("WaveNet", 32), ("DeepSpeech", 64)),
    "nlp-co": (("BiDAF", 60), ("Transformer", 4096)),
    "cv-co": (("ResNet-50", 128), ("InceptionV3", 64)),
    "vision-lab": (("AlexNet", 256), ("VGG16", 64)),
    "institute": tuple((m, 32) for m in MODEL_CURVES),
}
GPU_COUNTS = ((1, 0.6), (2, 0.25), (4, 0.15))
DURATION_MIN = (20, 90)
BORROWER, NOT_BORROWER = "batch", "etl"


@dataclass(frozen=True)
class GpuRun:
    """A GPU job of the schedule: its GPUs from ``start`` to ``end`` (s)."""

    name: str
    owner: str
    model: str
    batch: int
    gpus: int
    start: int
    end: int


def schedule(rng: random.Random, arrivals_s: int) -> list[GpuRun]:
    """Poisson arrivals for ``arrivals_s``, about 10 % more GPU demand than the node has (a
    queue forms, the GPUs stay busy); first come first served, a later job starts when it
    fits and the ones ahead of it do not."""
    mean_gpus = sum(g * p for g, p in GPU_COUNTS)
    mean_len = 60 * sum(DURATION_MIN) / 2
    gap = mean_len * mean_gpus / (GPUS * 1.1)
    owners = list(OWNERS)
    jobs, t = [], 0.0
    while True:
        t += rng.expovariate(1 / gap)
        if t >= arrivals_s:
            break
        owner = rng.choice(owners)
        model, batch = rng.choice(OWNERS[owner])
        gpus = rng.choices([g for g, _ in GPU_COUNTS], [p for _, p in GPU_COUNTS])[0]
        jobs.append((int(t), owner, model, batch, gpus, 60 * rng.randint(*DURATION_MIN)))
    runs, queue = [], []
    # event-driven FIFO with fitting: simulate GPU ends and arrivals in time order
    ends: list[tuple[int, list[int]]] = []
    free = list(range(GPUS))
    pending = sorted(jobs)
    now = 0
    i = 0
    while i < len(pending) or queue:
        next_arrival = pending[i][0] if i < len(pending) else None
        next_end = min(e for e, _ in ends) if ends else None
        if next_end is not None and (next_arrival is None or next_end <= next_arrival):
            now = next_end
            for e, gs in [x for x in ends if x[0] == next_end]:
                free.extend(gs)
            ends = [x for x in ends if x[0] != next_end]
        else:
            now = next_arrival
            queue.append(pending[i])
            i += 1
        started = []
        for job in queue:
            arrived, owner, model, batch, gpus, length = job
            if gpus <= len(free):
                gs, free = free[:gpus], free[gpus:]
                ends.append((now + length, gs))
                runs.append(GpuRun(f"{owner}/{model}#{len(runs)}", owner, model, batch, gpus, now, now + length))
                started.append(job)
        queue = [j for j in queue if j not in started]
    return runs


@dataclass
class Tally:
    """What one scheme did over the run."""

    iterations: dict[str, float]
    util_gpu_s: float = 0.0  # utilisation (%) x GPU-seconds
    busy_gpu_s: float = 0.0
    cpu_core_s: float = 0.0  # cores CPU jobs had, no GPU job's among them, x seconds
    lent_core_s: float | None = 0.0  # of those, GPU-array cores lent (None: no arrays)
    gpu_core_s: float = 0.0  # cores GPU jobs had x seconds

    def run(self, job: GpuRun, cores: int, seconds: float) -> None:
        curve = MODEL_CURVES[job.model]
        self.iterations[job.name] = self.iterations.get(job.name, 0.0) + curve.throughput(cores, job.gpus) * seconds
        self.util_gpu_s += curve.utilisation(cores, MODELS[job.model].solo_util, job.gpus) * job.gpus * seconds
        self.busy_gpu_s += job.gpus * seconds
        self.gpu_core_s += cores * seconds


def segments(runs: list[GpuRun], end: int):
    """(t0, t1, running jobs) between consecutive starts and ends."""
    points = sorted({0, end, *(r.start for r in runs), *(r.end for r in runs)})
    for t0, t1 in zip(points, points[1:]):
        yield t0, t1, [r for r in runs if r.start <= t0 < r.end]


def run_proportional(runs: list[GpuRun], end: int, cores: int) -> Tally:
    tally = Tally({})
    for t0, t1, running in segments(runs, end):
        used = 0
        for r in running:
            share = proportional_share(r.gpus, GPUS, cores, 0)[0]
            tally.run(r, share, t1 - t0)
            used += share
        tally.cpu_core_s += (cores - used) * (t1 - t0)
    return tally


def true_table(r: GpuRun, cores: int) -> np.ndarray:
    curve = MODEL_CURVES[r.model]
    return np.array([[curve.throughput(c, r.gpus)] for c in range(cores + 1)])


def run_oracle(runs: list[GpuRun], end: int, cores: int) -> Tally:
    tally = Tally({}, lent_core_s=None)  # no arrays: it hands every core out afresh
    tables = {r.name: true_table(r, cores) for r in runs}
    for t0, t1, running in segments(runs, end):
        if running:
            split = solve_split([JobCurve(r.name, r.gpus, tables[r.name]) for r in running], cores, 0, GPUS)
            assert split.feasible, split.reason
            for r in running:
                tally.run(r, split.allocations[r.name][0], t1 - t0)
            used = sum(split.allocations[r.name][0] for r in running)
        else:
            used = 0
        tally.cpu_core_s += (cores - used) * (t1 - t0)
    return tally


@dataclass
class Sizing:
    """noded's view of one running GPU job."""

    run: GpuRun
    spec: JobSpec
    sizing: object
    out: Probe | Sized
    rng: random.Random
    next_report: float
    source: str
    share: int
    sized_at: float | None = None
    trimmed_s: int = 0  # ticks a probe got fewer cores than it asked (nothing measured then)
    limited: int = 0  # times the allocator was told the plan's ceiling
    floor_checked: bool = False  # the allocator's floor phase measured the share


def run_noded(runs: list[GpuRun], end: int, cores: int, seed: int, config: AllocatorConfig,
              state_dir: str, floor: bool = True) -> tuple[Tally, list[dict], list[str]]:
    """noded's run: the tally, the answers and the jobs still probing when they ended."""
    tally = Tally({})
    history = SizingHistory(SecureDir(state_dir), persist=False)
    cpus = tuple(range(cores))
    everything = frozenset(cpus)
    starts: dict[int, list[GpuRun]] = {}
    for r in runs:
        starts.setdefault(r.start, []).append(r)
    running: dict[str, Sizing] = {}
    answers: list[dict] = []
    unsized: list[str] = []
    current: dict[str, tuple[int, ...]] = {}
    default_per_gpu = cores // GPUS
    last_inputs = None
    for t in range(end):
        for r in starts.get(t, ()):
            share = proportional_share(r.gpus, GPUS, cores, 0)[0]
            spec = JobSpec(r.name, min(cores, 2 * share), r.gpus, r.owner, MODEL_CURVES[r.model].category, r.model,
                           r.batch, share=share if floor else None)
            out, sizing = begin_job(spec, history.view(), config, float(t))
            job = Sizing(r, spec, sizing, out, random.Random(f"{seed}/{r.name}"), float(t),
                         sizing.state.start.source, share)
            running[r.name] = job
            if isinstance(out, Sized):
                _sized(job, out, float(t), history, answers)
        for name in [n for n, j in running.items() if j.run.end <= t]:
            if isinstance(running[name].out, Probe):
                unsized.append(name)
            del running[name]
            current.pop(name, None)
        reserve = reserve_from_history(history.view(), GPUS, cores, default_per_gpu)
        # the plan is a pure function of what it is shown: a tick that shows it what the last
        # one did (most ticks of a run, once its jobs are placed) gets the last plan
        inputs = (reserve, [(n, j.run.gpus, j.out, current.get(n, ())) for n, j in running.items()])
        if inputs != last_inputs:
            view = NodeView(cpus, GPUS, tuple(GpuJob.from_allocator(n, gpus, out, mine)
                                              for n, gpus, out, mine in inputs[1]),
                            (CpuJob("cpu:batch", BORROWER, everything), CpuJob("cpu:etl", NOT_BORROWER, everything)))
            p = plan(view, PlanConfig(reserve_cores=reserve, lend_to=frozenset({BORROWER})))
            last_inputs = inputs
            cpu_only = (set(p.cpus_of("cpu:batch")) | set(p.cpus_of("cpu:etl"))) - set(p.gpu_cpus)
            lent = cpu_only & set(p.gpu_array)
        for name, job in running.items():
            mine = p.cpus_of(name)
            current[name] = mine
            tally.run(job.run, len(mine), 1.0)
            if isinstance(job.out, Probe) and len(mine) < job.out.cores:
                # the plan could not give the probe its cores: the allocator is told, and its
                # probe (cut to what the plan gave, or a step of the search resumed within it)
                # is what the job's reports measure from now on
                job.limited += 1
                step, job.sizing = limit_job(job.sizing, len(mine), config, float(t))
                if isinstance(step, Probe):
                    job.out = step
                elif isinstance(step, Sized):
                    _sized(job, step, float(t), history, answers)
            if isinstance(job.out, Probe):
                _measure(job, len(mine), t, config, history, answers)
        tally.cpu_core_s += len(cpu_only)
        tally.lent_core_s += len(lent)
    return tally, answers, unsized


def _measure(job: Sizing, given: int, t: int, config: AllocatorConfig, history: SizingHistory,
             answers: list[dict]) -> None:
    """The job's iteration reports during tick [t, t+1) at ``given`` cores, fed to its window."""
    if given != job.out.cores:
        job.trimmed_s += 1  # not at the probe's cores: what it reports now says nothing of them
        job.next_report = float(t + 1)
        return
    curve = MODEL_CURVES[job.run.model]
    while job.next_report < t + 1 and isinstance(job.out, Probe):
        dt = curve.iteration_time(given, job.rng, job.run.gpus)
        job.next_report += dt
        now = job.next_report
        step, job.sizing, _ = feed(job.sizing, [(now, dt)], now, config)
        if isinstance(step, Probe):
            job.out = step
            job.floor_checked = job.floor_checked or step.phase == FLOOR
        elif isinstance(step, Sized):
            _sized(job, step, now, history, answers)


def _sized(job: Sizing, sized: Sized, now: float, history: SizingHistory, answers: list[dict]) -> None:
    job.out = sized
    job.sized_at = now
    history.record(job.spec, sized)
    curve = MODEL_CURVES[job.run.model]
    best = curve.best(job.spec.max_cores, job.run.gpus)
    answers.append({"job": job.run.name, "model": job.run.model, "gpus": job.run.gpus, "start": job.source,
                    "cores": sized.cores, "best": best,
                    "found_over_best": curve.share(sized.cores, job.run.gpus) / curve.share(best, job.run.gpus),
                    "steps": sized.steps, "probe_s": round(now - job.run.start, 1), "reason": sized.reason,
                    "trimmed_s": job.trimmed_s, "limited": job.limited, "floor_checked": job.floor_checked,
                    "floor_kept": job.floor_checked and sized.cores == min(job.share, job.spec.max_cores)})


def summary(tally: Tally, base: Tally, end: int) -> dict:
    ratios = {n: tally.iterations[n] / base.iterations[n] for n in base.iterations}
    worst = min(ratios, key=ratios.get)
    return {"progress": statistics.fmean(ratios.values()), "worst_ratio": ratios[worst], "worst_job": worst,
            "gpu_utilisation": tally.util_gpu_s / tally.busy_gpu_s, "cpu_core_s": tally.cpu_core_s,
            "lent_core_s": tally.lent_core_s, "gpu_cores_mean": tally.gpu_core_s / end,
            "per_job": {n: round(v, 4) for n, v in ratios.items()}}


GENERATED_CORES = (8, 16)
GENERATED_NOISE = (0.0, 0.03, 0.08)
#: the three jobs of one owner and model on a generated curve
FIRST, AGAIN, CHANGED = "first, no history", "again, history holds", "changed, history stale"


def generated_history(curves: int, methods: dict[str, AllocatorConfig]) -> dict:
    """Each method on ``curves`` generated curves x GENERATED_CORES x GENERATED_NOISE: a
    job sized with no history, the next of the same owner and model from the answer
    remembered, and one after the job changed (its curve's ``after``)."""
    out = {}
    for name, config in methods.items():
        rows = {FIRST: [], AGAIN: [], CHANGED: []}
        for seed in range(curves):
            for cores in GENERATED_CORES:
                for noise in GENERATED_NOISE:
                    drawn = curvegen.generate(seed, cores, noise, change_after_s=float("inf"))
                    same = GeneratedJob(drawn, config, seed, model="m")
                    first = same.size()
                    rows[FIRST].append(_generated_row(drawn, first, same.now))
                    if first.throughput is None:
                        continue
                    remembered = Remembered("bench", "m", None, None, 1, first.cores, first.throughput, ITERATION_TIME)
                    view = HistoryView({("bench", "m", None): remembered}, {})
                    again = GeneratedJob(drawn, config, seed + 1_000_000, history=view, model="m")
                    rows[AGAIN].append(_generated_row(drawn, again.size(), again.now))
                    changed = GeneratedJob(drawn.after, config, seed + 2_000_000, history=view, model="m")
                    rows[CHANGED].append(_generated_row(drawn.after, changed.size(), changed.now))
        out[name] = {job: _generated_summary(r) for job, r in rows.items()}
    return out


def _generated_row(curve: curvegen.GeneratedCurve, sized: Sized, probe_s: float) -> dict:
    oracle = curve.share(curve.oracle())
    return {"within": curve.share(sized.cores) >= (1 - curvegen.ORACLE_WITHIN) * oracle,
            "tp_ratio": curve.share(sized.cores) / oracle, "steps": sized.steps, "probe_s": probe_s}


def _generated_summary(rows: list[dict]) -> dict:
    return {"runs": len(rows), "within_share": sum(r["within"] for r in rows) / len(rows),
            "tp_worst": min(r["tp_ratio"] for r in rows), "steps_mean": statistics.fmean(r["steps"] for r in rows),
            "steps_median": statistics.median(r["steps"] for r in rows),
            "probe_s_mean": statistics.fmean(r["probe_s"] for r in rows),
            "probe_s_max": max(r["probe_s"] for r in rows)}


def print_generated(table: dict, curves: int) -> None:
    print(f"  generated curves: {curves} curves x cores {GENERATED_CORES} x window noise "
          f"{', '.join(f'{n:.0%}' for n in GENERATED_NOISE)}; three jobs of one owner and model each")
    print(f"    {'method':<6} {'job':<23} {'runs':>5} {'within':>6} {'worst':>6} {'steps':>5} {'med':>4} "
          f"{'probe s':>7} {'max s':>6}")
    for name, jobs in table.items():
        for job, r in jobs.items():
            print(f"    {name:<6} {job:<23} {r['runs']:>5} {r['within_share']:>6.1%} {r['tp_worst']:>6.3f} "
                  f"{r['steps_mean']:>5.2f} {r['steps_median']:>4g} {r['probe_s_mean']:>7.0f} {r['probe_s_max']:>6.0f}")
    print("    within: true throughput at the answer >= 97 % of the oracle's; worst: found/oracle throughput; "
          "steps: mean and median; probe s: mean and max simulated seconds, the best at 1 iteration/s (a changed "
          "job's at 0.5-2 iterations/s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rightsize", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="arrivals for 3 hours instead of 12")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--hours", type=float, help="how long jobs arrive (default 12, 3 with --quick)")
    ap.add_argument("--curves", type=int, help="generated curves for the history table (default 100, 20 with "
                                               "--quick; 0: none)")
    ap.add_argument("--json", default="bench/out/rightsize.json")
    args = ap.parse_args(argv)
    if args.cores < GPUS:
        ap.error(f"--cores must be at least {GPUS} (one per GPU)")
    hours = args.hours if args.hours is not None else (3.0 if args.quick else 12.0)
    wall = time.perf_counter()
    runs = schedule(random.Random(args.seed), int(hours * 3600))
    end = max((r.end for r in runs), default=0)
    if not runs:
        ap.error("no GPU job arrived; give more --hours")
    config = AllocatorConfig()
    coda = AllocatorConfig(method=CODA)
    curves = args.curves if args.curves is not None else (20 if args.quick else 100)
    if curves < 0:
        ap.error("--curves must be 0 or more")
    prop = run_proportional(runs, end, args.cores)
    oracle = run_oracle(runs, end, args.cores)
    with tempfile.TemporaryDirectory(prefix="bench-rightsize-") as state:
        noded, answers, unsized = run_noded(runs, end, args.cores, args.seed, config, os.path.join(state, "floor"))
        bare, bare_answers, _ = run_noded(runs, end, args.cores, args.seed, config, os.path.join(state, "bare"),
                                          floor=False)
        greedy, greedy_answers, _ = run_noded(runs, end, args.cores, args.seed, coda, os.path.join(state, "coda"))
    results = {name: summary(t, prop, end) for name, t in (("proportional", prop), ("no floor phase", bare),
                                                             ("noded", noded), ("oracle", oracle),
                                                             ("noded, coda", greedy))}
    results["no floor phase"]["steps_mean"] = statistics.fmean(a["steps"] for a in bare_answers) \
        if bare_answers else None
    steps = [a["steps"] for a in answers] or [float("nan")]
    probe_s = [a["probe_s"] for a in answers] or [float("nan")]
    fresh = [a for a in answers if a["start"] != "history"]
    gain = results["noded"]["gpu_utilisation"] / results["proportional"]["gpu_utilisation"] - 1
    oracle_gain = results["oracle"]["gpu_utilisation"] / results["proportional"]["gpu_utilisation"] - 1
    x = results["noded"]["progress"] / results["oracle"]["progress"]

    print(f"right-sizing on one node: {GPUS} GPUs, {args.cores} cores, seed {args.seed}; {len(runs)} GPU jobs arriving "
          f"for {hours:g} h, run until the last ends ({end / 3600:.1f} h); CPU-job backlog larger than the node")
    print(f"  {'scheme':<14} {'progress':>8} {'worst':>6} {'GPU util':>8} {'GPU cores':>9} "
          f"{'CPU core-h':>10} {'lent core-h':>11}")
    for name, r in results.items():
        print(f"  {name:<14} {r['progress']:>8.3f} {r['worst_ratio']:>6.3f} {r['gpu_utilisation']:>7.1f}% "
              f"{r['gpu_cores_mean']:>9.1f} {r['cpu_core_s'] / 3600:>10.0f} "
              f"{'-' if r['lent_core_s'] is None else format(r['lent_core_s'] / 3600, '.0f'):>11}")
    print(f"  progress: each job's iterations over its own under proportional, mean of {len(runs)} jobs; "
          f"worst: the lowest job's; GPU cores: mean in use")
    print(f"  noded probing: {len(answers)} jobs sized, mean {statistics.fmean(steps):.2f} steps "
          f"(max {max(steps)}; CODA Table II: 3-4), mean {statistics.fmean(probe_s):.0f} s per job "
          f"(max {max(probe_s):.0f} s; CODA: 4 steps of 90 s, 6 min); floor checks: "
          f"{sum(a['floor_checked'] for a in answers)}, the share kept: {sum(a['floor_kept'] for a in answers)}; "
          f"no floor phase: {results['no floor phase']['steps_mean'] or float('nan'):.2f} steps")
    if fresh:
        print(f"    without a remembered answer: {len(fresh)} jobs, "
              f"mean {statistics.fmean(a['steps'] for a in fresh):.2f} steps, "
              f"{statistics.fmean(a['probe_s'] for a in fresh):.0f} s; with one: "
              f"{len(answers) - len(fresh)} jobs, "
              f"{statistics.fmean([a['steps'] for a in answers if a['start'] == 'history'] or [0]):.2f} steps")
    if greedy_answers:
        hist = [a["steps"] for a in greedy_answers if a["start"] == "history"] or [float("nan")]
        print(f"  noded, coda: mean {statistics.fmean(a['steps'] for a in greedy_answers):.2f} steps, "
              f"{statistics.fmean(a['probe_s'] for a in greedy_answers):.0f} s per job; with a remembered answer "
              f"{statistics.fmean(hist):.2f} steps; answers at the best core count: "
              f"{sum(a['cores'] == a['best'] for a in greedy_answers)} of {len(greedy_answers)}")
    if answers:
        print(f"    answers at the best core count: {sum(a['cores'] == a['best'] for a in answers)} of {len(answers)}, "
              f"true throughput over the best: mean {statistics.fmean(a['found_over_best'] for a in answers):.3f}, "
              f"worst {min(a['found_over_best'] for a in answers):.3f}")
        starts = {}
        for a in answers:
            starts[a["start"]] = starts.get(a["start"], 0) + 1
        print(f"    starts: {', '.join(f'{k} {v}' for k, v in sorted(starts.items(), key=lambda kv: -kv[1]))}; "
              f"probes the plan cut (the allocator told): {sum(a['limited'] for a in answers)}, "
              f"probe ticks short of the probe: {sum(a['trimmed_s'] for a in answers)}; "
              f"jobs that ended still probing: {len(unsized)}")
    print(f"  GPU utilisation over GPU-proportional: noded {gain:+.1%}, oracle {oracle_gain:+.1%} "
          f"(CODA, cluster-wide: {CODA_GAIN:+.1%})")
    worst = results["noded"]
    print(f"  no GPU job below its GPU-proportional progress: {'yes' if worst['worst_ratio'] >= 1 else 'NO'} "
          f"(worst {worst['worst_ratio']:.3f}, {worst['worst_job']})")
    generated = generated_history(curves, {"coda": coda, "top": config}) if curves else {}
    if generated:
        print_generated(generated, curves)

    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"gpus": GPUS, "cores": args.cores, "seed": args.seed, "hours": hours, "end_s": end,
                   "jobs": [r.__dict__ for r in runs], "schemes": results, "answers": answers,
                   "steps_mean": statistics.fmean(steps), "probe_s_mean": statistics.fmean(probe_s),
                   "gpu_util_gain": gain, "oracle_gpu_util_gain": oracle_gain, "coda_gain": CODA_GAIN,
                   "unsized": unsized, "tuned_over_oracle": x, "generated": generated, "wall_s": time.perf_counter() - wall}, f, indent=1)
    print(f"  wrote {args.json} ({time.perf_counter() - wall:.1f} s)")
    print(f"tuned/oracle throughput: {x:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
