"""``noded calibrate``: this host's peak memory bandwidth, measured and written where
noded reads its node peak (``<state_dir>/calibration.json``, see ``noded.stores.calibration``).

STREAM's triad (``a = b + 3·c``) runs at full speed on one thread per CPU this process
may use, each pinned to its CPU and working on its own slice of three arrays well
beyond any last-level cache. Stores are non-temporal: they write around the cache, so
the bytes counted (STREAM's count, 24 per element) are the bytes that cross the
memory bus, as resctrl's MBM counts them. The rate is sampled once a second; the
peak is the median of the samples after the first (the first holds the threads'
start and any page faults), divided over the host's L3 domains, as noded compares
each domain with it.

Measure on a quiet host with noded stopped: other load lowers the figure, and a
running noded may throttle the measurement as it would any bandwidth hog.
"""

from __future__ import annotations

import datetime
import glob
import math
import os
import statistics
import sys
import threading
import time
from typing import Callable

import llvmlite.ir as ir
import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from noded.stores.calibration import Calibration, calibration_path, write_calibration
from noded.stores.securedir import SecureDir, SecureDirError, StateWriteError

GB = 1e9
#: triad: two arrays read, one written, 8 bytes each (STREAM's count)
BYTES_PER_ELEMENT = 24
SCALAR = 3.0
#: elements per kernel call: 4 MiB of each array, a few milliseconds of work
CHUNK = 1 << 19
MIN_SECONDS = 2  # the first second is not counted

Progress = Callable[[int, int], None]  # (seconds done, seconds in all); 0 done: about to start


@intrinsic
def _stream_store(typingctx, array, index, value):
    """``array[index] = value`` as a non-temporal (streaming) store.

    Streaming stores write around the cache: no read-for-ownership of the line first, so
    the bytes counted are the bytes that cross the memory bus (what MBM counts), and the
    kernel is not held back reading what it is about to overwrite. ``index`` must be in
    range: nothing checks it here."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        store = builder.store(args[2], builder.gep(data, [args[1]]))
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


@numba.njit(nogil=True, cache=True)
def _triad(a, b, c, lo, hi):
    # Views indexed from 0, so the loop bound is a plain length and LLVM vectorises it.
    y, z, dst = b[lo:hi], c[lo:hi], a[lo:hi]
    for i in range(dst.shape[0]):
        _stream_store(dst, i, y[i] + SCALAR * z[i])


def l3_domains(sysfs: str = "/sys/devices/system/cpu") -> int:
    """Distinct L3 caches (by the CPUs sharing each); 1 where sysfs does not say."""
    shared = set()
    for path in glob.glob(f"{sysfs}/cpu[0-9]*/cache/index*/level"):
        with open(path) as f:
            if f.read().strip() != "3":
                continue
        with open(os.path.join(os.path.dirname(path), "shared_cpu_list")) as f:
            shared.add(f.read().strip())
    return max(1, len(shared))


def measure_peak_gbps(seconds: float, size_mib: int = 512, threads: int | None = None,
                      progress: Progress | None = None) -> float:
    """The median per-second rate (GB/s, the whole host) of the triad at full speed,
    ``threads`` threads (default: one per CPU) pinned to this process's CPUs in turn."""
    if seconds < MIN_SECONDS:
        raise ValueError(f"seconds must be at least {MIN_SECONDS} (the first is not counted), got {seconds:g}")
    cpus = sorted(os.sched_getaffinity(0))
    threads = threads or len(cpus)
    n = size_mib * (1 << 20) // 8
    if threads < 1 or n < threads:
        raise ValueError(f"{threads} thread(s) cannot share arrays of {size_mib} MiB")
    a, b, c = np.full(n, 1.0), np.full(n, 2.0), np.full(n, 0.5)  # every page touched before the clock
    _triad(a, b, c, 0, min(n, 1024))  # compiled (or loaded from numba's cache) before the clock
    moved = [0] * threads  # bytes, per thread: each writes only its own slot
    stop = threading.Event()
    failed: list[BaseException] = []

    def work(k: int) -> None:
        try:
            os.sched_setaffinity(threading.get_native_id(), {cpus[k % len(cpus)]})
            lo, hi_all = n * k // threads, n * (k + 1) // threads
            pos = lo
            while not stop.is_set():
                hi = min(pos + CHUNK, hi_all)
                _triad(a, b, c, pos, hi)
                moved[k] += (hi - pos) * BYTES_PER_ELEMENT
                pos = hi if hi < hi_all else lo
        except BaseException as e:  # noqa: BLE001 - reported by the measuring thread
            failed.append(e)
            stop.set()

    workers = [threading.Thread(target=work, args=(k,), name=f"noded-calibrate-{k}", daemon=True)
               for k in range(threads)]
    total = math.ceil(seconds)
    rates = []
    if progress:
        progress(0, total)
    t0 = prev_t = time.monotonic()
    for w in workers:
        w.start()
    try:
        prev = 0
        for second in range(1, total + 1):
            stop.wait(max(0.0, t0 + min(second, seconds) - time.monotonic()))
            if failed:
                break
            now, done = time.monotonic(), sum(moved)
            rates.append((done - prev) / (now - prev_t) / GB)
            prev, prev_t = done, now
            if progress:
                progress(second, total)
    finally:
        stop.set()
        for w in workers:
            w.join()
    if failed:
        raise RuntimeError(f"a measuring thread failed: {failed[0]!r}")
    return statistics.median(rates[1:])


