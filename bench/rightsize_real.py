"""Right-sizing for real: noded slims and grows a real victim's cpuset and finds its knee.

On this machine, with real processes: a victim (``bench.victims.loader``: a training
job's input side, ``--workers`` worker processes making ``tokenise`` samples, the GPU side
instant) runs in a real cpuset cgroup of its own (cgroup v1 here, or v2 with the cpuset
controller) holding every CPU this process may use, and reports each iteration's time to
noded's report socket as a training script does. Its speed rises with its cores up to one
core per worker: with 1 worker its knee is 1 core, with 2 it is 2 (on a 2-CPU machine).

Per victim, in one run:

* **directly**: the bench writes the victim's ``cpuset.cpus`` itself, the top ``k`` CPUs of
  the node (where noded's plan puts a GPU job) for each ``k`` from all down to 1, in a few
  rounds, and takes the median of the victim's own per-second counts at each ``k`` (each
  round after a warm-up; other processes on this shared machine come and go). The knee is
  the fewest cores within ``noise_margin`` (noded's, 3 %) of the best: noded's own rule for
  a step that gains nothing.
* **noded**: the real daemon, built as ``noded run`` builds it, with its report socket,
  right-sizing on for the ``cgroup`` job source over the victim's cgroup. What this
  machine lacks is replaced at the lowest boundary as ``bench.scenario``'s cpuset node
  does: resctrl by the emulator (no bandwidth is demanded: nothing contends), NVML by the
  fake with 2 GPUs, the victim's process on GPU 0, so that it is a GPU job whose
  GPU-proportional share is 1 core (2 CPUs, 2 GPUs). noded sizes it from its iteration
  times, writing its cpuset for real (slimming, growing back), until it answers; the bench
  then measures the victim where noded left it.

Printed per victim: the cores noded probed in order with the throughput it measured there
(iterations/s times the victim's batch, in samples/s), its answer, the direct
measurements and the knee, probing steps and seconds (from the job's first tick to its
answer), and the throughput at noded's answer over the best, both measured directly. The
last line is the lowest of those ratios over the victims.

The right-sizing windows are shorter than noded's defaults (warm-up 5 s, at most 90 s a
probe, tolerance 2 %) so that a run takes minutes; the output says which were used.
``--noise-margin`` sets ``rightsize.noise_margin`` and the knee's margin together.

    python -m bench.rightsize_real [--quick] [--workers 1,2] [--victim tokenise] [--noise-margin 0.03]
                                   [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

from bench.scenario.cpuset_node import Cpusets, find_cpuset_root
from bench.scenario.noded_run import NodedInProcess
from bench.scenario.procs import ReportingProcess
from bench.victims import VICTIMS
from noded.admin.server import AdminServer
from noded.config import (Config, ContentionConfig, JobsConfig, JobSourceConfig, MetricsConfig, ResctrlConfig,
                          RightsizeConfig)
from noded.jobs.proctree import descendants, read_ppids
from noded.util.journal import CHANGES
from noded.util.procstat import stat_fields
from nodesim.gpus import SimGpus, SimProcess, make_gpus
from resctrl.cpulist import format_cpu_list
from nodesim.resctrl_emulator import MountedEmulator

#: the victim's samples per iteration: about 0.1 s of one worker's work on this machine
BATCH = 8192
#: the fake node's GPUs: the victim's share of 2 CPUs is then 1 core (noded's floor phase)
GPUS = 2
#: the victim's GPU utilisation as NVML shows it (unused once it reports iteration times)
GPU_UTIL = 90
#: what noded sizes on (``rightsize.sources``): the kind of the job source over the victim
SOURCE = "cgroup"
TICK_S = 0.5
PEAK_GBPS = 10.0  # the emulator's node peak (nothing demands bandwidth here)


@dataclass(frozen=True)
class Timing:
    """How long each part of a run takes (``--quick`` or not)."""

    warmup_s: float  # rightsize.warmup_s, and the direct measurements' warm-up
    max_window_s: float  # rightsize.max_window_s
    tolerance: float  # rightsize.tolerance
    direct_s: int  # seconds measured at each core count directly, per pass
    rounds: int  # rounds over the core counts, each from all CPUs down to 1
    hold_s: int  # seconds measured at noded's answer

    def rightsize(self, noise_margin: float) -> RightsizeConfig:
        return RightsizeConfig(sources=(SOURCE,), warmup_s=self.warmup_s, max_window_s=self.max_window_s,
                               tolerance=self.tolerance, noise_margin=noise_margin)


QUICK = Timing(warmup_s=1.0, max_window_s=5.0, tolerance=0.03, direct_s=2, rounds=2, hold_s=3)
FULL = Timing(warmup_s=2.0, max_window_s=15.0, tolerance=0.02, direct_s=4, rounds=4, hold_s=5)


def knee(direct: dict[int, float], margin: float) -> int:
    """The fewest cores whose throughput is within ``margin`` of the best measured."""
    best = max(direct.values())
    return min(k for k, v in direct.items() if v >= (1 - margin) * best)


def found_over_best(direct: dict[int, float], cores: int) -> float:
    """Throughput at ``cores`` over the best, both as measured directly."""
    return direct[cores] / max(direct.values())


def spread(seconds: list[float]) -> float:
    """How much a victim's speed at fixed cores moves from second to second on this machine:
    the 10th to the 90th percentile, over the median."""
    deciles = statistics.quantiles(seconds, n=10)
    return (deciles[-1] - deciles[0]) / statistics.median(seconds)


def top_cpus(cpus: list[int], k: int) -> list[int]:
    """The top ``k`` CPUs: where noded's plan puts a GPU job (its array is the top of the node)."""
    return sorted(cpus)[-k:]


