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
cgroups), ``NODED_SIM_FAULTS`` (a file another process writes faults into, applied at
once: ``FaultFile``), then ``READY=1``. SIGTERM or SIGINT tears everything down (jobs stopped, their
cgroups removed, the emulator unmounted); the jobs die with it if it is killed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile

import yaml

from noded.config import ConfigError, parse_config
from noded.util.signalflag import SignalFlag
from noded.util.yamlsafe import YamlError, read_yaml_file
from nodesim.mps_standin import write_launcher
from nodesim.node import SimNode, SimState
from nodesim.scenario import Scenario, ScenarioError, parse_scenario

LABELS = "labels.yaml"
CONFIG = "noded.yaml"
FAULTS = "faults.yaml"


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
        # rooted at the node's own cgroup, so that a job's id is its name there (cgroup:hog)
        jobs={**config.get("jobs", {}), "labels": os.path.join(workdir, LABELS), "sources": [
            {"kind": "cgroup", "root": sim.cgroup_dir, "patterns": ["*"]}]})
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


class FaultFile:
    """Faults applied when a process asks for them: a YAML list of scenario ``fault:``
    mappings written (whole: write and rename) to ``path``; each new version of the file is
    applied once, in order. A file the scenario's checks refuse is said and skipped."""

    def __init__(self, path: str, scenario: Scenario):
        self.path, self.scenario = path, scenario
        self._seen: tuple[int, int] | None = None

    def apply_new(self, sim: SimNode) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if (st.st_ino, st.st_mtime_ns) == self._seen:
            return
        self._seen = (st.st_ino, st.st_mtime_ns)
        try:
            faults = read_yaml_file(self.path).data
            if not isinstance(faults, list):
                raise ScenarioError(f"{self.path}: expected a list of faults")
            doc = {"duration_s": 1, "node": dataclasses.asdict(self.scenario.node),
                   "events": [{"at": 0, "fault": f} for f in faults]}
            events = parse_scenario(yaml.safe_dump(doc), self.path).events
        except (YamlError, ScenarioError) as e:
            print(f"noded sim-node: faults refused: {e}", file=sys.stderr, flush=True)
            return
        for ev in events:
            sim.fault(ev.args)


def watch_line(state: SimState) -> str:
    """What the node does now, as the simulation knows it (not as noded sees it): bandwidth
    granted, and each job with its GPU's utilisation."""
    jobs = "  ".join(f"{j}[gpu] util {state.gpu_util[j]:.0f}%" if j in state.gpu_util else f"{j}[cpu]"
                     for j in sorted(state.running))
    return (f"t={state.elapsed:5.1f}s node {state.granted_gbps:5.1f} GB/s "
            f"({state.node_utilisation:.0%} of peak)  {jobs}")


def run_sim_node(scenario: Scenario, base_config: str | None, workdir: str | None, out=sys.stdout, *,
                 hold: bool = False, watch: bool = False) -> int:
    """``hold``: the node stays up after the scenario's last second, until SIGTERM; ``watch``:
    a line a second on ``out`` after READY (``watch_line``)."""
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
    stop = SignalFlag()  # set by the handlers below: no lock taken (see SignalFlag)
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
        faults = FaultFile(os.path.join(workdir, FAULTS), scenario)
        env = {**sim.nvml_env, "NODED_SIM_CONFIG": config_path, "NODED_SIM_RESCTRL": sim.emu.root,
               "NODED_SIM_CGROUP": sim.cgroup_dir or "", "NODED_SIM_FAULTS": faults.path}
        for name, value in env.items():
            print(f"{name}={value}", file=out)
        print("READY=1", file=out, flush=True)
        shown, next_watch = dict(sim.labels), 0.0
        while (hold or not sim.finished) and not stop.is_set():
            faults.apply_new(sim)
            state = sim.step()
            if sim.labels != shown:  # a job started or stopped: noded learns what it is
                write_labels(sim, labels)
                shown = dict(sim.labels)
            if watch and state.elapsed >= next_watch:
                next_watch += 1.0
                try:
                    print(watch_line(state), file=out, flush=True)
                except BrokenPipeError:  # nobody watches any more: stop as on SIGTERM
                    break
            stop.wait(scenario.tick_s)
        return 0
    finally:
        sim.stop()
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
