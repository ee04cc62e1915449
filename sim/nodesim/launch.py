"""One launcher for a simulated node and noded beside it, each a process of its own, as on a
host: what ``noded run --sim`` (nodesim.with_daemon), the benchmarks and the system tests
all start them with.

``noded sim-node SCENARIO --config BASE --workdir DIR [--hold]`` prints its environment
(``NAME=value`` lines, then ``READY=1``); noded is then started exactly as a host starts
it, ``noded run --config $NODED_SIM_CONFIG`` (cwd /), with only ``LD_LIBRARY_PATH`` and
``NODED_SIM_NVML`` added to its environment. Every child lives in a session of its own (a
terminal's Ctrl-C reaches only whoever started it, which stops the children in order: the
daemon first, while the node it releases is still there, then the node) and gets SIGTERM
when its starter dies (nodesim.parentdeath). Each wait has a deadline; a stop is SIGTERM,
then SIGKILL past its timeout; ``leftovers`` says what a node left in the kernel.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Callable, Iterator

from nodesim.parentdeath import die_with_parent

#: how long each child gets to stop on SIGTERM before it is killed
STOP_TIMEOUT_S = 60.0
#: how long a simulated node may take to print READY=1, a daemon its metrics URL
READY_TIMEOUT_S = 120.0


def spawn(argv: list[str], *, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw) -> subprocess.Popen:
    """``python -m noded ARGV``: text output, a session of its own, SIGTERM at its starter's death."""
    return subprocess.Popen([sys.executable, "-m", "noded", *argv], stdout=stdout, stderr=stderr, text=True,
                            start_new_session=True, preexec_fn=die_with_parent, **kw)


