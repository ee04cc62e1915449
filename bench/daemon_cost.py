"""noded's own CPU at a steady state, 8 GPUs x 100 jobs, as a host runs it (issue #14).

The simulated node runs as its own process (``noded sim-node --hold``: the resctrl
emulator, the stand-in NVML, 100 jobs as real processes in real cpuset cgroups), and
noded as a host starts it (``noded run --config``, a process of its own). Half the jobs
are GPU jobs of four light models spread over the GPUs, half CPU jobs of 0.1 GB/s: the
node is far from contended (about a third of its peak), so nothing is throttled and the
figure is what noded costs just watching. Measured from ``/proc/PID/stat`` (utime +
stime), each over its own window:

1. the simulated node alone (the sim-node process and its descendants: the emulator,
   the jobs), before noded starts;
2. noded, once every job is measured and a warm-up of a few ticks has passed: its own
   CPU seconds and its ticks (``noded_ticks_total``), and the node's beside it;
3. the baseline, a bare Python process (``bench.bare_tick``) doing once a tick what a
   tick must at least do (every MBM counter of the node's monitoring groups, every job
   process's /proc/PID/stat, the same pynvml calls per GPU), with noded still running.

noded's metrics are scraped only at each window's start (before its CPU is read) and
end (after): the scrapes cost noded CPU (measured at the end, 20 scrapes) and none of it
falls inside its window. noded's CPU is also split by thread (/proc/PID/task), and the
baseline's by part (its own thread's CPU around each).

Through FUSE, each counter read costs its reader (noded, or the baseline) a round trip
into the emulator's process, which a host's kernfs resctrl does not: the table ends with
two estimates for a host, which swap that cost for kernfs's:

* by the sampler: noded's CPU less what its resctrl sampler took (its own
  ``noded_sampler_cpu_seconds_total{sampler="resctrl"}`` over the same window), plus what
  the same sampler (noded's ``BandwidthSampler``, in this process) takes over a copy of the
  mount's groups and counters on tmpfs, sampled once a tick through window 3 (its caches
  as cold as noded's between ticks, garbage collection on; the mean), its reads then
  swapped for as many reads of kernfs files (the jobs' cgroup v1 files) made the same way;
* by the baseline: noded's CPU less the bare tick's counter reads through FUSE (another
  process, another window), plus as many on kernfs.
Neither knows what a host's kernel spends on a counter read beyond a kernfs file's (an
MSR read on a CPU of the counter's domain): see bench/RESULTS.md.

    python -m bench.daemon_cost [--jobs 100] [--gpus 8] [--seconds 30] [--tick 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import glob
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench.bare_tick import mbm_files
from bench.host_costs import time_reads
from nodesim.waiting import wait_for
from resctrl.groups import DEFAULT_PREFIX, MonGroup, Resctrl
from resctrl.info import read_capabilities
from resctrl.mbm import MBM_TOTAL, STATES, MbmReader
from bench.measure import CLK_TCK, REPO, count_series, cpu_seconds, metric, tree_cpu_seconds, tree_delta
from nodesim.launch import DaemonProcess, Lines, node_and_daemon, stop

#: light GPU models (0.5-2 GB/s each in nodesim.workload): 50 of them are ~58 GB/s
MODELS = ["BiDAF", "Transformer", "DeepSpeech", "VGG16"]
PEAK_GBPS = 100  # per L3 domain (2 in the intel profile): the node runs at about a third
WARMUP_TICKS = 3
SCRAPES = 20
#: noded's own CPU at 8 GPUs x 100 jobs and a 1 s tick, a share of one core (issue #25)
GOAL = 0.007
#: the shortest measured window: below it, /proc's clock ticks (10 ms) round a share of ~1 % of a core to 0
MIN_WINDOW_S = 5.0
JBW = "noded_job_memory_bandwidth_bytes_per_second"


def scenario_text(jobs: int, gpus: int) -> str:
    lines = []
    for i in range(jobs):
        if i % 2 == 0:
            model, gpu = MODELS[(i // 2) % len(MODELS)], (i // 2) % gpus
            lines.append(f"  - {{at: 0, start: {{id: g{i}, model: {model}, gpu: {gpu}}}}}")
        else:
            lines.append(f"  - {{at: 0, start: {{id: c{i}, cpu_gbps: 0.1}}}}")
    return (f"seed: 1\nduration_s: 60\nnode: {{profile: intel, gpus: {gpus}, peak_gbps: {PEAK_GBPS}}}\n"
            "events:\n" + "\n".join(lines) + "\n")


def config_text(tick: float) -> str:
    return f"tick_s: {tick}\nmetrics: {{address: 127.0.0.1, port: 0}}\n"


def jobs_running(cgroup: str) -> int:
    n = 0
    for d in os.listdir(cgroup):
        procs = os.path.join(cgroup, d, "cgroup.procs")
        if os.path.isfile(procs):
            with open(procs) as f:
                n += bool(f.read().strip())
    return n


def node_parts(node_pid: int, readings: dict[int, float]) -> dict[str, list[int]]:
    """The node's processes by role: the sim-node process, the emulator, the rest (jobs)."""
    parts: dict[str, list[int]] = {"sim-node": [node_pid], "emulator": [], "jobs and others": []}
    for pid in readings:
        if pid == node_pid:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            cmd = b""
        parts["emulator" if b"nodesim.resctrl_emulator" in cmd else "jobs and others"].append(pid)
    return parts


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """tid -> CPU seconds, for each thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, IndexError):
            continue
    return out


def read_like_noded(paths: list[str], reps: int = 20) -> float:
    """CPU seconds (this thread's) of reading each of ``paths`` once as noded's MBM reader
    does each tick (os.open, os.pread of 64 bytes, os.close), median of ``reps``."""
    return time_reads(paths, reps)[0] * len(paths)


COUNTERS = ("mbm_total_bytes", "mbm_local_bytes", "llc_occupancy")


def mirror_resctrl(root: str, into: str) -> None:
    """What the bandwidth sampler reads of a resctrl mount, copied to ``into`` (tmpfs):
    every directory but ``info``, each counter file with its content now, every other file
    empty (listed, never read). Counters are copied in the sampler's order, monitoring
    groups' before their control groups' (a control group copied first, with traffic
    flowing, would hold less than its groups: a negative residual)."""
    counters = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d != "info"]
        os.makedirs(os.path.join(into, rel), exist_ok=True)
        for name in filenames:
            if name in COUNTERS:
                counters.append(os.path.join(rel, name))
            else:
                open(os.path.join(into, rel, name), "wb").close()
    for rel in sorted(counters, key=lambda r: f"{os.sep}mon_groups{os.sep}" not in f"{os.sep}{r}"):
        try:
            with open(os.path.join(root, rel), "rb") as f:
                content = f.read()
        except OSError:  # a counter the kernel answers EIO for: the sampler sees a word
            content = f"{STATES[0]}\n".encode()
        with open(os.path.join(into, rel), "wb") as f:
            f.write(content)


class _NoCreationTimes:
    """The sampler asks its job monitor when a new job's group was made: none were, here."""

    def created_at(self, job_id: str) -> None:
        return None


class _RecordingReader(MbmReader):
    """noded's counter reader, noting each file it reads (what the sampler reads, observed)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.read_paths: list[str] = []

    def _read_file(self, path: str) -> bytes | None:
        self.read_paths.append(path)
        return super()._read_file(path)


class MirrorSampler:
    """noded's ``BandwidthSampler`` (its own code, in this process) over the resctrl tree at
    ``root`` (a mirror of the mount), sampling it as noded does: every monitoring group of
    noded's in it as its jobs' groups, every control group, a quiet node read thin as
    noded's default config reads it (the mirror's counters stand still: the node is quiet).
    ``files`` are the counter files ``cycle`` samples in steady state read, as observed
    (one thin cycle: each job once); ``sample_cpu_s()`` is this thread's CPU for one."""

    def __init__(self, root: str, caps):
        from noded.config import Config  # noded's own code and defaults, as they run in the daemon
        from noded.samplers.bandwidth import BandwidthSampler, QuietRead

        defaults = Config()
        self.quiet = QuietRead(0.5 * defaults.contention.threshold * defaults.peak_bytes_per_domain,
                               defaults.resctrl.quiet_read_every)
        self.cycle = self.quiet.every
        self.rc = rc = Resctrl(root, caps, prefix=DEFAULT_PREFIX)
        self.groups = {}
        for ctrl in [rc.root_group()] + rc.list_ctrl_groups():
            for name in sorted(os.listdir(os.path.join(ctrl.path, "mon_groups"))):
                if rc.owns(name):
                    self.groups[name] = MonGroup(rc, name, os.path.join(ctrl.path, "mon_groups", name), ctrl)
        recording = _RecordingReader(events=(MBM_TOTAL,))
        observed = BandwidthSampler(_NoCreationTimes(), recording)
        for _ in range(2):  # the first reads make the meters, the second gives every rate: steady after
            observed.sample(rc, 1, self.groups, self.quiet)
        recording.read_paths.clear()
        for _ in range(self.cycle):
            self.last = observed.sample(rc, 1, self.groups, self.quiet)
        self.files = list(recording.read_paths)
        self.sampler = BandwidthSampler(_NoCreationTimes())  # as noded's: the plain reader
        for _ in range(2):
            self.sampler.sample(rc, 1, self.groups, self.quiet)

    def sample_cpu_s(self) -> float:
        c0 = time.thread_time()
        self.last = self.sampler.sample(self.rc, 1, self.groups, self.quiet)
        return time.thread_time() - c0


