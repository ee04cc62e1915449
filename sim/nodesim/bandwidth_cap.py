"""Holding a job at a bandwidth cap: noded's controller against the kernel's (issue #27).

``python -m bench.bandwidth_cap [--quick] [--json PATH]``

Runs the resctrl emulator's kernel in process with a clock of its own (10 ms steps), so a
run of 24 simulated seconds takes a fraction of a real one and every figure is the same on
every machine. Profiles: the emulator's MBA as hardware applies it (sim/nodesim/resctrl_emulator/mba.py):
``intel-linear``, ``intel-quantised`` (Skylake), ``intel-per-thread``, ``amd``. One job
per run, in its own control group, with 1, 4 or 16 busy threads each asking 14 GB/s (a
STREAM-like thread; one core passes at most 17.7), on a domain with room for all of it.

At t = 0 a cap of 10 .. 90 % of the job's demand is set; at t = 12 s its demand moves while
capped: ``step`` (every thread to 17.5 GB/s at once) or ``ramp`` (to 17.5 over 6 s).

* ``noded``: ``noded.capping.CapController``, every 100 ms, from the job's
  mbm_total_bytes as a reader of the file sees it.
* ``kernel-style``: the kernel's mba_MBps rule (update_mba_bw) on the same scale, once a
  second, one step (``KernelStyleController``); on Intel only, as the kernel offers it.

Per run, from the job's true bytes in 100 ms windows: time to settle (every window from
then until the demand moves within +-5 % of the cap), again once the demand stops moving
(at the step; at the ramp's end), overshoot after first settling (the worst run of windows
above the +5 % band: its height above the cap and how long), steady error (mean over the
last 2 s before each phase ends), time above the cap + 5 % in all.
A cap below what the lowest MB value passes cannot be met by MBA: such runs are listed
and left out of the percentiles (fewer cores is the lever there: the daemon halves the
job's CPUs, tests/test_cap_cores.py; not modelled here).

The reserve runs (``contention.gpu_reserve_gbps``): the domain's peak is the job's first
demand, a GPU job (``GPU_MODEL``) runs beside it in a group of its own, and the job's cap
is what ``RESERVE`` of the peak and the GPU job's own bandwidth leave
(``noded.capping.plan.reserve_share``); each controller, and no cap at all, on the same
runs. Per run: the GPU job's utilisation against solo (``nodesim.workload``: the node's
share of its peak in each 100 ms window), its mean from the cap's write and its 5th
percentile from 1 s on. The last line's percentiles are over every reachable run, these
included.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass

from noded.capping.controller import AMD_UNIT_BYTES, CapController, Hold, KernelStyleController
from noded.capping.plan import reserve_share
from nodesim.workload import MODELS, gpu_utilisation
from nodesim.resctrl_emulator.kernel import ResctrlKernel
from nodesim.resctrl_emulator.profiles import PROFILES

GB = 1e9
TICK_S = 0.01
WINDOW_S = 0.1
PHASE_S = 12.0
RAMP_S = 6.0
DEMAND_PER_THREAD = 14 * GB
MOVED_PER_THREAD = 17.5 * GB
PROFILE_NAMES = ("intel-linear", "intel-quantised", "intel-per-thread", "amd")
BAND = 0.05
#: the reserve runs: this share of the domain's peak kept for GPU jobs, the GPU job beside
#: the capped one (NLP: little bandwidth, much lost to contention: nodesim.workload)
RESERVE = 0.45
GPU_MODEL = "BiDAF"


@dataclass
class Run:
    profile: str
    threads: int
    cap_share: float
    pattern: str
    controller: str
    reachable: bool
    settle_s: float | None
    resettle_s: float | None
    overshoot_pct: float
    overshoot_ms: float
    steady_error_pct: float
    writes: int
    last_move_s: float  # when it last changed the value before the demand moved: its own steady state
    above_s: float  # time above cap + 5 % from the moment the cap was set, the first transient included
    # reserve runs: the GPU job's utilisation against solo, over the run from the cap's write,
    # and its 5th percentile over 100 ms windows from 1 s on (None: no GPU job in the run)
    gpu_vs_solo: float | None = None
    gpu_vs_solo_p5: float | None = None


class FakeProc:
    """A /proc with only the benchmark's tasks in it, for the emulator's task table."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="bwcap-proc-")
        self.next_tid = 4000

    def task(self) -> int:
        tid = self.next_tid
        self.next_tid += 1
        os.makedirs(f"{self.root}/{tid}/task/{tid}")
        with open(f"{self.root}/{tid}/stat", "w") as f:
            f.write(f"{tid} (job) S 1 " + "0 " * 17 + "100\n")
        with open(f"{self.root}/{tid}/status", "w") as f:
            f.write(f"Tgid:\t{tid}\nUid:\t0\t0\t0\t0\n")
        return tid