CLK_TCK = os.sysconf("SC_CLK_TCK")
UTIME, STIME = 11, 12  # in stat_fields (from the state on): /proc/PID/stat fields 14 and 15


@dataclass(frozen=True)
class CpuUse:
    """CPU time so far: the machine's (busy, steal included) and this process's with its
    descendants' (noded in this process, the victim, its workers, the emulator)."""

    wall: float
    busy_s: float
    own_s: float

    @classmethod
    def now(cls) -> "CpuUse":
        with open("/proc/stat") as f:
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
        own = 0
        for pid in descendants(os.getpid(), read_ppids("/proc")):
            fields = stat_fields("/proc", pid)
            if fields is not None:
                own += int(fields[UTIME]) + int(fields[STIME])
        busy = user + nice + system + irq + softirq + steal
        return cls(time.monotonic(), busy / CLK_TCK, own / CLK_TCK)

    def others_since(self, before: "CpuUse") -> float:
        """CPUs that everything else on the machine kept busy on average since ``before``
        (other sessions' work, the hypervisor's steal): what disturbs the measurements."""
        return max(0.0, (self.busy_s - before.busy_s) - (self.own_s - before.own_s)) / (self.wall - before.wall)


@dataclass
class Probe:
    cores: int
    t: float  # s since noded started
    cpus: str | None = None  # the victim's cpuset.cpus when the probe was first held


@dataclass
class SizingTrace:
    """What noded did to one job, tick by tick (filled in by the daemon's thread)."""

    job: str
    cgroup: str
    t0: float = 0.0
    begun_at: float | None = None
    sized_at: float | None = None
    probes: list[Probe] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # distinct cpuset.cpus values seen, in order
    view: object = None  # the last JobSizingView
    done: threading.Event = field(default_factory=threading.Event)

    def tick(self, result, now: float) -> None:
        rs = result.rightsize
        v = rs.jobs.get(self.job) if rs is not None else None
        if v is None:
            return
        t = now - self.t0
        if self.begun_at is None:
            self.begun_at = t
        self.view = v
        cpus = read_cpus(self.cgroup)
        if not self.held or self.held[-1] != cpus:
            self.held.append(cpus)
        if v.state == "probing" and (not self.probes or self.probes[-1].cores != v.target):
            self.probes.append(Probe(v.target, round(t, 2)))
        if self.probes and self.probes[-1].cpus is None and v.allocated == self.probes[-1].cores:
            self.probes[-1].cpus = cpus
        if v.state in ("sized", "limited", "stopped", "pinned") and self.sized_at is None:
            self.sized_at = t
            self.done.set()


