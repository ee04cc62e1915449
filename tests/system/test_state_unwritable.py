"""Record before you touch (issue #11, item 3): where the state directory cannot be
written, noded monitors and exports but changes no job, says so, and throttles again
once it can; a SIGKILL at any point leaves nothing a restart cannot put back."""

import os
import subprocess

import pytest
from prometheus_client import generate_latest

from noded.commands.wiring import build_daemon
from noded.loop.metrics import make_registry
from support.eliminator import NLP_AND_HOG, Harness, end_threads_as_a_kill_would

pytestmark = [pytest.mark.fuse,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to halve")]


def mount(*args):
    subprocess.run(["mount", *args], check=True)


@pytest.fixture
def state_on_tmpfs(tmpfs):
    return tmpfs(name="state")


def test_a_read_only_state_dir_changes_nothing_until_it_is_writable(tmp_path, state_on_tmpfs):
    h = Harness(tmp_path, NLP_AND_HOG, profile="no-mba")  # cores: every throttle needs a recorded original
    try:
        mount("-o", "remount,ro", str(state_on_tmpfs))
        r = h.until(lambda r: r.decision.triggered and "sim:hog" in r.sample.jobs, 20, "contention")
        hog = next(iter(r.sample.jobs["sim:hog"].pids))
        everything = os.sched_getaffinity(hog)
        for _ in range(6):
            r = h.tick()
            assert r.state_unwritable and "Read-only file system" in r.state_unwritable
            assert r.levels == {} and not r.applied and os.sched_getaffinity(hog) == everything
        assert "state directory not writable" in r.decision.note
        assert "noded_state_writable 0.0" in generate_latest(make_registry(h.daemon)).decode()
        assert not (state_on_tmpfs / "originals.json").exists()
        mount("-o", "remount,rw", str(state_on_tmpfs))
        r = h.until(lambda r: "sim:hog" in r.levels, 20, "the hog throttled once originals can be recorded")
        assert len(os.sched_getaffinity(hog)) < len(everything)
        assert f"affinity:{hog}:" in (state_on_tmpfs / "originals.json").read_text()
        # SIGKILL here: nothing of the daemon runs again. The next start puts the hog back.
        end_threads_as_a_kill_would(h.daemon)
        rebuilt = build_daemon(h.config, discovery=h.sim.discovery)
        assert os.sched_getaffinity(hog) == everything
        rebuilt.daemon.shutdown()
    finally:
        end_threads_as_a_kill_would(h.daemon)  # a second time does nothing
        h.sim.stop()


def test_while_unwritable_no_level_rises_and_none_goes_below_zero():
    from noded.actuators.plan import UNKNOWN, UNSETTLED
    from noded.policy.contention_controller import limits_while_unwritable

    limits = {"held": 3, "free": 3, "unknown": 3, "unsettled": 3, "absent": 3, "low": 1}
    in_force = {"held": 2, "free": 0, "unknown": UNKNOWN, "unsettled": UNSETTLED, "low": 2}
    assert limits_while_unwritable(limits, in_force) == {"held": 2, "free": 0, "unknown": 0, "unsettled": 0,
                                                         "absent": 0, "low": 1}
