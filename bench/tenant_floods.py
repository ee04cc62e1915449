"""noded's own CPU under what one tenant can send it, beside its normal cost (issue #22).

The simulated node runs as its own process (``noded sim-node --hold``: the resctrl
emulator, the stand-in NVML, the jobs as real processes in real cpuset cgroups, found
by a ``cgroup`` job source over the node's cgroup), with right-sizing on so that the
report socket listens, and noded as a host runs it (``noded run --config``). Measured
from ``/proc/PID/stat`` (utime + stime) over a window each, with the tick's mean
duration and its overruns from noded's own metrics (scraped at each window's edges only):

1. normal: the node's jobs, nothing else (the baseline: each flood is a ratio of it);
2. empty cgroups: ``--cgroups`` empty directories made under the job source's root
   (each one a job directory to its pattern), then the window while they stand;
3. exec storm: ``--shells`` shells as another user (nobody), each running /bin/true in
   a loop for the window's length (``timeout`` ends them);
4. report flood: one job's process (nobody's, in a job cgroup of its own, found by
   noded first) sending reports back to back on the report socket for the window.

Each flood stops by itself (a count, a time limit) and is cleaned away before the next
window; all traffic is on the host (a Unix socket, the kernel's process events).

    python -m bench.tenant_floods [--jobs 20] [--gpus 2] [--seconds 20] [--cgroups 10000] [--shells 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from nodesim.node import make_cpuset
from bench.daemon_cost import histogram_ms, jobs_running
from bench.measure import count_series, cpu_seconds, metric
from nodesim.launch import DaemonProcess, node_and_daemon
from nodesim.waiting import wait_for

NOBODY = 65534
#: the flooder runs as another user: an interpreter any user may run, with no module of noded's
SYSTEM_PYTHON = "/usr/bin/python3"
JBW = "noded_job_memory_bandwidth_bytes_per_second"
WARMUP_TICKS = 3

FLOODER = r"""
import json, socket, sys, time
path, job, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
sys.stdin.readline()  # once noded knows this process as its job's
request = json.dumps({"version": 1, "command": "report", "args": {"job": job, "iteration_s": 0.1}}).encode() + b"\n"
sent, replies, end = 0, {}, time.monotonic() + seconds
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        s.sendall(request)
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    except OSError as e:
        reply = json.dumps({"ok": False, "error": f"{type(e).__name__}"}).encode()
    finally:
        s.close()
    sent += 1
    try:
        r = json.loads(reply)
        key = "taken" if r["ok"] else r["error"].split(":")[0][:40]
    except ValueError:
        key = "no reply"
    replies[key] = replies.get(key, 0) + 1
