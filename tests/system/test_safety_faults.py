"""The safety issue's faults (issue #11) under a separate daemon (issue #14, item 4):
`noded run --config` started as a host starts it, beside `noded sim-node`, and every
check made where a host's operator would look: the daemon's /proc entries, the resctrl
groups on the emulator's mount, the jobs' cpuset files and affinities.

* Hundreds of slow clients on the admin socket, the report socket and the metrics port
  (items 1 and 2): the loop goes on throttling and releasing a pulsing hog, the daemon's
  descriptors and threads stay within the control plane's caps, metrics answer once the
  clients go, and a SIGTERM with the clients connected ends it in well under the unit's
  15 s, with nothing of noded's left.
* A read-only state directory on a host without MBA (item 3): started on it, noded halves
  no cpuset (no original can be recorded), says so, and halves the hog once the
  directory is writable again; made read-only again, a SIGTERM still gives the cores
  back.
* A hog running before noded starts (item 10): with this host's history of the GPU job's
  model in the state directory, the hog is throttled within the first ticks; across a
  restart made while resctrl's counters read Unavailable, nothing is throttled blind,
  and the throttle comes back once they read again.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from support.system import (CPUSET, REPO, cpusets, daemon_process, inject, noded_groups, running_node, scrape,
                            stop, value)

from support.waiting import wait_for
from resctrl.cpulist import parse_cpu_list
from noded.server.budget import CONTROL_PLANE_DESCRIPTORS

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(not os.path.isdir(CPUSET), reason="no v1 cpuset hierarchy")]

#: quick reactions (as FAST in test_sigkill_anywhere): a throttle or a release within a
#: few ticks of its cause
BASE = {"tick_s": 0.1, "metrics": {"address": "127.0.0.1", "port": 0},
        "contention": {"hold_s": 0.3, "settle_s": 0.1}}

HOG_LEVEL = r'noded_job_throttle_level{{job_id="cgroup:hog",method="{}"}} ([0-9.]+)'


def write_inputs(tmp_path, profile: str, events: str, **config) -> tuple[str, str]:
    (tmp_path / "scenario.yaml").write_text(f"seed: 11\nduration_s: 600\ntick_s: 0.1\n"
                                            f"node: {{profile: {profile}, gpus: 2, peak_gbps: 10}}\n"
                                            f"events:\n{events}")
    merged = {**BASE, **config, "contention": {**BASE["contention"], **config.get("contention", {})}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(merged))
    return str(tmp_path / "scenario.yaml"), str(tmp_path / "base.yaml")


def daemon_config(env: dict[str, str]) -> dict:
    with open(env["NODED_SIM_CONFIG"]) as f:
        return yaml.safe_load(f)


def lines(text: str, *names: str) -> str:
    """The metrics' lines of these families (what a failure shows)."""
    return "\n".join(line for line in text.splitlines() if line.startswith(names))


def ticks(text: str) -> float:
    return value(text, r"^noded_ticks_total ([0-9.]+)") or 0.0


def ticks_in_a_row(url: str, n: int, check) -> None:
    """``check(metrics text)`` holds at every scrape over ``n`` ticks of the daemon's."""
    start = ticks(scrape(url))
    while True:
        text = scrape(url)
        check(text)
        if ticks(text) >= start + n:
            return


def job_pids(env: dict[str, str], job: str) -> set[int]:
    try:
        with open(os.path.join(env["NODED_SIM_CGROUP"], job, "cgroup.procs")) as f:
            return {int(p) for p in f.read().split()}
    except FileNotFoundError:  # not started yet
        return set()


def mba_level(env: dict[str, str], job: str) -> int:
    """The MBA level the kernel has the job's tasks at: N of the noded-mba-N control
    group that holds them (0: none of noded's). The groups are read one after another, so
    a move between two of them may show the job in both: the higher is taken."""
    pids = job_pids(env, job)
    root = env["NODED_SIM_RESCTRL"]
    levels = set()
    for group in os.listdir(root):
        if group.startswith("noded-mba-"):
            try:
                with open(os.path.join(root, group, "tasks")) as f:
                    if pids & {int(t) for t in f.read().split()}:
                        levels.add(int(group.removeprefix("noded-mba-")))
            except OSError as e:
                # removed meanwhile: before the open (ENOENT) or between it and the read
                # (ENODEV, as kernfs answers a removed group's open file)
                if e.errno not in (errno.ENOENT, errno.ENODEV):
                    raise
    return max(levels, default=0)


