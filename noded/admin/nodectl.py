"""nodectl: the operator's client for noded's admin socket: its command line, and what each
command asks and prints (the request itself: noded.admin.request; the answers in words:
noded.admin.answertext)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
import traceback
from typing import Any, Callable

from noded.util import ages
from noded.util.cliopts import EXIT_INTERRUPTED, HelpFormatter, broken_pipe, option_parents, subparsers
from noded.util.journal import printable
from noded.admin.answertext import format_status, print_result, shown
from noded.admin.request import DEFAULT_SOCKET, DEFAULT_TIMEOUT_S, NodectlError, request


def _socket_path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("an empty path: name noded's admin socket")
    return text


def parse_duration(text: str) -> float:
    """'90', '30s', '15m', '2h', '1d' -> seconds (noded.util.ages: the syntax everywhere)."""
    try:
        return ages.parse_duration(text)
    except ages.DurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: the longest duration an option takes (noded's longest override TTL): a longer timeout or
#: interval is a typo, and beyond what a socket timeout or a sleep can hold it would crash
MAX_DURATION_S = 30 * 86400


def _positive_duration(text: str) -> float:
    seconds = parse_duration(text)
    if not 0 < seconds <= MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: it must be more than 0 and at most 30d")
    return seconds


def _global_options(p: argparse.ArgumentParser, default) -> None:
    socket = os.environ.get("NODED_SOCKET") or DEFAULT_SOCKET  # set but empty (a script's ""): unset
    p.add_argument("--socket", type=_socket_path, default=default(socket),
                   help=f"noded's admin socket (default: $NODED_SOCKET, else {DEFAULT_SOCKET})")
    p.add_argument("--json", action="store_true", default=default(False),
                   help="print noded's answer as JSON (top: one JSON document a line, a line per refresh) "
                        "(default: text)")
    p.add_argument("--timeout", type=_positive_duration, default=default(DEFAULT_TIMEOUT_S), metavar="DURATION",
                   help=f"give up when noded has not answered within this long, e.g. 10, 30s, 1m "
                        f"(default: {DEFAULT_TIMEOUT_S:g}s)")


def _whole_number(minimum: int):
    """An argparse type: a whole number of at least ``minimum``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be {minimum} or more")
        return n
    return parse


_positive_int, _count = _whole_number(1), _whole_number(0)


def build_parser() -> argparse.ArgumentParser:
    top, common = option_parents("nodectl", _global_options)
    ap = argparse.ArgumentParser(prog="nodectl", description="Inspect and override noded on this host. Options go "
                                 "before or after the command: `nodectl status --json` is `nodectl --json status`.",
                                 parents=[top], formatter_class=HelpFormatter)
    sub = subparsers(ap, common, dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description or help)

    cmd("status", "node bandwidth, GPUs, jobs, throttles, overrides")
    cmd("jobs", "the jobs and their throttle levels")
    _throttle_command(cmd)
    _cap_command(cmd)
    p = cmd("release", "drop the override on a job; the policy decides again")
    _job_arg(p)
    p = cmd("exempt", "never throttle a job (an override)")
    _job_arg(p)
    _ttl_arg(p)
    _reason_arg(p, "default: none")
    p = cmd("pause", "stop automatic throttling and right-sizing's probing (overrides, pins and sizes hold)")
    _reason_arg(p, "default: 'paused by uid N'")
    cmd("resume", "resume automatic throttling")
    p = cmd("explain", "why a job is throttled or not, with the values")
    _job_arg(p)
    _size_command(cmd)
    _admit_command(cmd)
    _label_command(cmd)
    p = cmd("forget", "a job ended: drop its registered labels and its co-location reservation (an end hook)")
    _job_arg(p)
    p = cmd("model", "the co-location speedup model")
    p.add_argument("action", choices=["fit"], help="fit: refit from the co-location records on this host")
    _top_command(cmd)
    return ap


_Command = Callable[..., argparse.ArgumentParser]  # a command's parser added: (name, help, description=None)


def _job_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="the job's id as `nodectl jobs` lists it, e.g. slurm:4242 (cgroup:hog in "
                               "`make demo`)")


