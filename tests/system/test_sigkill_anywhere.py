"""SIGKILL of the daemon process at 13 random moments (issue #14, item 4): no handler runs,
nothing is flushed. Each test's first moment is drawn from the spawn on, so it lands
anywhere: while the daemon starts and puts right what an earlier one left, or already
acting; the others from when noded is seen acting: while it throttles with MBA or
releases, while it halves a CPU job's cores (cpusets and affinities), while MPS starts or
an admission is answered, while an operator's override is being written. After each kill a restart must
leave the node as a clean start leaves it, checked from the kernel's side (and the
driver's): the restarted daemon, held before its first tick, shows its start's work alone
(every resctrl group of noded's gone, every cpuset and affinity back: a clean stop puts back
every record too, so it would hide a start that did not); once ticking, the killed run's MPS
processes are gone and the operator's override is still in force and whole; its clean stop
(SIGTERM, exit 0) leaves no resctrl group of noded's, every job's cpuset and every job
process's affinity its own, no MPS process, every GPU's compute mode its own.

Each kill and its checked restart is two daemon starts and most of the suite's CPU in this
file, so the kills are as few as cover the moments: there were 30, two in three from the
spawn, and on a loaded machine (the suite's four workers on two cores) a spawn's first
seconds are the interpreter's imports, so those kills all landed at the same moment, before
noded had read anything. Every kill drawn from acting is kept (4, 3 and 3); of those drawn
from the spawn, one in each test (on an MBA host, on one without, with co-location on):
there were 10, and on a loaded machine they land at one moment, the imports, so the other
7 repeated the first's moment, at 2.7 core-seconds each."""

from __future__ import annotations

import contextlib
import os
import random
import re
import subprocess
import threading
import time

import pytest
import yaml
from nodesim import launch
from support.system import CPUSET, compute_modes, cpusets, noded_groups, running_node, scrape

from support.waiting import wait_for
from resctrl.cpulist import parse_cpu_list
from support.mps import end_serving, processes_serving
from support.system import popen_noded

pytestmark = [pytest.mark.fuse, pytest.mark.slow, pytest.mark.skipif(not os.path.isdir(CPUSET), reason="no v1 cpuset hierarchy"),
              # each keeps a simulated node, noded and its restarts busy for most of a minute:
              # one after another in one worker, not three at once starving each other's ticks
              pytest.mark.xdist_group("sigkill")]

#: a hog that saturates the node for two seconds, then calms for two, for ten minutes:
#: every moment of a run falls near a throttle or a release
PULSING_HOG = "".join(f"  - {{at: {t}, set: {{id: hog, cpu_gbps: {16 if t % 4 == 0 else 0.5}}}}}\n"
                      for t in range(2, 600, 2))

THROTTLE = f"""
seed: 14
duration_s: 600
tick_s: 0.1
node: {{profile: PROFILE, gpus: 2, peak_gbps: 10}}
events:
  - {{at: 0, start: {{id: bert, model: BiDAF, gpu: 0}}}}
  - {{at: 0, start: {{id: etl, cpu_gbps: 0.5}}}}
  - {{at: 0, start: {{id: hog, cpu: hog}}}}
{PULSING_HOG}"""

#: quick reactions, so that throttles and releases happen within each run's few seconds:
#: the per-job cap throttles the hog from the first tick it pushes, whatever the GPU jobs
FAST = {"tick_s": 0.1, "metrics": {"address": "127.0.0.1", "port": 0},
        "contention": {"hold_s": 0.5, "settle_s": 0.1, "cpu_job_cap_gbps": 4.0}}


def write_inputs(tmp_path, profile: str, **config) -> tuple[str, str]:
    (tmp_path / "scenario.yaml").write_text(THROTTLE.replace("PROFILE", profile))
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({**FAST, **config}))
    return str(tmp_path / "scenario.yaml"), str(tmp_path / "base.yaml")


