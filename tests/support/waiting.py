"""Waiting on a condition with a deadline, never a fixed sleep: a condition polled
(``wait_for``, nodesim.waiting's, the one the benchmarks use too) or a line a process
prints (``read_until``)."""

from __future__ import annotations

import os
import queue
import threading
import time

from nodesim.waiting import wait_for

from noded.util.settled import SETTLE_S

__all__ = ["read_until", "settled", "thread_stacks", "wait_for"]


_readers: dict[int, tuple] = {}


def read_until(stream, text, what, timeout=30.0):
    """The next line of a process's output holding ``text``. Fails at EOF or at the
    deadline with everything read so far: a reader never spins on EOF nor waits forever.
    (A thread per stream feeds a queue, so lines Python has buffered are never missed.)"""
    if id(stream) not in _readers:
        q: queue.Queue = queue.Queue()
        reader = threading.Thread(target=lambda: [q.put(line) for line in iter(stream.readline, "")] + [q.put(None)],
                                  daemon=True)
        reader.start()
        _readers[id(stream)] = (stream, q, [], reader)
    _, q, seen, _ = _readers[id(stream)]
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = q.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {what} within {timeout}s; output so far:\n{''.join(seen)}") from None
        if line is None:
            q.put(None)
            raise AssertionError(f"the process ended before {what}; its output:\n{''.join(seen)}")
        seen.append(line)
        if text in line:
            return line



def stop_reading(stream, timeout=30.0) -> None:
    """``read_until``'s reader of ``stream`` ended and ``stream`` closed, once the process
    and every process that inherited the stream are gone (the reader ends at their EOF), so
    that a test's reader thread and pipe do not outlive it. A stream some process still
    holds after ``timeout`` is left open: closing it under its reader would break the read."""
    entry = _readers.pop(id(stream), None)
    if entry is not None:
        entry[3].join(timeout)
        if entry[3].is_alive():
            return
    stream.close()

def thread_stacks() -> str:
    """Every thread's stack in this process, for the message of a test that timed out
    waiting on something another thread should have done."""
    import sys
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(f"--- thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
                     for ident, frame in sys._current_frames().items())


def ended(process) -> None:
    """``process`` gone: killed if it still runs (a test that failed before stopping it), and
    reaped either way, so that no process outlives its test."""
    if process.poll() is None:
        process.kill()
    process.wait()


def settled(path, timeout=10.0) -> None:
    """Wait until the file at ``path`` has been unchanged for the settle time, as a reload
    wants it (noded.util.settled): one reloaded sooner is read again a tick later."""
    wait_for(lambda: time.time_ns() - os.stat(path).st_ctime_ns > SETTLE_S * 1e9, timeout=timeout, interval=0.05,
             what=f"{path} unchanged for {SETTLE_S:g} s")
