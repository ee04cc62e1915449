"""Time from a new process starting in a job's cgroup to its PID being in the job's
resctrl monitoring group: with the process-events connector, and with polling only
(a sampling tick every 1 s and every 100 ms). Needs root and the cgroup v1 cpuset
hierarchy (this machine) for a real job cgroup.

    python -m bench.exec_latency [--trials 15]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import threading
import time
import uuid

from nodesim.node import make_cpuset
from noded.jobs import CgroupSource, JobDiscovery
from noded.samplers.mongroups import JobMonitor
from noded.samplers.resctrl import ResctrlSession
from noded.samplers.telemetry import Telemetry
from resctrl import Resctrl
from nodesim.resctrl_emulator import MountedEmulator

CPUSET = "/sys/fs/cgroup/cpuset"




def measure(emu, rc, base: str, job_dir: str, mode: str, tick_s: float, trials: int) -> list[float]:
    discovery = JobDiscovery([CgroupSource.create("slurm", base)])
    session = ResctrlSession.of(rc)
    monitor = JobMonitor(session, clock=time.monotonic)
    telemetry = Telemetry(discovery, session, monitor, None, process_events=(mode == "connector"))
    if mode == "connector" and telemetry.events is None:
        raise SystemExit("process-events connector unavailable here")
    anchor = subprocess.Popen(["sh", "-c", f"echo $$ > {job_dir}/cgroup.procs; exec sleep infinity"])
    stop = threading.Event()
    while not monitor.groups():
        telemetry.sample()
    ticker = threading.Thread(target=lambda: [telemetry.sample() for _ in iter(lambda: stop.wait(tick_s), True)],
                              daemon=True)
    ticker.start()
    out = []
    try:
        for _ in range(trials):
            t0 = time.perf_counter()
            p = subprocess.Popen(["sh", "-c", f"echo $$ > {job_dir}/cgroup.procs; exec sleep infinity"])
            while (emu.control.task(p.pid) or {}).get("rmid", 0) == 0:
                time.sleep(0.0005)  # polling the emulator for the measurement itself
            out.append(time.perf_counter() - t0)
            p.kill()
            p.wait()
    finally:
        stop.set()
        ticker.join()
        anchor.kill()
        anchor.wait()
        telemetry.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--json", default="bench/out/exec_latency.json")
    args = ap.parse_args(argv)
    if not os.access(CPUSET, os.W_OK):
        raise SystemExit(f"{CPUSET} is not writable: run as root on a cgroup v1 cpuset host")
    base = f"{CPUSET}/noded-bench-{uuid.uuid4().hex[:6]}"
    dirs = [base, f"{base}/slurm", f"{base}/slurm/uid_0", f"{base}/slurm/uid_0/job_1"]
    for d in dirs:
        make_cpuset(d)
    results = {}
    try:
        with MountedEmulator("intel") as emu:
            rc = Resctrl.open(emu.root, mounts=emu.mounts_file)
            for label, mode, tick in (("connector (tick 1 s)", "connector", 1.0),
                                      ("polling, tick 1 s", "polling", 1.0),
                                      ("polling, tick 100 ms", "polling", 0.1)):
                results[label] = measure(emu, rc, base, dirs[-1], mode, tick, args.trials)
    finally:
        for d in reversed(dirs):
            os.rmdir(d)
    print(f"new process in a job cgroup -> its PID in the job's resctrl group ({args.trials} trials, "
          "from spawn, resctrl emulator)")
    print(f"  {'mode':<22} {'median ms':>10} {'p90 ms':>8} {'max ms':>8}")
    for label, v in results.items():
        p90 = sorted(v)[int(0.9 * (len(v) - 1))]
        print(f"  {label:<22} {statistics.median(v) * 1e3:10.1f} {p90 * 1e3:8.1f} {max(v) * 1e3:8.1f}")
    ratio = statistics.median(results["polling, tick 1 s"]) / statistics.median(results["connector (tick 1 s)"])
    print(f"  polling (1 s) / connector: {ratio:.0f}x")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "exec_latency", "trials": args.trials, "seconds": results,
                   "ratio_polling_1s_over_connector": ratio,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