class SizingRun(NodedInProcess):
    """noded as ``noded run`` builds it, its report socket served as ``noded run`` serves it,
    each tick's right-sizing of one job traced."""

    def __init__(self, config: Config, trace: SizingTrace):
        super().__init__(config)
        self.trace = trace
        os.makedirs(config.runtime_dir, mode=0o755, exist_ok=True)
        self.reports = AdminServer(config.report_socket, self.daemon, group=None, timeout_s=config.admin.timeout_s,
                                   reports_only=True)

    def _on_tick(self, result) -> None:
        super()._on_tick(result)
        self.trace.tick(result, time.monotonic())

    def start(self) -> "SizingRun":
        self.trace.t0 = time.monotonic()  # before the first tick
        self.reports.start()
        super().start()
        return self

    def stop(self) -> None:
        try:
            self.reports.stop()
        finally:
            if self._thread.is_alive():
                super().stop()  # the loop ends, then the daemon's shutdown puts every cpuset back
            else:
                self.daemon.shutdown()


class Changes(logging.Handler):
    """noded's journal lines (one per change it makes), with their times."""

    def __init__(self):
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))


def read_cpus(cgroup: str) -> str:
    with open(os.path.join(cgroup, "cpuset.cpus")) as f:
        return f.read().strip()


def write_cpus(cgroup: str, cpus: list[int]) -> None:
    with open(os.path.join(cgroup, "cpuset.cpus"), "w") as f:
        f.write(format_cpu_list(cpus))


def measure(victim: ReportingProcess, cores: int, warmup_s: float, seconds: int) -> list[float]:
    """Samples/s of ``seconds`` per-second reports taken at ``cores`` CPUs, after the first
    report that shows them and ``warmup_s`` more (those describe the change)."""
    i = len(victim.reports)
    skip = int(round(warmup_s))
    seen = None
    taken: list[float] = []
    deadline = time.monotonic() + 30 + warmup_s + seconds
    while len(taken) < seconds:
        if not victim.wait_reports(i + 1, timeout=max(0.1, deadline - time.monotonic())):
            raise RuntimeError(f"the victim stopped reporting at {cores} CPUs: {victim.failure()}")
        line = victim.reports[i]
        i += 1
        if line["cpus"] != cores:
            seen, taken = None, []  # not (or no longer) at the cores measured
            continue
        if seen is None:
            seen = i  # this second straddles the change
            continue
        if i - seen > skip:
            taken.append(line["samples_per_s"])
    return taken


