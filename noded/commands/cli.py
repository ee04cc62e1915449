"""The `noded` command.

Each command imports what it needs when it runs: the daemon's process (``run``,
``check-config``) loads no emulator or simulation code unless it runs one.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """noded; a reader of its output that goes away ends it quietly (141), as Ctrl-C does
    (130) where the command does not handle it itself (``run`` stops cleanly on it)."""
    from noded.util.cliopts import EXIT_INTERRUPTED, broken_pipe

    try:
        try:
            code = _main(argv)
        except SystemExit:
            sys.stdout.flush()  # --help, --version: written here, into a pipe that may be closed
            raise
        sys.stdout.flush()  # here, not at the interpreter's exit: a closed pipe is seen and said below
        return code
    except BrokenPipeError:
        return broken_pipe()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("nodesim"):
            raise
        # The simulated node is its own distribution (sim/ in the source): a GPU host has none.
        print("noded: the simulated node is not installed here (a GPU host needs none); for `noded sim`, "
              "`sim-node`, `tour` and `run --sim` install noded-sim (sim/ in noded's source)", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    """noded's command line (also what its completion and man page are made from: noded.commands.clidoc)."""
    from noded.util.cliopts import HelpFormatter, option_parents, subparsers

    top, common = option_parents("noded", lambda parser, default: None)
    parser = argparse.ArgumentParser(prog="noded", description="Node-level contention and co-location daemon.",
                                     parents=[top], formatter_class=HelpFormatter)
    sub = subparsers(parser, common, dest="command", required=True)
    tour = sub.add_parser("tour", help="a scripted tour of the resctrl library against the emulator")
    tour.add_argument("--profile", default="intel", help="the emulated host: intel (default), intel-cdp, "
                      "intel-mbps, amd or no-mba")
    tour.add_argument("--window", type=float, default=1.0, help="measurement window in seconds")
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", default=None, help="YAML config (default: built-in defaults; /etc/noded/noded.yaml "
                     "on installed hosts)")
    run.add_argument("--dry-run", action="store_true",
                     help="decide and log every change it would make to a job; make none (it still makes its "
                          "monitoring groups)")
    run.add_argument("--sim", metavar="SCENARIO", help="run the simulated node from this scenario file (`noded "
                     "sim-node`) and the daemon beside it, as two processes, as on a host")
    run.add_argument("--duration", type=_duration, metavar="DURATION", help="stop after this long, e.g. 90, 30s, "
                     "15m, 2h, 1d, as nodectl takes them (default: the scenario's, or never)")
    run.add_argument("-v", "--verbose", action="store_true", help="log at INFO: start and stop steps, reads and "
                     "other detail (default: WARNING and above; every change to a job is logged either way)")
    check = sub.add_parser("check-config", help="validate a config file and exit (errors as FILE:LINE: KEY: REASON)")
    check.add_argument("file", help="the YAML config, e.g. /etc/noded/noded.yaml")
    cal = sub.add_parser("calibrate", help="measure this host's peak memory bandwidth and write it where noded "
                         "reads its node peak", description="Runs STREAM's triad at full speed on every CPU and "
                         "writes the median rate per L3 domain to STATE_DIR/calibration.json; noded uses it at "
                         "start and reload when its config leaves peak_gbps_per_domain unset. Run it as root on a "
                         "quiet host with noded stopped.")
    cal.add_argument("--seconds", type=float, default=10, help="seconds to measure, at least 2; the first is not "
                     "counted (default: 10)")
    cal.add_argument("--size", type=int, default=512, metavar="MIB", help="MiB per array, three arrays, well "
                     "beyond any last-level cache (default: 512)")
    cal.add_argument("--threads", type=int, help="measuring threads, pinned to the CPUs in turn "
                     "(default: one per CPU)")
    cal.add_argument("--state-dir", default="/var/lib/noded", help="noded's state_dir, where calibration.json goes; "
                     "a relative one is taken from the current directory, and the absolute path written is printed "
                     "(default: /var/lib/noded)")
    sim = sub.add_parser("sim", help="run the simulated GPU node from a scenario file, with noded's telemetry")
    sim.add_argument("--scenario", required=True, help="scenario YAML (see scenarios/)")
    sim.add_argument("-v", "--verbose", action="store_true", help="log every job and fault")
    node = sub.add_parser("sim-node", help="run the simulated GPU node as its own process, for a separate "
                          "`noded run --config` (prints the environment it needs, NAME=value lines, then READY=1)")
    node.add_argument("scenario", help="scenario YAML (see scenarios/)")
    node.add_argument("--config", help="a noded config to point at the node (default: noded's defaults)")
    node.add_argument("--workdir", help="where its files go (default: a new temporary directory, removed at exit)")
    node.add_argument("-v", "--verbose", action="store_true", help="log every job and fault")
    node.add_argument("--hold", action="store_true", help="keep the node up after the scenario's end, until "
                      "SIGTERM")
    node.add_argument("--watch", action="store_true", help="after READY, a line a second of what the node does")
    return parser


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    cal, tour = _subparser(parser, "calibrate"), _subparser(parser, "tour")
    args = parser.parse_args(argv)
    if args.command == "check-config":
        return check_config(args.file)
    if args.command == "calibrate":
        return _calibrate(args, argv, cal)
    if args.command == "run" and args.sim:
        return _run_beside_a_simulated_node(args)
    if args.command == "run":
        return _run(args)
    if args.command in ("sim", "sim-node"):
        return _simulated_node(args)
    if args.command == "tour":
        return _tour(args, tour)
    return 2


