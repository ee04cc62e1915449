"""``python -m bench.victims.loader NAME --workers N [--batch S] [--job ID --report-socket PATH] [--json]``

A training job's CPU side as a data loader runs it: ``N`` worker processes each make
samples with a bench victim (``decode`` or ``tokenise``, as ``python -m bench.victims``
does) and hand them to the training loop, this process, which takes ``S`` samples per
iteration. The GPU side is taken to be instant: the job is input-bound, so its speed is
its workers' and rises with the cores they may run on up to one core per worker (its
knee), as a CPU-sensitive model's does (CODA Fig. 3).

Each iteration's time is measured from its samples' own finishing time (the worker whose
batch completes it stamps it), so the loop's own pauses do not show in it; with ``--job`` it
is reported to noded's report socket (``noded.colocation.client.report_iteration``, the
call a training script makes), which never raises and never blocks for long.

Every second it prints ``{"t", "samples_per_s", "iterations", "iteration_s", "cpus"}``
(with ``--json`` one object per line on stdout, else a live line on stderr): ``cpus`` is
how many CPUs it may run on now (its cpuset bounds them). SIGTERM or SIGINT stops it and
its workers; a worker whose loop has gone exits at its next hand-over.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import multiprocessing
import os
import select
import signal
import struct
import sys
import threading
import time

from bench.jsonlines import emit, reporter, stop_on_signals

from . import VICTIMS, make_victim

#: one iteration's end: its number and when its last sample was done (monotonic s);
#: smaller than PIPE_BUF, so the workers' writes to one pipe never interleave
RECORD = struct.Struct("<Qd")
#: glibc's mallopt parameters, and the size below which a worker's arrays come from its heap
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
HEAP_BYTES = 256 << 20
#: how often the loop looks at its stop flag and the time while no iteration ends
POLL_S = 0.1


def keep_buffers() -> bool:
    """Keep freed arrays in the heap for the next batch, as a real loader reuses its buffers.
    Otherwise glibc maps and unmaps each large temporary: page faults then take about half
    of a worker's time, in the kernel, and how long they take depends on the host's memory
    management more than on the cores (it doubles the speed and steadies it here). False
    where the C library is not glibc (nothing changed)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, HEAP_BYTES))


def worker(name: str, seed: int, made, batch: int, fd: int, loop_fd: int) -> None:
    """Make samples until the loop is gone (its end of the pipe closed). Each batch of
    samples is counted in ``made`` (shared by every worker); the batch that completes an
    iteration writes its end to the pipe, so the loop wakes once an iteration, not once a
    batch (it would take CPU time from a worker sharing its core)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the loop's to act on
    os.close(loop_fd)  # only the loop reads: its exit must leave the pipe without a reader
    keep_buffers()
    victim = make_victim(name, seed=seed)
    try:
        while True:
            n, _ = victim.step()
            with made.get_lock():  # under the lock: iteration ends are written in order
                before = made.value
                made.value = before + n
                if made.value // batch > before // batch:
                    os.write(fd, RECORD.pack(made.value // batch, time.monotonic()))
    except BrokenPipeError:
        pass


def run(name: str, workers: int, batch: int, report, stop: threading.Event, seed: int = 0,
        job: str | None = None, socket_path: str | None = None, duration: float | None = None) -> dict:
    from noded.colocation.client import report_iteration

    read_fd, write_fd = os.pipe()
    ctx = multiprocessing.get_context("fork")
    made = ctx.Value("Q", 0)
    procs = [ctx.Process(target=worker, args=(name, seed + i, made, batch, write_fd, read_fd), daemon=True)
             for i in range(workers)]
    for p in procs:
        p.start()
    os.close(write_fd)  # the workers hold it now: when they are all gone the pipe says so
    t0 = time.monotonic()
    window_start, window_made, window_times = t0, 0, []
    iterations = 0
    last_end: float | None = None  # the first iteration's end only starts the clock (workers warming up)
    pending = b""
    try:
        while not stop.is_set():
            if select.select([read_fd], [], [], POLL_S)[0]:
                data = os.read(read_fd, 64 * RECORD.size)
                if not data:
                    raise RuntimeError("every worker has exited")
                pending += data
                usable = len(pending) // RECORD.size * RECORD.size
                for _, end in RECORD.iter_unpack(pending[:usable]):
                    if last_end is not None:
                        seconds = end - last_end
                        iterations += 1
                        window_times.append(seconds)
                        if job:
                            report_iteration(seconds, job=job, socket_path=socket_path)
                    last_end = end
                pending = pending[usable:]
            now = time.monotonic()
            if now - window_start >= 1.0:
                span, total = now - window_start, made.value
                report({"t": round(now - t0, 3), "samples_per_s": round((total - window_made) / span, 1),
                        "iterations": len(window_times),
                        "iteration_s": round(sum(window_times) / len(window_times), 5) if window_times else None,
                        "cpus": len(os.sched_getaffinity(0))})
                window_start, window_made, window_times = now, total, []
            if duration is not None and now - t0 >= duration:
                break
    finally:
        os.close(read_fd)  # a worker's next write fails: it exits
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(5)
    elapsed = time.monotonic() - t0
    return {"victim": name, "workers": workers, "batch": batch, "seconds": round(elapsed, 3), "samples": made.value,
            "iterations": iterations, "samples_per_s": round(made.value / elapsed, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.victims.loader", description=__doc__.splitlines()[2])
    ap.add_argument("name", choices=VICTIMS)
    ap.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--batch", type=int, default=4096, help="samples per iteration (default 4096)")
    ap.add_argument("--job", help="report each iteration's time to noded as this job (e.g. cgroup:victim)")
    ap.add_argument("--report-socket", help="noded's report socket (default: $NODED_REPORT_SOCKET, else noded's)")
    ap.add_argument("--duration", type=float, help="seconds (default: until SIGTERM/SIGINT)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.workers < 1 or args.batch < 1:
        ap.error("--workers and --batch must be at least 1")
    if args.duration is not None and args.duration <= 0:
        ap.error(f"--duration must be positive, got {args.duration}")
    stop = stop_on_signals(threading.Event())
    report = reporter(args.json, stop,
                      lambda line: f"t={line['t']:7.1f}s  {line['samples_per_s']:9.1f} samples/s  {line['cpus']} CPUs")

    if args.json:
        emit({"ready": args.name, "workers": args.workers})
    summary = run(args.name, args.workers, args.batch, report, stop, seed=args.seed, job=args.job,
                  socket_path=args.report_socket, duration=args.duration)
    if args.json:
        emit({"summary": summary})
    else:
        print(f"\n{args.name} x{args.workers}: {summary['samples_per_s']:.1f} samples/s over "
              f"{summary['seconds']:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