def run_victim(node: "RealNode", name: str, workers: int, timing: Timing, margin: float, progress) -> dict:
    """One victim: measured directly at each core count, then sized by noded, then held there."""
    rel = f"victim{workers}"
    job = f"{SOURCE}:{rel}"
    cpus = node.cpus
    cgroup = node.cpusets.make(rel, format_cpu_list(cpus))
    tmp = tempfile.mkdtemp(prefix=f"{rel}-", dir=node.tmp.name)
    config = Config(tick_s=TICK_S, peak_gbps_per_domain=PEAK_GBPS, state_dir=f"{tmp}/state",
                    runtime_dir=f"{tmp}/run", metrics=MetricsConfig(port=0),
                    resctrl=ResctrlConfig(root=node.emu.root, mounts=node.emu.mounts_file),
                    jobs=JobsConfig(sources=(JobSourceConfig(SOURCE, node.cpusets.base, (rel,)),)),
                    contention=ContentionConfig(method="cores"), rightsize=timing.rightsize(margin))
    with ExitStack() as stack:
        victim = ReportingProcess("bench.victims.loader", [name, "--workers", str(workers), "--batch", str(BATCH),
                                                           "--job", job, "--report-socket", config.report_socket],
                                  cgroup=cgroup)
        stack.callback(victim.stop)
        if not victim.wait_reports(2, timeout=60):
            raise RuntimeError(f"the victim did not report: {victim.failure()}")
        gpu = node.gpus[0]
        with node.gpus.lock:
            gpu.processes[victim.pid] = SimProcess(victim.pid, sm_util=GPU_UTIL)
            gpu.util_gpu = GPU_UTIL

        def off_the_gpu() -> None:
            with node.gpus.lock:
                gpu.processes.pop(victim.pid, None)
                gpu.util_gpu = 0

        stack.callback(off_the_gpu)

        # directly: the bench writes the cpuset, from all the CPUs down to 1, round after round
        # (a drift of the machine's speed, or another process busy for a while, falls on every count)
        order = list(range(len(cpus), 0, -1)) * timing.rounds
        samples: dict[int, list[float]] = {}
        t_direct = time.monotonic()
        use_direct = CpuUse.now()
        for k in order:
            write_cpus(cgroup, top_cpus(cpus, k))
            progress(f"{name} x{workers}: directly at {k} CPU{'s' * (k > 1)}")
            samples.setdefault(k, []).extend(measure(victim, k, timing.warmup_s, timing.direct_s))
        write_cpus(cgroup, cpus)  # as it started: what noded will take as the job's own CPUs
        # the median second at k: the seconds when other processes took the CPUs do not move it
        direct = {k: statistics.median(v) for k, v in sorted(samples.items())}
        direct_s = time.monotonic() - t_direct
        others = {"direct": CpuUse.now().others_since(use_direct)}
        the_knee = knee(direct, margin)

        # noded: sizes it from its reports, writing its cpuset
        trace = SizingTrace(job, cgroup)
        changes = Changes()
        changes_log = logging.getLogger(CHANGES)
        changes_log.addHandler(changes)
        stack.callback(changes_log.removeHandler, changes)
        progress(f"{name} x{workers}: noded sizing it")
        noded = SizingRun(config, trace)
        try:
            use_noded = CpuUse.now()
            noded.start()
            deadline = 12 * (timing.max_window_s + timing.warmup_s + 2 * TICK_S) + 10
            trace.done.wait(deadline)
            use_sized = CpuUse.now()
            others["noded"] = use_sized.others_since(use_noded)
            v = trace.view
            answer = v.target if trace.sized_at is not None else None
            at_answer = None
            if answer is not None:
                progress(f"{name} x{workers}: held at noded's answer, {answer} CPU{'s' * (answer > 1)}")
                at_answer = statistics.median(measure(victim, answer, timing.warmup_s, timing.hold_s))
                others["held"] = CpuUse.now().others_since(use_sized)
            cpus_at_answer = read_cpus(cgroup)
        finally:
            noded.stop()
        restored = read_cpus(cgroup)
    return {
        "victim": name, "workers": workers, "batch": BATCH, "job": job, "cgroup": cgroup,
        "cpus_at_start": format_cpu_list(cpus),
        "direct": {str(k): round(x, 1) for k, x in direct.items()},
        "direct_spread": {str(k): round(spread(v), 4) for k, v in sorted(samples.items())},
        "direct_seconds": {str(k): [round(x, 1) for x in v] for k, v in sorted(samples.items())},
        "direct_order": order, "direct_s": round(direct_s, 1), "knee": the_knee,
        "signal": v.signal if v is not None else None,
        "start": v.start if v is not None else None, "start_source": v.start_source if v is not None else None,
        "probes": [{"cores": p.cores, "t": p.t, "cpus": p.cpus} for p in trace.probes],
        "points": [{"cores": c, "samples_per_s": round(x * BATCH, 1) if v.signal == "iteration_time" else None,
                    "throughput": x} for c, x in (v.points if v is not None else ())],
        "answer": answer, "state": v.state if v is not None else None, "reason": v.reason if v is not None else None,
        "steps": len(v.points) if v is not None and answer is not None else None,
        "probe_s": round(trace.sized_at - trace.begun_at, 1) if answer is not None else None,
        "noded_s": round(trace.sized_at, 1) if answer is not None else None,
        "cpusets_held": trace.held, "cpus_at_answer": cpus_at_answer, "cpus_after_noded": restored,
        "at_answer": round(at_answer, 1) if at_answer is not None else None,
        "found_over_best": found_over_best(direct, answer) if answer is not None else None,
        "others_cpus": {k: round(x, 3) for k, x in others.items()},
        "journal": [{"t": round(t - trace.t0, 2), "line": line} for t, line in changes.lines],
    }


