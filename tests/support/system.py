"""What the system tests share: a simulated node (`noded sim-node`) and noded beside it as
a host runs it (`noded run --config`), each a process of its own, started and stopped by
nodesim.launch (the launcher `noded run --sim` and the benchmarks use), and what is left in
the kernel afterwards."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import urllib.request

from nodesim import launch
from nodesim.launch import DaemonProcess, SimNodeProcess, leftovers
from nodesim.parentdeath import die_with_parent
from support.host import skip_if_another_noded
from support.waiting import ended

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPUSET = "/sys/fs/cgroup/cpuset"


def popen_noded(argv: list[str], **kw) -> subprocess.Popen:
    """``python -m noded ARGV`` as a test starts it by hand: SIGTERM when the process that
    started it dies, so a worker killed by its timeout leaves no noded holding the host's lock
    (one did, after its FUSE mount was gone, and every later sim node on that device number
    was refused)."""
    return subprocess.Popen([sys.executable, "-m", "noded", *argv], preexec_fn=die_with_parent, **kw)


def start_sim_node(tmp_path, scenario="scenarios/contention.yaml",
                   config="scenarios/demo-config.yaml") -> tuple[subprocess.Popen, dict[str, str]]:
    """``noded sim-node SCENARIO --config CONFIG`` (run from the repository: paths relative
    to it) in ``tmp_path/node``, ready: (its process, the environment it printed)."""
    node = _sim_node(tmp_path, scenario, config)
    return node.proc, node.env


def _sim_node(tmp_path, scenario, config) -> SimNodeProcess:
    os.makedirs(tmp_path / "node")
    return SimNodeProcess(scenario, config, tmp_path / "node", hold=False, cwd=REPO, timeout=60)


@contextlib.contextmanager
def running_node(tmp_path, scenario="scenarios/contention.yaml", config="scenarios/demo-config.yaml"):
    """A simulated node for the test (``start_sim_node``'s arguments): its environment; at
    the end it is stopped (SIGTERM, SIGKILL past 60 s) and must leave nothing behind."""
    node = _sim_node(tmp_path, scenario, config)
    try:
        yield node.env
    finally:
        code, _ = node.stop()
    assert code == 0, node.said()
    assert leftovers(node.env) == []


def start_daemon(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """noded as a host runs it (nodesim.launch.DaemonProcess: its config and the driver's
    library path, nothing else; its stderr the caller's to read); and the metrics URL it
    prints first. Skips the test where it refused to run beside another noded."""
    try:
        daemon = DaemonProcess(env, timeout=60)
    except RuntimeError as e:
        skip_if_another_noded(str(e))  # it refused to run beside another noded: say whose
        raise AssertionError(str(e)) from None
    return daemon.proc, daemon.url


@contextlib.contextmanager
def daemon_process(env: dict[str, str]):
    """(the daemon's process, its metrics URL); killed if the test fails, else left for the
    test to stop (``stop``)."""
    daemon, url = start_daemon(env)
    try:
        yield daemon, url
    finally:
        ended(daemon)


def stop(daemon: subprocess.Popen, bound_s: float = 5.0) -> tuple[float, str]:
    """SIGTERM; (the seconds until it exited, cleanly, within ``bound_s``; its stderr). The
    unit allows 15 s before SIGKILL; this, 30."""
    code, took = launch.stop(daemon, 30)
    err = daemon.stderr.read()
    assert code == 0, f"noded exited with {code} {took:.1f}s after SIGTERM (SIGKILL past 30 s): {err}"
    assert took < bound_s, f"SIGTERM took {took:.1f}s: {err[-2000:]}"
    return took, err


@contextlib.contextmanager
def running_daemon(env: dict[str, str]):
    """A daemon on the node for the test: its metrics URL; stopped cleanly (SIGTERM, exit 0)
    at the end, or killed where the test failed."""
    daemon, url = start_daemon(env)
    try:
        yield url
    except BaseException:
        daemon.kill()
        daemon.wait()
        raise
    code, _ = launch.stop(daemon, 30)
    assert code == 0, daemon.stderr.read()


def scrape(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def noded_groups(resctrl: str) -> list[str]:
    """noded's control and monitoring groups, as the (emulated) kernel lists them."""
    groups = [d for d in os.listdir(resctrl) if d.startswith("noded-")]
    mon = os.path.join(resctrl, "mon_groups")
    return groups + [f"mon_groups/{d}" for d in os.listdir(mon) if d.startswith("noded-")]


def cpusets(top: str) -> dict[str, str]:
    out = {}
    for d in sorted(os.listdir(top)):
        if os.path.isdir(os.path.join(top, d)):
            with open(os.path.join(top, d, "cpuset.cpus")) as f:
                out[d] = f.read().strip()
    return out


def inject(env: dict[str, str], *faults: dict) -> None:
    """Faults the simulated node applies at once (its faults file, written whole)."""
    import yaml

    path = env["NODED_SIM_FAULTS"]
    with open(path + ".tmp", "w") as f:
        yaml.safe_dump(list(faults), f)
    os.replace(path + ".tmp", path)


def value(text: str, pattern: str) -> float | None:
    """The number ``pattern``'s first group matches in ``text`` (metrics), or None."""
    m = re.search(pattern, text, re.M)
    return None if m is None else float(m.group(1))


def shared_node(env: dict[str, str]):
    """The simulated node as the stand-in NVML library reads it now (nodesim.nvml_shm.Node)."""
    import ctypes

    from nodesim.nvml_shm import Node

    with open(env["NODED_SIM_NVML"], "rb") as f:
        return Node.from_buffer_copy(f.read(ctypes.sizeof(Node)))


def compute_modes(env: dict[str, str]) -> list[int]:
    """Each simulated GPU's compute mode as the driver holds it now (0: DEFAULT)."""
    node = shared_node(env)
    return [node.driver.compute_mode[i] for i in range(node.published.gpu_count)]


def slow_ms(env: dict[str, str], call: str, gpu: int = 0) -> int:
    """How long ``call`` on ``gpu`` is made to take now (an injected fault in force: 0, none)."""
    from nodesim.nvml_shm import CALL_INDEX

    return shared_node(env).published.gpus[gpu].slow_ms[CALL_INDEX[call]]
