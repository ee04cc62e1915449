"""A call into something that may hang (a GPU driver), made with a deadline: the one way
noded bounds a call into NVML, both for the tick's samples (``DeadlineWorker``, one thread
kept) and for the rare calls that change a GPU (``call_within``, a thread a call).

NVML's calls run in the driver; a GPU falling off the bus or a wedged driver can make one
take seconds or never return, and ``nvidia-smi`` hanging is a known sight on such hosts.
Made in the tick's thread, such a call would stop noded altogether: no decision, no
release, no watchdog ping. ``DeadlineWorker`` runs one call at a time in a thread of its own
and the caller waits at most a deadline: past it, and for as long as that call has not
returned, every call is answered ``StillRunning`` at once (never a second call into the
hung one's way, never a second thread). One thread, made once, a daemon thread: a call that
never returns cannot hold up the process's exit.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from mps.errors import NvmlTimeout


class StillRunning(Exception):
    """The call (or an earlier one) has not returned; ``running_s``: for how long."""

    def __init__(self, running_s: float):
        super().__init__(f"a call has been running for {running_s:.1f} s")
        self.running_s = running_s


class DeadlineWorker:
    def __init__(self, name: str, *, clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.clock = clock
        self._cpu_done = 0.0  # CPU seconds the calls that returned took in the worker thread
        self._cpu_clock: int | None = None  # the worker thread's CPU clock, once it runs
        self._call_cpu0: float | None = None  # that clock when the call in flight began
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._work: tuple[Callable[[], Any], dict, threading.Event] | None = None
        self._since: float | None = None  # when the call in flight started
        self._thread: threading.Thread | None = None
        self._stopping = False

    def call(self, fn: Callable[[], Any], deadline_s: float) -> Any:
        """``fn()``'s value (or its exception), if it returns within ``deadline_s``; raises
        StillRunning otherwise, or at once while an earlier call is still in flight."""
        done = threading.Event()
        box: dict = {}
        with self._lock:
            if self._stopping:
                raise RuntimeError(f"{self.name}: stopped")
            if self._since is not None:
                raise StillRunning(self.clock() - self._since)
            self._since = self.clock()
            started = self._since
            self._work = (fn, box, done)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._wake.notify()
        if not done.wait(deadline_s):
            raise StillRunning(self.clock() - started)
        if "error" in box:
            raise box["error"]
        return box["value"]

    def cpu_s(self) -> float:
        """CPU seconds the calls have taken in the worker thread so far, a call still in
        flight included (a hung driver that spins shows here, not only once it returns)."""
        with self._lock:
            total = self._cpu_done
            if self._call_cpu0 is not None:  # the worker is inside a call: alive, its clock valid
                total += time.clock_gettime(self._cpu_clock) - self._call_cpu0
            return total

    def _run(self) -> None:
        self._cpu_clock = time.pthread_getcpuclockid(threading.get_ident())
        while True:
            with self._lock:
                while self._work is None and not self._stopping:
                    self._wake.wait()
                if self._work is None:
                    return
                fn, box, done = self._work
                self._work = None
                self._call_cpu0 = time.clock_gettime(self._cpu_clock)
            try:
                box["value"] = fn()
            except BaseException as e:  # handed to the caller, whatever it is
                box["error"] = e
            with self._lock:
                self._since = None
                # counted before done is set: the caller reads it once the call returned
                self._cpu_done += time.clock_gettime(self._cpu_clock) - self._call_cpu0
                self._call_cpu0 = None
            done.set()

    @property
    def stopped(self) -> bool:
        """Whether ``stop`` was called: no call is taken any more."""
        with self._lock:
            return self._stopping

    def stop(self) -> None:
        """No more calls; the thread ends once a call in flight returns (not waited for)."""
        with self._lock:
            self._stopping = True
            self._wake.notify()


def call_within(deadline_s: float, what: str, fn: Callable[[threading.Event], Any]) -> Any:
    """``fn(cancelled)``'s value (or its exception), made in a thread of its own and waited
    for at most ``deadline_s``: a driver that hangs must not hold whoever waits (a start, a
    stop). Past the deadline ``cancelled`` is set, so ``fn`` changes nothing more once its
    call returns, and NvmlTimeout says ``what`` was not done; the thread, a daemon one, is
    left to the driver (it ends once the call returns)."""
    cancelled = threading.Event()
    worker = DeadlineWorker("nvml-call")
    try:
        return worker.call(lambda: fn(cancelled), deadline_s)
    except StillRunning:
        cancelled.set()
        raise NvmlTimeout(f"NVML did not answer within {deadline_s:g} s {what}") from None
    finally:
        worker.stop()
