"""`noded run`: the daemon on this host (``--sim``: see nodesim.with_daemon).

Signals: SIGTERM/SIGINT stop the loop, release every throttle, restore what was
changed and remove noded's groups; SIGHUP reloads the config (a bad one is refused
with its reason and the running one kept; one still being written is read again at the
next tick: noded.util.settled). Under systemd the notify protocol says
READY after the loop's first round, a STATUS line each round (saying so where the tick
failed), and WATCHDOG after every round that ends, failed or not.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from contextlib import ExitStack
from typing import Callable

from mps.errors import MpsError

from noded.admin.server import AdminServer
from noded.commands.wiring import build_daemon, serve_metrics, with_node_peak
from noded.stores.calibration import CalibrationError
from noded.util.cliopts import say
from noded.config import Config, ConfigError, EmptyConfig, load_config
from noded.util.heap import settle_heap
from noded.util.settled import SETTLE_S, Unsettled
from noded.loop.daemon import TickFailure, TickResult
from noded.commands.hostcheck import refusal, start_check
from noded.util.journal import configure_logging
from noded.stores.lockfile import AlreadyRunning, HostLock, InstanceLock, LockFileRefused
from noded.commands.sdnotify import SystemdNotifier
from noded.commands.signals import Signals
from noded.stores.securedir import SecureDir, SecureDirError, StateReadError
from noded.server.budget import DescriptorBudgetError, ensure_descriptor_budget
from noded.server.stream import ListenError

log = logging.getLogger(__name__)


def status_line(result: TickResult) -> str:
    s, d = result.sample, result.decision
    gpu = sum(1 for j in s.jobs.values() if j.kind == "gpu")
    share = "unknown" if d.node_share is None else f"{d.node_share:.0%} of peak"
    return (f"{len(s.jobs)} jobs ({gpu} GPU), node bandwidth {share}, {len(result.levels)} throttled"
            + (f", {len(s.missing)} inputs missing" if s.missing else ""))


#: what a dry run cannot know, said at its start
DRY_RUN_CANNOT_KNOW = (
    "dry run: noded decides and logs, and changes nothing; so what it cannot know is the effect of its own "
    "steps: each later step assumes the earlier ones had no effect (a real throttle lowers the bandwidth the next "
    "tick sees and may end the contention), so levels climb past where a real run would stop, and no release "
    "follows a throttle's success; read the first decision of each episode, not the level it reaches")


class StartError(Exception):
    """Starting cannot go on; the message says why (printed, exit 1)."""


def main_run(args, signals: Signals | None = None) -> int:
    """``signals``: installed by the caller as early as it could (noded.commands.cli does it before
    importing this module); installed here otherwise."""
    signals = signals or Signals().install()
    # the journal under journald, <N> lines on stderr elsewhere; a dry run's every line marked
    configure_logging(args.verbose, dry_run=args.dry_run)
    try:
        return _run(args, signals)
    except StartError as e:
        print(f"noded run: {e}", file=sys.stderr)
        return 1
    finally:
        signals.restore()


#: what starting can fail with, for reasons an operator can act on (printed, exit 1)
_START_ERRORS = (ConfigError, CalibrationError, AlreadyRunning, LockFileRefused, SecureDirError, StateReadError,
                 ListenError, DescriptorBudgetError, MpsError)


def _run(args, signals: Signals) -> int:
    try:
        config = load_config(args.config, empty_ok=False) if args.config else Config()
    except EmptyConfig as e:
        # At start an empty file is the defaults, as no file is (a reload refuses it: see _reload).
        log.warning("%s: noded starts on the built-in defaults", e)
        config = Config()
    except ConfigError as e:
        raise StartError(e) from None
    # Startup is a transaction: everything started is registered on the stack at once,
    # so a failure at any later step (a port in use, say) undoes all of it.
    with ExitStack() as stack:
        try:
            return _start_and_run(args, config, signals, stack)
        except _START_ERRORS as e:
            raise StartError(e) from None


def _start_and_run(args, config: Config, signals: Signals, stack: ExitStack) -> int:
    # what check-config checks, by the same code, and what only systemd's noded knows (its
    # watchdog's interval); before anything is made
    check = start_check(config, path=args.config, watchdog_s=SystemdNotifier().watchdog_s)
    if check.problems:
        raise StartError("; ".join(f"{key}: {reason}" for key, reason in check.problems))
    for key, what in check.warnings:
        log.warning("%s: %s", key, what)
    settle = with_node_peak  # the node peak: the config's, else the calibration's, else the default
    config, peak_note = settle(config)
    budget = ensure_descriptor_budget()
    _hold_the_host(config, stack)
    if signals.stop.is_set():
        return 0  # asked to stop while starting: nothing was changed yet
    if args.dry_run:
        log.warning("%s", DRY_RUN_CANNOT_KNOW)
    notifier = SystemdNotifier()  # RELOADING=1 / READY=1 around each reload
    reloader = (lambda: _reload(args.config, settle)) if args.config else None
    built = build_daemon(config, dry_run=args.dry_run, reloader=reloader, notifier=notifier)
    daemon = built.daemon
    stack.callback(daemon.shutdown)  # from here on, whatever fails below, the node is put back
    signals.attach(daemon)
    server, url = serve_metrics(daemon, config.metrics.address, config.metrics.port)
    stack.callback(server.shutdown)
    head = "noded: [dry-run]" if args.dry_run else "noded:"  # a dry run marks every line, these too
    say(f"{head} metrics at {url}")  # first thing, before anything else speaks
    say(f"{head} node peak {config.peak_gbps_per_domain:g} GB/s per L3 domain ({peak_note})")
    log.info("%s", budget.describe())
    for note in built.operator_notes:
        print(f"{head} {note}", file=sys.stderr, flush=True)
    _open_sockets(config, daemon, stack)
    say(f"{head} admin socket at {config.admin_socket} (nodectl --socket {config.admin_socket} status)")
    if args.duration:
        timer = threading.Timer(args.duration, signals.stop.set)
        timer.daemon = True
        timer.start()
        stack.callback(timer.cancel)
    stack.callback(notifier.stopping)  # runs first on the way out: systemd sees STOPPING at once
    on_tick, on_failed = _notifier_hooks(notifier)
    settle_heap()  # what noded built to run is never walked by the collector again: ticks cost what they allocate
    daemon.run(signals.stop, on_tick=on_tick, on_failed=on_failed)
    stack.close()
    say("noded: [dry-run] stopped; nothing was throttled or changed, its monitoring groups removed." if args.dry_run
        else "noded: stopped; throttles released, groups removed.")
    return 0


def _hold_the_host(config: Config, stack: ExitStack) -> None:
    """The runtime directory, checked, and the locks that keep a second noded off this host."""
    runtime = stack.enter_context(SecureDir(config.runtime_dir, mode=0o755, what="runtime directory"))
    if os.path.realpath(os.path.dirname(config.admin_socket)) != os.path.realpath(runtime.path):
        # An admin socket elsewhere gets the same checks: in a directory another user may
        # change, they could put their own socket at its path and read root's requests.
        stack.enter_context(SecureDir(os.path.dirname(config.admin_socket), mode=0o755,
                                      what="admin socket directory"))
    stack.enter_context(InstanceLock(runtime))
    # What a second noded must not share, whatever its runtime directory: the resctrl
    # mount and the cgroup trees it acts on.
    shared = [config.resctrl.root] + sorted({s.root for s in config.jobs.sources})
    stack.enter_context(HostLock.for_filesystems(shared))


def _open_sockets(config: Config, daemon, stack: ExitStack) -> None:
    """The admin socket, and the report socket where a controller reads tenants' reports."""
    admin = _listening(AdminServer(config.admin_socket, daemon, group=config.admin.group,
                                   timeout_s=config.admin.timeout_s), "admin socket", config.admin_socket)
    stack.callback(admin.stop)
    if daemon.parts.report_budget is not None:  # co-location or right-sizing reads tenants' reports
        reports = _listening(AdminServer(config.report_socket, daemon, group=None,
                                         timeout_s=config.admin.timeout_s, reports_only=True,
                                         budget=daemon.parts.report_budget),
                             "report socket", config.report_socket)
        stack.callback(reports.stop)