def scale_of(profile_name: str) -> list[int]:
    p = PROFILES[profile_name]
    return list(range(p.mb_min, p.mb_max + 1, p.mb_gran))


class Bench:
    """One run's node: the job in its own group; with ``reserve`` (a share of the domain's
    peak kept for GPU jobs) a domain whose peak the job's demand fills, a GPU job beside it
    (``GPU_MODEL``) and the job's cap the one ``contention.gpu_reserve_gbps`` gives it."""

    def __init__(self, proc: FakeProc, profile_name: str, threads: int, cap_share: float, pattern: str,
                 reserve: float | None = None):
        self.now = -1.0
        self.peak = threads * DEMAND_PER_THREAD if reserve is not None else 1e13
        profile = PROFILES[profile_name].replace(peak_bytes_per_s=self.peak)
        self.kernel = ResctrlKernel(profile, proc=proc.root, clock=lambda: self.now)
        self.tid = proc.task()
        self.kernel.mkdir(["job"])
        self.kernel.write(["job", "tasks"], f"{self.tid}\n".encode(), os.getpid(), 0)
        self.rmid = self.kernel.groups["job"].rmid
        self.threads = threads
        self.pattern = pattern
        self.cap = cap_share * threads * DEMAND_PER_THREAD
        self.gpu_rmid: int | None = None
        if reserve is not None:
            gpu = proc.task()
            self.kernel.mkdir(["gpu"])
            self.kernel.write(["gpu", "tasks"], f"{gpu}\n".encode(), os.getpid(), 0)
            self.gpu_rmid = self.kernel.groups["gpu"].rmid
            gpu_bps = MODELS[GPU_MODEL].demand_gbps * GB
            self.kernel.set_demand(gpu, gpu_bps, 0)
            # the daemon's arithmetic: what the peak leaves once the reserve and the GPU job's
            # own bandwidth are set aside, shared by the CPU jobs (one here: all of it)
            self.cap = reserve_share({"job": None}, self.peak - reserve * self.peak - gpu_bps)
        self.node_windows: list[float] = []  # every group's bytes/s in each window (with a GPU job)
        self.scale = scale_of(profile_name)
        self.writes = 0
        self.value = self.scale[-1]
        self.changes: list[float] = []  # when the MB value changed
        self._set_demand(0.0)

    def _set_demand(self, t: float) -> None:
        if t < PHASE_S:
            per_thread = DEMAND_PER_THREAD
        elif self.pattern == "step":
            per_thread = MOVED_PER_THREAD
        else:
            per_thread = DEMAND_PER_THREAD + (MOVED_PER_THREAD - DEMAND_PER_THREAD) * min(1.0, (t - PHASE_S) / RAMP_S)
        self.kernel.set_demand(self.tid, per_thread * self.threads, 0, threads=self.threads)

    def write_mb(self, value: int) -> None:
        if value != self.value:
            self.changes.append(self.now)
        self.value = value
        self.kernel.write(["job", "schemata"], f"MB:0={value}\n".encode(), os.getpid(), 0)
        self.writes += 1

    def lowest_bandwidth(self) -> float:
        """What the job moves at the lowest MB value, with the demand it has at the end."""
        self._set_demand(2 * PHASE_S)
        self.write_mb(self.scale[0])
        low = self.kernel.rates_now(0).get(self.rmid, 0.0)
        self._set_demand(0.0)
        self.write_mb(self.scale[-1])
        self.writes = 0
        self.changes = []
        return low

    def mbm_bytes(self) -> int:
        return int(self.kernel.read(["job", "mon_data", "mon_L3_00", "mbm_total_bytes"]))

    def true_bytes(self) -> float:
        self.kernel.advance(self.now)
        return self.kernel.counters[(self.rmid, 0)].total

    def node_bytes(self) -> float:
        return sum(self.kernel.counters[(rmid, 0)].total for rmid in (self.rmid, self.gpu_rmid) if rmid is not None)

    def run(self, controller, period_s: float) -> list[float]:
        """The job's bandwidth in each 100 ms window from t = 0 to 2 x PHASE_S."""
        held = Hold(self.scale[-1], self.scale[-1])
        switches: list[tuple[float, int]] = []
        steps = round(2 * PHASE_S / TICK_S)
        per_period = round(period_s / TICK_S)
        per_window = round(WINDOW_S / TICK_S)
        windows: list[float] = []
        start = -1.0
        last_read, window_start, node_start = None, None, 0.0
        for i in range(-round(1.0 / TICK_S), steps + 1):
            t = start + (i + round(1.0 / TICK_S)) * TICK_S
            while switches and switches[0][0] < t - 1e-9:  # a switch between ticks, at its own time
                self.now, value = switches.pop(0)
                self.write_mb(value)
            self.now = t
            if self.pattern == "ramp" and PHASE_S <= t <= PHASE_S + RAMP_S + TICK_S:
                self._set_demand(t)
            elif self.pattern == "step" and i == round(PHASE_S / TICK_S):
                self._set_demand(t)
            while switches and switches[0][0] <= t + 1e-9:
                self.write_mb(switches.pop(0)[1])
            if i >= 0 and i % per_window == 0:
                b, node = self.true_bytes(), self.node_bytes()
                if window_start is not None:
                    windows.append((b - window_start) / WINDOW_S)
                    self.node_windows.append((node - node_start) / WINDOW_S)
                window_start, node_start = b, node
            if i % per_period == 0:
                now_bytes = self.mbm_bytes()
                if last_read is not None and i >= 0:
                    measured = (now_bytes - last_read) / period_s
                    held = controller.update(measured, self.threads, held)
                    switches = []
                    offset = 0.0
                    for value, share in held.values:
                        switches.append((t + offset, value))
                        offset += share * period_s
                    while switches and switches[0][0] <= t + 1e-9:
                        self.write_mb(switches.pop(0)[1])
                last_read = now_bytes
        return windows


