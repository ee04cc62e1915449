"""Ticks under a flood of scrapes by an unprivileged user (helper F2's attack on the metrics port).

``python -m bench.scrape_flood [--jobs 60] [--tick 0.25] [--seconds 15] [--in-flight 4]``, as
root: a simulated node of JOBS CPU jobs and noded beside it (nodesim.launch, as
bench.hostile_clients), then two phases of SECONDS each, counting noded's ticks and tick
overruns (scraped at each phase's start and end): no client, then a process of uid nobody
keeping IN_FLIGHT scrapes of /metrics in flight back to back, each answer read whole at once.
Any local user may reach the metrics port; each answer is a render of every job's series.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request

from bench.measure import metric
from nodesim.launch import node_and_daemon
from nodesim.scrapers import SCRAPE_FLOOD



def scenario(jobs: int) -> str:
    return ("seed: 1\nduration_s: 3600\nnode: {gpus: 2, peak_gbps: 50}\nevents:\n"
            + "".join(f"  - {{at: 0, start: {{id: c{i}, cpu_gbps: 0.05}}}}\n" for i in range(jobs)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scrape_flood", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--tick", type=float, default=0.25)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--in-flight", type=int, default=4)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench.scrape_flood: needs root (the scraper drops to nobody; the sim node uses FUSE)")
    config = f"tick_s: {args.tick}\nmetrics: {{address: 127.0.0.1, port: 0}}\n"
    with node_and_daemon(scenario(args.jobs), config, prefix="noded-scrape-flood-") as (_node, daemon, _workdir):
        daemon.wait_until("ten ticks", lambda text: metric(text, "noded_ticks_total") >= 10, timeout=120)

        def counters() -> tuple[float, float, int]:
            body = urllib.request.urlopen(daemon.url, timeout=30).read().decode()
            return metric(body, "noded_ticks_total"), metric(body, "noded_tick_overruns_total"), len(body)

        for phase in ("no client", f"{args.in_flight} scrapes in flight, as nobody"):
            scraper = None
            if phase != "no client":
                scraper = subprocess.Popen([sys.executable, "-c", SCRAPE_FLOOD, str(daemon.port), "1e9", str(args.in_flight)],
                                           stdout=subprocess.PIPE, text=True)
                if scraper.stdout.readline() != "up\n":
                    raise SystemExit("bench.scrape_flood: the scraper did not start")
            try:
                t0, (ticks0, over0, size) = time.monotonic(), counters()
                time.sleep(args.seconds)  # the phase's length: ticks are counted by noded itself
                ticks1, over1, _ = counters()
                wall = time.monotonic() - t0
            finally:
                if scraper is not None:
                    scraper.kill()
                    scraper.wait()
            print(f"{phase}: {args.jobs} jobs (exposition {size / 1024:.0f} KiB), tick {args.tick:g} s: "
                  f"{ticks1 - ticks0:.0f} ticks of {wall / args.tick:.0f} due in {wall:.1f} s, "
                  f"{over1 - over0:.0f} overruns", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