def _reason_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--reason", default="", help=f"why, for noded's log and `nodectl status` ({what})")


def _ttl_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ttl", type=_positive_duration, metavar="DURATION",
                   help="expire after this long, e.g. 90, 30s, 15m, 2h, 1d (default: until released)")


def _throttle_command(cmd: _Command) -> None:
    p = cmd("throttle", "hold a job at a throttle level (an override)",
            description="Hold a job at a throttle level: an override that wins over the policy until it expires or "
                        "is released. noded refuses a job it does not know and a level its throttle does not have.")
    _job_arg(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--level", type=_positive_int, help="the level, 1 (mildest) up to the number of levels of noded's "
                   "throttle (MBA: the entries of contention.mba_levels; cores: halvings until one CPU is left)")
    g.add_argument("--cores", type=_positive_int, help="hosts without MBA: leave the job at most this many of its "
                   "CPUs (fewer than it has)")
    _ttl_arg(p)
    _reason_arg(p, "default: none")


def _cap_command(cmd: _Command) -> None:
    p = cmd("cap", "hold a CPU job at a bandwidth, e.g. 6GB/s (an override), or --release it",
            description="Hold a CPU job's memory bandwidth at a cap: noded gives it a control group of its own and "
                        "steers its MBA value every 100 ms (or hands the cap to the kernel's mba_MBps where "
                        "resctrl is mounted so). The throttle's levels leave a capped job alone. Units, spelled "
                        "exactly: GB/s and MB/s (decimal), GiB/s and MiB/s (binary), e.g. 6GB/s, 6.5GB/s, 512MiB/s.")
    _job_arg(p)
    p.add_argument("bandwidth", nargs="?", type=_bandwidth_arg, help="the cap, e.g. 6GB/s")
    p.add_argument("--release", action="store_true", help="lift the job's cap")
    _ttl_arg(p)
    _reason_arg(p, "default: none")