def settle_after(windows: list[float], cap: float, first: int, end: int) -> float | None:
    """Seconds from window ``first`` until every window up to ``end`` is in the band."""
    inside = [abs(w / cap - 1) <= BAND for w in windows[first:end]]
    if not inside or not inside[-1]:
        return None
    k = len(inside)
    while k > 0 and inside[k - 1]:
        k -= 1
    return k * WINDOW_S


def measure(windows: list[float], cap: float,
            pattern: str = "step") -> tuple[float | None, float | None, float, float, float]:
    """(settle s, resettle s, overshoot %, overshoot ms, steady error %) of one run's windows."""
    phase = round(PHASE_S / WINDOW_S)
    settle = settle_after(windows, cap, 0, phase)
    # after the demand stops moving: at once for a step, at the ramp's end for a ramp
    still = phase + (0 if pattern == "step" else round(RAMP_S / WINDOW_S))
    resettle = settle_after(windows, cap, still, len(windows))
    first_in = next((i for i, w in enumerate(windows) if abs(w / cap - 1) <= BAND), len(windows))
    height, longest, run = 0.0, 0, 0
    for w in windows[first_in:]:
        if w > cap * (1 + BAND):
            run += 1
            longest = max(longest, run)
            height = max(height, w / cap - 1)
        else:
            run = 0
    tail = round(2.0 / WINDOW_S)
    errors = [abs(statistics.fmean(windows[end - tail:end]) / cap - 1) for end in (phase, len(windows))]
    return settle, resettle, 100 * height, longest * WINDOW_S * 1000, 100 * max(errors)


