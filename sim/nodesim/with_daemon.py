"""`noded run --sim SCENARIO`: the simulated node and the daemon, as two processes, as on a host.

A thin wrapper: it starts ``noded sim-node SCENARIO --hold --watch`` and, once that is
ready, ``noded run --config`` with the config the node wrote and the environment it printed
(the driver's library path), nothing else: no simulation code runs in the daemon's process.
The daemon's output is this command's; the node's line a second is passed on. After the
duration (the scenario's, or ``--duration``), on SIGINT or SIGTERM, or when nobody reads
the output any more, the daemon is stopped first (it releases what it changed while the
node is still there), then the node. Both children die with this process (a parent-death
signal), and live in sessions of their own so that a terminal's Ctrl-C reaches only this
process, which stops them in that order. A node that ends before it is ready (it could not
build the stand-in NVML library, mount the emulator, ...) is reported at once with its exit
status and the last lines of its stderr; its stderr is held back until then, passed on after.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from noded.util.cliopts import say
from nodesim.parentdeath import die_with_parent

#: how long each child gets to stop on SIGTERM before it is killed
STOP_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0

def _spawn(argv: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "noded", *argv], start_new_session=True,
                            preexec_fn=die_with_parent, **kw)


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


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
            _stop(node)
    else:
        _stop(node)
    tail = stderr.tail()
    said = f"{error} ({status})"
    return f"{said}; its last words:\n{tail}" if tail else f"{said}; it said nothing on stderr"


def run_with_sim_node(scenario_path: str, duration_s: float, config: str | None, *, dry_run: bool = False,
                      verbose: bool = False) -> int:
    """Exit status: the daemon's (2 where the node could not start)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    node = daemon = None
    try:
        node = _spawn(["sim-node", scenario_path, "--hold", "--watch",
                       *(["--config", config] if config else []), *(["-v"] if verbose else [])],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stderr = StderrTail(node.stderr)
        try:
            env = read_environment(node.stdout)
        except NotReady as e:
            print(f"noded run --sim: {not_ready_message(e, node, stderr)}", file=sys.stderr)
            node = None
            return 2
        stderr.release()
        daemon = _spawn(["run", "--config", env["NODED_SIM_CONFIG"], *(["--dry-run"] if dry_run else []),
                         *(["-v"] if verbose else [])],
                        env={**os.environ, "LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"],
                             "NODED_SIM_NVML": env["NODED_SIM_NVML"]}, stdout=subprocess.PIPE, text=True)
        spoken = threading.Event()  # the daemon's first line (its metrics URL) is the first passed on
        stopping = threading.Event()  # from the daemon's stop on, its lines are the last passed on
        relays = [threading.Thread(target=_pass_on, args=(out, stop, spoken, stopping, out is daemon.stdout),
                                   name="noded-sim-output", daemon=True) for out in (daemon.stdout, node.stdout)]
        for relay in relays:
            relay.start()
        threading.Thread(target=lambda: (daemon.wait(), stop.set()), name="noded-daemon-wait", daemon=True).start()
        stop.wait(duration_s)
        stopping.set()
        code = _stop(daemon)
        daemon = None
        relays[0].join(timeout=STOP_TIMEOUT_S)  # the daemon's last lines before the node's end
        _stop(node)
        node = None
        say("noded: simulated node torn down.")
        return code
    finally:
        for p in (daemon, node):  # started, then something failed here: nothing is left behind
            if p is not None:
                _stop(p)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_writing = threading.Lock()


def _pass_on(lines, stop: threading.Event, spoken: threading.Event, stopping: threading.Event,
             daemons: bool) -> None:
    """A child's lines onto this command's output, whole lines, one writer at a time. The
    node's lines are dropped until the daemon's first is out (``spoken``) and once the daemon
    is being stopped (``stopping``: its goodbye is not interleaved with the node's status). A
    reader gone stops the run."""
    for line in lines:
        if not daemons and (not spoken.is_set() or stopping.is_set()):
            continue
        with _writing:
            ok = say(line.rstrip("\n"))
        if daemons:
            spoken.set()
        if not ok:
            stop.set()
            return