def _size_command(cmd: _Command) -> None:
    p = cmd("size", "pin a GPU job's cores, stop probing it, or probe it again (right-sizing)",
            description="Control right-sizing of a GPU job: hold it at a number of cores (no probing until "
                        "--reprobe), stop probing it (it keeps the cores it has), or search its size again. Kept "
                        "while the job runs (not across a restart of noded); `nodectl explain JOB` shows its sizing.")
    _job_arg(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--cores", type=_positive_int, help="pin the job at this many cores (1 up to the CPUs it had "
                   "at start)")
    g.add_argument("--stop", action="store_true", help="stop probing: it keeps the cores it has now")
    g.add_argument("--reprobe", action="store_true", help="search again from the cores it has (undoes a pin or stop)")
    _reason_arg(p, "default: none")


def _admit_command(cmd: _Command) -> None:
    p = cmd("admit", "ask whether a GPU job may share a GPU; prints the environment it must use")
    p.add_argument("--job", required=True, help="the job's id as noded will see it, e.g. slurm:$SLURM_JOB_ID "
                                                "(required)")
    p.add_argument("--model", required=True, help="the job's model, e.g. ResNet-50 (required)")
    p.add_argument("--batch-size", type=_positive_int, required=True, help="the job's batch size (required)")
    p.add_argument("--profile", help="an Nsight Compute CSV (ncu --csv --page raw) or a profile YAML file "
                                     "(default: the profile noded has for the model and batch size)")
    p.add_argument("--gpu", default="auto", help="auto (noded picks), or a GPU UUID")
    p.add_argument("--uid", type=int, help="the user the job runs as; MPS serves one user per GPU (default: not "
                                           "said: no check of the GPU's users)")


def _label_command(cmd: _Command) -> None:
    p = cmd("label", "register a job's labels (model, batch size, category, ...): a job manager's start hook",
            description="Register a job's labels, e.g. `nodectl label slurm:42 model=BiDAF batch_size=32 "
                        "category=NLP`, before or while it runs (a Slurm prolog does). They replace any registered "
                        "before; the label file (jobs.labels) wins for a job it lists. Kept in memory until "
                        "`nodectl forget` (or a restart of noded). Never exempt or priority: those are the "
                        "operator's.")
    _job_arg(p)
    p.add_argument("labels", nargs="+", metavar="KEY=VALUE", help="labels: category, model, batch_size, "
                   "requested_cores, pipelined, many_weights, heavy_preprocessing, dataset_gb, uncached_share")


def _top_command(cmd: _Command) -> None:
    p = cmd("top", "a live status view, refreshed until Ctrl-C",
            description="A live status view. On a terminal the screen is redrawn; into a pipe or file each refresh "
                        "is appended (with --json: one JSON document a line).")
    p.add_argument("--interval", type=_positive_duration, default=1.0, metavar="DURATION",
                   help="seconds between refreshes (default: 1s)")
    p.add_argument("--iterations", type=_count, default=0, help="stop after N refreshes (default: 0, until Ctrl-C)")


def main(argv: list[str] | None = None) -> int:
    """nodectl; exit 0, 1 on an error (said on stderr), 2 on a bad command line, 3 for a
    refused admission, 130 after Ctrl-C (top ends on it with 0), 141 when stdout's reader
    went away (nodectl jobs | head)."""
    _show_what_stdout_cannot_encode()
    try:
        try:
            ap = build_parser()
            args = ap.parse_args(argv)
            if args.command == "cap" and _cap_usage(args):
                ap.error(_cap_usage(args))  # a bad command line (exit 2), before anything is sent
        except SystemExit:
            sys.stdout.flush()  # --help, --version: written here, into a pipe that may be closed
            raise
        code = _main(args)
        sys.stdout.flush()  # here, not at the interpreter's exit: a closed pipe is seen and said below
        return code
    except BrokenPipeError:  # the socket's are NodectlError: this one is stdout's
        return broken_pipe()


def _show_what_stdout_cannot_encode() -> None:
    """A character stdout's encoding lacks (a job named in UTF-8 on a C/latin-1 terminal,
    PYTHONIOENCODING=ascii) is written as its escape, as Python writes stderr, not a
    UnicodeEncodeError that ends nodectl halfway through a table."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")


def _main(args) -> int:
    try:
        return _run(args)
    except NodectlError as e:  # noded's answers among them: checked whole where they came in
        print(f"nodectl: {printable(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout's reader went away: main() ends quietly
        raise
    except Exception as e:
        # Not noded's: its answer was checked before any of it was read. The traceback is
        # for the bug report; the last line says whose error it is.
        traceback.print_exc()
        print(f"nodectl: {type(e).__name__} in nodectl itself, not in noded's answer: {printable(str(e))} (a bug in "
              "nodectl; with --json it prints noded's answer as it came)", file=sys.stderr)
        return 1


def _top(args) -> int:
    """Refreshes until Ctrl-C or --iterations. Screen control codes only on a terminal."""
    # Ctrl-C is how a live view ends, even where SIGINT came in ignored (Python then leaves it
    # so: a script's system(), a launcher that ignores it for its children; seen as a top that
    # outlived its Ctrl-C, SigIgn with SIGINT set), as procps' top does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tty = sys.stdout.isatty()
    n = 0
    try:
        while True:
            st = request(args.socket, "status", timeout=args.timeout)
            if args.json:
                text = json.dumps(st, sort_keys=True) + "\n"
            else:
                text = format_status(shown(st))
                stamp = time.strftime("%H:%M:%S")
                text = f"\x1b[H\x1b[2J{stamp} {text}" if tty else f"{'' if n == 0 else chr(10)}--- {stamp}\n{text}"
            sys.stdout.write(text)
            sys.stdout.flush()
            n += 1
            if args.iterations and n >= args.iterations:
                return 0
            time.sleep(args.interval)  # the refresh period of a live view
    except KeyboardInterrupt:
        return 0  # how a live view ends


def _bandwidth_arg(text: str) -> float:
    from noded.capping.units import BandwidthError, parse_bandwidth

    try:
        return parse_bandwidth(text)
    except BandwidthError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _cap_usage(args) -> str | None:
    """What is wrong with a `nodectl cap` command line, or None."""
    if args.release:
        if args.bandwidth is not None or args.ttl is not None or args.reason:
            return "cap --release takes no bandwidth, --ttl or --reason"
    elif args.bandwidth is None:
        return "cap: give a bandwidth (e.g. 6GB/s) or --release"
    return None


def _cap_args(args) -> dict[str, Any]:
    """A cap's request (the command line is checked already: ``_cap_usage``)."""
    if args.release:
        return {"release": True}
    out: dict[str, Any] = {"bytes_per_s": args.bandwidth, "reason": args.reason}
    if args.ttl is not None:
        out["ttl_s"] = args.ttl
    return out


def _run(args) -> int:
    cmd = args.command
    if cmd == "top":
        return _top(args)
    if cmd == "admit":
        return _admit(args)
    if cmd == "model":
        return _model_fit(args)
    result = request(args.socket, cmd, _request_args(args), timeout=args.timeout)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    print_result(cmd, shown(result))
    return 0


def _model_fit(args) -> int:
    """``nodectl model fit``: the co-location model refit, and how well it predicts."""
    m = request(args.socket, "model_fit", timeout=args.timeout)
    if args.json:
        print(json.dumps(m, indent=2, sort_keys=True))
    else:
        print(f"fitted from {m['records']} records; mean absolute error of the predicted speedup "
              f"{m['mean_abs_error']:.3f}")
    return 0


def _request_args(args) -> dict[str, Any]:
    """The arguments of the request a command makes (its labels checked here first)."""
    cmd = args.command
    call_args: dict[str, Any] = {}
    if cmd in ("throttle", "release", "exempt", "explain", "size", "label", "forget", "cap"):
        call_args["job"] = args.job
    if cmd == "label":
        from noded.jobs.labelwords import LabelWordError, parse_label_words

        try:
            call_args["labels"] = parse_label_words(args.labels)
        except LabelWordError as e:
            raise NodectlError(str(e)) from None
    if cmd == "size":
        call_args.update({"cores": args.cores} if args.cores is not None else
                         {"stop": True} if args.stop else {"reprobe": True})
        call_args["reason"] = args.reason
    if cmd == "throttle":
        call_args.update({"level": args.level} if args.level is not None else {"cores": args.cores})
    if cmd in ("throttle", "exempt"):
        if args.ttl is not None:
            call_args["ttl_s"] = args.ttl
        call_args["reason"] = args.reason
    if cmd == "pause":
        call_args["reason"] = args.reason
    if cmd == "cap":
        call_args.update(_cap_args(args))
    return call_args


ADMIT_REFUSED = 3  # exit status of `nodectl admit` when the job is refused


def _admit(args) -> int:
    from noded.colocation.profiles import ProfileError, load_profiles, read_ncu_csv

    call: dict[str, Any] = {"job": args.job, "model": args.model, "batch_size": args.batch_size, "gpu": args.gpu}
    if args.uid is not None:
        call["uid"] = args.uid
    if args.profile:
        # The profile is read here, as the caller, and sent as numbers: the daemon never
        # opens paths on a client's behalf.
        try:
            if args.profile.endswith(".csv"):
                p = read_ncu_csv(args.profile, model=args.model, batch_size=args.batch_size)
            else:
                found = load_profiles(args.profile).get((args.model, args.batch_size))
                if found is None:
                    raise NodectlError(f"{args.profile} has no profile for {args.model} at batch size "
                                       f"{args.batch_size}")
                p = found
        except (OSError, ProfileError) as e:
            raise NodectlError(str(e)) from None
        call["profile"] = {"c": p.c, "m": p.m, "window_us": p.window_us, "source": p.source}
    result = request(args.socket, "admit", call, timeout=args.timeout)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0 if result["admit"] else ADMIT_REFUSED
    result = shown(result)
    if result["admit"]:
        speed = "" if result["predicted_speedup"] is None else f", predicted speedup {result['predicted_speedup']:.2f}"
        print(f"# admitted {result['job']} on GPU {result['gpu_index']} ({result['gpu_uuid']}){speed}: "
              f"{result['reason']}")
        for k, v in sorted(result["env"].items()):
            print(f"export {k}={shlex.quote(v)}")  # for eval: a value is one word, whatever it holds
    else:
        print(f"# refused {result['job']}: {result['reason']}")
    return 0 if result["admit"] else ADMIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
