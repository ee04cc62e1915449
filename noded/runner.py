"""`noded run`: the daemon on this host, or (``--sim``) on the simulated node."""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading

from .app import build_daemon, run_until_signalled, serve_metrics
from .config import Config, ConfigError, load_config

log = logging.getLogger(__name__)


def main_run(args) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        config = load_config(args.config) if args.config else Config()
    except ConfigError as e:
        print(f"noded run: {e}", file=sys.stderr)
        return 1
    if args.sim:
        return _run_sim(args, config)
    built = build_daemon(config, dry_run=args.dry_run)
    server, url = serve_metrics(built.daemon, config.metrics.address, config.metrics.port)
    print(f"noded: metrics at {url}", flush=True)
    stop = threading.Event()
    timer = threading.Timer(args.duration, stop.set) if args.duration else None
    if timer:
        timer.start()
    try:
        run_until_signalled(built.daemon, stop)
    finally:
        if timer:
            timer.cancel()
        server.shutdown()
    return 0


def _run_sim(args, config: Config) -> int:
    from .sim.node import SimNode
    from .sim.scenario import ScenarioError, load_scenario

    try:
        scenario = load_scenario(args.sim)
    except (OSError, ScenarioError) as e:
        print(f"noded run: {e}", file=sys.stderr)
        return 2
    import tempfile

    with SimNode(scenario) as sim, tempfile.TemporaryDirectory(prefix="noded-state-") as state_dir:
        config = dataclasses.replace(
            config, peak_gbps_per_domain=scenario.node.peak_gbps, state_dir=state_dir,
            resctrl=dataclasses.replace(config.resctrl, root=sim.emu.root, mounts=sim.emu.mounts_file))
        built = build_daemon(config, dry_run=args.dry_run, discovery=sim.discovery)
        server, url = serve_metrics(built.daemon, config.metrics.address, config.metrics.port)
        print(f"noded: metrics at {url}", flush=True)
        print(f"noded: simulated node, {scenario.node.gpus} GPUs, profile {scenario.node.profile!r}, "
              f"peak {scenario.node.peak_gbps:g} GB/s per L3 domain, throttling with "
              f"{built.daemon.throttle.kind if built.daemon.throttle else 'nothing'}; {scenario.name}", flush=True)
        stop = threading.Event()
        stepper = threading.Thread(target=_step_sim, args=(sim, stop), daemon=True)
        stepper.start()
        timer = threading.Timer(args.duration or scenario.duration_s, stop.set)
        timer.start()
        try:
            _run_with_report(built.daemon, stop)
        finally:
            timer.cancel()
            stop.set()
            stepper.join()
            server.shutdown()
    print("noded: stopped; throttles released, groups removed, simulated node torn down.")
    return 0


def _step_sim(sim, stop: threading.Event) -> None:
    while not stop.is_set():
        sim.step()
        stop.wait(sim.scenario.tick_s)


def _run_with_report(daemon, stop: threading.Event) -> None:
    import signal

    from .sim.run import print_tick

    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    state = {"next": 0.0, "t0": None}

    def report(result):
        if state["t0"] is None:
            state["t0"] = result.t
        elapsed = result.t - state["t0"]
        for a in result.decision.actions:
            print(f"t={elapsed:5.1f}s  {a.kind.upper()} {a.job.removeprefix('sim:')} level "
                  f"{a.from_level}->{a.to_level}: {a.reason}", flush=True)
        if elapsed >= state["next"]:
            state["next"] += 1.0
            print_tick(elapsed, result.sample, result.levels, sys.stdout)

    try:
        daemon.run(stop, on_tick=report)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        daemon.shutdown()
