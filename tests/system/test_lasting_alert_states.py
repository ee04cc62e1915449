"""Every lasting state an alert sees is one journal line when it begins and one when it
ends (issue #26, item 5's class): jobs held by an error of their own (NodedJobsHeld), ticks
overrunning their period (NodedTickOverruns), noded's groups near the RMIDs the hardware
has (NodedRmidsNearlyExhausted). Driven tick by tick on a fake clock."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import MappingProxyType

import pytest

from noded.config import Config
from noded.jobs.model import JobMeta
from noded.loop.daemon import OVERRUN_WINDOW, Daemon
from noded.loop.parts import Parts
from noded.samplers import SamplerStatus
from noded.samplers.resctrl import GroupsView, ResctrlFacts
from noded.samplers.sample import CPU, JobSample, Sample


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class Node:
    """Two CPU jobs; what a test sets is what the next sample says."""

    discovery = events = None  # what the metrics read of telemetry: none here

    def __init__(self, clock: Clock):
        self.clock = clock
        self.held: tuple[str, ...] = ()  # jobs whose monitoring group's sync failed
        self.resctrl: ResctrlFacts | None = None

    def sample(self, quiet=None):
        jobs = {j: JobSample(j, "cgroup", frozenset({pid}), JobMeta(), CPU, (), None, 1e9, "own")
                for j, pid in (("cgroup:a", 11), ("cgroup:b", 12))}
        errors = tuple(("monitor", j, "OSError: a tenant's group") for j in self.held)
        return Sample(self.clock(), MappingProxyType(jobs), (), False, "no NVML", (0,), MappingProxyType({0: 1e9}),
                      (), (SamplerStatus("jobs", True, 0.001),), job_errors=errors, resctrl=self.resctrl)

    def close(self):
        pass


HOLD_S = 5.0


@pytest.fixture
def node_and_daemon(tmp_path):
    clock = Clock()
    node = Node(clock)
    config = Config(tick_s=1.0, state_dir=str(tmp_path / "state"))
    config = replace(config, contention=replace(config.contention, hold_s=HOLD_S))
    return node, Daemon(config, Parts(node), clock=clock), clock


def said(caplog, state):
    return [r.noded_state_change for r in caplog.records if getattr(r, "noded_state", None) == state]


def ticks(daemon, clock, n, overrun_every: int | None = None):
    """``n`` ticks a second apart; ``overrun_every``: every so many, one counted as overrun
    (what the loop counts after a tick longer than its period)."""
    for i in range(n):
        daemon.tick()
        clock.t += 1.0
        if overrun_every and i % overrun_every == 0:
            daemon.overruns += 1


def test_jobs_held_is_said_when_it_begins_and_once_it_has_ended_for_the_hold(node_and_daemon, caplog):
    node, daemon, clock = node_and_daemon
    with caplog.at_level(logging.INFO):
        ticks(daemon, clock, 3)
        assert said(caplog, "jobs_held") == []
        node.held = ("cgroup:a",)
        ticks(daemon, clock, 5)
        assert said(caplog, "jobs_held") == ["entered"]  # once, not once a tick
        node.held = ()
        ticks(daemon, clock, int(HOLD_S) - 1)
        assert said(caplog, "jobs_held") == ["entered"]  # not ended before the hold has passed
        ticks(daemon, clock, 3)
    assert said(caplog, "jobs_held") == ["entered", "ended"]
    entered = next(r.getMessage() for r in caplog.records if getattr(r, "noded_state", None) == "jobs_held")
    assert "cgroup:a" in entered and "1 job(s)" in entered


def test_ticks_overrunning_is_said_once_a_tenth_of_the_window_overran_and_when_it_stops(node_and_daemon, caplog):
    node, daemon, clock = node_and_daemon
    with caplog.at_level(logging.INFO):
        ticks(daemon, clock, 2 * OVERRUN_WINDOW, overrun_every=5)
        assert said(caplog, "ticks_overrunning") == ["entered"]  # 1 in 5 > 1 in 10
        ticks(daemon, clock, OVERRUN_WINDOW + int(HOLD_S) + 2)
    assert said(caplog, "ticks_overrunning") == ["entered", "ended"]


def test_one_overrun_now_and_then_is_no_state(node_and_daemon, caplog):
    node, daemon, clock = node_and_daemon
    with caplog.at_level(logging.INFO):
        ticks(daemon, clock, 3 * OVERRUN_WINDOW, overrun_every=20)  # 1 in 20: under the alert's tenth
    assert said(caplog, "ticks_overrunning") == []


def facts(mon_groups: int, rmids: int) -> ResctrlFacts:
    view = GroupsView({}, {}, {f"noded-job-{i}": "" for i in range(mon_groups)})
    return ResctrlFacts(1, rmids, 15, None, view)


def test_rmids_nearly_exhausted_is_said_past_nine_tenths_and_when_it_falls_back(node_and_daemon, caplog):
    node, daemon, clock = node_and_daemon
    with caplog.at_level(logging.INFO):
        node.resctrl = facts(90, 100)
        ticks(daemon, clock, 3)
        assert said(caplog, "rmids_nearly_exhausted") == []  # 90 of 100: at the line, not past it
        node.resctrl = facts(95, 100)
        ticks(daemon, clock, 3)
        assert said(caplog, "rmids_nearly_exhausted") == ["entered"]
        node.resctrl = facts(40, 100)
        ticks(daemon, clock, int(HOLD_S) + 2)
    assert said(caplog, "rmids_nearly_exhausted") == ["entered", "ended"]
    entered = next(r.getMessage() for r in caplog.records if getattr(r, "noded_state", None) == "rmids_nearly_exhausted")
    assert "95 of the 100 RMIDs" in entered
