"""A benchmark process that reports one JSON object per line on stdout (the stressor,
a victim), started in a given cgroup with given CPUs, its latest report always at hand."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where `bench` imports


class ReportingProcess:
    """``python -m MODULE ARGS --json``, moved into ``cgroup`` (a directory with
    ``cgroup.procs``) before it execs, so every thread it makes starts there."""

    def __init__(self, module: str, args: list[str], *, cgroup: str | None = None, cpus: str | None = None):
        argv = [sys.executable, "-m", module, *args, "--json"]
        if cpus is not None:
            # An affinity set on this process is inherited, and the kernel keeps it within
            # any cpuset the child joins: start the workload with the CPUs it is meant to have.
            argv = ["taskset", "-c", cpus, *argv]
        if cgroup is not None:
            # The shell joins the cgroup, then execs: no instant of the workload runs outside it.
            argv = ["sh", "-c", f'echo $$ > {shlex.quote(cgroup)}/cgroup.procs && exec "$@"', "sh", *argv]
        self.argv = argv
        self._stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: it can never fill and block
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                     cwd=REPO_ROOT)
        self.reports: list[dict] = []
        self.summary: dict | None = None
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._cond:
                if "summary" in obj:
                    self.summary = obj["summary"]
                elif "t" in obj:
                    self.reports.append(obj)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def latest(self) -> dict | None:
        with self._cond:
            return self.reports[-1] if self.reports else None

    def wait_reports(self, count: int, timeout: float) -> bool:
        """Wait until at least ``count`` reports have arrived (False at the deadline or exit)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.reports) < count:
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def since(self, index: int) -> list[dict]:
        with self._cond:
            return list(self.reports[index:])

    def stop(self, timeout: float = 20.0) -> dict | None:
        """SIGTERM, wait for its summary; SIGKILL if it does not stop."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout)
        return self.summary

    def failure(self) -> str:
        """What it said on stderr, for an error message."""
        self._stderr.seek(0)
        err = self._stderr.read()
        return f"{' '.join(self.argv)} exited {self.proc.returncode}: {err.strip()[-500:]}"
