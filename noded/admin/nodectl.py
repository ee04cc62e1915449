"""nodectl: the operator's client for noded's admin socket."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import stat
import sys
import time
import traceback
from typing import Any, Callable

from noded.util import ages
from noded.util.cliopts import EXIT_INTERRUPTED, HelpFormatter, broken_pipe, option_parents, subparsers
from noded.util.journal import escaped, printable, words
from noded.server.client import NotThePeer, ReplyTooLarge, request_line
from noded.admin.protocol import VERSION, encode
from noded.admin.replyshape import SHAPES, MalformedReply, check_reply

DEFAULT_SOCKET = "/run/noded/noded.sock"
GB = 1e9


class NodectlError(Exception):
    pass


class NotNodedsAnswer(NodectlError):
    """What came back is not an answer noded gives: not JSON, or not of its command's shape."""


class RefusedByNoded(NodectlError):
    """noded answered, and its answer is an error (the request was refused): not a noded
    that is down or silent."""


#: how long nodectl waits for noded, connecting, asking and reading the answer together
DEFAULT_TIMEOUT_S = 10.0
#: a reply larger than this is not noded's (a status of thousands of jobs is a few MiB)
MAX_REPLY_BYTES = 64 * 1024 * 1024
#: noded runs as root: a socket answered by anyone else is not noded's (a socket path
#: another user could replace), and no request is sent to it
NODED_UID = 0


