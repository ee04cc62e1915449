"""One job's data never stops the tick (issue #22, "What to build"): a job whose own part
of a tick fails is held and counted, the others go on; a tick that fails for any reason is
counted in noded_tick_failures_total even when no tick ever completes; systemd's watchdog
hears from every round of the loop, and its STATUS says when the tick failed."""

from __future__ import annotations

import logging
import threading
import time
from types import MappingProxyType

from prometheus_client import generate_latest

from support.sockets import NotifySocket
from support.waiting import wait_for
from noded.actuators.plan import LevelThrottle
from noded.loop.overrides import Override, OverrideStore
from noded.config import Config
from noded.loop.daemon import Daemon
from noded.loop.parts import Parts
from noded.jobs.model import JobMeta
from noded.loop.metrics import make_registry
from noded.commands import run as runner
from noded.samplers.sample import CPU, JobSample, Sample
from noded.samplers import SamplerStatus
from noded.commands.sdnotify import SystemdNotifier
from test_metrics import parse, value
from support.metrics import parse, value


class BrokenTelemetry:
    """Every sample raises, as the non-UTF-8 job id did in every tick (issue #22, item 2),
    until ``mend`` is set."""

    discovery = events = None  # what the metrics read of telemetry: none here

    def __init__(self):
        self.mend = threading.Event()
        self.n = 0

    def sample(self, quiet=None):
        self.n += 1
        if not self.mend.is_set():
            raise UnicodeEncodeError("utf-8", "cgroup:\udcff", 7, 8, "surrogates not allowed")
        return Sample(float(self.n), MappingProxyType({}), (), False, "no NVML", (0,), MappingProxyType({0: 1e9}),
                      (), (SamplerStatus("jobs", True, 0.001),))

    def close(self):
        pass


def running(daemon: Daemon, **hooks):
    stop = threading.Event()
    loop = threading.Thread(target=daemon.run, args=(stop,), kwargs=hooks)
    loop.start()
    return stop, loop


def test_ticks_that_never_complete_are_counted_in_the_scrape(tmp_path):
    daemon = Daemon(Config(tick_s=0.02, state_dir=str(tmp_path / "state")), Parts(BrokenTelemetry()))
    stop, loop = running(daemon)
    try:
        # before the fix: counted in a snapshot only a completed tick publishes, so 0 forever
        def scraped():
            return parse(generate_latest(make_registry(daemon)).decode())[0]

        values = wait_for(lambda: v if value(v := scraped(), "noded_tick_failures_total") >= 3 else None,
                          timeout=10, what="three failed ticks counted in the scrape")
    finally:
        stop.set()
        loop.join(timeout=5)
    assert value(values, "noded_ticks_total") == 0 and daemon.last is None


def test_the_watchdog_hears_from_every_round_and_the_status_says_the_tick_failed(tmp_path):
    notify = NotifySocket(tmp_path / "notify")
    telemetry = BrokenTelemetry()
    daemon = Daemon(Config(tick_s=0.02, state_dir=str(tmp_path / "state")), Parts(telemetry))
    notifier = SystemdNotifier({"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000"})
    on_tick, on_failed = runner._notifier_hooks(notifier)
    stop, loop = running(daemon, on_tick=on_tick, on_failed=on_failed)
    try:
        # started: the loop runs, though no tick completes; systemd is told so, not left
        # waiting for a READY=1 that never comes (a restart loop with protection off)
        ready = notify.ready()
        assert ready["READY"] == "1"
        assert ready["STATUS"].startswith("tick failed (1 in a row, 0 completed before): UnicodeEncodeError: ")
        said = [notify.recv() for _ in range(10)]  # a STATUS, then WATCHDOG=1, each round
        assert sum(m.get("WATCHDOG") == "1" for m in said) >= 4, said
        assert all(m["STATUS"].startswith("tick failed (") for m in said if "STATUS" in m), said
        telemetry.mend.set()
        healed = notify.until("STATUS")
        while healed["STATUS"].startswith("tick failed"):
            healed = notify.until("STATUS")
        assert healed["STATUS"].startswith("0 jobs (0 GPU)")
        assert notify.recv() == {"WATCHDOG": "1"}
    finally:
        stop.set()
        loop.join(timeout=5)
        notify.close()


class OneBadJobThrottle(LevelThrottle):
    """Levels kept in memory; the change of ``bad`` raises what no write raises (data of
    the job's that noded cannot take, or a bug)."""

    kind = "mba"

    def __init__(self, bad: str):
        super().__init__()
        self.bad = bad
        self.levels: dict[str, int] = {}

    def max_levels(self, sample):
        return {j: 3 for j in sample.jobs}

    def levels_in_force(self, sample):
        return {j: self.levels.get(j, 0) for j in sample.jobs}

    def level_share(self, level):
        return 0.5 ** level

    def _set_level(self, job, level, in_force, sample, writes):
        if job == self.bad:
            raise KeyError(f"no such level for {job}")
        self.levels[job] = level
        writes.append(f"{job} at level {level}")

    def release_all(self):
        self.levels.clear()
        return []


