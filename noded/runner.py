"""`noded run`: the daemon on this host, or (``--sim``) on the simulated node.

Signals: SIGTERM/SIGINT stop the loop, release every throttle, restore what was
changed and remove noded's groups; SIGHUP reloads the config (a bad one is refused
with its reason and the running one kept). Under systemd the notify protocol says
READY after the first tick, a STATUS line each tick, and WATCHDOG from the loop.
"""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
import threading
import time
from contextlib import ExitStack

from .admin.overrides import OverrideStore
from .admin.server import AdminServer
from .app import build_daemon, serve_metrics
from .calibration import CalibrationError, with_node_peak
from .config import Config, ConfigError, load_config
from .daemon import Daemon, TickResult
from .lockfile import AlreadyRunning, InstanceLock
from .sdnotify import SystemdNotifier

log = logging.getLogger(__name__)


def status_line(result: TickResult) -> str:
    s, d = result.sample, result.decision
    gpu = sum(1 for j in s.jobs.values() if j.kind == "gpu")
    share = "unknown" if d.node_share is None else f"{d.node_share:.0%} of peak"
    return (f"{len(s.jobs)} jobs ({gpu} GPU), node bandwidth {share}, {len(result.levels)} throttled"
            + (f", {len(s.missing)} inputs missing" if s.missing else ""))


def main_run(args) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        config = load_config(args.config) if args.config else Config()
    except ConfigError as e:
        print(f"noded run: {e}", file=sys.stderr)
        return 1
    with ExitStack() as stack:
        discovery = None
        sim = None
        settle = with_node_peak  # the node peak: the config's, else the calibration's, else the default
        if args.sim:
            from .sim.node import SimNode
            from .sim.scenario import ScenarioError, load_scenario

            try:
                scenario = load_scenario(args.sim)
            except (OSError, ScenarioError) as e:
                print(f"noded run: {e}", file=sys.stderr)
                return 2
            sim = stack.enter_context(SimNode(scenario))
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="noded-sim-"))
            discovery = sim.discovery

            def settle(c: Config, sim=sim, scratch=scratch) -> tuple[Config, str]:
                return sim.configure(c, scratch), "from the scenario"
        try:
            config, peak_note = settle(config)
        except CalibrationError as e:
            print(f"noded run: {e}", file=sys.stderr)
            return 1
        try:
            stack.enter_context(InstanceLock(config.runtime_dir))
        except AlreadyRunning as e:
            print(f"noded run: {e}", file=sys.stderr)
            return 1
        built = build_daemon(config, dry_run=args.dry_run, discovery=discovery)
        daemon = built.daemon
        if args.config:
            daemon.reloader = lambda: _reload(args.config, settle)
        server, url = serve_metrics(daemon, config.metrics.address, config.metrics.port)
        stack.callback(server.shutdown)
        print(f"noded: metrics at {url}", flush=True)  # first thing, before anything else speaks
        print(f"noded: node peak {config.peak_gbps_per_domain:g} GB/s per L3 domain ({peak_note})", flush=True)
        daemon.overrides = OverrideStore(config.state_dir, time.time)
        admin = AdminServer(config.admin_socket, daemon, daemon.overrides, group=config.admin.group,
                            timeout_s=config.admin.timeout_s).start()
        stack.callback(admin.stop)
        if daemon.colocation is not None:
            reports = AdminServer(config.report_socket, daemon, None, group=None, timeout_s=config.admin.timeout_s,
                                  reports_only=True).start()
            stack.callback(reports.stop)
        stop = threading.Event()
        duration = args.duration or (sim.scenario.duration_s if sim else None)
        if duration:
            timer = threading.Timer(duration, stop.set)
            timer.start()
            stack.callback(timer.cancel)
        on_tick = _notifier_hook(SystemdNotifier())
        if sim is not None:
            print(f"noded: simulated node, {sim.scenario.node.gpus} GPUs, profile {sim.scenario.node.profile!r}, "
                  f"peak {sim.scenario.node.peak_gbps:g} GB/s per L3 domain, throttling with "
                  f"{daemon.throttle.kind if daemon.throttle else 'nothing'}; {sim.scenario.name}", flush=True)
            on_tick = _with_sim(sim, stop, stack, on_tick)
        run_with_signals(daemon, stop, on_tick)
    print("noded: stopped; throttles released, groups removed" + (", simulated node torn down." if args.sim else "."),
          flush=True)
    return 0


def _reload(path: str, settle) -> Config | None:
    try:
        config, source = settle(load_config(path))
        log.info("reload: node peak %g GB/s per L3 domain (%s)", config.peak_gbps_per_domain, source)
        return config
    except (ConfigError, CalibrationError) as e:
        log.error("config reload refused, keeping the running config: %s", e)
        return None


def _notifier_hook(notifier: SystemdNotifier):
    state = {"ready": False}

    def on_tick(result: TickResult) -> None:
        if not notifier.enabled:
            return
        line = status_line(result)
        if not state["ready"]:
            notifier.ready(line)
            state["ready"] = True
        else:
            notifier.status(line)
        notifier.watchdog()

    on_tick.notifier = notifier  # type: ignore[attr-defined]
    return on_tick


def _with_sim(sim, stop: threading.Event, stack: ExitStack, on_tick):
    from .sim.run import print_tick

    def step() -> None:
        while not stop.is_set():
            sim.step()
            stop.wait(sim.scenario.tick_s)

    stepper = threading.Thread(target=step, name="noded-sim", daemon=True)
    stepper.start()
    stack.callback(stepper.join)
    stack.callback(stop.set)
    state = {"next": 0.0, "t0": None}

    def report(result: TickResult) -> None:
        on_tick(result)
        if state["t0"] is None:
            state["t0"] = result.t
        elapsed = result.t - state["t0"]
        for a in result.decision.actions:
            print(f"t={elapsed:5.1f}s  {a.kind.upper()} {a.job.removeprefix('sim:')} level "
                  f"{a.from_level}->{a.to_level}: {a.reason}", flush=True)
        if elapsed >= state["next"]:
            state["next"] += 1.0
            print_tick(elapsed, result.sample, result.levels, sys.stdout)

    return report


def run_with_signals(daemon: Daemon, stop: threading.Event, on_tick=None) -> None:
    notifier = getattr(on_tick, "notifier", None) or SystemdNotifier()

    def on_stop(*_):
        stop.set()

    def on_hup(*_):
        daemon.request_reload()

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_stop),
                signal.SIGINT: signal.signal(signal.SIGINT, on_stop),
                signal.SIGHUP: signal.signal(signal.SIGHUP, on_hup)}
    try:
        daemon.run(stop, on_tick=on_tick)
    finally:
        notifier.stopping()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        daemon.shutdown()
