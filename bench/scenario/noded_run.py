"""noded itself, in this process: built from a Config as `noded run` builds it, ticking
in a thread, its throttle actions kept with their times; stopping it runs the
daemon's shutdown (throttles released, cpusets restored, groups removed)."""

from __future__ import annotations

import threading
import time

from noded.app import build_daemon
from noded.config import Config, ContentionConfig
from noded.jobs.discovery import JobDiscovery


#: Faster reactions than the production defaults (as the demo's), so a scenario cell of a
#: dozen seconds shows noded settle: the same on every node.
SCENARIO_CONTENTION = ContentionConfig(hold_s=4.0, settle_s=1.0)


def outcome(noded: "NodedRun | None") -> dict:
    """What noded did in a cell (nothing, and no throttle, when it did not run)."""
    return {"actions": noded.actions if noded else [], "throttle": noded.throttle_kind if noded else None}


class NodedRun:
    def __init__(self, config: Config, *, discovery: JobDiscovery | None = None):
        self.built = build_daemon(config, discovery=discovery)
        self.daemon = self.built.daemon
        self.stop_event = threading.Event()
        self.actions: list[dict] = []
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self.daemon.run, args=(self.stop_event, self._on_tick),
                                        name="noded", daemon=True)

    @property
    def throttle_kind(self) -> str:
        return self.daemon.throttle.kind if self.daemon.throttle else "none"

    def _on_tick(self, result) -> None:
        for a in result.decision.actions:
            self.actions.append({"t": round(result.t - self.t0, 2), "job": a.job, "kind": a.kind,
                                 "from": a.from_level, "to": a.to_level, "reason": a.reason})

    def start(self) -> "NodedRun":
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self._thread.join()
        self.daemon.shutdown()