def request(path: str, command: str, args: dict[str, Any] | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """One request and its reply, all within ``timeout`` seconds (not per read: a daemon
    that answers a byte at a time cannot hold nodectl longer). The reply is checked whole
    against the command's shape: one that is not noded's is NotNodedsAnswer, before any of
    it is read."""
    try:
        buf = request_line(path, encode({"version": VERSION, "command": command, "args": args or {}}), timeout,
                           MAX_REPLY_BYTES, peer_uid=NODED_UID)
    except ReplyTooLarge as e:
        raise NodectlError(f"{e}: not noded's") from None
    except NotThePeer as e:
        raise NodectlError(f"{e}: not noded (it runs as root); nothing was sent") from None
    except TimeoutError:
        raise NodectlError(f"{path}: noded did not answer within {timeout:g}s; is it overloaded or "
                           "stopped? (a request it has not read yet is not carried out: nodectl gave up on it)") from None
    except FileNotFoundError:
        raise NodectlError(f"no admin socket at {path}: is noded running?") from None
    except PermissionError:
        raise NodectlError(f"permission denied on {path}: run as root or as a member of noded's admin group") from None
    except ConnectionRefusedError:
        raise NodectlError(_refused(path)) from None
    except OSError as e:
        raise NodectlError(f"{path}: {e.strerror or e}") from None
    if not buf:
        raise NodectlError(f"{path}: noded closed the connection without an answer")
    try:
        reply = json.loads(buf)
    except ValueError:  # not JSON, or not UTF-8
        reply = None
    if not isinstance(reply, dict):
        raise NotNodedsAnswer(f"{path}: not an answer from noded: {buf[:200]!r}")
    if not reply.get("ok"):
        raise RefusedByNoded(reply.get("error", "unknown error"))
    result = reply.get("result")
    if command in SHAPES:
        try:
            check_reply(command, result)
        except MalformedReply as e:
            raise NotNodedsAnswer(f"{path}: an answer to {command!r} of a shape noded does not give ({e}); "
                                  "is it noded, of this version?") from None
    return result


def _refused(path: str) -> str:
    """Why a connect to ``path`` was refused: a socket no process listens on (noded is
    down), or no socket at all (the kernel refuses both alike; the second is a wrong path,
    and restarting noded would not help)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is None or stat.S_ISSOCK(mode):
        return f"{path}: nothing is listening (noded stopped or is starting?)"
    kind = next((name for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                                         (stat.S_ISFIFO, "a FIFO")) if test(mode)), "a device")
    return f"{path} is {kind}, not a socket: --socket (or $NODED_SOCKET) must name noded's admin socket"


def _socket_path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("an empty path: name noded's admin socket")
    return text


def shown(value: Any) -> Any:
    """An answer for text output: every string in it (job ids come from cgroup names, reasons
    from any operator, errors from noded) with its control characters escaped, so nothing
    in it can move the cursor, retitle or clear the terminal, or forge a line; one to one
    (``escaped``: a backslash doubled where it would read as an escape), so two jobs never
    show as the same id. (--json needs none of this: json.dumps escapes them.)"""
    if isinstance(value, str):
        return escaped(value)
    if isinstance(value, dict):
        return {shown(k): shown(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shown(v) for v in value]
    return value


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


def _gbps(v: float | None) -> str:
    return "-" if v is None else f"{v / GB:.1f}"


def _pct(v: float | None, scale: float = 1.0) -> str:
    return "-" if v is None else f"{v * scale:.0f}%"


def format_status(st: dict[str, Any]) -> str:
    lines = []
    node = st.get("node")
    state = f"PAUSED ({st['paused']})" if st["paused"] else "active"
    if "tick_s" in st:
        lines.append(f"noded {state}; throttling with {st['throttle_method'] or 'nothing'}; tick {st['tick_s']:g}s; "
                     f"threshold {st['threshold']:.0%} (release below {st['release_threshold']:.0%}) of "
                     f"{st['peak_bytes_per_s_per_domain'] / GB:g} GB/s per domain")
    else:  # no tick has completed: the settings it ran with are not known yet
        lines.append(f"noded {state}")
    # a failing loop first: it decides and changes nothing, whatever the rest shows (its last good tick)
    failing = _tick_failure_line(st.get("tick_failures"))
    if failing:
        lines.append(failing)
    if node is None:
        lines.append("no tick yet")
        return "\n".join(lines) + "\n"
    # what noded does not watch first, before anything it shows: an empty table may mean "nothing to see"
    for w in st.get("watching", ()):
        if not w["watching"]:
            lines.append(f"NOT WATCHING {w['what']}: {w['why']}")
    watched = [w["why"] for w in st.get("watching", ()) if w["watching"]]
    if watched:
        lines.append("watching: " + "; ".join(watched))
    doms = ", ".join(f"L3 {d}: {_gbps(v)} GB/s" for d, v in sorted(node["bandwidth_bytes_per_s"].items()))
    lines.append(f"node: {_pct(node['share_of_peak'], 100)} of peak ({doms})"
                 + ("; CONTENTION" if node["contention"] else "") + (f"; {node['note']}" if node["note"] else ""))
    if st["gpus"]:
        lines.append("gpus: " + "  ".join(f"{g['gpu']}:{_pct(g['util'])}" + (f"({g['error']})" if g["error"] else "")
                                          for g in st["gpus"]))
    lines.append("")
    lines.append(format_jobs(st["jobs"]).rstrip("\n"))
    if st["overrides"]:
        lines.append("")
        lines.append("overrides:")
        for o in st["overrides"]:
            ttl = "until released" if o["expires_in_s"] is None else f"{ages.format_age(o['expires_in_s'])} left"
            held = f"{o['cap_bytes_per_s'] / GB:.3g} GB/s" if o.get("cap_bytes_per_s") else f"level {o['level']}"
            lines.append(f"  {o['job']}: {o['kind']} {held} by uid {o['set_by_uid']}, {ttl}"
                         + (f" ({o['reason']})" if o["reason"] else ""))
    if st["missing"]:
        lines.append("")
        lines.append("missing: " + "; ".join(st["missing"]))
    return "\n".join(lines) + "\n"


def _tick_failure_line(failures: dict[str, Any] | None) -> str | None:
    """While ticks fail: how many in a row, since when, and why; once they complete again:
    when the last one failed. None where no tick has failed since start."""
    if not failures or failures.get("last") is None:
        return None
    last = failures["last"]
    ago = "at an unknown time" if last["seconds_ago"] is None else f"{ages.format_age(last['seconds_ago'])} ago"
    if failures["in_a_row"]:
        n = failures["in_a_row"]
        return (f"TICK FAILING: {n} tick{'s' if n != 1 else ''} in a row, the last {ago}: {last['error']}; "
                "nothing is decided or changed until a tick completes (the journal has the traceback)")
    return f"last failed tick {ago}: {last['error']}; ticks complete since"


def format_jobs(jobs: list[dict[str, Any]]) -> str:
    rows = [("JOB", "KIND", "GB/s", "GPU", "LEVEL", "NOTE")]
    for j in jobs:
        pod = j.get("pod")
        cap = j.get("cap_bytes_per_s")
        note = ", ".join(n for n, on in ((f"cap {_gbps(cap)} GB/s", cap), ("override", j["override"]),
                                         ("exempt", j["exempt"]),
                                         (f"monitoring {j['monitoring']}", j["monitoring"] != "own"),
                                         (f"pod {pod['qos']}" if pod else "", pod)) if on)
        rows.append((j["job"], j["kind"], _gbps(j["bandwidth_bytes_per_s"]),
                     _pct(j["gpu_util"]) if j["kind"] == "gpu" else "", str(j["level"] or ""), note))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in rows)


def _rate_read(read: dict[str, Any] | None) -> str:
    """How old a job's rate is, in explain: read this tick, or carried from a read some
    seconds ago (a quiet node read thin); and what it is a mean over, where known."""
    if not read:  # no rate, or a noded that does not say
        return ""
    over = f", its mean over {ages.format_age(read['window_s'])}" if read.get("window_s") is not None else ""
    if read["this_tick"]:
        return f" (read this tick{over})"
    return (f" (carried: read {ages.format_age(read['seconds_ago'])} ago{over}; a quiet node's jobs are read "
            f"every resctrl.quiet_read_every ticks)")


def format_explain(e: dict[str, Any]) -> str:
    lines = [f"{e['job']}: {e['kind']} job, throttle level {e['level']}, {_gbps(e['bandwidth_bytes_per_s'])} GB/s"
             + _rate_read(e.get("bandwidth_read"))
             + (f", GPU {_pct(e['gpu_util'])} (baseline {_pct(e['baseline'])})" if e["kind"] == "gpu" else ""),
             f"node at {_pct(e['node_share_of_peak'], 100)} of peak, threshold {_pct(e['threshold'], 100)}; "
             f"slowed GPU jobs: {words(e['slowed_gpu_jobs']) or 'none'}"]
    pod = e.get("pod")
    if pod:
        lines.append(f"pod uid {pod['uid']}, QoS {pod['qos']} (kubelet's {pod['driver']} cgroup driver), "
                     f"containers: {words(pod['containers']) or 'none'}")
    lines += [f"  - {w}" for w in e["why"]]
    lines += format_sizing(e)
    if e.get("held"):
        lines.append(f"held at level {e['level']}, not released because:")
        lines += [f"  - {w}" for w in e["held"]]
    if e["decisions"]:
        lines.append("last decisions:")
        lines += [f"  {ages.format_age(d['seconds_ago']) + ' ago':>10}  {d['action']} {d['from']}->{d['to']} "
                  f"({d['cause']}): {d['reason']}"
                  for d in e["decisions"]]
    else:
        lines.append("no decisions about it yet")
    return "\n".join(lines) + "\n"


def format_size(r: dict[str, Any]) -> str:
    """What a `nodectl size` did, in words."""
    if r.get("note"):
        return f"{r['job']}: {r['note']}\n"
    why = f"reason: {r['reason']}" if r["reason"] else "no reason given"
    head = {"pin": f"{r['job']} is pinned at {r['cores']} cores, no probing until --reprobe",
            "stop": f"{r['job']}: probing stopped, it keeps {r['cores']} cores",
            "reprobe": f"{r['job']} is probed again from {r['cores']} cores"}.get(r["control"], r["job"])
    then = "it has that many already" if r["cores"] == r["cores_before"] else \
        f"it asked for {r['cores_before']} before; noded's next plan gives it {r['cores']}"
    return f"{head} ({why}); state {r['state']}; {then}\n"


def format_sizing(e: dict[str, Any]) -> list[str]:
    """A job's right-sizing in explain: the curve measured, the plan's note, what it borrowed."""
    lines = []
    z = e.get("sizing")
    if z:
        lines.append(f"right-sizing: {z['state']} (phase {z['phase']}), asks {z['target']} of its {z['max_cores']} "
                     f"CPUs" + (f", found best {z['optimal']}" if z["optimal"] is not None else "")
                     + (f", holds {z['allocated']} now" if z["allocated"] is not None else "")
                     + f"; measured by {z['signal']}")
        if z["points"]:
            lines.append("  cores -> throughput (in the order measured):")
            best = max(p[1] for p in z["points"])
            lines += [f"  {c:>5} -> {v:.4g}{'  (best)' if v == best else ''}" for c, v in z["points"]]
        else:
            lines.append("  nothing measured yet")
        if z["plan_note"]:
            lines.append(f"  plan: {z['plan_note']}")
    if e.get("borrowed_cpus"):
        lines.append(f"borrows GPU-array CPUs {','.join(map(str, e['borrowed_cpus']))} (lent while idle)")
    return lines


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


def _when(expires_in_s: float | None) -> str:
    """'until released', 'until 12:30:00', or 'until 2025-01-02 12:30:00' beyond today."""
    if expires_in_s is None:
        return "until released"
    at = time.time() + expires_in_s
    fmt = "%H:%M:%S" if time.strftime("%Y-%m-%d", time.localtime(at)) == time.strftime("%Y-%m-%d") \
        else "%Y-%m-%d %H:%M:%S"
    return f"until {time.strftime(fmt, time.localtime(at))}"


def _bandwidth_arg(text: str) -> float:
    from noded.capping.units import BandwidthError, parse_bandwidth

    try:
        return parse_bandwidth(text)
    except BandwidthError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def format_cap(r: dict[str, Any]) -> str:
    """What a `nodectl cap` did, in words."""
    if "cap_released" in r:
        return f"{r['job']}: " + ("cap released; the policy decides again" if r["cap_released"] else "had no cap") \
            + "\n"
    why = f"reason: {r['reason']}" if r["reason"] else "no reason given"
    head = f"{r['job']} is capped at {r['cap_bytes_per_s'] / GB:.3g} GB/s {_when(r['expires_in_s'])} ({why})"
    if not r["in_last_sample"]:
        then = "it was not among noded's jobs at the last tick: the cap holds once it is"
    else:
        then = f"it moved {_gbps(r['bandwidth_bytes_per_s'])} GB/s at the last tick"
    if r.get("replaced"):
        then += f"; this replaces its {r['replaced']} override"
    return f"{head}; {then}\n"


def format_override(command: str, r: dict[str, Any]) -> str:
    """What a throttle or exempt did, in words."""
    job, level, now = r["job"], r["level"], r["level_now"]
    why = f"reason: {r['reason']}" if r["reason"] else "no reason given"
    if command == "exempt":
        head = f"{job} is exempt from throttling {_when(r['expires_in_s'])} ({why})"
        then = f"it was at level {now} and will be released next tick" if now else "it is not throttled now"
    else:
        head = f"{job} is held at throttle level {level} of {r['max_level']} {_when(r['expires_in_s'])} ({why})"
        then = "it is at that level already" if now == level else \
            f"it was at level {now} and goes to level {level} next tick"
    if not r["in_last_sample"]:
        then = "it was not among noded's jobs at the last tick: the override holds once it is"
    return f"{head}; {then}\n"


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
    _print_result(cmd, shown(result))
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


def _print_result(cmd: str, result: dict[str, Any]) -> None:
    """A command's answer as text."""
    if cmd == "status":
        sys.stdout.write(format_status(result))
    elif cmd == "jobs":
        sys.stdout.write(format_jobs(result))
    elif cmd == "explain":
        sys.stdout.write(format_explain(result))
    elif cmd in ("throttle", "exempt"):
        sys.stdout.write(format_override(cmd, result))
    elif cmd == "size":
        sys.stdout.write(format_size(result))
    elif cmd == "cap":
        sys.stdout.write(format_cap(result))
    elif cmd == "label":
        print(f"{result['job']}: " + " ".join(f"{k}={v}" for k, v in sorted(result["labels"].items())))
    elif cmd == "forget":
        print(f"{result['job']}: " + ("labels forgotten" if result["labels_forgotten"] else "had no labels") + ", "
              + ("reservation released" if result["reservation_released"] else "had no reservation"))
    elif cmd == "release":
        held = result.get("overrides", [])
        print(f"{result['job']}: " + ("override removed" if result["override_cleared"] else
                                      "had no override; " + (f"overrides are on {words(held)}" if held else
                                                             "no job has one")))
        if result.get("not_saved"):
            print(f"nodectl: warning: in force, but not saved ({result['not_saved']}): a restart of noded before "
                  "its state directory is writable again would bring the override back", file=sys.stderr)
    else:
        print("paused: " + result["paused"] if result["paused"] else "resumed")


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