def spawn_daemon(env: dict[str, str]) -> subprocess.Popen:
    """noded as a host runs it; what it says is not read (a killed one says little)."""
    return popen_noded(["run", "--config", env["NODED_SIM_CONFIG"]],
                       env={**os.environ, **{k: env[k] for k in ("LD_LIBRARY_PATH", "NODED_SIM_NVML")}},
                       cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class SimulatedNode:
    """The simulated node as the kernel and the driver show it."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.top = env["NODED_SIM_CGROUP"]
        with open(os.path.join(self.top, "cpuset.cpus")) as f:
            self.everything = f.read().strip()
        with open(env["NODED_SIM_CONFIG"]) as f:
            config = yaml.safe_load(f)
        self.pipe_dir = os.path.join(config["runtime_dir"], "mps")
        self.admin = os.path.join(config["runtime_dir"], "noded.sock")

    def affinities(self) -> dict[int, set[int]]:
        out = {}
        for d in os.listdir(self.top):
            if os.path.isdir(os.path.join(self.top, d)):
                with open(os.path.join(self.top, d, "cgroup.procs")) as f:
                    for pid in map(int, f.read().split()):
                        with contextlib.suppress(ProcessLookupError):
                            out[pid] = os.sched_getaffinity(pid)
        return out

    def compute_modes(self) -> list[int]:
        return compute_modes(self.env)

    def changed(self) -> dict[str, object]:
        """What noded has changed now, of what it may change (empty: the node as it was)."""
        cpus = {job: c for job, c in cpusets(self.top).items() if c != self.everything}
        allowed = parse_cpu_list(self.everything)
        affinities = {pid: sorted(a) for pid, a in self.affinities().items() if a != allowed}
        out = {"groups": noded_groups(self.env["NODED_SIM_RESCTRL"]), "cpusets": cpus, "affinities": affinities,
               "mps": processes_serving(self.pipe_dir), "compute_modes": [m for m in self.compute_modes() if m]}
        return {k: v for k, v in out.items() if v}


def asking(node: SimulatedNode, command: str, args_of, period: float):
    """What a thread does while the daemon lives and dies (``while_running``): ``command``
    to the admin socket every ``period`` seconds, the nth with ``args_of(n)``; a request
    refused or unanswered is expected (the daemon starting, or killed meanwhile)."""
    from noded.admin.request import request

    def run(stop: threading.Event) -> None:
        n = 0
        while not stop.wait(period):
            n += 1
            with contextlib.suppress(Exception):
                request(node.admin, command, args_of(n), timeout=2)

    return run


def from_acting(i: int) -> bool:
    """Whether the ``i``th kill's moment is drawn from when noded is seen acting (all but
    the first, which is drawn from the spawn)."""
    return i > 0


def kill_and_restart(node: SimulatedNode, rng: random.Random, while_running=None, after_restart=None,
                     acting=None) -> dict:
    """One SIGKILL at a moment drawn from the spawn on, then the restart and its clean
    stop, checked. ``while_running(stop)``: what an operator or a job does meanwhile (a
    thread, until ``stop`` is set); ``after_restart(url)``: checks on the restarted daemon.
    ``acting(changed)``: the moment is drawn from when noded is seen doing this instead
    (how long noded takes to start is the machine's, not the test's: from the spawn alone,
    a loaded machine's kills all land before noded acts). Returns what noded had changed
    at the moment it was killed."""
    daemon = spawn_daemon(node.env)
    try:
        stop = threading.Event()
        helper = threading.Thread(target=while_running, args=(stop,), daemon=True) if while_running else None
        if helper:
            helper.start()
        try:
            if acting is None:
                moment = time.monotonic() + rng.uniform(0.3, 2.2)
            else:
                wait_for(lambda: acting(node.changed()) or daemon.poll() is not None, timeout=60, interval=0.02,
                         what="noded acting")
                moment = time.monotonic() + rng.uniform(0.0, 0.5)
            wait_for(lambda: time.monotonic() >= moment or daemon.poll() is not None, timeout=10, interval=0.02,
                     what="the moment to kill")
            assert daemon.poll() is None, f"the daemon exited by itself ({daemon.returncode})"
            at_kill = node.changed()
            daemon.kill()
            daemon.wait()
        finally:
            stop.set()
            if helper:
                helper.join(timeout=10)
        with restarted_daemon(node.env) as restart:
            # its start, alone: what the killed run left is put right or it is no restart at all
            # (a clean stop puts back every record too, so it would hide a start that did not)
            held = node.changed()
            assert {k: v for k, v in held.items() if k in RECOVERED_AT_START} == {}, \
                f"left by a SIGKILL at {at_kill} when the restarted noded starts ticking"
            url = restart.release()
            wait_for(lambda: re.search(r"^noded_ticks_total [1-9]", scrape(url), re.M), timeout=30, interval=0.05,
                     what="the restarted daemon ticking")
            # the killed run's MPS control daemon and servers: killed by the restart's MPS start
            # (in the supervisor's thread, beside the first ticks), whoever serves now
            wait_for(lambda: not set(at_kill.get("mps", ())) & set(node.changed().get("mps", ())), timeout=10,
                     what="the killed run's MPS processes gone")
            if after_restart:
                after_restart(url)
        assert node.changed() == {}, f"left after a SIGKILL at {at_kill} and a restart"
    except BaseException:
        # failed anywhere: neither run may outlive the test, nor the MPS daemon either one
        # started (the killed run's is ended by a restart that got that far, not otherwise)
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()
        end_serving(node.pipe_dir)
        raise
    return at_kill


#: what a start puts right before its first tick (noded.commands.wiring.build_daemon): every
#: resctrl group of noded's removed, every recorded cpuset and affinity put back (compute
#: modes too, but co-location's start sets them again at once, before the first tick)
RECOVERED_AT_START = ("groups", "cpusets", "affinities")


class HeldRestart:
    """noded started as ``running_daemon`` starts it, its output into a pipe already full:
    the first line it writes, its metrics URL, waits there until ``release``. noded writes
    it once its start has put right what an earlier run left and before its first tick
    (noded.commands.run), so while it waits the kernel shows that start's work alone."""

    def __init__(self, env: dict[str, str]):
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(write_end, b"x" * 4096)
        with contextlib.suppress(BlockingIOError):
            while True:  # the last page's room too
                os.write(write_end, b"x")
        os.set_blocking(write_end, True)
        try:
            self.proc = launch.spawn(["run", "--config", env["NODED_SIM_CONFIG"]], stdout=write_end, cwd="/",
                                     env=launch.daemon_environment(env))
        finally:
            os.close(write_end)
        self.out = os.fdopen(read_end, "r")
        wait_for(lambda: self.writing_stdout() or self.proc.poll() is not None, timeout=60, interval=0.02,
                 what="the restarted noded writing its first line")
        if self.proc.poll() is not None:
            raise AssertionError(f"the restarted noded exited ({self.proc.returncode}): {self.proc.stderr.read()}")

    def writing_stdout(self) -> bool:
        """Whether noded's main thread waits in a write to its (full) stdout pipe, as the
        kernel shows it."""
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            with open(f"/proc/{self.proc.pid}/wchan") as f:
                waiting_in = f.read()
            with open(f"/proc/{self.proc.pid}/syscall") as f:
                fd = f.read().split()[1:2]
            return waiting_in.endswith("pipe_write") and fd == ["0x1"]
        return False

    def release(self) -> str:
        """The pipe read (what filled it, then noded's lines): the metrics URL."""
        line = launch.Lines(self.out).wait_for(lambda s: "http://" in s, "the metrics URL from noded", 60)
        return re.search(r"http://\S+", line).group(0)


@contextlib.contextmanager
def restarted_daemon(env: dict[str, str]):
    """A ``HeldRestart``; stopped cleanly (SIGTERM, exit 0) at the end, or killed where the
    test failed."""
    restart = HeldRestart(env)
    try:
        yield restart
    except BaseException:
        restart.proc.kill()
        restart.proc.wait()
        raise
    code, _ = launch.stop(restart.proc, 30)
    assert code == 0, restart.proc.stderr.read()


def test_sigkill_while_throttling_releasing_and_overriding_then_a_restart_is_a_clean_start(tmp_path):
    """5 kills on an MBA host: the hog throttled and released every few seconds, and an
    operator re-writing an override on another job all the while."""
    scenario, base = write_inputs(tmp_path, "intel")
    rng = random.Random(1401)
    with running_node(tmp_path, scenario, base) as env:
        node = SimulatedNode(env)

        operator = asking(node, "throttle", lambda n: {"job": "cgroup:etl", "level": 1 + n % 2, "ttl_s": 3600,
                                                       "reason": "system test"}, period=0.05)

        def override_whole(url: str) -> None:
            # in force at level 1 or 2 (the one last written, or the one before): never lost,
            # never half-written (nobody writes it while this daemon runs)
            level = r'noded_job_throttle_level{job_id="cgroup:etl",method="mba"} ([12])\.0\b'
            wait_for(lambda: re.search(level, scrape(url)), timeout=10, what="the etl override in force")
            assert re.search(r'noded_override_active{job_id="cgroup:etl",kind="throttle"[^}]*} 1', scrape(url))

        def override_set(url: str) -> None:  # by the first restart, before the kills that write it
            from noded.admin.request import request

            request(node.admin, "throttle", {"job": "cgroup:etl", "level": 1, "ttl_s": 3600, "reason": "system test"})
            override_whole(url)

        seen = [kill_and_restart(node, rng, operator if i else None, override_whole if i else override_set,
                                 acting=throttling_now if from_acting(i) else None)
                for i in range(5)]
    throttling = [s for s in seen if throttling_now(s)]
    assert len(throttling) >= 3, seen  # killed with a throttle of its own in the kernel


def throttling_now(changed: dict) -> bool:
    return any(g.startswith("noded-mba-") for g in changed.get("groups", ()))


def test_sigkill_while_halving_cores_then_a_restart_is_a_clean_start(tmp_path):
    """4 kills on a host without MBA: the hog's cores halved (its cpuset, its processes'
    affinities) and given back every few seconds."""
    scenario, base = write_inputs(tmp_path, "no-mba")
    rng = random.Random(1402)
    with running_node(tmp_path, scenario, base) as env:
        node = SimulatedNode(env)
        if len(parse_cpu_list(node.everything)) < 2:
            pytest.skip("one CPU: no cores to halve")
        halving = lambda changed: "cpusets" in changed or "affinities" in changed  # noqa: E731
        seen = [kill_and_restart(node, rng, acting=halving if from_acting(i) else None) for i in range(4)]
    assert sum(map(halving, seen)) >= 2, seen


def test_sigkill_while_mps_starts_and_admissions_are_answered_then_a_restart_is_a_clean_start(tmp_path):
    """4 kills with co-location on: MPS started (compute modes set to EXCLUSIVE_PROCESS,
    recorded first) and admission requests answered all the while."""
    # numba's cache is warm before it starts (support.plugin waits for the run's compile before
    # every test of this tier): a cold compile is not what is tested
    scenario, base = write_inputs(tmp_path, "intel", colocation={"enabled": True})
    rng = random.Random(1403)
    with running_node(tmp_path, scenario, base) as env:
        node = SimulatedNode(env)

        job = asking(node, "admit", lambda n: {"job": f"slurm:{n}", "model": "ResNet-50", "batch_size": 32},
                     period=0.1)

        serving = lambda changed: "mps" in changed and "compute_modes" in changed  # noqa: E731
        seen = [kill_and_restart(node, rng, job, acting=serving if from_acting(i) else None) for i in range(4)]
    assert sum("mps" in s for s in seen) >= 2 and any("compute_modes" in s for s in seen), seen
