"""Contention present from the start is throttled (issue #11, item 10): GPU baselines are
kept across restarts, per job and per model, and the metrics say whether each GPU job
has one."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from noded.policy.baselines import parse_baselines
from noded.loop.metrics import make_registry
from support.eliminator import Harness

pytestmark = pytest.mark.fuse

ALONE = "  - {at: 0, start: {id: bert, model: BiDAF, gpu: 0}}\n"
HOG_FROM_START = ("  - {at: 0, start: {id: hog, cpu: hog}}\n"
                  "  - {at: 0, start: {id: %s, model: BiDAF, gpu: 0}}\n")


def learn_alone(tmp_path):
    """A first run: the NLP job alone long enough for its baseline; then a clean stop."""
    h = Harness(tmp_path, ALONE)
    try:
        h.until(lambda r: "sim:bert" in r.baselines and r.baselines["sim:bert"][1] == "learned", 15,
                "a learned baseline")
    finally:
        h.stop()
    return json.loads((tmp_path / "state" / "baselines.json").read_text())


def ticks_until_throttled(h, job):
    """Ticks from the first one that sees the node and both jobs, to the hog's first throttle."""
    h.until(lambda r: r.decision.node_share is not None and job in r.sample.jobs and "sim:hog" in r.sample.jobs,
            15, "the node and both jobs seen")
    start = len(h.results)
    h.until(lambda r: "sim:hog" in r.levels, 15, "the hog throttled")
    return len(h.results) - start


def test_a_new_job_of_a_model_this_host_has_run_is_protected_from_its_first_minute(tmp_path):
    saved = learn_alone(tmp_path)
    assert saved["models"]["BiDAF"] == pytest.approx(80, abs=5)
    h = Harness(tmp_path, HOG_FROM_START % "bert2")  # a hog running before noded started
    try:
        assert ticks_until_throttled(h, "sim:bert2") <= 5
        assert h.results[-1].baselines["sim:bert2"][1] == "model"
        text = generate_latest(make_registry(h.daemon)).decode()
        assert 'noded_job_gpu_baseline_known{job_id="sim:bert2"} 1.0' in text
        assert 'noded_job_gpu_baseline_ratio{job_id="sim:bert2",source="model"}' in text
        assert any("from its model history" in a.reason for a in h.actions())
    finally:
        h.stop()


def test_a_job_keeps_its_baseline_across_a_restart(tmp_path):
    learn_alone(tmp_path)
    h = Harness(tmp_path, HOG_FROM_START % "bert")  # the same job, noded restarted beside a hog
    try:
        assert ticks_until_throttled(h, "sim:bert") <= 5
        assert h.results[-1].baselines["sim:bert"][1] == "job"
    finally:
        h.stop()


def test_without_any_history_the_metrics_say_the_baseline_is_missing(tmp_path):
    h = Harness(tmp_path, HOG_FROM_START % "bert")
    try:
        r = h.until(lambda r: r.decision.node_share is not None and "sim:bert" in r.sample.jobs
                    and r.sample.jobs["sim:bert"].gpu_util is not None, 15, "the job seen")
        for _ in range(5):
            r = h.tick()
        assert "sim:bert" not in r.baselines and "sim:hog" not in r.levels
        text = generate_latest(make_registry(h.daemon)).decode()
        assert 'noded_job_gpu_baseline_known{job_id="sim:bert"} 0.0' in text
    finally:
        h.stop()


def test_a_corrupt_baselines_file_is_moved_aside(tmp_path):
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "baselines.json").write_text('{"jobs": {"a": NaN}, "models": {}}')
    h = Harness(tmp_path, ALONE)
    try:
        assert any("baselines.json is corrupt" in n for n in h.built.notes)
        assert list((tmp_path / "state").glob("baselines.json.corrupt-*"))
    finally:
        h.stop()


json_values = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                      max_size=3), max_leaves=10)


@given(st.one_of(json_values, st.fixed_dictionaries({"jobs": json_values, "models": json_values})))
def test_the_baselines_file_parser_takes_only_utilisations(data):
    try:
        jobs, models = parse_baselines(data)
    except ValueError:
        return
    assert all(0 < v <= 100 for v in list(jobs.values()) + list(models.values()))
