"""``python -m bench.scenario contention|calibrate``: the end-to-end scenarios.

    python -m bench.scenario calibrate [--seconds 10] [--size 512] [--state-dir /var/lib/noded]
    python -m bench.scenario contention [--victim decode|tokenise] [--nodes cpusets,sim]
                                        [--shares 25,50,75,100] [--seconds 12] [--warmup 3]
                                        [--peak-gbps X] [--resctrl auto|host|emulator]
                                        [--out bench/results]

``contention`` runs the victim alone and beside the stressor at each share of the
peak, without and with noded, on this machine's real cpusets (core halving; on a host
with RDT, its resctrl and MBA) and on the simulated node (MBA); it prints a table and writes contention.json and
contention.png in ``--out``. ``calibrate`` measures the peak (all CPUs, triad) and
writes it where noded reads it: the product's ``noded calibrate`` (``noded.commands.calibrate``),
recorded with this command line. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from noded.stores.calibration import CalibrationError, read_calibration

from .contention import SHARES, run_matrix, table


class Progress:
    """One line on stderr, rewritten in place on a terminal; a line per step otherwise."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self.last_label = None

    def __call__(self, label: str, done: int, total: int) -> None:
        if self.tty:
            bar = "#" * int(20 * done / max(total, 1))
            print(f"\r{label}: {bar:<20} {done}/{total} s ", end="", file=self.stream, flush=True)
        elif label != self.last_label:
            print(f"{label} ({total} s)", file=self.stream, flush=True)
        self.last_label = label

    def line(self, text: str) -> None:
        print(("\r" if self.tty else "") + text + (" " * 20 if self.tty else ""), file=self.stream, flush=True)


def _shares(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) / 100 for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected percentages like 25,50,75,100, got {text!r}") from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"each share must be in (0, 100], got {text!r}")
    return values


def node_peak(args, progress: Progress) -> float:
    """The peak the cpuset node's shares are of: --peak-gbps, the calibration, or a quick measurement."""
    if args.peak_gbps:
        return args.peak_gbps
    try:
        cal = read_calibration(args.state_dir)
    except CalibrationError as e:
        raise SystemExit(f"bench.scenario: {e}")
    if cal is not None:
        progress.line(f"peak: {cal.peak_gbps_per_domain * cal.domains:.1f} GB/s from {args.state_dir}/calibration.json "
                      f"({cal.measured_at})")
        return cal.peak_gbps_per_domain * cal.domains
    from noded.commands.calibrate import measure_peak_gbps

    peak = measure_peak_gbps(5, 256, progress=lambda done, total: progress("measuring the peak", done, total))
    progress.line(f"peak: {peak:.1f} GB/s measured now (no calibration in {args.state_dir})")
    return peak


def host_resctrl(choice: str) -> tuple[str, str] | None:
    """The host's resctrl (root, mounts file) when it has one and ``choice`` allows it."""
    if choice == "emulator":
        return None
    from resctrl import Resctrl, ResctrlError

    try:
        Resctrl.open("/sys/fs/resctrl")
    except (ResctrlError, OSError) as e:
        if choice == "host":
            raise SystemExit(f"bench.scenario: --resctrl host, but {e}") from None
        return None
    return "/sys/fs/resctrl", "/proc/mounts"


