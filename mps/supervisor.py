"""Keeping the MPS control daemon up, from a thread of its own.

The daemon's loop never waits on MPS: it reads ``state``. Here, one thread starts
the daemon, checks its health every ``health_interval_s`` (a command answered
within ``health_timeout_s``; see ``MpsControl.check``) and restarts it with backoff
when it died, a server faulted, or it stopped answering ``unhealthy_after`` checks
in a row (one slow answer on a loaded host must not cost every GPU job its MPS
server). Each start, the first and every restart, goes through ``MpsControl.start``,
which sets the daemon's defaults: they cannot be forgotten after a restart.

``close()`` is bounded and safe at any point (before ``start``, during a start that
hangs, twice): it kills what is in flight, lets the thread go, and stops MPS with a
deadline. Closing is also what ``with`` does.

``state``: ``idle`` (not started), ``starting``, ``ok`` (answering), ``unresponsive``
(a check went unanswered; restarted if it persists), ``down`` (a start failed; the
next one waits out the backoff), ``stopped``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from mps.control import MpsControl

from mps.errors import MpsError, MpsStopping

log = logging.getLogger(__name__)


class MpsSupervisor:
    def __init__(self, control: MpsControl, *, health_interval_s: float = 2.0, health_timeout_s: float = 2.0,
                 unhealthy_after: int = 2, backoff_s: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 30.0),
                 stable_s: float = 60.0, stop_budget_s: float = 0.7, clock: Callable[[], float] = time.monotonic):
        self.control = control
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.unhealthy_after = unhealthy_after
        self.backoff_s = backoff_s
        self.stable_s = stable_s  # a daemon up this long resets the backoff
        self.stop_budget_s = stop_budget_s
        self.clock = clock
        self.state = "idle"
        self.last_error: str | None = None
        self.restarts = 0
        self.last_restart_reason: str | None = None
        self.failures = 0  # in a row: starts that failed, daemons that died before stable_s
        self.start_failures = 0  # starts that failed, since noded started (for the metrics)
        self.next_start_at: float | None = None  # when the next start is due, while waiting out a backoff
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def pipe_dir(self) -> str:
        return self.control.pipe_dir

    def start(self) -> "MpsSupervisor":
        with self._lock:
            if self._closed or self._thread is not None:
                return self
            self.state = "starting"
            self._thread = threading.Thread(target=self._run, name="mps-supervisor", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        went_down = False  # since MPS last answered: a restart, or a start that failed
        while not self._stop.is_set():
            if self.failures:
                delay = self.backoff_s[min(self.failures - 1, len(self.backoff_s) - 1)]
                self.next_start_at = self.clock() + delay
                if self._stop.wait(delay):
                    break
                self.next_start_at = None
            self.state = "starting"
            try:
                self.control.start()
            except MpsStopping:
                break
            except Exception as e:  # a start that failed in any way is retried; the thread must not die
                self.failures += 1
                self.start_failures += 1
                self.state, self.last_error = "down", str(e)
                went_down = True
                log.error("mps=start_failed attempt=%d retry_in=%gs error=%s", self.failures,
                          self.backoff_s[min(self.failures - 1, len(self.backoff_s) - 1)], e)
                continue
            started = self.clock()
            if went_down:
                went_down = False
                # the end of the episode its restarting line began (what NodedMpsDown sees), at the
                # same level, so the log says when MPS answered again and not only when it went
                log.warning("mps=up again pid=%s (since noded started: %d restarts, %d failed starts)",
                            self.control.pid(), self.restarts, self.start_failures)
            self.state, self.last_error = "ok", None
            reason = self._watch()
            if reason is None:
                break  # closing
            self.last_error = self.last_restart_reason = reason
            self.state = "down"
            went_down = True
            self.failures = self.failures + 1 if self.clock() - started < self.stable_s else 0
            log.warning("mps=restarting reason=%r restarts=%d", reason, self.restarts + 1)
            try:
                self.control.reset()
            except Exception:
                log.exception("mps: clearing the failed daemon failed")
            self.restarts += 1

    def _watch(self) -> str | None:
        """Health checks until one says restart (its reason), or closing (None)."""
        silent = 0
        while not self._stop.wait(self.health_interval_s):
            try:
                problem = self.control.check(self.health_timeout_s)
            except MpsStopping:
                return None
            except Exception as e:  # a check that cannot be made counts as no answer
                problem_kind, message = "silent", f"health check failed: {e}"
            else:
                if problem is None:
                    if silent:
                        log.warning("mps=answering again after %d unanswered checks", silent)
                    silent = 0
                    self.state = "ok"
                    continue
                problem_kind, message = problem.kind, problem.message
            if problem_kind != "silent":
                return message
            silent += 1
            self.state, self.last_error = "unresponsive", message
            if silent >= self.unhealthy_after:
                return f"{message} ({silent} checks in a row)"
            log.warning("mps=unresponsive checks=%d error=%s", silent, message)
        return None

    def close(self) -> None:
        """Bounded (about ``stop_budget_s`` plus a short join), at any point, more than once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        self._stop.set()
        self.control.interrupt()
        if thread is not None:
            thread.join(timeout=0.2)
            if thread.is_alive():
                log.error("mps supervisor did not finish in 0.2s; stopping MPS beside it")
        try:
            self.control.stop(self.stop_budget_s)
        except MpsError as e:
            log.error("stopping MPS failed: %s", e)
        self.state = "stopped"

    def __enter__(self) -> "MpsSupervisor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