class Window:
    """CPU seconds of the node's tree (by part) and of chosen processes over a wall-clock window."""

    def __init__(self, node_pid: int, pids: dict[str, int]):
        self.node_pid, self.pids = node_pid, pids

    def __enter__(self) -> "Window":
        self.node0 = tree_cpu_seconds(self.node_pid)
        self.own0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.threads0 = {name: thread_cpu_seconds(pid) for name, pid in self.pids.items()}
        self.load0 = os.getloadavg()
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.own1 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.threads1 = {name: thread_cpu_seconds(pid) for name, pid in self.pids.items()}
        self.node1 = tree_cpu_seconds(self.node_pid)
        self.parts = node_parts(self.node_pid, self.node1)  # while they run: their command lines
        self.wall = time.monotonic() - self.t0
        self.load1 = os.getloadavg()

    def result(self) -> dict:
        node = {name: sum(self.node1[p] - self.node0.get(p, 0.0) for p in pids) for name, pids in self.parts.items()}
        node["total"] = tree_delta(self.node0, self.node1)
        threads = {n: {str(tid): v - self.threads0[n].get(tid, 0.0) for tid, v in self.threads1[n].items()}
                   for n in self.pids}
        return {"wall_s": self.wall, "cpu_s": {n: self.own1[n] - self.own0[n] for n in self.pids},
                "thread_cpu_s": threads,
                "node_cpu_s": node, "loadavg_start": self.load0, "loadavg_end": self.load1}


