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
    args = parser.parse_args(argv)
    if args.command == "tour":
        from .tour import run_tour

        if args.window <= 0:
            parser.error(f"--window must be positive, got {args.window}")
        return run_tour(args.profile, args.window)
    return 2


if __name__ == "__main__":
    sys.exit(main())
