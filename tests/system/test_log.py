"""The log (issue #26, item 5): a reason's figures are the sample's as the job ran (the
first throttle of a hog names its rate, not the sliver its new monitoring group had
counted); a lasting state is logged when it begins and when it ends; operators' overrides
are changes, at notice; a dry run marks every line and says at its start what it cannot
know."""

from __future__ import annotations

import logging
import os
import re
import statistics
import subprocess
import sys
from types import SimpleNamespace

import pytest

from noded.loop.overrides import Override, OverrideStore
from noded.samplers.bandwidth import BandwidthSampler
from resctrl.mbm import MBM_TOTAL, CounterReading
from noded.util.journal import NOTICE
from support.eliminator import NLP_AND_HOG, Harness
from support.paths import REPO_ROOT

ROOT = REPO_ROOT
GB = 1e9
RATE = re.compile(r"heaviest CPU job \((\d+\.\d) GB/s\)")


def test_contention_with_no_cpu_job_left_to_throttle_is_logged_when_it_begins_and_when_it_ends(tmp_path, caplog):
    # dry run: the hog runs on at every level, so noded reaches the deepest level with the
    # contention still there, until the hog stops
    events = NLP_AND_HOG + "  - {at: 6, stop: {id: hog}}\n"
    h = Harness(tmp_path, events, dry_run=True)
    state = "state=contention_nothing_left_to_throttle"
    try:
        with caplog.at_level(logging.DEBUG, logger="noded.changes"):
            h.until(lambda r: any(state in m.message for m in caplog.records), 20, "the state logged on entry")
            h.until(lambda r: any(f"{state} ended" in m.message for m in caplog.records), 20,
                    "the state logged on exit, once the hog has stopped")
            assert "sim:hog" not in h.results[-1].sample.jobs
            for _ in range(8):
                h.tick()
        lines = [(r.levelno, r.getMessage()) for r in caplog.records if state in r.getMessage()]
        assert [(lvl, m.split(":")[0]) for lvl, m in lines] == [(logging.WARNING, f"{state} entered"),
                                                                 (NOTICE, f"{state} ended")], lines
        assert "GPU job sim:bert below baseline" in lines[0][1]
    finally:
        h.stop()


def test_an_override_set_cleared_or_expired_is_logged_at_notice_not_warning(tmp_path, caplog):
    now = [1_700_000_000.0]
    store = OverrideStore(str(tmp_path / "state"), lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="noded.changes"):
        store.set(Override("cgroup:hog", 2, 0, "maintenance", now[0], now[0] + 60))
        store.set(Override("cgroup:other", 0, 0, "debugging", now[0], None))
        store.clear("cgroup:other", 0)
        now[0] += 61
        store.active()
    changes = {r.getMessage().split(" ")[0]: r.levelno for r in caplog.records if r.name == "noded.changes"}
    assert changes == {"override-set": NOTICE, "override-cleared": NOTICE, "override-expired": NOTICE}, changes


@pytest.fixture(scope="module")
def dry_run_of_the_demo():
    """`make demo`, dry, for its first 10 s (the hog starts at 4 s): nothing slows the hog,
    so every decision sees the rate it runs at. Its log lines."""
    p = subprocess.run([sys.executable, "-m", "noded", "run", "--sim", "scenarios/contention.yaml", "--config",
                        "scenarios/demo-config.yaml", "--dry-run", "--duration", "10"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0, p.stderr
    # its log lines and what it says to whoever started it (not the simulated node's t= lines)
    return [line for line in (p.stdout + p.stderr).splitlines() if re.match(r"<\d>|noded: ", line)]


#: the one line of `run --sim` that is the simulated node's, not the daemon's
SIM_NODES_OWN = "noded: simulated node torn down."


@pytest.mark.xdist_group("demo-dry-run")  # one run of the demo (the module fixture) for both
def test_the_first_throttles_reason_names_the_rate_the_hog_runs_at(dry_run_of_the_demo):
    # The hog's monitoring group is made in the tick that first sees it: its first reading
    # counted only since that mkdir, and was read as 0.1 GB/s of a 16 GB/s hog.
    named = [float(m.group(1)) for line in dry_run_of_the_demo if (m := RATE.search(line))]
    assert len(named) >= 3, dry_run_of_the_demo
    ran = statistics.median(named[1:])
    # Within half of it either way: the bug read a 16 GB/s hog as 0.1 (a factor of 160), and the
    # emulator's counters advance in a process of its own that a loaded machine starves for a
    # while (12.3 of 16 once beside stress-ng --cpu 2 and the demo)
    assert 0.5 * ran <= named[0] <= 1.5 * ran, named


@pytest.mark.xdist_group("demo-dry-run")  # one run of the demo (the module fixture) for both
def test_a_dry_run_marks_every_line_and_says_at_its_start_what_it_cannot_know(dry_run_of_the_demo):
    logged = dry_run_of_the_demo
    assert any(re.match(r"<5>noded\.changes: \[dry-run\] throttle job=cgroup:hog", line) for line in logged), logged
    unmarked = [line for line in logged if not re.match(r"(<\d>[\w.]+|noded): \[dry-run\] ", line)
                and line != SIM_NODES_OWN]
    assert not unmarked, unmarked
    # and its last line does not claim throttles were released: none was made
    assert "noded: [dry-run] stopped; nothing was throttled or changed, its monitoring groups removed." in logged
    start = next(line for line in logged if "what it cannot know" in line)
    assert "each later step assumes the earlier ones had no effect" in start
    assert logged.index(start) < min(i for i, line in enumerate(logged) if "throttle job=" in line)


class Counters:
    """An MbmReader over counters a test sets: path -> bytes, on L3 domain 0."""

    def __init__(self):
        self.bytes: dict[str, int] = {}

    def read(self, path, domains):
        return {d: {MBM_TOTAL: CounterReading(self.bytes[path])} for d in domains}

    def close(self):
        pass


def test_a_new_jobs_first_rate_is_over_the_time_its_group_counted_and_the_nodes_stays_whole(tmp_path):
    (tmp_path / "mon_data" / "mon_L3_00").mkdir(parents=True)
    root, hog = str(tmp_path), str(tmp_path / "mon_groups" / "hog")
    now = [0.0]
    counters = Counters()
    made = {"hog": 1.9}  # the hog's group made 0.1 s before the read at 2.0
    sampler = BandwidthSampler(SimpleNamespace(created_at=made.get), counters, clock=lambda: now[0])
    rc = SimpleNamespace(root=root, list_ctrl_groups=lambda: [])
    counters.bytes[root] = 0
    sampler.sample(rc, 1, {})
    now[0], counters.bytes[root] = 1.0, 2 * GB  # 2 GB/s, nobody's
    sampler.sample(rc, 1, {})
    # at 2.0: the hog pushed 16 GB/s all second; 0.1 s of it in its own group, the rest in the root's
    now[0], counters.bytes[hog] = 2.0, int(1.6 * GB)
    counters.bytes[root] = 2 * GB + 2 * GB + int(14.4 * GB) + int(1.6 * GB)  # the root's total holds its child
    s = sampler.sample(rc, 1, {"hog": SimpleNamespace(path=hog, parent=SimpleNamespace(path=root))})
    assert s.job_bps["hog"][0] == pytest.approx(16 * GB)  # read as 1.6 GB/s before
    assert s.node_bps[0] == pytest.approx(18 * GB)  # 2 GB/s of the rest and the hog's 16, counted once