def histogram_ms(before: str, after: str, name: str, label: str, value: str) -> float | None:
    """Mean of a histogram's observations between two scrapes, in ms."""
    sums = [metric(t, f"{name}_sum", f'{label}="{value}"') for t in (before, after)]
    counts = [metric(t, f"{name}_count", f'{label}="{value}"') for t in (before, after)]
    if None in sums or None in counts or counts[1] == counts[0]:
        return None
    return (sums[1] - sums[0]) / (counts[1] - counts[0]) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.daemon_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0, help="each measured window")
    ap.add_argument("--node-seconds", type=float, default=10.0, help="the node alone, before noded starts")
    ap.add_argument("--tick", type=float, default=1.0)
    ap.add_argument("--json", default="bench/out/daemon_cost.json")
    args = ap.parse_args(argv)
    if args.seconds < MIN_WINDOW_S or args.node_seconds < MIN_WINDOW_S:
        ap.error(f"--seconds and --node-seconds must be at least {MIN_WINDOW_S:g} "
                 f"(got {args.seconds:g} and {args.node_seconds:g})")
    if os.geteuid() != 0:
        raise SystemExit("bench.daemon_cost: needs root (the simulated node mounts FUSE and makes cgroups)")
    gpu_jobs = (args.jobs + 1) // 2
    load_at_start = os.getloadavg()
    with node_and_daemon(scenario_text(args.jobs, args.gpus), config_text(args.tick), daemon=False,
                         prefix="noded-bench-cost-") as (node, _, workdir):
        env = node.env
        wait_for(lambda: jobs_running(env["NODED_SIM_CGROUP"]) == args.jobs, 120, 0.2, what=f"all {args.jobs} jobs running")
        with Window(node.pid, {}) as alone:
            time.sleep(args.node_seconds)  # the measured window
        daemon = bare = mirror = None
        try:
            daemon = DaemonProcess(env, os.path.join(workdir, "noded.log"))
            text = daemon.wait_until(
                f"all {args.jobs} jobs measured",
                lambda t: count_series(t, JBW) == args.jobs and count_series(t, JBW, 'kind="gpu"') == gpu_jobs)
            measured_at = metric(text, "noded_ticks_total")
            daemon.wait_until(f"{WARMUP_TICKS} ticks of warm-up",
                              lambda t: metric(t, "noded_ticks_total") >= measured_at + WARMUP_TICKS)
            # window 2: noded. Scraped before its CPU is read, and after: no scrape inside
            before = daemon.scrape()
            with Window(node.pid, {"noded": daemon.pid}) as win:
                time.sleep(args.seconds)  # the measured window
            after = daemon.scrape()
            children = tree_cpu_seconds(daemon.pid)
            children.pop(daemon.pid)
            # noded's resctrl sampler as on a host: the same code over a tmpfs copy of the
            # mount, sampled once a tick through window 3 (so with its caches as cold as
            # noded's, garbage collection on), its reads' cost then swapped for kernfs's
            mirror = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None,
                                      prefix="noded-bench-mirror-")
            mirror_resctrl(env["NODED_SIM_RESCTRL"], mirror)
            on_mirror = MirrorSampler(mirror, read_capabilities(env["NODED_SIM_RESCTRL"], mba_mbps=False))
            mirror_cpu: list[float] = []
            # window 3: the baseline, beside noded
            bare = subprocess.Popen([sys.executable, "-m", "bench.bare_tick", "--resctrl", env["NODED_SIM_RESCTRL"],
                                     "--cgroup", env["NODED_SIM_CGROUP"], "--tick", str(args.tick)], cwd=REPO,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, "LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"],
                                         "NODED_SIM_NVML": env["NODED_SIM_NVML"]})
            bare_out = Lines(bare.stdout)
            ready = bare_out.wait_for(lambda s: s.startswith("ready"), "the baseline's ready line", 60)
            before_b = daemon.scrape()
            with Window(node.pid, {"noded": daemon.pid, "bare": bare.pid}) as win_b:
                ends = time.monotonic() + args.seconds
                while time.monotonic() < ends:
                    mirror_cpu.append(on_mirror.sample_cpu_s())
                    time.sleep(min(args.tick, max(0.0, ends - time.monotonic())))  # the window's pace
            after_b = daemon.scrape()
            bare.stdin.close()
            done = bare_out.wait_for(lambda s: s.startswith("done"), "the baseline's done line", 30)
            bare.wait(30)
            kv = dict(item.split("=") for item in done.split()[1:])
            bare_parts = {k: float(v) / int(kv["ticks"]) for k, v in kv.items() if k != "ticks"}
            # as many counter reads on kernfs as the bare tick makes through FUSE, the same way
            # (a host's resctrl is kernfs, as cgroup v1 is): what FUSE adds to a tick's CPU
            files = mbm_files(env["NODED_SIM_RESCTRL"])
            cg = sorted(glob.glob(os.path.join(env["NODED_SIM_CGROUP"], "*", "cpuset.*")))
            kernfs_s = read_like_noded([cg[i % len(cg)] for i in range(len(files))])
            # the mirror sampler's own reads (a tick's share of a thin cycle's), and as many on
            # kernfs, the same way
            tmpfs_reads_s = read_like_noded(on_mirror.files) / on_mirror.cycle
            kernfs_mirror_s = read_like_noded([cg[i % len(cg)] for i in range(len(on_mirror.files))]) / on_mirror.cycle
            # what a scrape costs noded (its ticks meanwhile subtracted at their measured cost)
            ticks = metric(after, "noded_ticks_total") - metric(before, "noded_ticks_total")
            per_tick = win.result()["cpu_s"]["noded"] / ticks
            c0, t0 = cpu_seconds(daemon.pid), time.monotonic()
            for _ in range(SCRAPES):
                daemon.scrape()
            scrape_s = (cpu_seconds(daemon.pid) - c0 - per_tick * (time.monotonic() - t0) / args.tick) / SCRAPES
        finally:
            if mirror is not None:
                shutil.rmtree(mirror, ignore_errors=True)
            if bare is not None:
                stop(bare, 30)
            if daemon is not None:
                code, _ = daemon.stop()
                if code != 0:
                    print(f"bench.daemon_cost: noded exited {code}", file=sys.stderr)
    load_at_end = os.getloadavg()
    a, d, b = alone.result(), win.result(), win_b.result()
    ticks_b = metric(after_b, "noded_ticks_total") - metric(before_b, "noded_ticks_total")
    bare_ticks = b["wall_s"] / args.tick
    stages = {s: histogram_ms(before, after, "noded_tick_duration_seconds", "stage", s)
              for s in ("sample", "decide", "act", "total")}
    samplers = {s: histogram_ms(before, after, "noded_sampler_duration_seconds", "sampler", s)
                for s in ("resctrl_groups", "jobs", "cpus", "nvml", "resctrl")}
    result = {
        "benchmark": "daemon_cost", "jobs": args.jobs, "gpu_jobs": gpu_jobs, "gpus": args.gpus, "tick_s": args.tick,
        "window_s": args.seconds, "loadavg_start": load_at_start, "loadavg_end": load_at_end,
        "node_alone": a, "noded": d, "noded_ticks": ticks, "noded_children_at_end": len(children),
        "baseline": b, "baseline_ticks": bare_ticks, "noded_ticks_beside_baseline": ticks_b,
        "baseline_ready": ready.strip(), "baseline_parts_cpu_s_per_tick": bare_parts,
        "mbm_files": len(files), "kernfs_reads_cpu_s": kernfs_s, "scrape_cpu_s": scrape_s,
        "noded_sampler_cpu_ms_per_tick": {
            s: (metric(after, "noded_sampler_cpu_seconds_total", f'sampler="{s}"')
                - metric(before, "noded_sampler_cpu_seconds_total", f'sampler="{s}"')) / ticks * 1e3
            for s in ("resctrl_groups", "jobs", "cpus", "nvml", "resctrl")},
        "resctrl_sampler_on_tmpfs": {"files": len(on_mirror.files) / on_mirror.cycle, "samples": len(mirror_cpu),
                                     "sampler_cpu_s": statistics.mean(mirror_cpu),
                                     "sampler_cpu_s_range": [min(mirror_cpu), max(mirror_cpu)],
                                     "tmpfs_reads_cpu_s": tmpfs_reads_s, "kernfs_reads_cpu_s": kernfs_mirror_s},
        "noded_wall_ms_per_tick": {"stages": stages, "samplers": samplers},
        "noded_overruns": metric(after, "noded_tick_overruns_total") - metric(before, "noded_tick_overruns_total"),
        "contention_triggered": metric(after, "noded_contention_triggered"),
        "node_bandwidth_ratio": metric(after, "noded_node_memory_bandwidth_ratio"),
        "jobs_throttled": len(re.findall(r"^noded_job_throttle_level\{[^}]*\} (?!0(?:\.0)?$)", after, re.M)),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    per_tick = {"noded": d["cpu_s"]["noded"] / ticks * 1e3, "bare": b["cpu_s"]["bare"] / bare_ticks * 1e3}
    result["ms_per_tick"] = per_tick
    # FUSE's client-side cost of the counter reads (the bare tick's, made as noded makes them)
    # replaced by as many reads on kernfs: what a host would see (an estimate); noded's
    # share of it by the counter files it reads a tick (fewer than every one on a quiet node)
    swap = (kernfs_s - bare_parts["mbm"]) * 1e3
    noded_share = result["resctrl_sampler_on_tmpfs"]["files"] / len(files)
    result["noded_mbm_files_per_tick"] = result["resctrl_sampler_on_tmpfs"]["files"]
    result["host_estimate_ms_per_tick"] = {"noded": per_tick["noded"] + swap * noded_share,
                                           "bare": per_tick["bare"] + swap}
    # noded's resctrl sampler through FUSE (its own count, its window) swapped for the same
    # sampler on tmpfs with its reads' cost made kernfs's: the estimate the goal is judged on
    m = result["resctrl_sampler_on_tmpfs"]
    on_host = (m["sampler_cpu_s"] - m["tmpfs_reads_cpu_s"] + m["kernfs_reads_cpu_s"]) * 1e3
    result["host_estimate_by_sampler_ms_per_tick"] = {
        "noded": per_tick["noded"] - result["noded_sampler_cpu_ms_per_tick"]["resctrl"] + on_host,
        "resctrl_sampler_through_fuse": result["noded_sampler_cpu_ms_per_tick"]["resctrl"],
        "resctrl_sampler_on_host": on_host}
    print_table(result)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


def print_table(r: dict) -> None:
    tick = r["tick_s"]
    a, d, b = r["node_alone"], r["noded"], r["baseline"]
    ms = lambda cpu, n: f"{cpu / n * 1e3:8.1f}"
    pct = lambda cpu, wall: f"{cpu / wall:8.2%}"
    print(f"noded's own CPU, steady state: {r['jobs']} jobs ({r['gpu_jobs']} on GPUs), {r['gpus']} GPUs, "
          f"tick {tick:g} s; noded and the simulated node each a process (noded run --config, noded sim-node)")
    print(f"  node at {r['node_bandwidth_ratio']:.0%} of its peak, contention triggered: "
          f"{'yes' if r['contention_triggered'] else 'no'}, jobs throttled: {r['jobs_throttled']}; "
          f"load average at start {r['loadavg_start'][0]:.2f}, at end {r['loadavg_end'][0]:.2f}")
    print(f"  {'process (CPU from /proc/PID/stat)':<44} {'window s':>8} {'ticks':>6} {'ms/tick':>8} {'% core':>8}")

    def row(name: str, cpu: float, wall: float, ticks: float) -> None:
        print(f"  {name:<44} {wall:8.1f} {ticks:6.0f} {ms(cpu, ticks)} {pct(cpu, wall)}")

    row("noded (the daemon alone)", d["cpu_s"]["noded"], d["wall_s"], r["noded_ticks"])
    row("bare tick (baseline, beside noded)", b["cpu_s"]["bare"], b["wall_s"], r["baseline_ticks"])
    row("noded, beside the baseline", b["cpu_s"]["noded"], b["wall_s"], r["noded_ticks_beside_baseline"])
    for label, w in (("alone", a), ("with noded", d), ("with noded and baseline", b)):
        n = w["wall_s"] / tick
        node = w["node_cpu_s"]
        row(f"simulated node, {label}", node["total"], w["wall_s"], n)
        for part in ("sim-node", "emulator", "jobs and others"):
            row(f"  {part}", node[part], w["wall_s"], n)
    main = d["thread_cpu_s"]["noded"]
    tick_thread = max(main.values())
    print(f"  noded by thread: the busiest (the tick loop) {tick_thread / r['noded_ticks'] * 1e3:.1f} ms/tick, "
          f"the other {len(main) - 1} together {(sum(main.values()) - tick_thread) / r['noded_ticks'] * 1e3:.1f}")
    parts = r["baseline_parts_cpu_s_per_tick"]
    print(f"  bare tick by part (its thread's CPU per tick): {r['mbm_files']} MBM files {parts['mbm'] * 1e3:.1f} ms, "
          f"/proc/PID/stat {parts['proc'] * 1e3:.1f} ms, pynvml {parts['nvml'] * 1e3:.1f} ms")
    ratio = (d["cpu_s"]["noded"] / r["noded_ticks"]) / (b["cpu_s"]["bare"] / r["baseline_ticks"])
    print(f"  ratio noded / bare tick (CPU per tick): {ratio:.2f}")
    emu = (d["node_cpu_s"]["emulator"] / d["wall_s"] - a["node_cpu_s"]["emulator"] / a["wall_s"]) * tick
    print(f"  the emulator serving noded: {emu * 1e3:.1f} ms of its CPU per tick (with noded less alone), "
          "not counted in noded's")
    st, sa = r["noded_wall_ms_per_tick"]["stages"], r["noded_wall_ms_per_tick"]["samplers"]
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    print(f"  noded's tick in wall ms (its histograms over the window): total {fmt(st['total'])}, sample "
          f"{fmt(st['sample'])} (" + ", ".join(f"{k} {fmt(v)}" for k, v in sa.items()) +
          f"), decide {fmt(st['decide'])}, act {fmt(st['act'])}; overruns {r['noded_overruns']:.0f}")
    print(f"  metrics scraped only at each window's edges, outside noded's CPU readings; one scrape costs noded "
          f"{r['scrape_cpu_s'] * 1e3:.1f} ms of CPU (mean of {SCRAPES})")
    fuse, kernfs = parts["mbm"], r["kernfs_reads_cpu_s"]
    noded_ms, bare_ms = r["ms_per_tick"]["noded"], r["ms_per_tick"]["bare"]
    host_ms, bare_host = r["host_estimate_ms_per_tick"]["noded"], r["host_estimate_ms_per_tick"]["bare"]
    print(f"  FUSE's share: {r['mbm_files']} counter reads (open, pread, close, as noded makes them) cost the bare "
          f"tick {fuse * 1e3:.1f} ms through the emulator; as many on kernfs (cgroup files, as a host's resctrl "
          f"is) {kernfs * 1e3:.1f} ms")
    share = r["noded_mbm_files_per_tick"] / r["mbm_files"]
    print(f"  estimate by the baseline, resctrl on kernfs as on a host (noded reads {r['noded_mbm_files_per_tick']:g} "
          f"counter files a tick: {share:.0%} of that swap): noded {noded_ms:.1f} - {fuse * 1e3 * share:.1f} + "
          f"{kernfs * 1e3 * share:.1f} = {host_ms:.1f} ms per tick, {host_ms / 1e3 / tick:.2%} of one core; bare tick "
          f"{bare_ms:.1f} - {fuse * 1e3:.1f} + {kernfs * 1e3:.1f} = {bare_host:.1f} ms ({host_ms / bare_host:.1f}x)")
    cpu = r["noded_sampler_cpu_ms_per_tick"]
    print("  noded's CPU by sampler, ms per tick (noded_sampler_cpu_seconds_total over its window): "
          + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
    m, e = r["resctrl_sampler_on_tmpfs"], r["host_estimate_by_sampler_ms_per_tick"]
    print(f"  noded's resctrl sampler (its BandwidthSampler, in this process) over a tmpfs copy of the mount, once "
          f"a tick beside the baseline: {m['sampler_cpu_s'] * 1e3:.2f} ms (mean of {m['samples']}), of which its "
          f"{m['files']:g} reads a tick {m['tmpfs_reads_cpu_s'] * 1e3:.2f}; "
          f"as many on kernfs {m['kernfs_reads_cpu_s'] * 1e3:.2f}: {e['resctrl_sampler_on_host']:.2f} ms on a host")
    host_s = e["noded"]
    print(f"  estimate by the sampler: noded {noded_ms:.1f} - {e['resctrl_sampler_through_fuse']:.1f} (its resctrl "
          f"sampler through FUSE) + {e['resctrl_sampler_on_host']:.1f} = {host_s:.1f} ms per tick, "
          f"{host_s / 1e3 / tick:.2%} of one core")
    share = d["cpu_s"]["noded"] / d["wall_s"]
    verdict = lambda v: "met" if v <= GOAL else f"NOT met ({v / GOAL:.2f}x the goal)"
    print(f"  goal (issue #25): noded <= {GOAL:.1%} of one core at a {tick:g} s tick, emulator excluded: as measured "
          f"{verdict(share)}; "
          f"estimated for a host (by the sampler) {verdict(host_s / 1e3 / tick)}, (by the baseline) "
          f"{verdict(host_ms / 1e3 / tick)}")


if __name__ == "__main__":
    raise SystemExit(main())
