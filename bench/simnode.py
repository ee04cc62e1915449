"""A simulated node and noded beside it, each a process of its own, as on a host.

``noded sim-node SCENARIO --config BASE --workdir DIR --hold`` prints its environment
(``NAME=value`` lines, then ``READY=1``); noded is then started exactly as a host starts
it, ``noded run --config $NODED_SIM_CONFIG``, with only ``LD_LIBRARY_PATH`` and
``NODED_SIM_NVML`` added to its environment. What the benchmarks that run noded this way
share: starting both, waiting on their output with a deadline, stopping them in order
(the daemon first, while the node it releases is still there; then the node), CPU time
from ``/proc``, a process's descendants, and what a node leaves in the kernel.

Both children run in sessions of their own (a terminal's Ctrl-C reaches only the
benchmark, which stops them in that order) and get SIGTERM if the benchmark dies.
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")
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


def _spawn(argv: list[str], log: str, **kw) -> subprocess.Popen:
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, "-m", "noded", *argv], stdout=subprocess.PIPE, stderr=err,
                                text=True, start_new_session=True, preexec_fn=die_with_parent, **kw)


def stop(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[int, float]:
    """SIGTERM, then wait for the exit (SIGKILL past ``timeout``): (exit status, seconds
    from the signal to the exit)."""
    t0 = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode, time.monotonic() - t0


def tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return ""


class SimNodeProcess:
    """``noded sim-node SCENARIO --config BASE --workdir WORKDIR/node --hold``; ``env`` is
    what it printed. Its log (stderr) goes to WORKDIR/node.log."""

    def __init__(self, scenario: str, base_config: str, workdir: str, timeout: float = 120.0):
        self.workdir = os.path.join(workdir, "node")
        os.makedirs(self.workdir)
        self.log = os.path.join(workdir, "node.log")
        self.proc = _spawn(["sim-node", scenario, "--config", base_config, "--workdir", self.workdir, "--hold"],
                           self.log, cwd=REPO)
        self.out = Lines(self.proc.stdout)
        self.env: dict[str, str] = {}
        try:
            while "READY" not in self.env:
                line = self.out.wait_for(lambda s: "=" in s, "READY=1 from the simulated node", timeout)
                name, _, value = line.rstrip("\n").partition("=")
                self.env[name] = value
        except RuntimeError as e:
            self.stop()
            raise RuntimeError(f"noded sim-node: {e}; its log:\n{tail(self.log)}") from None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 60.0) -> tuple[int, float]:
        return stop(self.proc, timeout)

    def leftovers(self) -> list[str]:
        """The node's mount and cgroups, where still there (nothing, after a clean stop)."""
        out = []
        root = self.env.get("NODED_SIM_RESCTRL")
        if root:
            with open("/proc/mounts") as f:
                out += [line.split()[1] for line in f if line.split()[1] == root]
        cgroup = self.env.get("NODED_SIM_CGROUP")
        if cgroup and os.path.exists(cgroup):
            out.append(cgroup)
        return out


class DaemonProcess:
    """``noded run --config $NODED_SIM_CONFIG`` as a host runs it (cwd /, the environment
    plus the driver's library path); ``url``: the metrics URL it prints first. Its log
    goes to ``log``; its later stdout is drained."""

    def __init__(self, env: dict[str, str], log: str, *, config: str | None = None, timeout: float = 120.0):
        self.log = log
        self.proc = _spawn(["run", "--config", config or env["NODED_SIM_CONFIG"]], log, cwd="/",
                           env={**os.environ, "LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"],
                                "NODED_SIM_NVML": env["NODED_SIM_NVML"]})
        self.out = Lines(self.proc.stdout)
        try:
            first = self.out.wait_for(lambda s: "http://" in s, "the metrics URL from noded", timeout)
        except RuntimeError as e:
            self.stop()
            raise RuntimeError(f"noded run: {e}; its output: {''.join(self.out.seen)}{tail(self.log)}") from None
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
                raise RuntimeError(f"noded exited ({self.proc.returncode}) before {what}: {tail(self.log)}")
            try:
                text = self.scrape()
                if test(text):
                    return text
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {timeout:g} s; noded's log: {tail(self.log)}")
            time.sleep(every)  # polling from outside, with the deadline above

    def stop(self, timeout: float = 60.0) -> tuple[int, float]:
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
    node = d = None
    left: list[str] = []
    try:
        node = SimNodeProcess(scenario, base, workdir)
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


# -- CPU time from /proc

def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command (field 3, the state, is [0])."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def descendants(pid: int) -> list[int]:
    """Every living process whose ancestry leads to ``pid`` (not ``pid`` itself)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parent[int(name)] = int(stat_fields(int(name))[1])
            except (OSError, IndexError, ValueError):
                continue
    children: dict[int, list[int]] = {}
    for p, pp in parent.items():
        children.setdefault(pp, []).append(p)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """pid -> CPU seconds, for ``pid`` and each living descendant (one that is gone by the
    time it is read is left out)."""
    out = {}
    for p in [pid, *descendants(pid)]:
        try:
            out[p] = cpu_seconds(p)
        except (OSError, IndexError):
            continue
    return out


def tree_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds a tree used between two ``tree_cpu_seconds`` readings: those alive at
    both, plus what new ones used since they started (those gone by the second reading
    are not counted; a steady node has none)."""
    return sum(v - before.get(p, 0.0) for p, v in after.items())


def metric(text: str, name: str, labels: str = "") -> float | None:
    """The value of a series in a scrape (``labels``: a regex over the label set), or None."""
    pattern = rf"^{re.escape(name)}" + (rf"\{{[^}}]*{labels}[^}}]*\}}" if labels else r"(?:\{[^}]*\})?") + r" (\S+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else None


def count_series(text: str, name: str, labels: str = "") -> int:
    return len(re.findall(rf"^{re.escape(name)}\{{[^}}]*{labels}[^}}]*\}} ", text, re.M))