def contention(args, progress: Progress) -> int:
    from .plot import plot

    os.makedirs(args.out, exist_ok=True)
    results = []
    for key in args.nodes:
        if key == "cpusets":
            from .cpuset_node import CpusetNode, find_cpuset_root

            try:
                find_cpuset_root()
            except RuntimeError as e:
                print(f"bench.scenario: {e}", file=sys.stderr)
                return 1
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) < 2:
                print("bench.scenario: the cpuset scenario needs at least 2 CPUs", file=sys.stderr)
                return 1
            node = CpusetNode(args.victim, node_peak(args, progress), victim_cpus=str(cpus[-1]),
                              stressor_cpus=",".join(map(str, cpus)),
                              stressor_threads=args.stressor_threads or 2 * len(cpus),
                              resctrl=host_resctrl(args.resctrl))
        else:
            from .sim_node import SimulatedNode

            node = SimulatedNode(args.victim)
        with node:
            result = run_matrix(node, args.shares, args.warmup, args.seconds, progress)
        progress.line("")
        print(table(result), flush=True)
        results.append(result)
    data = {"scenario": "contention", "victim": args.victim, "seconds": args.seconds, "warmup_s": args.warmup,
            "command": args.command,
            "nodes": results}
    json_path = os.path.join(args.out, "contention.json")
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1)
    png = plot(results, args.victim, os.path.join(args.out, "contention.png"))
    print(f"wrote {json_path} and {png}")
    return 0


def calibrate(args, progress: Progress) -> int:
    from noded.commands.calibrate import calibrate as run

    cal, path = run(args.state_dir, args.command, args.seconds, args.size,
                    progress=lambda done, total: progress("calibrate: triad on all CPUs", done, total))
    progress.line("")
    print(f"peak {cal.peak_gbps_per_domain:.2f} GB/s per L3 domain ({cal.domains} domain(s)); wrote {path}\n"
          f"command: {cal.command}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scenario", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="name", required=True)
    c = sub.add_parser("contention", help="the victim beside the stressor, without and with noded")
    c.add_argument("--victim", choices=("decode", "tokenise"), default="tokenise")
    c.add_argument("--nodes", type=lambda t: t.split(","), default=["cpusets", "sim"],
                   help="cpusets (this machine), sim (the simulated node), or both")
    c.add_argument("--shares", type=_shares, default=SHARES, help="stressor levels in %% of peak, e.g. 25,50,75,100")
    c.add_argument("--seconds", type=int, default=12, help="measured seconds per cell")
    c.add_argument("--warmup", type=int, default=3, help="seconds of the victim alone before the stressor starts")
    c.add_argument("--resctrl", choices=("auto", "host", "emulator"), default="auto",
                   help="cpusets node: the host's resctrl (MBM, and MBA where present) or the emulator; "
                        "auto: the host's when mounted")
    c.add_argument("--stressor-threads", type=int,
                   help="cpusets node: the stressor's threads (default: two per CPU; CODA set its stressor's "
                        "pressure by its thread count)")
    c.add_argument("--peak-gbps", type=float, help="the node's peak (default: the calibration, else measured now)")
    c.add_argument("--state-dir", default="/var/lib/noded", help="where calibrate wrote calibration.json")
    c.add_argument("--out", default="bench/results", help="folder for contention.json and contention.png")
    k = sub.add_parser("calibrate", help="measure the peak and write it where noded reads it")
    k.add_argument("--seconds", type=float, default=10)
    k.add_argument("--size", type=int, default=512, help="MiB per array")
    k.add_argument("--state-dir", default="/var/lib/noded", help="noded's state_dir")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    args.command = "python -m bench.scenario " + " ".join(shlex.quote(a) for a in argv)
    if args.name == "contention":
        bad = [n for n in args.nodes if n not in ("cpusets", "sim")]
        if bad:
            ap.error(f"--nodes: unknown node(s) {bad}; use cpusets, sim or both")
        if args.seconds < 2 or args.warmup < 1:
            ap.error("--seconds must be at least 2 and --warmup at least 1")
        if args.stressor_threads is not None and args.stressor_threads < 1:
            ap.error(f"--stressor-threads must be at least 1, got {args.stressor_threads}")
        if args.peak_gbps is not None and args.peak_gbps <= 0:
            ap.error(f"--peak-gbps must be positive, got {args.peak_gbps}")
        return contention(args, Progress())
    if args.seconds < 2:
        ap.error("--seconds must be at least 2 (the first second is not counted)")
    return calibrate(args, Progress())


if __name__ == "__main__":
    sys.exit(main())