class RealNode:
    """This machine's CPUs, a private cpuset subtree, the resctrl emulator and a fake NVML
    with ``GPUS`` GPUs; all of it undone on close, whatever happened."""

    def __init__(self):
        self.cpus = sorted(os.sched_getaffinity(0))
        self.stack = ExitStack()
        self.tmp = tempfile.TemporaryDirectory(prefix="noded-bench-rsreal-")
        self.stack.callback(self.tmp.cleanup)
        self.cpusets = Cpusets(find_cpuset_root())
        self.stack.callback(self.cpusets.close)  # kills what is left in them, removes them
        self.emu: MountedEmulator | None = None
        self.gpus: SimGpus | None = None

    def start(self) -> "RealNode":
        try:
            self.emu = MountedEmulator("no-mba", workdir=self.tmp.name,
                                       extra_args=["--peak-gbps", str(PEAK_GBPS)]).start()
            self.stack.callback(self.emu.stop)
            self.gpus = SimGpus(os.path.join(self.tmp.name, "nvml.shm"), make_gpus(GPUS))
            self.stack.callback(self.gpus.close)
            self.gpus.install()
            self.gpus.keep_publishing()  # nothing steps this node: the driver samples all the time
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        self.stack.close()

    def __enter__(self) -> "RealNode":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _k(x: float) -> str:
    return f"{x / 1000:.1f}k"


