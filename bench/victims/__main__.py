"""``python -m bench.victims decode|tokenise [--duration S] [--json] [--cpus LIST]``

Runs one victim workload and reports samples/second every second: a live line on
stderr, or with ``--json`` one object per line on stdout
(``{"t", "samples_per_s", "approx_gbps"}``) and a summary last. ``approx_gbps`` is
the bytes the pipeline's arrays read and write (an estimate, not a measurement).
SIGTERM or SIGINT stops it cleanly.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from bench.jsonlines import emit, reporter, stop_on_signals

from . import VICTIMS, make_victim

GB = 1e9


def run(victim, duration: float | None, report, stop: threading.Event) -> dict:
    t0 = time.monotonic()
    samples = moved = 0
    window_samples = window_bytes = 0
    window_start = t0
    while not stop.is_set():
        n, b = victim.step()
        samples += n
        moved += b
        window_samples += n
        window_bytes += b
        now = time.monotonic()
        if now - window_start >= 1.0:
            span = now - window_start
            report({"t": round(now - t0, 3), "samples_per_s": round(window_samples / span, 2),
                    "approx_gbps": round(window_bytes / span / GB, 3)})
            window_samples = window_bytes = 0
            window_start = now
        if duration is not None and now - t0 >= duration:
            break
    elapsed = time.monotonic() - t0
    return {"victim": victim.name, "seconds": round(elapsed, 3), "samples": samples,
            "samples_per_s": round(samples / elapsed, 2), "approx_gbps": round(moved / elapsed / GB, 3)}


def main(argv: list[str] | None = None) -> int:
    from bench.stress import parse_cpus

    ap = argparse.ArgumentParser(prog="python -m bench.victims", description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=VICTIMS)
    ap.add_argument("--duration", type=float, help="seconds (default: until SIGTERM/SIGINT)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cpus", type=parse_cpus, help="pin to these CPUs, e.g. 1")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.duration is not None and args.duration <= 0:
        ap.error(f"--duration must be positive, got {args.duration}")
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)
    victim = make_victim(args.name, seed=args.seed)
    stop = stop_on_signals(threading.Event())
    report = reporter(args.json, stop, lambda line: f"t={line['t']:7.1f}s  {line['samples_per_s']:9.1f} samples/s  "
                                                    f"~{line['approx_gbps']:.2f} GB/s")

    if args.json:
        emit({"ready": args.name})
    else:
        print(f"{args.name}: running", file=sys.stderr, flush=True)
    summary = run(victim, args.duration, report, stop)
    if args.json:
        emit({"summary": summary})
    else:
        print(f"\n{args.name}: {summary['samples_per_s']:.1f} samples/s over {summary['seconds']:.1f} s",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
