"""noded on the simulated node, first left alone, then while an unprivileged user
(`nobody`) holds slow connections on each of its three endpoints (issue #11).

One noded (tick 0.1 s, co-location on so the report socket exists), started as a host
runs it (`noded run --config`) beside a simulated node of its own (`noded sim-node`,
another process: nodesim.launch), is measured twice in the same run: a baseline with no
attacker, then under attack, where three children of this process drop to `nobody` and
each keeps --slow connections to one endpoint (the metrics port, the admin socket, the
report socket), sending a byte every --every seconds and reconnecting whatever noded drops. Each phase counts tick
overruns (from noded_ticks / noded_tick_overruns, scraped at its start and end) and
times `nodectl status` (the request, in this process), a scrape, and a `report` (the
training jobs' client, noded.colocation.client). Last, SIGTERM is sent while the
attack is still on, and the daemon's time to exit (the node is torn down after, untimed)
is compared with a quiet noded's (a short run of its own before the others). The CPU,
descriptors and threads are the daemon process's alone.

The admin socket is root:root 0660 here, as the unit makes it for the admin group:
`nobody` is refused at connect(), which the table shows. The runtime directory is
made traversable (0755), as systemd's RuntimeDirectoryMode makes /run/noded, so the
report socket (0666) is open to the attacker, as on a host. Needs root.

    python -m bench.hostile_clients [--seconds 15] [--slow 2000] [--calls 30]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import urllib.request

import yaml

from bench.measure import cpu_seconds, metric
from nodesim.launch import node_and_daemon, tail
from noded.admin.request import request
from noded.colocation.client import report_iteration

NOBODY = 65534
SCENARIO = """\
# A few jobs for the control plane benchmark: two GPU jobs, two CPU jobs.
seed: 11
duration_s: 3600
tick_s: 0.25
node: {profile: intel, gpus: 4, peak_gbps: 20}
events:
  - {at: 0, start: {id: bert, model: BiDAF, gpu: 0}}
  - {at: 0, start: {id: resnet, model: ResNet-50, gpu: 1}}
  - {at: 0, start: {id: etl, cpu_gbps: 4}}
  - {at: 0, start: {id: hog, cpu: hog}}