def stop(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> tuple[int, float]:
    """SIGTERM, then wait for the exit (SIGKILL past ``timeout``): (exit status, seconds
    from the signal to the exit). A process already gone is only reaped."""
    t0 = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode, time.monotonic() - t0


def daemon_environment(node_env: dict[str, str]) -> dict[str, str]:
    """This process's environment plus the driver's library path the node printed: all a
    daemon on the simulated node gets, as on a host."""
    return {**os.environ, "LD_LIBRARY_PATH": node_env["LD_LIBRARY_PATH"], "NODED_SIM_NVML": node_env["NODED_SIM_NVML"]}


def tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return ""


def leftovers(env: dict[str, str]) -> list[str]:
    """What a simulated node (its printed environment ``env``) left in the kernel: its
    emulator's mount (and any below it) and its cgroup, where still there (nothing, after a
    clean stop)."""
    out = []
    root = env.get("NODED_SIM_RESCTRL")
    if root:
        with open("/proc/mounts") as f:
            out += [point for point in (line.split()[1] for line in f) if point == root or point.startswith(root + "/")]
    cgroup = env.get("NODED_SIM_CGROUP")
    if cgroup and os.path.exists(cgroup):
        out.append(cgroup)
    return out


# -- reading a child's output with a deadline

class Lines:
    """A process's output read by a thread into a queue, so that a wait has a deadline and
    nothing it printed is lost (``seen``); after the wanted line it keeps draining, so a
    chatty process never blocks on a full pipe."""

    def __init__(self, stream):
        self.seen: list[str] = []
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in iter(stream.readline, ""):
            self._q.put(line)
        self._q.put(None)

    def wait_for(self, match: Callable[[str], bool], what: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"no {what} within {timeout:g} s") from None
            if line is None:
                self._q.put(None)
                raise RuntimeError(f"the process ended before {what}")
            self.seen.append(line)
            if len(self.seen) > 1000:
                del self.seen[:500]
            if match(line):
                return line


class NotReady(RuntimeError):
    """The simulated node did not print READY=1: it ended first (``exited``), or took too long."""

    def __init__(self, message: str, *, exited: bool):
        super().__init__(message)
        self.exited = exited


def read_environment(stdout, timeout: float = READY_TIMEOUT_S) -> dict[str, str]:
    """The ``NAME=value`` lines a simulated node prints, up to ``READY=1``. Raises NotReady
    where its output ends first (it exited) or it takes longer than ``timeout`` (then the
    caller stops it, which ends the reading). A thread reads, up to READY=1 and no further,
    so that the output is another reader's afterwards; closing a stream another thread
    reads would block on the stream's own lock instead."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stdout:
            lines.put(line)
            if line.startswith("READY="):
                return
        lines.put(None)

    threading.Thread(target=read, name="noded-sim-ready", daemon=True).start()
    deadline = time.monotonic() + timeout
    env: dict[str, str] = {}
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise NotReady(f"the simulated node was not ready within {timeout:g} s", exited=False) from None
        if line is None:
            raise NotReady("the simulated node exited before it was ready", exited=True)
        name, sep, value = line.rstrip("\n").partition("=")
        if sep:
            env[name] = value
        if name == "READY":
            return env


class StderrTail:
    """A child's stderr, held back (the last ``keep`` lines) until ``release``, then passed
    on as it comes: a node that fails to start is reported once, in the error that names
    its failure, and one that starts says what it says as before."""

    def __init__(self, stream, keep: int = 20):
        self._lines: list[str] = []
        self._keep = keep
        self._released = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), name="noded-sim-stderr", daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._lock:
                if not self._released:
                    self._lines = [*self._lines[-(self._keep - 1):], line]
                    continue
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):  # nobody reads this command's stderr any more
                return

    def tail(self, wait_s: float = 5.0) -> str:
        """What it said last (after its end, bounded by ``wait_s``)."""
        self._thread.join(timeout=wait_s)
        with self._lock:
            return "".join(self._lines).rstrip("\n")

    def release(self) -> None:
        with self._lock:
            self._released = True
            held, self._lines = self._lines, []
        sys.stderr.write("".join(held))
        sys.stderr.flush()


def not_ready_message(error: NotReady, node: subprocess.Popen, stderr: StderrTail) -> str:
    """The readiness error with the node's own failure: its exit status and last words. A
    node still running (too slow) is stopped first."""
    status = "still running: stopped"
    if error.exited:
        try:
            status = f"exit status {node.wait(timeout=5.0)}"  # its output ended: it is exiting
        except subprocess.TimeoutExpired:  # it closed its output and lives on
            stop(node)
    else:
        stop(node)
    said = stderr.tail()
    message = f"{error} ({status})"
    return f"{message}; its last words:\n{said}" if said else f"{message}; it said nothing on stderr"


# -- the two processes

class SimNodeProcess:
    """``noded sim-node SCENARIO [--config BASE] [--workdir WORKDIR] [--hold] [EXTRA...]``,
    started and waited on until READY=1 (``timeout``); ``env`` is what it printed. Its
    stderr goes to ``log`` where given, else is held back (``stderr``, a StderrTail: its
    last lines, in the error where it fails to start). Raises NotReady (the node stopped,
    its failure in the message) where it is not ready in time. Its output after READY=1
    is the caller's (``proc.stdout``)."""

    def __init__(self, scenario: str, base_config: str | None = None, workdir: str | None = None, *,
                 hold: bool = True, extra: tuple[str, ...] = (), log: str | None = None, cwd: str | None = None,
                 timeout: float = READY_TIMEOUT_S):
        self.workdir, self.log = workdir, log
        argv = ["sim-node", str(scenario), *(["--config", str(base_config)] if base_config else []),
                *(["--workdir", str(workdir)] if workdir else []), *(["--hold"] if hold else []), *extra]
        err = open(log, "w") if log else None
        try:
            self.proc = spawn(argv, stderr=err or subprocess.PIPE, cwd=cwd)
        finally:
            if err:
                err.close()
        self.stderr = None if log else StderrTail(self.proc.stderr)
        try:
            self.env = read_environment(self.proc.stdout, timeout)
        except NotReady as e:
            if self.stderr is not None:
                raise NotReady(f"noded sim-node: {not_ready_message(e, self.proc, self.stderr)}",
                               exited=e.exited) from None
            self.stop()
            raise NotReady(f"noded sim-node: {e}; its log:\n{tail(log)}", exited=e.exited) from None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> tuple[int, float]:
        return stop(self.proc, timeout)

    def said(self) -> str:
        """Its stderr's last lines (its log's, where it writes one)."""
        return tail(self.log) if self.log else self.stderr.tail() if self.stderr else ""

    def leftovers(self) -> list[str]:
        return leftovers(self.env)


class DaemonProcess:
    """``noded run --config $NODED_SIM_CONFIG`` (or ``config``) as a host runs it: cwd /, the
    environment plus the driver's library path (``daemon_environment``); ``url``: the
    metrics URL it prints first, within ``timeout``; its later stdout is drained. Its
    stderr goes to ``log`` where given, else to a pipe (``proc.stderr``, the caller's to
    read once it has ended). Raises RuntimeError (it is stopped, its output in the
    message) where it prints no URL in time."""

    def __init__(self, env: dict[str, str], log: str | None = None, *, config: str | None = None,
                 timeout: float = READY_TIMEOUT_S):
        self.log = log
        err = open(log, "w") if log else None
        try:
            self.proc = spawn(["run", "--config", config or env["NODED_SIM_CONFIG"]], stderr=err or subprocess.PIPE,
                              cwd="/", env=daemon_environment(env))
        finally:
            if err:
                err.close()
        self.out = Lines(self.proc.stdout)
        try:
            first = self.out.wait_for(lambda s: "http://" in s, "the metrics URL from noded", timeout)
        except RuntimeError as e:
            self.stop()
            said = tail(log) if log else self.proc.stderr.read()
            raise RuntimeError(f"noded run: {e}; its output: {''.join(self.out.seen)}{said}") from None
        self.url = re.search(r"http://\S+", first).group(0)
        self.port = int(re.search(r":(\d+)", self.url.split("//", 1)[1]).group(1))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def scrape(self, timeout: float = 10.0) -> str:
        return urllib.request.urlopen(self.url, timeout=timeout).read().decode()

    def wait_until(self, what: str, test: Callable[[str], bool], timeout: float = 120.0, every: float = 0.2) -> str:
        """Polls the metrics until ``test(text)`` (a deadline; noded's exit ends it early):
        the text that passed."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"noded exited ({self.proc.returncode}) before {what}: {tail(self.log or '')}")
            try:
                text = self.scrape()
                if test(text):
                    return text
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {timeout:g} s; noded's log: {tail(self.log or '')}")
            time.sleep(every)  # polling from outside, with the deadline above

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> tuple[int, float]:
        return stop(self.proc, timeout)


@contextlib.contextmanager
def node_and_daemon(scenario_text: str, base_config_text: str, *, prefix: str = "noded-bench-",
                    daemon: bool = True) -> Iterator[tuple[SimNodeProcess, DaemonProcess | None, str]]:
    """A simulated node with ``scenario_text`` and noded on it with ``base_config_text``,
    in a new directory; at the end (also on an error or Ctrl-C) the daemon is stopped,
    then the node, and the directory removed. Raises RuntimeError where either left
    anything behind (a mount, a cgroup, a process)."""
    workdir = tempfile.mkdtemp(prefix=prefix)
    os.chmod(workdir, 0o755)
    scenario, base = os.path.join(workdir, "scenario.yaml"), os.path.join(workdir, "base.yaml")
    with open(scenario, "w") as f:
        f.write(scenario_text)
    with open(base, "w") as f:
        f.write(base_config_text)
    os.makedirs(os.path.join(workdir, "node"))
    node = d = None
    left: list[str] = []
    try:
        node = SimNodeProcess(scenario, base, os.path.join(workdir, "node"), log=os.path.join(workdir, "node.log"))
        d = DaemonProcess(node.env, os.path.join(workdir, "noded.log")) if daemon else None
        yield node, d, workdir
    finally:
        try:
            if d is not None:
                d.stop()
        finally:
            if node is not None:
                code, _ = node.stop()
                left = node.leftovers()
            shutil.rmtree(workdir, ignore_errors=True)
    if left:  # after a clean run only: an error in the body is the one to show
        raise RuntimeError(f"the simulated node left {left} behind (exit status {code})")