class TwoJobs:
    """Two CPU jobs; ``monitor_error``: the bad one's monitoring group could not be synced."""

    discovery = events = None  # what the metrics read of telemetry: none here

    def __init__(self, monitor_error: bool):
        self.monitor_error = monitor_error
        self.t = 0.0

    def sample(self, quiet=None):
        self.t += 1.0
        jobs = {j: JobSample(j, "cgroup", frozenset({pid}), JobMeta(), CPU, (), None, 1e9, "own")
                for j, pid in (("cgroup:bad\udcff", 11), ("cgroup:good", 12))}
        errors = (("monitor", "cgroup:bad\udcff", "OSError: a tenant's group"),) if self.monitor_error else ()
        return Sample(self.t, MappingProxyType(jobs), (), False, "no NVML", (0,), MappingProxyType({0: 1e9}), (),
                      (SamplerStatus("jobs", True, 0.001),), job_errors=errors)

    def close(self):
        pass


def test_a_job_whose_change_fails_alone_is_held_counted_and_said_once_and_the_others_change(tmp_path, caplog):
    throttle = OneBadJobThrottle("cgroup:bad\udcff")
    daemon = Daemon(Config(tick_s=0.05, state_dir=str(tmp_path / "state")), Parts(
        TwoJobs(monitor_error=True), throttle, overrides=OverrideStore(str(tmp_path / "state"), time.time)))
    for job in ("cgroup:bad\udcff", "cgroup:good"):
        daemon.control.overrides.set(Override(job, 2, 0, "test", time.time(), None))
    with caplog.at_level(logging.ERROR, logger="noded.loop.daemon"):
        results = [daemon.tick() for _ in range(3)]  # before the fix: the first raised KeyError
    assert throttle.levels == {"cgroup:good": 2}
    assert all(r.levels.get("cgroup:bad\udcff", 0) == 0 for r in results)  # held where it was
    assert results[-1].levels["cgroup:good"] == 2
    values, _ = parse(generate_latest(make_registry(daemon)).decode())
    assert value(values, "noded_tick_job_errors_total", stage="act") == 3
    assert value(values, "noded_tick_job_errors_total", stage="monitor") == 3
    assert value(values, "noded_tick_failures_total") == 0
    said = [r.getMessage() for r in caplog.records if "held" in r.getMessage()]
    assert len(said) == 2, said  # once per stage, not once a tick
    assert any("change failed" in m and "KeyError" in m for m in said)


CPUS_SCRIPT = """
import json, sys
from noded.jobs.model import Job
from noded.samplers.cpus import CpuPlacementSampler
from noded.samplers.sample import build_sample
jobs = {j: Job(j, "cgroup", frozenset(), path) for j, path in json.loads(sys.argv[1]).items()}
sampler = CpuPlacementSampler()
placed = sampler.sample(jobs)
sample = build_sample(1.0, jobs, None, None, None, cpus=placed, cpus_unreadable=sampler.unreadable)
print(json.dumps({"placed": {j: sorted(p.held()) for j, p in placed.items()}, "unreadable": sampler.unreadable,
                  "partial": sampler.partial, "cpusets": {j: [d for d, _ in p.cpusets] for j, p in placed.items()},
                  "job_errors": sample.job_errors}))
"""


def test_a_tenant_that_shuts_noded_out_of_part_of_its_subtree_hides_that_part_only(v1_cpuset):
    # noded's unit runs it as root without CAP_DAC_OVERRIDE: a subtree's owner can make part
    # of it unreadable; setpriv drops the same capabilities here, and the kernel answers
    # EACCES. The job's own cpuset and every part noded can read are its CPUs, the part
    # shut is said (before: the job's CPUs were unknown, a job error every tick).
    import json
    import os
    import subprocess
    import sys

    base, mkcg = v1_cpuset
    shut, fine = mkcg("jobs/shut"), mkcg("jobs/fine")
    step = mkcg("jobs/shut/step")
    os.chown(step, 65534, 65534)
    os.chmod(step, 0o700)
    try:
        jobs = json.dumps({"cgroup:shut": shut, "cgroup:fine": fine})
        out = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
                              sys.executable, "-c", CPUS_SCRIPT, jobs], capture_output=True, text=True, timeout=60)
    finally:
        os.chmod(step, 0o755)
        os.chown(step, 0, 0)
    assert out.returncode == 0, out.stderr  # before an earlier fix: PermissionError, every job's CPUs missing
    got = json.loads(out.stdout)
    assert set(got["placed"]) == {"cgroup:fine", "cgroup:shut"} and got["placed"]["cgroup:fine"]
    assert got["cpusets"]["cgroup:shut"] == [shut] and got["placed"]["cgroup:shut"]  # its own, read
    assert got["unreadable"] == {} and got["job_errors"] == []
    assert "Permission denied" in got["partial"]["cgroup:shut"] and step in got["partial"]["cgroup:shut"]
    assert "cpuset tree partly read" in out.stderr and out.stderr.count("job=cgroup:shut") == 1