def _calibrate(args: argparse.Namespace, argv: list[str] | None, cal: argparse.ArgumentParser) -> int:
    """``noded calibrate``: its arguments checked, then the measurement (the command line
    as given goes into the calibration file)."""
    if not 2 <= args.seconds < float("inf"):
        cal.error(f"--seconds must be a finite number of at least 2 (the first second is not counted), "
                  f"got {args.seconds:g}")
    if args.size < 1:
        cal.error(f"--size must be at least 1 MiB, got {args.size}")
    if not args.state_dir:  # taken from the current directory, it would be the current directory
        cal.error("--state-dir is empty: name noded's state_dir (its config's state_dir, default /var/lib/noded)")
    if args.threads is not None and args.threads < 1:
        cal.error(f"--threads must be at least 1, got {args.threads}")
    cpus = len(os.sched_getaffinity(0))
    if args.threads is not None and args.threads > cpus:
        # one per CPU is the most that measures anything (each is pinned to one); more only
        # costs their start, a hundred thousand of them past any wait for the result
        cal.error(f"--threads must be at most {cpus}, the CPUs this process may use, got {args.threads}")
    import shlex

    from noded.commands.calibrate import main as calibrate

    shown = sys.argv[1:] if argv is None else argv
    return calibrate(args.state_dir, args.seconds, args.size, args.threads,
                     " ".join(["noded", *map(shlex.quote, shown)]))


def _run_beside_a_simulated_node(args: argparse.Namespace) -> int:
    """``noded run --sim SCENARIO``: the daemon beside the scenario's simulated node."""
    from nodesim.scenario import ScenarioError, load_scenario
    from nodesim.with_daemon import run_with_sim_node

    try:
        duration = args.duration or load_scenario(args.sim).duration_s
    except (OSError, ScenarioError) as e:
        print(f"noded run: {e}", file=sys.stderr)
        return 1
    return run_with_sim_node(args.sim, duration, args.config, dry_run=args.dry_run, verbose=args.verbose)