print(json.dumps({"sent": sent, "replies": replies}), flush=True)
"""


def scenario_text(jobs: int, gpus: int) -> str:
    lines = []
    for i in range(jobs):
        if i % 2 == 0:
            lines.append(f"  - {{at: 0, start: {{id: g{i}, model: BiDAF, gpu: {(i // 2) % gpus}}}}}")
        else:
            lines.append(f"  - {{at: 0, start: {{id: c{i}, cpu_gbps: 0.1}}}}")
    return (f"seed: 1\nduration_s: 60\nnode: {{profile: intel, gpus: {gpus}, peak_gbps: 100}}\n"
            "events:\n" + "\n".join(lines) + "\n")


def config_text(tick: float) -> str:
    # right-sizing on (GPU jobs of the cgroup source): the report socket listens
    return f"tick_s: {tick}\nmetrics: {{address: 127.0.0.1, port: 0}}\nrightsize: {{sources: [cgroup]}}\n"


def as_nobody():
    os.setgid(NOBODY)
    os.setgroups([])
    os.setuid(NOBODY)




class EmptyCgroups:
    def __init__(self, root: str, count: int):
        self.paths = [os.path.join(root, f"tenant-empty-{i:05d}") for i in range(count)]

    def start(self) -> dict:
        t0 = time.monotonic()
        for p in self.paths:
            os.mkdir(p)
        return {"made": len(self.paths), "made_in_s": round(time.monotonic() - t0, 2)}

    def stop(self) -> dict:
        for p in self.paths:
            try:
                os.rmdir(p)
            except FileNotFoundError:
                pass
        return {}


class ExecStorm:
    def __init__(self, shells: int, seconds: float):
        self.shells, self.seconds = shells, seconds
        self.procs: list[subprocess.Popen] = []

    def start(self) -> dict:
        for _ in range(self.shells):
            self.procs.append(subprocess.Popen(
                ["timeout", "-s", "KILL", f"{self.seconds:g}", "sh", "-c", "while :; do /bin/true; done"],
                preexec_fn=as_nobody, stdin=subprocess.DEVNULL))
        return {"shells": self.shells}

    def stop(self) -> dict:
        for p in self.procs:
            p.wait(self.seconds + 30)
        return {}


class ReportFlood:
    def __init__(self, cgroup_root: str, socket_path: str, seconds: float, daemon: DaemonProcess):
        self.cgroup = os.path.join(cgroup_root, "tenant-flooder")
        self.socket_path, self.seconds, self.daemon = socket_path, seconds, daemon
        self.proc: subprocess.Popen | None = None

    def start(self) -> dict:
        make_cpuset(self.cgroup)
        procs = f"{self.cgroup}/cgroup.procs"

        def join_then_become_nobody():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
            as_nobody()

        self.proc = subprocess.Popen([SYSTEM_PYTHON, "-c", FLOODER, self.socket_path, "cgroup:tenant-flooder",
                                      str(self.seconds)], preexec_fn=join_then_become_nobody,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={})
        # noded must know the flooder as its job's process first (else each report is refused early)
        at = metric(self.daemon.scrape(), "noded_ticks_total")
        self.daemon.wait_until("the flooder's job to be found", lambda t: metric(t, "noded_ticks_total") >= at + 2)
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return {}

    def stop(self) -> dict:
        out = json.loads(self.proc.stdout.read() or "{}")
        self.proc.wait(30)
        wait_for(lambda: not open(f"{self.cgroup}/cgroup.procs").read().strip(), 10, what="the flooder's cgroup to empty")
        os.rmdir(self.cgroup)
        return out


def window(daemon: DaemonProcess, seconds: float) -> dict:
    before = daemon.scrape()
    c0, t0 = cpu_seconds(daemon.pid), time.monotonic()
    time.sleep(seconds)  # the measured window
    c1, wall = cpu_seconds(daemon.pid), time.monotonic() - t0
    after = daemon.scrape()

    def delta(name: str, labels: str = "") -> float:
        a, b = metric(before, name, labels), metric(after, name, labels)
        return (b or 0.0) - (a or 0.0)

    return {"wall_s": round(wall, 2), "cpu_pct": round(100 * (c1 - c0) / wall, 2),
            "tick_ms": histogram_ms(before, after, "noded_tick_duration_seconds", "stage", "total"),
            "ticks": int(delta("noded_ticks_total")), "overruns": int(delta("noded_tick_overruns_total")),
            "exec_events": int(delta("noded_process_events_total")),
            "exec_dropped": int(delta("noded_process_events_dropped_total")),
            "reports_dropped": int(delta("noded_reports_dropped_total", 'reason="uid"')
                                   + delta("noded_reports_dropped_total", 'reason="job"')),
            "source_capped": metric(after, "noded_job_source_capped") or 0.0}


def report_socket(config_path: str) -> str:
    from noded.config import load_config

    return load_config(config_path).report_socket


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tenant_floods", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0, help="each measured window")
    ap.add_argument("--tick", type=float, default=1.0)
    ap.add_argument("--cgroups", type=int, default=10000)
    ap.add_argument("--shells", type=int, default=2)
    ap.add_argument("--json", default="bench/out/tenant_floods.json")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench.tenant_floods: needs root (the simulated node mounts FUSE and makes cgroups)")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        raise SystemExit(f"bench.tenant_floods: {SYSTEM_PYTHON} is needed (the flooder runs as another user)")
    rows = []
    with node_and_daemon(scenario_text(args.jobs, args.gpus), config_text(args.tick),
                         prefix="noded-bench-floods-") as (node, daemon, _):
        env = node.env
        wait_for(lambda: jobs_running(env["NODED_SIM_CGROUP"]) == args.jobs, 120, 0.2,
                 what=f"all {args.jobs} jobs running")
        text = daemon.wait_until(f"all {args.jobs} jobs measured", lambda t: count_series(t, JBW) == args.jobs)
        at = metric(text, "noded_ticks_total")
        daemon.wait_until("warm-up", lambda t: metric(t, "noded_ticks_total") >= at + WARMUP_TICKS)
        cgroup = env["NODED_SIM_CGROUP"]
        floods = [("normal", None),
                  (f"{args.cgroups} empty cgroups", EmptyCgroups(cgroup, args.cgroups)),
                  (f"exec storm, {args.shells} shells", ExecStorm(args.shells, args.seconds + 2)),
                  ("report flood, 1 job", ReportFlood(cgroup, report_socket(env["NODED_SIM_CONFIG"]), args.seconds + 2,
                                                      daemon))]
        for name, flood in floods:
            info = flood.start() if flood else {}
            try:
                if isinstance(flood, EmptyCgroups):  # the first tick after lists them all: not the steady state
                    at = metric(daemon.scrape(), "noded_ticks_total")
                    daemon.wait_until("two ticks", lambda t: metric(t, "noded_ticks_total") >= at + 2)
                row = {"flood": name, **window(daemon, args.seconds), **info}
            finally:
                row_after = flood.stop() if flood else {}
            row.update(row_after)
            rows.append(row)
            print(f"# {name}: {json.dumps(row)}", file=sys.stderr, flush=True)
    normal = rows[0]["cpu_pct"] or 1e-9
    print(f"noded's own CPU under one tenant's floods: {args.jobs} jobs ({args.gpus} GPUs), tick {args.tick:g} s, "
          f"{args.seconds:g} s windows ({platform.machine()}, {os.cpu_count()} CPUs)")
    print(f"{'flood':<26} {'CPU % core':>10} {'x normal':>9} {'tick ms':>8} {'overruns':>9} "
          f"{'exec evts':>9} {'dropped':>8} {'reports dropped':>15}")
    for r in rows:
        tick = f"{r['tick_ms']:.1f}" if r["tick_ms"] is not None else "-"
        print(f"{r['flood']:<26} {r['cpu_pct']:>10.2f} {r['cpu_pct'] / normal:>9.2f} {tick:>8} "
              f"{r['overruns']:>4}/{r['ticks']:<4} {r['exec_events']:>9} {r['exec_dropped']:>8} "
              f"{r['reports_dropped']:>15}")
    flood_row = rows[-1]
    if "sent" in flood_row:
        print(f"report flood: {flood_row['sent']} sent, replies {flood_row['replies']}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
