"""Reading the registered jobs' process trees once a tick, on a host of many processes:
discovery reading each tree from its processes' children files (``noded.jobs.proctree``)
against the whole ``/proc/*/stat`` scan every discovery did before (``read_ppids``, then
each tree from the parents), in one process, in turns.

``--others`` sleeping processes stand for the host's (forked here, killed at the end), and
``--jobs`` registered trees of three processes each (a root, its child and grandchild). CPU
time of this thread (``time.thread_time``) per discovery, the median of ``--repeat`` rounds
of ``--rounds``.

    python -m bench.registered_trees [--others 2000] [--jobs 4] [--repeat 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time

from noded.jobs import JobDiscovery
from noded.jobs.proctree import descendants, read_ppids

#: a root that forks a child, which forks a grandchild; each then sleeps
TREE = "import os,time\nif os.fork()==0:\n  os.fork()\ntime.sleep(3600)"


class WholeScan(JobDiscovery):
    """Discovery's registered trees as they were read: every process's stat, each tick."""

    def _registered_jobs(self, labels):
        from noded.jobs.model import Job

        with self._lock:
            registered = dict(self._registered)
        ppids = read_ppids(self.proc)
        return {job_id: Job(job_id, "registered", frozenset(descendants(root, ppids)), None, meta)
                for job_id, (root, meta) in registered.items()}


def per_discovery_ms(d: JobDiscovery, rounds: int) -> float:
    start = time.thread_time()
    for _ in range(rounds):
        d.discover()
    return (time.thread_time() - start) / rounds * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--others", type=int, default=2000, help="sleeping processes beside the jobs")
    ap.add_argument("--jobs", type=int, default=4, help="registered trees of three processes")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    # the others: one process that forks them, all in a session of its own, killed at the end
    others = subprocess.Popen([sys.executable, "-c",
                               f"import os,time\nfor _ in range({args.others}):\n  if os.fork()==0:\n"
                               "    time.sleep(3600)\n    os._exit(0)\nprint('up',flush=True)\ntime.sleep(3600)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    roots = [subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True) for _ in range(args.jobs)]
    try:
        assert others.stdout.readline() == "up\n"
        deadline = time.monotonic() + 30
        while any(len(descendants(r.pid, read_ppids("/proc"))) < 3 for r in roots):
            if time.monotonic() > deadline:
                raise SystemExit("the trees did not come up in 30 s")
            time.sleep(0.05)
        new, old = JobDiscovery([]), WholeScan([])
        for d in (new, old):
            for r in roots:
                d.register(r.pid, f"tree-{r.pid}")
        assert new.discover() == old.discover()
        host = len([n for n in os.listdir("/proc") if n.isdigit()])
        times: dict[str, list[float]] = {"whole scan": [], "children files": []}
        for _ in range(args.repeat):
            times["whole scan"].append(per_discovery_ms(old, args.rounds))
            times["children files"].append(per_discovery_ms(new, args.rounds))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"Reading {args.jobs} registered trees of 3 processes once (one discovery), {host} processes on the "
              f"host, CPU ms of this thread, median of {args.repeat} x {args.rounds}")
        print(f"  whole /proc/*/stat scan  {med['whole scan']:8.3f}")
        print(f"  children files           {med['children files']:8.3f}  ({new.tree_reads} files read)  "
              f"ratio {med['children files'] / med['whole scan']:.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"host_processes": host, "jobs": args.jobs, "ms": med, "runs": times,
                           "files_read": new.tree_reads, "python": platform.python_version()}, f, indent=1)
            print(f"  wrote {args.json}")
    finally:
        for p in [others, *roots]:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
