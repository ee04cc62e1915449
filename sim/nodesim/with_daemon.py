"""`noded run --sim SCENARIO`: the simulated node and the daemon, as two processes, as on a host.

A thin wrapper: it starts ``noded sim-node SCENARIO --hold --watch`` and, once that is
ready, ``noded run --config`` with the config the node wrote and the environment it printed
(the driver's library path), nothing else: no simulation code runs in the daemon's process.
The daemon's output is this command's; the node's line a second is passed on. After the
duration (the scenario's, or ``--duration``), on SIGINT or SIGTERM, or when nobody reads
the output any more, the daemon is stopped first (it releases what it changed while the
node is still there), then the node. Both children die with this process (a parent-death
signal), and live in sessions of their own so that a terminal's Ctrl-C reaches only this
process, which stops them in that order. A node that ends before it is ready (it could not
build the stand-in NVML library, mount the emulator, ...) is reported at once with its exit
status and the last lines of its stderr; its stderr is held back until then, passed on after.
Starting, reading READY=1 and stopping are nodesim.launch's, as for the benchmarks and tests.
"""

from __future__ import annotations

import signal
import sys
import threading

from noded.util.cliopts import say
from noded.util.signalflag import SignalFlag
from nodesim.launch import (STOP_TIMEOUT_S, NotReady, StderrTail, daemon_environment, not_ready_message,
                            read_environment, spawn, stop)

#: how long the node may take to print READY=1 (it builds the stand-in NVML library, mounts)
READY_TIMEOUT_S = 60.0


def run_with_sim_node(scenario_path: str, duration_s: float, config: str | None, *, dry_run: bool = False,
                      verbose: bool = False) -> int:
    """Exit status: the daemon's (2 where the node could not start)."""
    # the run is to end: its duration, a signal, the daemon gone, no reader (set by the signal
    # handlers too: a SignalFlag takes no lock, where a second SIGTERM deadlocked an Event)
    ending = SignalFlag()
    previous = {sig: signal.signal(sig, lambda *_: ending.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    node = daemon = None
    try:
        node = spawn(["sim-node", scenario_path, "--hold", "--watch",
                      *(["--config", config] if config else []), *(["-v"] if verbose else [])])
        stderr = StderrTail(node.stderr)
        try:
            env = read_environment(node.stdout, READY_TIMEOUT_S)
        except NotReady as e:
            print(f"noded run --sim: {not_ready_message(e, node, stderr)}", file=sys.stderr)
            node = None
            return 2
        stderr.release()
        daemon = spawn(["run", "--config", env["NODED_SIM_CONFIG"], *(["--dry-run"] if dry_run else []),
                        *(["-v"] if verbose else [])], stderr=None, env=daemon_environment(env))
        spoken = threading.Event()  # the daemon's first line (its metrics URL) is the first passed on
        stopping = threading.Event()  # from the daemon's stop on, its lines are the last passed on
        relays = [threading.Thread(target=_pass_on, args=(out, ending, spoken, stopping, out is daemon.stdout),
                                   name="noded-sim-output", daemon=True) for out in (daemon.stdout, node.stdout)]
        for relay in relays:
            relay.start()
        threading.Thread(target=lambda: (daemon.wait(), ending.set()), name="noded-daemon-wait", daemon=True).start()
        ending.wait(duration_s)
        stopping.set()
        code, _ = stop(daemon)
        daemon = None
        relays[0].join(timeout=STOP_TIMEOUT_S)  # the daemon's last lines before the node's end
        stop(node)
        node = None
        say("noded: simulated node torn down.")
        return code
    finally:
        for p in (daemon, node):  # started, then something failed here: nothing is left behind
            if p is not None:
                stop(p)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_writing = threading.Lock()


def _pass_on(lines, stop: threading.Event, spoken: threading.Event, stopping: threading.Event,
             daemons: bool) -> None:
    """A child's lines onto this command's output, whole lines, one writer at a time. The
    node's lines are dropped until the daemon's first is out (``spoken``) and once the daemon
    is being stopped (``stopping``: its goodbye is not interleaved with the node's status). A
    reader gone stops the run."""
    for line in lines:
        if not daemons and (not spoken.is_set() or stopping.is_set()):
            continue
        with _writing:
            ok = say(line.rstrip("\n"))
        if daemons:
            spoken.set()
        if not ok:
            stop.set()
            return