def report(r: dict, margin: float) -> list[str]:
    direct = {int(k): v for k, v in r["direct"].items()}
    best = max(direct.values())
    lines = [f"  {r['victim']} x{r['workers']} worker{'s' * (r['workers'] > 1)} ({r['job']}, CPUs {r['cpus_at_start']} "
             f"at start; {r['batch']} samples an iteration)"]
    lines.append("    directly (the bench writes cpuset.cpus): " + ", ".join(
        f"{k} CPU{'s' * (k > 1)} {_k(v)}/s ({v / best:.3f})" for k, v in sorted(direct.items(), reverse=True))
        + f" -> knee {r['knee']} (fewest within {margin:.0%} of the best); p10-p90 of a second: "
        + ", ".join(f"{float(s):.0%}" for _, s in sorted(r["direct_spread"].items(), reverse=True)))
    if r["answer"] is None:
        lines.append(f"    noded: NOT SIZED (state {r['state']}, probes {[p['cores'] for p in r['probes']]})")
        return lines
    probes = ", ".join(f"{p['cores']} ({p['cpus']}, t={p['t']:.1f}s)" for p in r["probes"])
    points = ", ".join(f"{p['cores']}: {_k(p['samples_per_s'])}/s" if p["samples_per_s"] is not None
                       else f"{p['cores']}: {p['throughput']:.3g}" for p in r["points"])
    lines.append(f"    noded probed, in order: {probes}; measured (signal {r['signal']}): {points}")
    lines.append(f"    noded's answer: {r['answer']} CPU{'s' * (r['answer'] > 1)} ({r['state']}, {r['reason']}; start "
                 f"{r['start']} from {r['start_source']}) after {r['steps']} steps, {r['probe_s']:.1f} s from the "
                 f"job's first tick")
    lines.append(f"    cpuset.cpus as noded wrote it: {' -> '.join(r['cpusets_held'])}; held at the answer: "
                 f"{_k(r['at_answer'])}/s ({r['at_answer'] / best:.3f} of the best); after noded stopped: "
                 f"{r['cpus_after_noded']}")
    lines.append("    other work on the machine meanwhile (CPUs busy on average, not this bench's): " + ", ".join(
        f"{k} {x:.2f}" for k, x in r["others_cpus"].items()))
    return lines


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM unwinds as Ctrl-C does: every cleanup runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rightsize_real", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter windows and measurements (well under 2 minutes)")
    ap.add_argument("--victim", choices=VICTIMS, default="tokenise", help="what the workers make (default tokenise)")
    ap.add_argument("--workers", default="1,2", help="worker counts, one victim each (default 1,2)")
    ap.add_argument("--noise-margin", type=float, default=RightsizeConfig().noise_margin,
                    help="rightsize.noise_margin, and the knee's (default noded's, %(default)s)")
    ap.add_argument("--json", default="bench/out/rightsize_real.json")
    args = ap.parse_args(argv)
    try:
        workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        ap.error(f"--workers: a comma-separated list of counts, not {args.workers!r}")
    if not workers or min(workers) < 1:
        ap.error("--workers: counts of at least 1")
    if os.geteuid() != 0:
        ap.error("needs root: it makes cpuset cgroups and moves processes into them")
    timing = QUICK if args.quick else FULL
    margin = args.noise_margin
    if not 0 <= margin < 1:
        ap.error(f"--noise-margin must be in [0, 1), not {margin}")
    wall = time.perf_counter()

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - wall:5.1f}s] {what}", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGTERM, _interrupted)
    results = []
    try:
        with RealNode() as node:
            if len(node.cpus) < 2:
                ap.error("needs at least 2 CPUs")
            print(f"right-sizing for real: {len(node.cpus)} CPUs ({format_cpu_list(node.cpus)}), victims "
                  f"{args.victim} x{','.join(map(str, workers))} worker processes, each in a cpuset of its own under "
                  f"{node.cpusets.base}; noded's tick {TICK_S:g} s, a fake NVML of {GPUS} GPUs")
            rs = timing.rightsize(margin)
            print(f"  rightsize windows shortened{' (--quick)' if args.quick else ''}: warmup_s {rs.warmup_s:g}, "
                  f"max_window_s {rs.max_window_s:g}, tolerance {rs.tolerance:g} (defaults 5, 90, 0.02); noise_margin "
                  f"{rs.noise_margin:g}{'' if rs.noise_margin == RightsizeConfig().noise_margin else ' (default 0.03)'}"
                  f"; direct measurements: the median second of {timing.rounds} rounds of {timing.direct_s} s per core count, "
                  f"each after {timing.warmup_s:g} s")
            for w in workers:
                results.append(run_victim(node, args.victim, w, timing, margin, progress))
                print("\n".join(report(results[-1], margin)), flush=True)
    except KeyboardInterrupt:
        print("bench.rightsize_real: interrupted; its daemon, processes, cpusets and mounts are gone",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    ratios = [r["found_over_best"] for r in results]
    x = min(ratios) if None not in ratios else float("nan")
    print(f"  {'victim':<14} {'knee':>4} {'noded':>5} {'steps':>5} {'probe s':>7} {'found/best':>10}")
    for r in results:
        print(f"  {r['victim'] + ' x' + str(r['workers']):<14} {r['knee']:>4} {r['answer'] or '-':>5} "
              f"{r['steps'] or '-':>5} {r['probe_s'] if r['probe_s'] is not None else '-':>7} "
              f"{r['found_over_best'] if r['found_over_best'] is not None else float('nan'):>10.3f}")
    print(f"  found/best: throughput (measured directly) at noded's answer over the best measured directly; "
          f"answers at the knee: {sum(r['answer'] == r['knee'] for r in results)} of {len(results)}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        command = " ".join(["python -m bench.rightsize_real", *(sys.argv[1:] if argv is None else argv)])
        json.dump({"command": command,
                   "cpus": format_cpu_list(sorted(os.sched_getaffinity(0))), "gpus": GPUS, "tick_s": TICK_S,
                   "rightsize": {"warmup_s": timing.warmup_s, "max_window_s": timing.max_window_s,
                                 "tolerance": timing.tolerance, "noise_margin": margin},
                   "timing": timing.__dict__, "victims": results, "found_over_knee": x,
                   "wall_s": round(time.perf_counter() - wall, 1)}, f, indent=1)
    print(f"  wrote {args.json} ({time.perf_counter() - wall:.0f} s)")
    print(f"found/knee throughput: {x:.3f}")
    return 0 if None not in ratios else 1


if __name__ == "__main__":
    sys.exit(main())
