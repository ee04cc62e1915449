"""Inputs missing (noded.samplers.missing): one line when each goes, one when it is back,
never one a tick (issue #26, item 5: every lasting state an alert sees, here NodedBlind's,
is logged on entry and exit)."""

from __future__ import annotations

import logging

import pytest

from noded.samplers import run_sampler
from noded.samplers.missing import STATE, MissingInputs


@pytest.fixture
def said(caplog):
    caplog.set_level(logging.DEBUG)
    return lambda: [(r.noded_state_change, r.getMessage().split(": ", 1)[1]) for r in caplog.records
                    if getattr(r, "noded_state", None) == STATE]


def failing():
    raise OSError(5, "Input/output error")


def test_a_sampler_failing_every_tick_is_one_line_when_it_begins_and_one_when_it_ends(said, caplog):
    inputs = MissingInputs(grace_s=10)
    for t in range(100):
        _, status = run_sampler("nvml", failing)
        inputs.update([f"sampler nvml: {status.error}"], float(t))
    assert said() == [("entered", "sampler nvml: OSError: [Errno 5] Input/output error (for 10s)")]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "noded.samplers"]
    for t in range(100, 120):
        inputs.update([], float(t))
    assert [c for c, _ in said()] == ["entered", "ended"]
    assert said()[1][1].startswith("sampler nvml measured again (10s since it came back); it was: sampler nvml:")


def test_an_input_missing_for_less_than_the_grace_period_is_not_said(said):
    inputs = MissingInputs(grace_s=10)
    for t in range(0, 100, 10):  # missing 5 s in every 10
        for dt in range(5):
            inputs.update(["node bandwidth on L3 domain 1"], float(t + dt))
        for dt in range(5, 10):
            inputs.update([], float(t + dt))
    assert said() == []


def test_a_reason_that_changes_is_the_same_episode_and_each_input_is_its_own(said):
    inputs = MissingInputs(grace_s=1)
    for t in range(5):
        inputs.update([f"gpu 0: Unknown {t}", "gpu 1: GpuIsLost"], float(t))
    assert sorted(m for _, m in said()) == ["gpu 0: Unknown 1 (for 1s)", "gpu 1: GpuIsLost (for 1s)"]
    assert set(inputs.now) == {"gpu 0", "gpu 1"} and inputs.now["gpu 0"] == "gpu 0: Unknown 4"


def test_resctrl_and_nvml_unavailable_are_left_to_the_watching_states(said):
    inputs = MissingInputs(grace_s=1)
    for t in range(5):
        inputs.update(["resctrl: no resctrl filesystem mounted at /sys/fs/resctrl",
                       "nvml: NVML library not found"], float(t))
    assert said() == []
