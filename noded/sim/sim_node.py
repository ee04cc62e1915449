"""`noded sim-node SCENARIO`: the simulated node as its own long-running process.

It starts what a GPU host has for noded, simulated at the lowest boundary: the resctrl
emulator mounted, the GPUs published through the stand-in ``libnvidia-ml.so.1``, the MPS
stand-in, and each job's processes in a real cpuset cgroup of its own (v1), with the
scenario's events over time. A daemon started the way systemd starts it, ``noded run
--config FILE``, in another process, then finds the jobs with a ``cgroup`` job source and
their models in a labels file, both written here into a config for it.

Once ready it prints, one ``NAME=value`` a line, what another process needs:
``LD_LIBRARY_PATH`` and ``NODED_SIM_NVML`` (pynvml sees the GPUs), ``NODED_SIM_CONFIG``
(a config for noded on this node: the base config given with ``--config``, pointed at all
of it), ``NODED_SIM_RESCTRL`` (the emulator's mount), ``NODED_SIM_CGROUP`` (the jobs'
cgroups), then ``READY=1``. SIGTERM or SIGINT tears everything down (jobs stopped, their
cgroups removed, the emulator unmounted); the jobs die with it if it is killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading

import yaml

from ..config import ConfigError, parse_config
from ..yamlsafe import YamlError, read_yaml_file
from .mps_standin import write_launcher
from .node import SimNode
from .scenario import Scenario

LABELS = "labels.yaml"
CONFIG = "noded.yaml"


def find_cpuset_root(mounts: str = "/proc/mounts") -> str:
    """The v1 cpuset hierarchy's mount (the simulated jobs' cgroups go there). Raises
    RuntimeError where there is none."""
    with open(mounts) as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 4 and fields[2] == "cgroup" and "cpuset" in fields[3].split(","):
                return fields[1]
    raise RuntimeError(f"no cgroup v1 cpuset hierarchy in {mounts}: the simulated jobs need one for their cgroups")


def remove_stale_cgroups(root: str) -> list[str]:
    """The cgroups of simulated nodes that were killed (a dying process cannot remove its
    own): every ``noded-sim-PID-*`` whose PID is gone and whose job cgroups hold no process.
    Returns those removed."""
    removed = []
    for name in sorted(os.listdir(root)):
        top = os.path.join(root, name)
        pid = name.removeprefix("noded-sim-").partition("-")[0]
        if not name.startswith("noded-sim-") or not pid.isdigit() or not os.path.isdir(top):
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its node is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            for job in os.listdir(top):
                if os.path.isdir(os.path.join(top, job)):
                    os.rmdir(os.path.join(top, job))  # EBUSY while a process is in it: then left
            os.rmdir(top)
            removed.append(top)
        except OSError:
            continue
    return removed


def daemon_config(sim: SimNode, base: dict, workdir: str) -> dict:
    """``base`` (a config's mapping) pointed at this node: its emulator, its jobs' cgroups and
    labels, state and runtime directories in ``workdir``, the MPS stand-in."""
    assert sim.emu is not None and sim.cgroup_dir is not None and sim.cpuset_root is not None
    config = dict(base)
    config.update(
        peak_gbps_per_domain=sim.scenario.node.peak_gbps, state_dir=os.path.join(workdir, "state"),
        runtime_dir=os.path.join(workdir, "run"),
        resctrl={**config.get("resctrl", {}), "root": sim.emu.root, "mounts": sim.emu.mounts_file},
        jobs={**config.get("jobs", {}), "labels": os.path.join(workdir, LABELS), "sources": [
            {"kind": "cgroup", "root": sim.cpuset_root,
             "patterns": [os.path.relpath(sim.cgroup_dir, sim.cpuset_root) + "/*"]}]})
    colocation = dict(config.get("colocation", {}))
    colocation["mps"] = {**colocation.get("mps", {}), "control": write_launcher(workdir),
                         "log_dir": os.path.join(workdir, "mps-log")}
    config["colocation"] = colocation
    return config


def write_labels(sim: SimNode, path: str) -> None:
    labels = {job: {k: v for k, v in (("model", m.model), ("category", m.category), ("exempt", m.exempt)) if v}
              for job, m in sim.labels.items()}
    partial = f"{path}.tmp"
    with open(partial, "w") as f:
        yaml.safe_dump(labels, f)
    os.replace(partial, path)  # noded re-reads it whole when it changes


def run_sim_node(scenario: Scenario, base_config: str | None, workdir: str | None, out=sys.stdout) -> int:
    try:
        base = (read_yaml_file(base_config).data or {}) if base_config else {}
    except YamlError as e:
        print(f"noded sim-node: {base_config}: {e.reason}", file=sys.stderr)
        return 2
    if not isinstance(base, dict):
        print(f"noded sim-node: {base_config}: not a mapping of config keys", file=sys.stderr)
        return 2
    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="noded-sim-node-")
    os.chmod(workdir, 0o755)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    root = find_cpuset_root()
    remove_stale_cgroups(root)
    sim = SimNode(scenario, workdir=workdir, cpuset_root=root)
    try:
        sim.start()
        config = daemon_config(sim, base, workdir)
        config_path = os.path.join(workdir, CONFIG)
        with open(config_path, "w") as f:
            yaml.safe_dump(config, f)
        try:
            sim.report_socket = parse_config(open(config_path).read(), config_path).report_socket
        except ConfigError as e:
            print(f"noded sim-node: the config made from {base_config or 'the defaults'} is refused: {e}",
                  file=sys.stderr)
            return 2
        labels = os.path.join(workdir, LABELS)
        write_labels(sim, labels)
        assert sim.emu is not None
        env = {**sim.nvml_env, "NODED_SIM_CONFIG": config_path, "NODED_SIM_RESCTRL": sim.emu.root,
               "NODED_SIM_CGROUP": sim.cgroup_dir or ""}
        for name, value in env.items():
            print(f"{name}={value}", file=out)
        print("READY=1", file=out, flush=True)
        shown = dict(sim.labels)
        while not sim.finished and not stop.is_set():
            sim.step()
            if sim.labels != shown:  # a job started or stopped: noded learns what it is
                write_labels(sim, labels)
                shown = dict(sim.labels)
            stop.wait(scenario.tick_s)
        return 0
    finally:
        sim.stop()
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
