"""noded on the simulated node, first left alone, then while an unprivileged user
(`nobody`) holds slow connections on each of its three endpoints (issue #11).

One `noded run --sim` (tick 0.1 s, co-location on so the report socket exists) is
measured twice in the same run: a baseline with no attacker, then under attack, where
three children of this process drop to `nobody` and each keeps --slow connections to
one endpoint (the metrics port, the admin socket, the report socket), sending a byte
every --every seconds and reconnecting whatever noded drops. Each phase counts tick
overruns (from noded_ticks / noded_tick_overruns, scraped at its start and end) and
times `nodectl status` (the request, in this process), a scrape, and a `report` (the
training jobs' client, noded.colocation.client). Last, SIGTERM is sent while the
attack is still on, and the time to exit is compared with a quiet noded's (a short
run of its own before the others).

The admin socket is root:root 0660 here, as the unit makes it for the admin group:
`nobody` is refused at connect(), which the table shows. The runtime directory is
made traversable (0755), as systemd's RuntimeDirectoryMode makes /run/noded, so the
report socket (0666) is open to the attacker, as on a host. Needs root.

    python -m bench.hostile_clients [--seconds 15] [--slow 2000] [--calls 30]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from noded.admin import nodectl
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
    def __init__(self, workdir: str, tick_s: float):
        self.workdir = workdir
        self.admin_socket = f"{workdir}/noded.sock"
        scenario = f"{workdir}/scenario.yaml"
        config = f"{workdir}/noded.yaml"
        with open(scenario, "w") as f:
            f.write(SCENARIO)
        with open(config, "w") as f:
            f.write(f"tick_s: {tick_s}\nmetrics: {{address: 127.0.0.1, port: 0}}\n"
                    f"admin: {{socket: {self.admin_socket}, group: root}}\n"
                    f"colocation:\n  enabled: true\n  mps: {{log_dir: {workdir}/mps-log}}\n")  # the sim's MPS stand-in
        self.tmp = f"{workdir}/tmp"  # where noded run --sim makes its scratch (runtime and state) directory
        os.mkdir(self.tmp)
        self.proc = subprocess.Popen([sys.executable, "-m", "noded", "run", "--sim", scenario, "--config", config],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "TMPDIR": self.tmp})
        self.stderr: list[str] = []
        threading.Thread(target=lambda: self.stderr.extend(iter(self.proc.stderr.readline, "")), daemon=True).start()
        first = self.proc.stdout.readline()
        m = re.fullmatch(r"noded: metrics at (\S+)\n", first)
        if not m:
            self.proc.kill()
            raise SystemExit(f"bench.hostile_clients: noded said {first!r}; {self.proc.stdout.read()}"
                             f"{''.join(self.stderr)}")
        self.url = m.group(1)
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        threading.Thread(target=lambda: [None for _ in iter(self.proc.stdout.readline, "")], daemon=True).start()
        self.report_socket = self._wait(lambda: (glob.glob(f"{self.tmp}/noded-sim-*/run/report.sock") or [None])[0],
                                        "the report socket")
        # As systemd's RuntimeDirectoryMode=0755 makes /run/noded: any user reaches report.sock.
        run = os.path.dirname(self.report_socket)
        for d in (os.path.dirname(run), run):
            os.chmod(d, 0o755)
        os.chmod(workdir, 0o755)
        self._wait(lambda: self.counters()["ticks"] >= 5, "five ticks")

    def _wait(self, what, name: str, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = what()
            except OSError:
                value = None
            if value:
                return value
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise SystemExit(f"bench.hostile_clients: no {name} from noded; {''.join(self.stderr)[-3000:]}")
            time.sleep(0.1)  # polling noded's start from outside

    def counters(self) -> dict[str, float]:
        body = urllib.request.urlopen(self.url, timeout=10).read().decode()
        get = lambda name: float(re.search(rf"^{name} (\S+)$", body, re.M).group(1))
        return {"ticks": get("noded_ticks_total"), "overruns": get("noded_tick_overruns_total")}

    def usage(self) -> dict[str, float]:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{self.proc.pid}/status") as f:
            threads = int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))
        return {"cpu_s": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
                "fds": len(os.listdir(f"/proc/{self.proc.pid}/fd")), "threads": threads}

    def stop(self) -> float:
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - t0


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
    if not report_iteration(0.1, job="sim:bert", socket_path=path):
        raise RuntimeError("report_iteration: not taken")


def phase(noded: Noded, seconds: float, calls: int) -> dict:
    c0, u0, t0 = noded.counters(), noded.usage(), time.monotonic()
    lat = {"status": [], "scrape": [], "report": []}
    errors: dict[str, list[str]] = {k: [] for k in lat}
    period = seconds / calls
    for i in range(calls):
        for name, call in (("status", lambda: nodectl.request(noded.admin_socket, "status", timeout=10)),
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
    quiet_dir = tempfile.mkdtemp(prefix="noded-quiet-")
    try:  # SIGTERM with no attacker, for comparison with SIGTERM under attack
        quiet = Noded(quiet_dir, args.tick)
        quiet_stop_s = quiet.stop()
    finally:
        shutil.rmtree(quiet_dir, ignore_errors=True)
    workdir = tempfile.mkdtemp(prefix="noded-hostile-")
    attacks: list[Attack] = []
    noded = None
    try:
        noded = Noded(workdir, args.tick)
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
        if noded is not None and noded.proc.poll() is None:
            noded.proc.kill()
            noded.proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
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