class Uncapped:
    """No cap at all (the reserve runs' reference): the top value, always."""

    def __init__(self, values: list[int]):
        self.top = values[-1]

    def update(self, measured_bps: float, busy_threads: int, held: Hold) -> Hold:
        return Hold(self.top, self.top)


def one_run(proc: FakeProc, profile: str, threads: int, share: float, pattern: str, which: str,
            reserve: float | None = None) -> Run:
    bench = Bench(proc, profile, threads, share, pattern, reserve)
    reachable = bench.lowest_bandwidth() <= bench.cap * (1 + BAND)
    period = 0.1
    if which == "noded":
        controller = CapController(bench.scale, bench.cap,
                                   absolute_unit_bytes=AMD_UNIT_BYTES if PROFILES[profile].vendor == "amd" else None)
    elif which == "uncapped":
        controller = Uncapped(bench.scale)
    else:
        controller = KernelStyleController(bench.scale, bench.cap)
        period = KernelStyleController.period_s
    windows = bench.run(controller, period)
    settle, resettle, height, duration, error = measure(windows, bench.cap, pattern)
    last_move = max((t for t in bench.changes if t < PHASE_S), default=0.0)
    above = sum(WINDOW_S for w in windows if w > bench.cap * (1 + BAND))
    gpu = gpu_low = None
    if bench.gpu_rmid is not None:
        model = MODELS[GPU_MODEL]
        ratios = [gpu_utilisation(model, w / bench.peak) / model.solo_util for w in bench.node_windows]
        gpu = statistics.fmean(ratios)
        later = sorted(ratios[round(1.0 / WINDOW_S):])
        gpu_low = later[max(0, math.ceil(0.05 * len(later)) - 1)]
    return Run(profile, threads, bench.cap / (threads * DEMAND_PER_THREAD), pattern, which, reachable, settle,
               resettle, height, duration, error, bench.writes, last_move, above, gpu, gpu_low)


def p95(values: list[float | None]) -> float:
    """95th percentile, a run that never settled counting as infinitely slow."""
    xs = sorted(math.inf if v is None else v for v in values)
    if not xs:
        return math.nan
    return xs[min(len(xs) - 1, math.ceil(0.95 * len(xs)) - 1)]


def fmt_s(v: float) -> str:
    return f">{PHASE_S:g}" if math.isinf(v) else f"{v:.1f}"


def reserve_runs(proc: FakeProc) -> list[Run]:
    """The job beside a GPU job on a domain its demand fills, capped by the reserve."""
    runs = []
    for profile in PROFILE_NAMES:
        for threads in (1, 4, 16):
            for pattern in ("step", "ramp"):
                for which in ("noded", "kernel-style", "uncapped"):
                    if which != "kernel-style" or PROFILES[profile].vendor == "intel":
                        runs.append(one_run(proc, profile, threads, 0.0, pattern, which, RESERVE))
    return runs


