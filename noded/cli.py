"""The `noded` command."""

from __future__ import annotations

import argparse
import sys

from resctrl.emulator.profiles import PROFILES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="noded", description="Node-level contention and co-location daemon.")
    sub = parser.add_subparsers(dest="command", required=True)
    tour = sub.add_parser("tour", help="a scripted tour of the resctrl library against the emulator")
    tour.add_argument("--profile", choices=sorted(PROFILES), default="intel")
    tour.add_argument("--window", type=float, default=1.0, help="measurement window in seconds")
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", default=None, help="YAML config (default: built-in defaults; /etc/noded/noded.yaml "
                     "on installed hosts)")
    run.add_argument("--dry-run", action="store_true", help="decide and log every write it would make; make none")
    run.add_argument("--sim", metavar="SCENARIO", help="run against the simulated node from this scenario file")
    run.add_argument("--duration", type=float, help="stop after this many seconds (default: the scenario's, or never)")
    run.add_argument("-v", "--verbose", action="store_true")
    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("file")
    sim = sub.add_parser("sim", help="run the simulated GPU node from a scenario file, with noded's telemetry")
    sim.add_argument("--scenario", required=True, help="scenario YAML (see scenarios/)")
    sim.add_argument("-v", "--verbose", action="store_true", help="log every job and fault")
    args = parser.parse_args(argv)
    if args.command == "check-config":
        from .config import ConfigError, load_config

        try:
            load_config(args.file)
        except ConfigError as e:
            print(f"noded check-config: {e}", file=sys.stderr)
            return 1
        print(f"{args.file}: ok")
        return 0
    if args.command == "run":
        from .runner import main_run

        return main_run(args)
    if args.command == "sim":
        import logging

        from .sim.run import run_scenario
        from .sim.scenario import ScenarioError, load_scenario

        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
        try:
            scenario = load_scenario(args.scenario)
        except (OSError, ScenarioError) as e:
            print(f"noded sim: {e}", file=sys.stderr)
            return 2
        return run_scenario(scenario)
    if args.command == "tour":
        from .tour import run_tour

        if args.window <= 0:
            parser.error(f"--window must be positive, got {args.window}")
        return run_tour(args.profile, args.window)
    return 2


if __name__ == "__main__":
    sys.exit(main())