"""


class Noded:
    """A simulated node and noded beside it, each a process of its own, as on a host
    (nodesim.launch): ``noded sim-node`` with SCENARIO, then ``noded run --config``."""

    def __init__(self, tick_s: float):
        self._stack = contextlib.ExitStack()
        try:
            self.node, self.daemon, self.workdir = self._stack.enter_context(
                node_and_daemon(SCENARIO, f"tick_s: {tick_s}\nmetrics: {{address: 127.0.0.1, port: 0}}\n"
                                "admin: {group: root}\ncolocation: {enabled: true}\n", prefix="noded-hostile-"))
            with open(self.node.env["NODED_SIM_CONFIG"]) as f:
                run = yaml.safe_load(f)["runtime_dir"]
            self.url, self.port = self.daemon.url, self.daemon.port
            self.admin_socket = os.path.join(run, "noded.sock")
            self.report_socket = os.path.join(run, "report.sock")
            self.daemon.wait_until("the report socket", lambda _: os.path.exists(self.report_socket), timeout=60)
            # As systemd's RuntimeDirectoryMode=0755 makes /run/noded: any user reaches report.sock.
            for d in (os.path.dirname(run), run):
                os.chmod(d, 0o755)
            self.daemon.wait_until("five ticks", lambda text: metric(text, "noded_ticks_total") >= 5, timeout=60)
        except BaseException:
            self._stack.close()
            raise

    def counters(self) -> dict[str, float]:
        body = self.daemon.scrape()
        return {"ticks": metric(body, "noded_ticks_total"), "overruns": metric(body, "noded_tick_overruns_total")}

    def usage(self) -> dict[str, float]:
        pid = self.daemon.pid
        with open(f"/proc/{pid}/status") as f:
            threads = int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))
        return {"cpu_s": cpu_seconds(pid), "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": threads}

    def stop(self) -> float:
        """SIGTERM to the daemon: the seconds to its exit (the daemon's alone; the node
        is torn down by ``close``)."""
        code, seconds = self.daemon.stop()
        if code != 0:
            raise SystemExit(f"bench.hostile_clients: noded exited {code}: {tail(self.daemon.log)}")
        return seconds

    def close(self) -> None:
        """The daemon stopped (where it still runs), then the node; nothing left behind."""
        self._stack.close()


class Attack:
    """bench/hostile.py as nobody against one endpoint."""

    def __init__(self, name: str, target: list[str], slow: int, every: float):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.hostile", *target, "--count", str(slow),
                                      "--every", str(every), "--reopen", "--uid", str(NOBODY)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _line(self, word: str) -> dict[str, int]:
        line = self.proc.stdout.readline()  # ends at EOF
        if not line.startswith(word + " "):
            self.proc.kill()
            out, err = self.proc.communicate()
            raise SystemExit(f"bench.hostile_clients: the {self.name} attacker said {line!r}; {out}{err}")
        return {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}

    def ready(self) -> dict[str, int]:
        return self._line("ready")

    def done(self) -> dict[str, int]:
        self.proc.stdin.close()
        stats = self._line("done")
        self.proc.wait(30)
        return stats


def timed(call) -> tuple[float, str | None]:
    t0 = time.perf_counter()
    try:
        call()
        return time.perf_counter() - t0, None
    except Exception as e:  # a failure is a result here: counted and shown
        return time.perf_counter() - t0, f"{type(e).__name__}: {e}"


def report_request(path: str) -> None:
    """What a training job does (noded.colocation.client, its 0.5 s timeout included)."""
    if not report_iteration(0.1, job="cgroup:bert", socket_path=path):
        raise RuntimeError("report_iteration: not taken")


def phase(noded: Noded, seconds: float, calls: int) -> dict:
    c0, u0, t0 = noded.counters(), noded.usage(), time.monotonic()
    lat = {"status": [], "scrape": [], "report": []}
    errors: dict[str, list[str]] = {k: [] for k in lat}
    period = seconds / calls
    for i in range(calls):
        for name, call in (("status", lambda: request(noded.admin_socket, "status", timeout=10)),
                           ("scrape", lambda: urllib.request.urlopen(noded.url, timeout=10).read()),
                           ("report", lambda: report_request(noded.report_socket))):
            took, err = timed(call)
            lat[name].append(took)
            if err:
                errors[name].append(err)
        pause = t0 + (i + 1) * period - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # spreading the calls over the phase
    c1, u1 = noded.counters(), noded.usage()
    wall = time.monotonic() - t0
    ticks = c1["ticks"] - c0["ticks"]
    return {"seconds": wall, "ticks": ticks, "overruns": c1["overruns"] - c0["overruns"],
            "expected_ticks": wall / noded_tick_s, "cpu_share": (u1["cpu_s"] - u0["cpu_s"]) / wall,
            "fds": u1["fds"], "threads": u1["threads"],
            "latency": {k: {"median": statistics.median(v), "max": max(v), "n": len(v), "errors": len(errors[k]),
                            "first_error": errors[k][0] if errors[k] else None} for k, v in lat.items()}}


noded_tick_s = 0.1


def main(argv: list[str] | None = None) -> int:
    global noded_tick_s
    ap = argparse.ArgumentParser(prog="python -m bench.hostile_clients", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    ap.add_argument("--slow", type=int, default=2000, help="slow connections per endpoint")
    ap.add_argument("--every", type=float, default=3.0, help="seconds between an attacker's bytes")
    ap.add_argument("--calls", type=int, default=30, help="nodectl status / scrape / report calls per phase")
    ap.add_argument("--tick", type=float, default=0.1)
    ap.add_argument("--out", default="bench/out/hostile_clients.json")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench.hostile_clients: needs root (the attackers drop to nobody; the sim node uses FUSE)")
    noded_tick_s = args.tick
    quiet = Noded(args.tick)
    try:  # SIGTERM with no attacker, for comparison with SIGTERM under attack
        quiet_stop_s = quiet.stop()
    finally:
        quiet.close()
    attacks: list[Attack] = []
    noded = None
    try:
        noded = Noded(args.tick)
        baseline = phase(noded, args.seconds, args.calls)
        targets = {"metrics": ["--tcp", f"127.0.0.1:{noded.port}", "--first", r"GET /metrics HTTP/1.1\r\n"],
                   "admin": ["--unix", noded.admin_socket],
                   "report": ["--unix", noded.report_socket]}
        attacks = [Attack(name, target, args.slow, args.every) for name, target in targets.items()]
        opened = {a.name: a.ready() for a in attacks}
        attacked = phase(noded, args.seconds, args.calls)
        stop_s = noded.stop()  # SIGTERM with the attack still on
        held = {a.name: a.done() for a in attacks}
        attacks = []
    finally:
        for a in attacks:
            a.proc.kill()
            a.proc.wait()
        if noded is not None:
            noded.close()
    result = {"baseline": baseline, "attack": attacked, "attackers": {"ready": opened, "done": held},
              "sigterm_quiet_s": quiet_stop_s, "sigterm_under_attack_s": stop_s, "slow_per_endpoint": args.slow, "every_s": args.every,
              "tick_s": args.tick, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print_table(result)
    print(f"wrote {args.out}")
    return 0


def print_table(r: dict) -> None:
    b, a = r["baseline"], r["attack"]
    ms = lambda v: f"{v * 1000:.0f} ms" if v >= 0.01 else f"{v * 1000:.1f} ms"
    over = lambda p: f"{p['overruns']:.0f} of {p['ticks']:.0f} ({p['overruns'] / max(p['ticks'], 1):.1%})"
    rows = [("", "no attacker", f"{r['slow_per_endpoint']} slow x 3 endpoints, as nobody"),
            ("ticks (expected at tick_s)", f"{b['ticks']:.0f} ({b['expected_ticks']:.0f})",
             f"{a['ticks']:.0f} ({a['expected_ticks']:.0f})"),
            ("tick overruns", over(b), over(a))]
    for name, label in (("status", "nodectl status"), ("scrape", "GET /metrics"), ("report", "report (report.sock)")):
        cell = lambda p: (f"{ms(p['latency'][name]['median'])} / {ms(p['latency'][name]['max'])}"
                          + (f", {p['latency'][name]['errors']} failed" if p['latency'][name]['errors'] else ""))
        rows.append((f"{label}: median / max", cell(b), cell(a)))
    rows += [("noded CPU (share of one core)", f"{b['cpu_share']:.0%}", f"{a['cpu_share']:.0%}"),
             ("noded descriptors / threads at the end", f"{b['fds']} / {b['threads']}", f"{a['fds']} / {a['threads']}")]
    width = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, width)).rstrip())
    print()
    print("attacker (nobody)   connected at first   refused at connect   dropped by noded   open after noded exited")
    for name in ("metrics", "admin", "report"):
        ready, done = r["attackers"]["ready"][name], r["attackers"]["done"][name]
        refused = done.get("refused", 0)
        why = ", ".join(f"{k.removeprefix('errno_')} {v}" for k, v in done.items() if k.startswith("errno_"))
        print(f"{name:<20}{ready['opened']:<21}{refused:<21}{done['dropped']:<19}{done['held']}"
              + (f"   ({why}; reconnects included)" if why else ""))
    print()
    print(f"SIGTERM: noded exited in {r['sigterm_quiet_s']:.2f} s with no attacker (a run of its own), "
          f"{r['sigterm_under_attack_s']:.2f} s under attack")
    ok = a["overruns"] <= 0.01 * a["ticks"] and a["latency"]["status"]["max"] < 1.0 and \
        not a["latency"]["status"]["errors"] and r["sigterm_under_attack_s"] < 2.0
    print(f"target (under attack: overruns <= 1 %, nodectl status < 1 s, SIGTERM < 2 s): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
