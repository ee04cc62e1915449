"""A daemon on a fresh simulated node, for benchmarks that tick it themselves."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from noded.commands.wiring import build_daemon
from noded.config import Config, ContentionConfig, MetricsConfig, ResctrlConfig
from noded.loop.daemon import Daemon
from nodesim.node import SimNode
from nodesim.scenario import parse_scenario

#: the simulated node advances this often, in its own thread, whatever the tick
STEP_S = 0.05


@contextmanager
def daemon_on_sim(scenario: str, *, tick: float, state_dir: str, peak_gbps: float = 8.0,
                  **contention) -> Iterator[tuple[SimNode, Daemon, Config]]:
    """``scenario`` (YAML text) on a simulated node, and a daemon built as `noded run`
    builds it on that node (its state in ``state_dir``); shut down and torn down after."""
    with SimNode(parse_scenario(scenario, "bench")) as sim:
        config = Config(tick_s=tick, peak_gbps_per_domain=peak_gbps, state_dir=state_dir,
                        metrics=MetricsConfig(port=0),
                        resctrl=ResctrlConfig(root=sim.emu.root, mounts=sim.emu.mounts_file),
                        contention=ContentionConfig(**contention))
        daemon = build_daemon(config, discovery=sim.discovery).daemon
        stop = threading.Event()
        stepper = threading.Thread(target=lambda: [sim.step() for _ in iter(lambda: stop.wait(STEP_S), True)],
                                   daemon=True)
        stepper.start()
        try:
            yield sim, daemon, config
        finally:
            stop.set()
            stepper.join()
            daemon.shutdown()
