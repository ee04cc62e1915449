"""noded for a scenario cell.

``NodedRun``: as a host runs it, ``noded run --config FILE`` in a process of its own, given
only the environment a host's driver would (the stand-in NVML's library path and shared
memory). Its throttle actions are read from its journal lines as they come, with their
times; its own CPU from /proc over the cell; stopping it is a SIGTERM (throttles released,
cpusets restored, groups removed) and its exit, which must be clean.

``NodedInProcess``: built from a Config as ``noded run`` builds it, ticking in a thread of
this process, for a benchmark that traces each tick's result objects (bench.rightsize_real
follows a sizing tick by tick); it reports no CPU of noded's own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from typing import Mapping

import yaml

from bench.measure import cpu_seconds
from nodesim.launch import DaemonProcess, tail
from noded.commands.wiring import build_daemon
from noded.config import Config, ContentionConfig
from noded.jobs.discovery import JobDiscovery

#: Faster reactions than the production defaults (as the demo's), so a scenario cell of a
#: dozen seconds shows noded settle: the same on every node.
SCENARIO_CONTENTION = ContentionConfig(hold_s=4.0, settle_s=1.0)

#: a decision's journal line (noded.util.journal.log_change): "throttle job=cgroup:stressor level=0->1 cause=contention: …"
_ACTION = re.compile(r"noded\.changes: (throttle|release) job=(\S+) level=(\d+)->(\d+) cause=(\S+?)(?:: (.*))?$")
_METHOD = re.compile(r'^noded_job_throttle_level\{[^}]*method="([^"]+)"', re.M)


def outcome(noded: "NodedRun | None") -> dict:
    """What noded did in a cell (nothing, and no throttle, when it did not run), and its CPU."""
    if noded is None:
        return {"actions": [], "throttle": None, "noded_cpu_share": None}
    return {"actions": noded.actions, "throttle": noded.throttle_kind, "noded_cpu_share": noded.cpu_share}


class NodedRun:
    def __init__(self, config: Config | dict, env: Mapping[str, str], workdir: str):
        """``config``: a Config or its mapping (as a config file holds it); ``env``: what
        noded's process needs to see the node's GPUs (``SimGpus.env``); ``workdir``: where
        its config and log go."""
        doc = json.loads(json.dumps(dataclasses.asdict(config))) if isinstance(config, Config) else dict(config)
        doc["metrics"] = {**doc.get("metrics", {}), "address": "127.0.0.1", "port": 0}
        self.env = {"LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"], "NODED_SIM_NVML": env["NODED_SIM_NVML"]}
        self.path = os.path.join(workdir, "noded.yaml")
        with open(self.path, "w") as f:
            yaml.safe_dump(doc, f)
        self.log = os.path.join(workdir, "noded.log")
        self.actions: list[dict] = []
        self.throttle_kind: str = (doc.get("contention") or {}).get("method", "auto")
        self.cpu_share: float | None = None  # noded's CPU over the cell, a share of one core
        self.daemon: DaemonProcess | None = None
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._follow, name="noded-log", daemon=True)

    def start(self) -> "NodedRun":
        self.daemon = DaemonProcess(self.env, self.log, config=self.path)
        self.t0 = time.monotonic()
        self.cpu0 = cpu_seconds(self.daemon.pid)
        self._reader.start()
        return self

    def _follow(self) -> None:
        """Each decision as its line appears, stamped then (to a tenth of a second)."""
        with open(self.log, errors="replace") as f:
            partial = ""
            while True:
                chunk = f.read()
                if chunk:
                    lines = (partial + chunk).split("\n")
                    partial = lines.pop()
                    for line in lines:
                        m = _ACTION.search(line)
                        if m and m.group(5) != "stopping":  # the releases of its shutdown are not decisions
                            self.actions.append({"t": round(time.monotonic() - self.t0, 2), "job": m.group(2),
                                                 "kind": m.group(1), "from": int(m.group(3)), "to": int(m.group(4)),
                                                 "reason": m.group(6)})
                elif self._done.is_set():
                    return
                else:
                    self._done.wait(0.1)  # a file being written: looked at ten times a second

    def stop(self) -> None:
        assert self.daemon is not None
        wall = time.monotonic() - self.t0
        self.cpu_share = (cpu_seconds(self.daemon.pid) - self.cpu0) / wall if wall > 0 else None
        try:
            found = _METHOD.search(self.daemon.scrape())
            if found and found.group(1) != "none":
                self.throttle_kind = found.group(1)
        except OSError:
            pass  # the configured method stands
        code, _ = self.daemon.stop()
        self._done.set()
        self._reader.join()
        if code != 0:
            raise RuntimeError(f"noded exited {code} at its stop: {tail(self.log)}")


class NodedInProcess:
    def __init__(self, config: Config, *, discovery: JobDiscovery | None = None):
        self.built = build_daemon(config, discovery=discovery)
        self.daemon = self.built.daemon
        self.stop_event = threading.Event()
        self.actions: list[dict] = []
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self.daemon.run, args=(self.stop_event, self._on_tick),
                                        name="noded", daemon=True)

    def _on_tick(self, result) -> None:
        for a in result.decision.actions:
            self.actions.append({"t": round(result.t - self.t0, 2), "job": a.job, "kind": a.kind,
                                 "from": a.from_level, "to": a.to_level, "reason": a.reason})

    def start(self) -> "NodedInProcess":
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self._thread.join()
        self.daemon.shutdown()
