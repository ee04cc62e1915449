"""A memory-bandwidth stressor: STREAM kernels (copy, scale, add, triad) compiled with
numba, on N threads pinned to CPUs, at full speed or holding a chosen bandwidth.

    python -m bench.stress --threads 2 --size 512 --duration 30 [--target-gbps 5] [--json]
    python -m bench.stress --target-gbps 8 --ramp sine --ramp-period 20

Bytes are counted as STREAM counts them (read + written: copy and scale move 16 bytes
an element, add and triad 24) and GB is 10⁹ bytes. A target is held by pacing work
in short chunks: the threads draw on one shared credit and sleep whenever the work
is ahead of it, so a low target costs little CPU. It reports achieved bandwidth every second: a live line on
stderr, or with ``--json`` one JSON object per line on stdout
(``{"t", "achieved_gbps", "target_gbps", "busy"}``; target null at full speed;
``busy`` the share of the threads' time spent working rather than pacing: near 1
with the target missed means the memory gave no more). SIGTERM or
SIGINT stops it cleanly with a summary.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time

import numba
import numpy as np

from bench.jsonlines import emit, reporter, stop_on_signals
from noded.commands.calibrate import SCALAR, _stream_store, _triad  # one triad: what `noded calibrate` measures

GB = 1e9
BYTES_PER_ELEMENT = {"copy": 16, "scale": 16, "add": 24, "triad": 24}
MIN_SLEEP_S = 0.002


# Each kernel works on views of [lo, hi) indexed from 0: with the bounds as loop limits
# numba must allow for negative indices (wrap-around), which stops LLVM vectorising.
@numba.njit(nogil=True, cache=True)
def _copy(a, b, c, lo, hi):
    src, dst = a[lo:hi], c[lo:hi]
    for i in range(dst.shape[0]):
        _stream_store(dst, i, src[i])


@numba.njit(nogil=True, cache=True)
def _scale(a, b, c, lo, hi):
    src, dst = c[lo:hi], b[lo:hi]
    for i in range(dst.shape[0]):
        _stream_store(dst, i, SCALAR * src[i])


@numba.njit(nogil=True, cache=True)
def _add(a, b, c, lo, hi):
    x, y, dst = a[lo:hi], b[lo:hi], c[lo:hi]
    for i in range(dst.shape[0]):
        _stream_store(dst, i, x[i] + y[i])


KERNELS = {"copy": _copy, "scale": _scale, "add": _add, "triad": _triad}


def ramp_target(profile: str | None, base: float | None, t: float, period: float) -> float | None:
    """The target (GB/s) at time t: constant, or shaped by a ramp profile over ``period``."""
    if base is None or profile is None:
        return base
    phase = (t % period) / period
    if profile == "steps":  # 25, 50, 75, 100 % of the target, a quarter period each
        return base * (math.floor(phase * 4) + 1) / 4
    if profile == "sine":  # between 10 % and 100 %
        return base * (0.55 + 0.45 * math.sin(2 * math.pi * phase))
    if profile == "square":  # 100 % then 10 %
        return base if phase < 0.5 else 0.1 * base
    raise ValueError(f"unknown ramp profile {profile!r}")


class Pacer:
    """One token bucket for all threads: credit accrues at the target rate and a thread
    that finds the work done ahead of it sleeps off the lead. Sharing it lets a thread
    that got more CPU make up for one that got less, so the total holds the target.
    Credit runs at most ``burst_s`` of the target (and at least ``burst`` bytes) ahead
    of the work: enough to make up a brief dip in what the memory gives within the
    same second, not so much that a long shortfall (a target above what the memory
    gives) comes back later as a spike."""

    def __init__(self, burst: int, burst_s: float = 0.1):
        self.burst = burst
        self.burst_s = burst_s
        self.allowed = 0.0
        self.last: float | None = None
        self.lock = threading.Lock()

    def lead_s(self, done: int, target_gbps: float, now: float) -> float:
        """Seconds the work is ahead of the credit (0 if not ahead)."""
        rate = target_gbps * GB
        with self.lock:
            if self.last is not None:
                self.allowed += rate * (now - self.last)
            self.allowed = min(self.allowed, done + max(self.burst, rate * self.burst_s))
            self.last = now
            return max(0.0, (done - self.allowed) / rate)


class Stressor:
    def __init__(self, threads: int, size_mib: int, kernel: str, cpus: list[int] | None,
                 target_gbps: float | None, ramp: str | None, ramp_period: float, chunk_kib: int = 4096):
        n = size_mib * (1 << 20) // 8
        self.a = np.full(n, 1.0)
        self.b = np.full(n, 2.0)
        self.c = np.full(n, 0.0)  # written now, so its pages are not faulted in on the clock
        self.kernel = kernel
        self.threads = threads
        self.cpus = cpus
        self.target = target_gbps
        self.ramp = ramp
        self.ramp_period = ramp_period
        self.chunk = max(1024, chunk_kib * 1024 // 8)
        self.done = [0] * threads  # bytes moved, per thread
        self.slept = [0.0] * threads  # seconds spent pacing, per thread
        self.pacer = Pacer(burst=2 * threads * self.chunk * BYTES_PER_ELEMENT[kernel])
        self.stop = threading.Event()
        self.t0 = 0.0

    def target_at(self, t: float) -> float | None:
        return ramp_target(self.ramp, self.target, t, self.ramp_period)

    def _worker(self, k: int) -> None:
        if self.cpus:
            os.sched_setaffinity(threading.get_native_id(), {self.cpus[k % len(self.cpus)]})
        n = self.a.shape[0]
        lo_all, hi_all = n * k // self.threads, n * (k + 1) // self.threads
        fn = KERNELS[self.kernel]
        per_element = BYTES_PER_ELEMENT[self.kernel]
        pos = lo_all
        while not self.stop.is_set():
            hi = min(pos + self.chunk, hi_all)
            fn(self.a, self.b, self.c, pos, hi)
            self.done[k] += (hi - pos) * per_element
            pos = hi if hi < hi_all else lo_all
            now = time.monotonic()
            target = self.target_at(now - self.t0)
            if target is not None:
                lead = self.pacer.lead_s(sum(self.done), target, now)
                # Sleep only a lead worth sleeping: each wake-up costs tens of microseconds,
                # which at a high target would be bandwidth lost on every chunk.
                if lead > MIN_SLEEP_S:
                    self.stop.wait(min(lead, 0.05))
                    self.slept[k] += time.monotonic() - now

    def run(self, duration: float | None, report) -> dict:
        KERNELS[self.kernel](self.a, self.b, self.c, 0, min(1024, self.a.shape[0]))  # compile before timing
        cpu0 = time.process_time()
        self.t0 = time.monotonic()
        workers = [threading.Thread(target=self._worker, args=(k,), daemon=True) for k in range(self.threads)]
        for w in workers:
            w.start()
        samples = []
        prev_bytes, prev_slept, prev_t = 0, 0.0, self.t0
        second = 1
        while not self.stop.is_set():
            deadline = self.t0 + second
            if duration is not None:
                deadline = min(deadline, self.t0 + duration)
            self.stop.wait(max(0.0, deadline - time.monotonic()))
            now = time.monotonic()
            moved, slept = sum(self.done), sum(self.slept)
            if now - prev_t > 0.05:
                gbps = (moved - prev_bytes) / (now - prev_t) / GB
                target = self.target_at(now - self.t0 - 0.5)
                busy = 1.0 - (slept - prev_slept) / (self.threads * (now - prev_t))
                sample = {"t": round(now - self.t0, 3), "achieved_gbps": round(gbps, 3),
                          "target_gbps": None if target is None else round(target, 3),
                          "busy": round(min(1.0, max(0.0, busy)), 3)}
                samples.append(sample)
                report(sample)
            prev_bytes, prev_slept, prev_t = moved, slept, now
            second += 1
            if duration is not None and now - self.t0 >= duration:
                self.stop.set()
        for w in workers:
            w.join()
        elapsed = time.monotonic() - self.t0
        cpu = time.process_time() - cpu0  # the run's own CPU, without start-up (arrays, JIT cache)
        return {"seconds": round(elapsed, 3), "bytes": sum(self.done),
                "mean_gbps": round(sum(self.done) / elapsed / GB, 3), "cpu_s": round(cpu, 3), "kernel": self.kernel,
                "threads": self.threads, "target_gbps": self.target, "ramp": self.ramp}


def parse_cpus(text: str) -> list[int]:
    from resctrl.cpulist import parse_cpu_list

    try:
        return sorted(parse_cpu_list(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.stress", description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--size", type=int, default=512, help="MiB per array (three arrays); well beyond the LLC")
    ap.add_argument("--kernel", choices=sorted(KERNELS), default="triad")
    ap.add_argument("--cpus", type=parse_cpus, help="pin thread k to the k-th CPU of this list, e.g. 0-3")
    ap.add_argument("--target-gbps", type=float, help="hold this bandwidth instead of the maximum")
    ap.add_argument("--ramp", choices=["steps", "sine", "square"], help="shape the target over time")
    ap.add_argument("--ramp-period", type=float, default=20.0, help="seconds per ramp cycle")
    ap.add_argument("--duration", type=float, help="seconds (default: until SIGTERM/SIGINT)")
    ap.add_argument("--json", action="store_true", help="one JSON object per second on stdout")
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error(f"--threads must be at least 1, got {args.threads}")
    if args.size < 1:
        ap.error(f"--size must be at least 1 MiB, got {args.size}")
    if args.target_gbps is not None and args.target_gbps <= 0:
        ap.error(f"--target-gbps must be positive, got {args.target_gbps}")
    if args.ramp and args.target_gbps is None:
        ap.error("--ramp shapes a target: give --target-gbps too")
    if args.ramp_period <= 0:
        ap.error(f"--ramp-period must be positive, got {args.ramp_period}")
    stressor = Stressor(args.threads, args.size, args.kernel, args.cpus, args.target_gbps, args.ramp,
                        args.ramp_period)
    stop_on_signals(stressor.stop)

    def progress(sample: dict) -> str:
        target = "full speed" if sample["target_gbps"] is None else f"target {sample['target_gbps']:.2f}"
        return f"t={sample['t']:7.1f}s  {sample['achieved_gbps']:7.2f} GB/s  ({target}) "

    report = reporter(args.json, stressor.stop, progress)

    summary = stressor.run(args.duration, report)
    if args.json:
        emit({"summary": summary})
    else:
        print(f"\n{args.kernel}: {summary['mean_gbps']:.2f} GB/s on average over {summary['seconds']:.1f} s, "
              f"{args.threads} thread(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