def calibrate(state_dir: str, command: str, seconds: float = 10, size_mib: int = 512, threads: int | None = None,
              progress: Progress | None = None) -> tuple[Calibration, str]:
    """Measure, then write ``calibration.json`` into ``state_dir``: (the calibration, its
    absolute path). The state directory is checked (and made, 0700) first, so a bad one is
    refused before the measurement; raises SecureDirError or StateWriteError for it.

    A relative ``state_dir`` is taken from the current directory and the path returned is
    absolute: noded's state_dir must be absolute, so the operator is shown the one its
    config must name for noded to read this (a bare 'state' read as noded's own was a
    calibration no noded read)."""
    state_dir = os.path.abspath(state_dir)
    with SecureDir(state_dir, mode=0o700) as d:
        total = measure_peak_gbps(seconds, size_mib, threads, progress)
        domains = l3_domains()
        cal = Calibration(round(total / domains, 2), domains,
                          datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), command)
        write_calibration(d, cal)
    return cal, calibration_path(state_dir)


def main(state_dir: str, seconds: float, size_mib: int, threads: int | None, command: str) -> int:
    """The command: progress on stderr, the result on stdout; 1 with the reason when the
    measurement or the write fails."""
    tty = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if done == 0:  # the state directory was accepted and the arrays are ready
            shown = threads or len(os.sched_getaffinity(0))
            print(f"noded calibrate: triad on {shown} thread(s), {3 * size_mib} MiB, {seconds:g} s",
                  file=sys.stderr, flush=True)
        elif tty:
            print(f"\r  {done}/{total} s", end="" if done < total else "\n", file=sys.stderr, flush=True)

    try:
        cal, path = calibrate(state_dir, command, seconds, size_mib, threads, progress)
    except MemoryError:
        print(f"noded calibrate: not enough memory for three arrays of {size_mib} MiB; give a smaller --size",
              file=sys.stderr)
        return 1
    except (SecureDirError, StateWriteError, OSError, RuntimeError, ValueError) as e:
        print(f"noded calibrate: {e}", file=sys.stderr)
        return 1
    print(f"peak {cal.peak_gbps_per_domain:.2f} GB/s per L3 domain ({cal.domains} domain(s)); wrote {path}\n"
          f"command: {cal.command}\n"
          f"noded uses it at its next start or reload where its config's state_dir is {os.path.dirname(path)} "
          "and its peak_gbps_per_domain unset",
          flush=True)
    return 0
