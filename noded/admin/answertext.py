"""noded's answers in words, as nodectl prints them on a terminal: the status and jobs
tables, explain, and what an override, a cap or a size did. Every string of an answer is
escaped first (``shown``): job ids come from cgroup names, which a tenant chooses."""

from __future__ import annotations

import sys
import time
from typing import Any

from noded.util import ages
from noded.util.journal import escaped, words


GB = 1e9


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


def _when(expires_in_s: float | None) -> str:
    """'until released', 'until 12:30:00', or 'until 2025-01-02 12:30:00' beyond today."""
    if expires_in_s is None:
        return "until released"
    at = time.time() + expires_in_s
    fmt = "%H:%M:%S" if time.strftime("%Y-%m-%d", time.localtime(at)) == time.strftime("%Y-%m-%d") \
        else "%Y-%m-%d %H:%M:%S"
    return f"until {time.strftime(fmt, time.localtime(at))}"


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


def print_result(cmd: str, result: dict[str, Any]) -> None:
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