def _run(args: argparse.Namespace) -> int:
    """``noded run``: the daemon on this host."""
    # Signals before anything heavy is imported: a SIGTERM or SIGHUP from here on
    # never kills noded half-started (see noded.commands.signals).
    from noded.commands.sdnotify import SystemdNotifier
    from noded.commands.signals import Signals

    signals = Signals().install()
    SystemdNotifier().status("starting")
    from noded.commands.run import main_run

    return main_run(args, signals)


def _simulated_node(args: argparse.Namespace) -> int:
    """``noded sim`` (a scenario run through) and ``noded sim-node`` (a simulated node held
    for a daemon): the scenario loaded and the stand-in NVML library built first."""
    from noded.util.journal import configure_logging
    from nodesim.scenario import ScenarioError, load_scenario

    configure_logging(args.verbose)
    try:
        scenario = load_scenario(args.scenario)
    except (OSError, ScenarioError) as e:
        print(f"noded {args.command}: {e}", file=sys.stderr)
        return 2
    from nodesim.nvml_lib import BuildError, library_dir

    try:  # the node's GPUs need the stand-in NVML library: built (once) before anything starts
        library_dir(scenario.node.nvml)
    except BuildError as e:
        print(f"noded {args.command}: {e}", file=sys.stderr)
        return 2
    if args.command == "sim":
        from nodesim.run import run_scenario

        return run_scenario(scenario)
    from nodesim.sim_node import run_sim_node

    return run_sim_node(scenario, args.config, args.workdir, hold=args.hold, watch=args.watch)


def _tour(args: argparse.Namespace, tour: argparse.ArgumentParser) -> int:
    """``noded tour``: a scripted tour of the resctrl library against the emulator, its
    arguments checked first."""
    from nodesim.resctrl_emulator.profiles import PROFILES

    from nodesim.tour import run_tour

    if args.profile not in PROFILES:
        tour.error(f"--profile must be one of {', '.join(sorted(PROFILES))}, not {args.profile!r}")
    if args.window <= 0:
        tour.error(f"--window must be positive, got {args.window}")
    return run_tour(args.profile, args.window)


#: the longest --duration: a longer one is a typo (leave it out to run until stopped), and
#: beyond what a timer can wait its thread failed with an OverflowError and noded ran on
MAX_RUN_DURATION_S = 365 * 86400


def _duration(text: str) -> float:
    """A duration in noded's one syntax (noded.util.ages), more than 0 and at most a year."""
    from noded.util.ages import DurationError, parse_duration

    try:
        seconds = parse_duration(text)
    except DurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not 0 < seconds <= MAX_RUN_DURATION_S:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: it must be more than 0 and at most 365d")
    return seconds


def check_config(path: str) -> int:
    """Validate a config, and what ``noded run`` checks on this host at start, by the
    same code (noded.commands.hostcheck.start_check). Errors go to stderr as FILE:LINE: KEY:
    REASON (exit 1); what run starts without, as FILE:LINE: KEY: warning: ... (exit 0)."""
    from noded.config import Config, ConfigError, EmptyConfig, load_config
    from noded.util.journal import printable

    notes = []
    try:
        config = load_config(path, empty_ok=False)
    except EmptyConfig as e:  # as run takes it at start
        config = Config()
        notes.append(("(file)", f"{e.reason}; `noded run` starts on the built-in defaults"))
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1
    from noded.commands.hostcheck import start_check

    check = start_check(config, path=path)
    doc = None
    if check.problems or check.warnings:
        from noded.util.yamlsafe import YamlError, read_yaml_file

        try:
            doc = read_yaml_file(path)  # read and parsed once already: the lines of the keys
        except YamlError:  # changed since: say it without lines
            doc = None

    def say(key: str, text: str) -> None:
        line = doc.line_of(key) if doc else None
        print(printable(f"{path}{f':{line}' if line else ''}: {key}: {text}"), file=sys.stderr)

    for key, reason in check.problems:
        say(key, reason)
    for key, what in notes + check.warnings:
        say(key, f"warning: {what}")
    if check.problems:
        return 1
    print(f"{path}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