def _listening(server: AdminServer, what: str, path: str) -> AdminServer:
    try:
        return server.start()
    except OSError as e:
        raise StartError(f"cannot listen on the {what} {path}: {e.strerror or e}") from None


def _reload(path: str, settle, *, settle_s: float = SETTLE_S, now: Callable[[], float] = time.time) -> Config | None:
    """The config in ``path`` for a reload; None where it is refused (said in the journal).
    Raises Unsettled for a file that may be half written (the daemon reads it again at a
    later tick: noded.util.settled)."""
    try:
        # An empty file is refused: a file truncated or half written (an editor, a full
        # disk) would otherwise put every key back to its default (tick, caps, the peak).
        # One being written is not read as it is now: a file an editor or `cat >` rewrites
        # in place may be caught cut short yet still parse, its later keys at their defaults.
        config = load_config(path, empty_ok=False, settle_s=settle_s, now=now)
        # What `noded run` and check-config refuse on this host, a reload refuses whole:
        # taken as far as the schema goes, it would be half applied (the new tick, the old
        # job source that could not be used).
        check = start_check(config, path=path, reloading=True, watchdog_s=SystemdNotifier().watchdog_s)
        if check.problems:
            raise refusal(path, check.problems)
        for key, what in check.warnings:
            log.warning("reload: %s: %s", key, what)
        config, source = settle(config)
        log.info("reload: node peak %g GB/s per L3 domain (%s)", config.peak_gbps_per_domain, source)
        return config
    except Unsettled:
        raise  # not refused: read again at a later tick
    except ConfigError as e:
        log.error("config reload refused, keeping the running config: %s", e.summary())
        return None
    except CalibrationError as e:
        log.error("config reload refused, keeping the running config: %s", e)
        return None
    except Exception as e:  # whatever the failure, the running config stays
        log.exception("config reload failed, keeping the running config: %s: %s", type(e).__name__, e)
        return None


def failure_line(failure: TickFailure) -> str:
    """systemd's STATUS while ticks fail: the loop runs, but decides and changes nothing."""
    return (f"tick failed ({failure.in_a_row} in a row, {failure.completed} completed before): "
            f"{failure.error}; nothing is decided or changed until a tick completes (the journal has the traceback)")


def _notifier_hooks(notifier: SystemdNotifier):
    """(after a tick, after a failed tick) for the notify protocol: READY=1 once, after the
    loop's first round whatever its outcome (noded has started: its loop runs); a STATUS
    line each round, saying so where the tick failed; WATCHDOG=1 each round. The watchdog
    hears from every round that ends, so it says "stalled" only when the loop itself is
    stuck (a tick that never returns), not when ticks fail or hold: those are in STATUS, the
    journal and noded_tick_failures_total, and a restart would not mend them."""
    state = {"ready": False}

    def tell(line: str) -> None:
        if not notifier.enabled:
            return
        if not state["ready"]:
            notifier.ready(line)
            state["ready"] = True
        else:
            notifier.status(line)
        notifier.watchdog()

    def on_tick(result: TickResult) -> None:
        tell(status_line(result))

    def on_failed(failure: TickFailure) -> None:
        tell(failure_line(failure))

    return on_tick, on_failed
