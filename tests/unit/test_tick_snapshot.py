"""One control snapshot a tick (issue #25, item 1): what operators set (pause, overrides)
is read once, before anything is decided, and every part of the tick sees that one reading.
Before, ``control.paused`` was read by contention and read again by right-sizing, so a
pause arriving between the two paused right-sizing and not contention; the overrides were
read for the decision and again for the result.

The operator's change is made from inside the tick, by a part the tick calls between
those old reads (the owner of jobs' CPUs, asked where a job's CPUs are): a real
ControlState and OverrideStore, changed at a point the test reaches every time."""

from __future__ import annotations

import time
from types import MappingProxyType, SimpleNamespace

from noded.config import Config
from noded.jobs.model import JobMeta
from noded.loop.daemon import Daemon
from noded.loop.overrides import Override, OverrideStore
from noded.loop.parts import Parts
from noded.samplers import SamplerStatus
from noded.samplers.sample import CPU, JobSample, Sample

JOB = "cgroup:batch"


class OneCpuJob:
    """Telemetry of one CPU job; ``during``: called inside each sample (an operator's step)."""

    discovery = events = None  # what the metrics read of telemetry: none here

    def __init__(self, during=lambda: None):
        self.during = during
        self.t = 0.0

    def sample(self, quiet=None):
        self.during()
        self.t += 1.0
        jobs = {JOB: JobSample(JOB, "cgroup", frozenset({11}), JobMeta(), CPU, (), None, 1e9, "own")}
        return Sample(self.t, MappingProxyType(jobs), (), False, "no NVML", (0,), MappingProxyType({0: 1e9}), (),
                      (SamplerStatus("jobs", True, 0.001),))

    def close(self):
        pass


class RecordingSizer:
    """Right-sizing as the tick drives it: which of ``tick`` (sizing goes on) or ``hold``
    (paused) each tick called; it plans nothing."""

    def __init__(self):
        self.calls: list[str] = []

    def tick(self, sample, have, originals, now, node_cpus, gpus):
        self.calls.append("tick")

    def hold(self, now):
        self.calls.append("hold")

    def plan(self, sample, originals, levels, lend_to, now):
        return None

    def view(self, have=None, plan=None, error=None):
        return None


class OwnerThatLetsAnOperatorIn:
    """The owner of every job's CPUs; asked where a job's CPUs are (right-sizing's first
    step), it runs the operator's ``step`` first: a change made while the tick runs."""

    def __init__(self, step):
        self.step = step

    def view(self, job, js):
        self.step()
        return SimpleNamespace(original=(0, 1), now=(0, 1))

    def release_all(self):
        return []


def daemon_with(tmp_path, telemetry, owner):
    overrides = OverrideStore(str(tmp_path / "state"), time.time)
    return Daemon(Config(state_dir=str(tmp_path / "state")),
                  Parts(telemetry, overrides=overrides, rightsize=RecordingSizer(), cpu_owner=owner))


def test_a_pause_arriving_inside_a_tick_reaches_contention_and_right_sizing_alike(tmp_path):
    owner = OwnerThatLetsAnOperatorIn(lambda: daemon.control.pause("maintenance"))
    daemon = daemon_with(tmp_path, OneCpuJob(), owner)
    first = daemon.tick()
    # before: right-sizing read the pause again and held, while contention decided unpaused
    assert daemon.parts.rightsize.calls == ["tick"]
    assert not (first.decision.note or "").startswith("paused") and first.control.paused is None
    owner.step = lambda: None
    second = daemon.tick()  # the pause is in force from the next tick on, for both
    assert daemon.parts.rightsize.calls == ["tick", "hold"]
    assert second.decision.note == "paused: maintenance" and second.control.paused == "maintenance"


def test_a_pause_arriving_while_sampling_reaches_both_in_that_tick(tmp_path):
    telemetry = OneCpuJob()
    daemon = daemon_with(tmp_path, telemetry, OwnerThatLetsAnOperatorIn(lambda: None))
    telemetry.during = lambda: daemon.control.pause("maintenance")
    result = daemon.tick()
    assert daemon.parts.rightsize.calls == ["hold"]
    assert result.decision.note == "paused: maintenance" and result.control.paused == "maintenance"


def test_an_override_set_inside_a_tick_is_in_its_result_only_if_its_decision_had_it(tmp_path):
    def operator_exempts():
        store = daemon.control.overrides
        if JOB not in store.current():
            store.set(Override(JOB, 0, 0, "exempt mid-tick", time.time(), None))

    daemon = daemon_with(tmp_path, OneCpuJob(), OwnerThatLetsAnOperatorIn(operator_exempts))
    first = daemon.tick()
    # before: the result read the overrides again, after the decision, and showed one it never had
    assert first.control.overrides == ()
    second = daemon.tick()
    assert [o.job for o in second.control.overrides] == [JOB]