def print_reserve(runs: list[Run]) -> None:
    model = MODELS[GPU_MODEL]
    print(f"GPU reserve: {RESERVE:.0%} of the domain's peak kept for GPU jobs, the job's demand filling the peak "
          f"beside a {GPU_MODEL} job ({model.demand_gbps:g} GB/s, solo {model.solo_util:g} %), the job capped at what "
          "the reserve leaves (noded.capping.plan), 1/4/16 threads x step/ramp per profile")
    print(f"  {'profile':<17}{'controller':<14}{'runs':>5}{'settle p95 s':>13}{'overshoot p95 %':>16}"
          f"{'GPU vs solo mean':>17}{'worst':>7}{'p5 window worst':>16}")
    for profile in PROFILE_NAMES:
        for which in ("noded", "kernel-style", "uncapped"):
            rs = [r for r in runs if r.profile == profile and r.controller == which]
            if not rs:
                continue
            settle = fmt_s(p95([r.settle_s for r in rs])) if which != "uncapped" else "-"
            over = f"{p95([r.overshoot_pct for r in rs]):.1f}" if which != "uncapped" else "-"
            print(f"  {profile:<17}{which:<14}{len(rs):>5}{settle:>13}{over:>16}"
                  f"{statistics.fmean(r.gpu_vs_solo for r in rs):>17.3f}{min(r.gpu_vs_solo for r in rs):>7.3f}"
                  f"{min(r.gpu_vs_solo_p5 for r in rs):>16.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bandwidth_cap", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="caps 20, 50, 80 %% only (a smoke run)")
    ap.add_argument("--json", metavar="PATH", help="write every run here")
    args = ap.parse_args(argv)
    shares = (0.2, 0.5, 0.8) if args.quick else tuple(k / 10 for k in range(1, 10))
    proc = FakeProc()
    runs: list[Run] = []
    for profile in PROFILE_NAMES:
        for threads in (1, 4, 16):
            for share in shares:
                for pattern in ("step", "ramp"):
                    runs.append(one_run(proc, profile, threads, share, pattern, "noded"))
                    if PROFILES[profile].vendor == "intel":
                        runs.append(one_run(proc, profile, threads, share, pattern, "kernel-style"))
    print(f"bandwidth caps: {len(shares)} caps x 1/4/16 threads x step/ramp per profile; 100 ms windows, band +-5 %")
    print(f"  {'profile':<17}{'controller':<14}{'runs':>5}{'unreach':>8}{'settle p50':>11}{'p95 s':>7}"
          f"{'resettle p95':>13}{'overshoot p95 %':>16}{'for ms':>7}{'steady err p95 %':>17}"
          f"{'above cap p95 s':>16}{'writes/s':>9}")
    for profile in PROFILE_NAMES:
        for which in ("noded", "kernel-style"):
            rs = [r for r in runs if r.profile == profile and r.controller == which]
            if not rs:
                continue
            ok = [r for r in rs if r.reachable]
            print(f"  {profile:<17}{which:<14}{len(rs):>5}{len(rs) - len(ok):>8}"
                  f"{fmt_s(statistics.median([math.inf if r.settle_s is None else r.settle_s for r in ok])):>11}"
                  f"{fmt_s(p95([r.settle_s for r in ok])):>7}{fmt_s(p95([r.resettle_s for r in ok])):>13}"
                  f"{p95([r.overshoot_pct for r in ok]):>16.1f}{p95([r.overshoot_ms for r in ok]):>7.0f}"
                  f"{p95([r.steady_error_pct for r in ok]):>17.1f}{p95([r.above_s for r in ok]):>16.1f}"
                  f"{statistics.fmean(r.writes for r in ok) / (2 * PHASE_S):>9.1f}")
    reserved = reserve_runs(proc)
    print_reserve(reserved)
    unreachable = sorted({(r.profile, r.threads, r.cap_share) for r in runs if not r.reachable})
    if unreachable:
        print("  unreachable by MBA (the lowest value passes more than cap + 5 %): "
              + ", ".join(f"{p} {n}t {s:.0%}" for p, n, s in unreachable))
    runs += reserved
    ours = [r for r in runs if r.controller == "noded" and r.reachable]
    theirs = [r for r in runs if r.controller == "kernel-style" and r.reachable]
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in runs], f, indent=1)
        print(f"  wrote {args.json}")
    worst = max(ours, key=lambda r: (r.overshoot_pct, r.overshoot_ms), default=None)
    if worst is not None and worst.overshoot_pct > 0:
        print(f"  noded's worst overshoot: {worst.overshoot_pct:.1f} % for {worst.overshoot_ms:.0f} ms "
              f"({worst.profile}, {worst.threads} threads, cap {worst.cap_share:.0%}, {worst.pattern})")
    print(f"  kernel-style never within +-5 % counts as > {PHASE_S:g} s; it stops moving at p95 "
          f"{p95([r.last_move_s for r in theirs]):.1f} s (noded, where it mixes two values, never stops)")
    settle, baseline = fmt_s(p95([r.settle_s for r in ours])), fmt_s(p95([r.settle_s for r in theirs]))
    print(f"settle p95 {settle} s (kernel-style {baseline} s), "
          f"overshoot p95 {p95([r.overshoot_pct for r in ours]):.1f} % for {p95([r.overshoot_ms for r in ours]):.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