def affinities(env: dict[str, str]) -> dict[str, list[list[int]]]:
    """Each job's processes' affinities, as the scheduler has them."""
    out = {}
    for job in cpusets(env["NODED_SIM_CGROUP"]):
        out[job] = sorted(sorted(os.sched_getaffinity(pid)) for pid in job_pids(env, job))
    return out


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def jobs_running(env: dict[str, str], n: int) -> tuple[dict[str, str], dict[str, list[list[int]]]]:
    """Once the node's ``n`` jobs run in their cgroups: their cpusets and affinities (as
    they must be again once noded is gone)."""
    top = env["NODED_SIM_CGROUP"]
    wait_for(lambda: len(cpusets(top)) == n and all(job_pids(env, job) for job in cpusets(top)), timeout=30,
             what=f"the node's {n} jobs running in their cgroups")
    return cpusets(top), affinities(env)


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))


class SlowClients:
    """bench/hostile.py in a process of its own: ``count`` connections to one endpoint,
    each sending an unfinished request, then a byte every ``every`` seconds, the dropped
    ones reopened each round."""

    def __init__(self, *target, count: int, every: float = 2.0):
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.hostile", *target, "--count", str(count),
                                      "--every", str(every), "--reopen"],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def ready(self) -> dict[str, int]:
        line = self.proc.stdout.readline()  # ends at EOF: a dead attacker cannot hang the test
        assert line.startswith("ready "), (line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        return {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}

    def go(self) -> None:
        """Closes its connections and ends."""
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def slow_clients(env: dict[str, str], url: str, count: int):
    """``count`` slow clients on each of the admin socket, the report socket and the
    metrics port (spread over 40 source addresses, so that more than one peer's cap of
    them is held), all connected when this is entered."""
    run = daemon_config(env)["runtime_dir"]
    port = re.search(r":(\d+)/", url).group(1)
    started = []
    try:
        for target in (["--unix", os.path.join(run, "noded.sock")], ["--unix", os.path.join(run, "report.sock")],
                       ["--tcp", f"127.0.0.1:{port}", "--sources", "40",
                        "--first", r"GET /metrics HTTP/1.1\r\nHost: noded\r\n"]):
            started.append(SlowClients(*target, count=count))
        for clients in started:
            stats = clients.ready()
            assert stats["opened"] >= count * 0.9, stats
        yield
    finally:
        for clients in started:
            clients.go()


#: the hog pushes 16 GB/s for a second, then 0.5 for three, over and over: it must be
#: throttled, then released, then throttled again, all the while
PULSING = ("  - {at: 0, start: {id: bert, model: BiDAF, gpu: 0}}\n"
           "  - {at: 0, start: {id: hog, cpu: hog}}\n"
           + "".join(f"  - {{at: {t}, set: {{id: hog, cpu_gbps: {16 if t % 4 == 0 else 0.5}}}}}\n"
                     for t in range(1, 600) if t % 4 in (0, 1)))


def test_slow_clients_on_every_endpoint_starve_neither_the_loop_nor_the_stop(tmp_path):
    # right-sizing on: the report socket is open (any local user may connect to it)
    scenario, base = write_inputs(tmp_path, "intel", PULSING, contention={"cpu_job_cap_gbps": 4.0},
                                  rightsize={"sources": ["cgroup"]})
    with running_node(tmp_path, scenario, base) as env, daemon_process(env) as (daemon, url):
        top = env["NODED_SIM_CGROUP"]
        before, own = jobs_running(env, 2)
        wait_for(lambda: mba_level(env, "hog") >= 1, timeout=30, interval=0.05, what="the hog throttled")
        fds, threads_before = descriptors(daemon.pid), threads(daemon.pid)
        seen = {"fds": fds, "threads": threads_before}

        def watch() -> int:
            seen["fds"] = max(seen["fds"], descriptors(daemon.pid))
            seen["threads"] = max(seen["threads"], threads(daemon.pid))
            return mba_level(env, "hog")

        with slow_clients(env, url, 300):
            # the loop acts under the flood: the hog let go when it calms, throttled when it pushes
            wait_for(lambda: watch() == 0, timeout=15, interval=0.05, what="the hog released under the flood")
            wait_for(lambda: watch() >= 1, timeout=15, interval=0.05, what="the hog throttled again under the flood")
            watch()
        # the flood reached noded (more than one peer's cap held), and it held no more than its caps
        assert fds + 40 < seen["fds"] <= fds + CONTROL_PLANE_DESCRIPTORS, (fds, seen)
        assert seen["threads"] <= threads_before + 4, (threads_before, seen)  # no thread per connection
        # the clients gone: their descriptors go, and a scrape is answered at once
        wait_for(lambda: descriptors(daemon.pid) <= fds + 8, timeout=10, interval=0.05,
                 what="the clients' descriptors closed")
        t0 = time.monotonic()
        assert ticks(scrape(url)) > 0 and time.monotonic() - t0 < 1.0
        with slow_clients(env, url, 300):
            wait_for(lambda: descriptors(daemon.pid) > fds + 40, timeout=10, interval=0.05,
                     what="the flood held again")
            stop(daemon)
        assert noded_groups(env["NODED_SIM_RESCTRL"]) == []
        assert cpusets(top) == before and affinities(env) == own


NO_MBA = ("  - {at: 0, start: {id: bert, model: BiDAF, gpu: 0}}\n"
          "  - {at: 0, start: {id: etl, cpu_gbps: 0.5}}\n"
          "  - {at: 0, start: {id: hog, cpu: hog}}\n")


@contextlib.contextmanager
def bind_mounted(path: str):
    """``path`` bind-mounted on itself (so that it can be made read-only and back)."""
    subprocess.run(["mount", "--bind", path, path], check=True)
    try:
        yield lambda mode: subprocess.run(["mount", "-o", f"remount,{mode},bind", path], check=True)
    finally:
        if subprocess.run(["umount", path], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", path], check=True)  # busy: detached all the same


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: no cores to halve")
def test_a_read_only_state_dir_halves_no_cpuset_until_it_is_writable_and_a_stop_still_gives_cores_back(tmp_path):
    scenario, base = write_inputs(tmp_path, "no-mba", NO_MBA, contention={"cpu_job_cap_gbps": 4.0})
    with running_node(tmp_path, scenario, base) as env:
        top = env["NODED_SIM_CGROUP"]
        state = daemon_config(env)["state_dir"]
        os.mkdir(state, 0o700)
        with bind_mounted(state) as remount:
            remount("ro")
            with pytest.raises(OSError, match="Read-only"):
                open(os.path.join(state, "probe"), "w").close()
            before, own = jobs_running(env, 3)
            with daemon_process(env) as (daemon, url):
                hog_bw = r'noded_job_memory_bandwidth_bytes_per_second{job_id="cgroup:hog",kind="cpu"} ([0-9.e+]+)'
                wait_for(lambda: (value(scrape(url), hog_bw) or 0) > 4e9, timeout=30, interval=0.05,
                         what="the hog measured over the per-job cap")

                def nothing_changed(text: str) -> None:
                    shown = lines(text, "noded_state_writable", "noded_job_throttle_level", "noded_ticks_total")
                    assert value(text, r"^noded_state_writable ([0-9.]+)") == 0, shown
                    assert (value(text, HOG_LEVEL.format("cores")) or 0) == 0, shown
                    assert cpusets(top) == before and affinities(env) == own, "changed with no original recorded"

                ticks_in_a_row(url, 10, nothing_changed)
                remount("rw")
                halved = wait_for(lambda: cpusets(top)["hog"] != before["hog"] and cpusets(top), timeout=15,
                                  interval=0.05, what="the hog's cores halved once its original can be recorded")
                with open(os.path.join(state, "originals.json")) as f:
                    assert os.path.join(top, "hog") in f.read()
                assert {j: c for j, c in halved.items() if j != "hog"} == {j: before[j] for j in ("bert", "etl")}
                halved_cpus = parse_cpu_list(halved["hog"])
                assert len(halved_cpus) < len(parse_cpu_list(before["hog"]))
                wait_for(lambda: all(set(a) <= halved_cpus for a in affinities(env)["hog"]), timeout=10,
                         interval=0.05, what="the hog's processes on its halved cores")

                # read-only again (noded finds out at its next probe or write): a stop still
                # gives every job its cores back, though it cannot forget the records
                remount("ro")
                with pytest.raises(OSError, match="Read-only"):
                    open(os.path.join(state, "probe"), "w").close()
                stop(daemon)
            assert cpusets(top) == before and affinities(env) == own
            assert noded_groups(env["NODED_SIM_RESCTRL"]) == []


HOG_FROM_START = ("  - {at: 0, start: {id: bert, model: BiDAF, gpu: 0}}\n"
                  "  - {at: 0, start: {id: hog, cpu: hog}}\n")


def test_a_hog_running_before_noded_starts_is_throttled_at_once_and_never_blind_across_a_restart(tmp_path):
    scenario, base = write_inputs(tmp_path, "intel", HOG_FROM_START)  # no per-job cap: CODA's trigger alone
    with running_node(tmp_path, scenario, base) as env:
        state = daemon_config(env)["state_dir"]
        os.mkdir(state, 0o700)
        # this host has run BiDAF before: its history, as an earlier noded left it
        with open(os.open(os.path.join(state, "baselines.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                  "w") as f:
            json.dump({"jobs": {}, "models": {"BiDAF": 80.0}}, f)
        jobs_running(env, 2)
        level = HOG_LEVEL.format("mba")
        with daemon_process(env) as (daemon, url):

            def throttled() -> str | None:
                text = scrape(url)
                return text if (value(text, level) or 0) >= 1 else None

            text = wait_for(throttled, timeout=15, interval=0.02, what="the hog throttled")
            assert ticks(text) <= 8, f"throttled only at tick {ticks(text)}"
            assert 'noded_job_gpu_baseline_ratio{job_id="cgroup:bert",source="model"} 0.8' in text
            assert mba_level(env, "hog") >= 1
            stop(daemon)
        assert noded_groups(env["NODED_SIM_RESCTRL"]) == []

        # restarted while the counters read Unavailable: the node's bandwidth is unknown
        inject(env, {"counters": "Unavailable"})
        counter = os.path.join(env["NODED_SIM_RESCTRL"], "mon_data", "mon_L3_00", "mbm_total_bytes")
        wait_for(lambda: read(counter) == "Unavailable", timeout=10, what="the counters Unavailable")
        with daemon_process(env) as (daemon, url):
            wait_for(lambda: ticks(scrape(url)) >= 1, timeout=30, interval=0.05, what="the restarted daemon ticking")

            def not_blind(text: str) -> None:
                shown = lines(text, "noded_inputs_missing", "noded_job_throttle_level", "noded_ticks_total")
                assert (value(text, r"^noded_inputs_missing ([0-9.]+)") or 0) >= 1, shown
                assert (value(text, level) or 0) == 0 and mba_level(env, "hog") == 0, f"throttled blind:\n{shown}"

            ticks_in_a_row(url, 10, not_blind)
            inject(env, {"counters": None})
            wait_for(lambda: mba_level(env, "hog") >= 1, timeout=15, interval=0.05,
                     what="the hog throttled once the counters read again")
            assert 'noded_job_gpu_baseline_known{job_id="cgroup:bert"} 1' in scrape(url)
            stop(daemon)
        assert noded_groups(env["NODED_SIM_RESCTRL"]) == []
