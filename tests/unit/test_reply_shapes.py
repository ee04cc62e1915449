"""nodectl's text output of noded's answers: an answer its shape accepts is formatted
without error whatever it holds, and one it refuses is a MalformedReply naming the field.
So an error while formatting is nodectl's own, never noded's answer (F2, leftover 1)."""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from noded.admin import answertext
from noded.admin.replyshape import SHAPES, MalformedReply, check_reply

JOB = {"job": "cgroup:hog", "kind": "cpu", "bandwidth_bytes_per_s": 1e9, "gpu_util": None, "level": 1,
       "override": False, "exempt": False, "monitoring": "own", "cap_bytes_per_s": 2e9,
       "pod": {"qos": "Burstable", "uid": "u"}}
GPU_JOB = {**JOB, "job": "sim:bert", "kind": "gpu", "gpu_util": 0.8, "pod": None, "cap_bytes_per_s": None}
OVERRIDE = {"job": "cgroup:hog", "kind": "throttle", "level": 2, "cap_bytes_per_s": None, "set_by_uid": 0,
            "reason": "r", "expires_in_s": 60.0}
STATUS = {"paused": None, "tick_s": 1.0, "throttle_method": "mba", "threshold": 0.75, "release_threshold": 0.6,
          "peak_bytes_per_s_per_domain": 1e10,
          "tick_failures": {"in_a_row": 2, "last": {"seconds_ago": 3.0, "error": "boom"}},
          "watching": [{"what": "jobs", "watching": False, "why": "gone"}],
          "node": {"share_of_peak": 0.5, "bandwidth_bytes_per_s": {"0": 1e9, "1": None}, "contention": True,
                   "note": "n"},
          "gpus": [{"gpu": 0, "util": 0.5, "error": None}, {"gpu": 1, "util": None, "error": "lost"}],
          "jobs": [JOB, GPU_JOB], "overrides": [OVERRIDE, {**OVERRIDE, "cap_bytes_per_s": 6e9, "expires_in_s": None}],
          "missing": ["nvml"]}
EXPLAIN = {"job": "sim:bert", "kind": "gpu", "level": 0, "bandwidth_bytes_per_s": 1e9, "gpu_util": 0.7,
           "bandwidth_read": {"this_tick": False, "seconds_ago": 3.0, "window_s": 1.0},
           "baseline": 0.9, "node_share_of_peak": 0.8, "threshold": 0.75, "slowed_gpu_jobs": ["sim:bert"],
           "why": ["w"], "held": ["h"], "borrowed_cpus": [3, 4],
           "pod": {"uid": "u", "qos": "Guaranteed", "driver": "systemd", "containers": ["c"]},
           "decisions": [{"seconds_ago": 5.0, "action": "throttle", "from": 0, "to": 1, "cause": "c", "reason": "r"}],
           "sizing": {"state": "probing", "phase": "up", "target": 4, "max_cores": 8, "optimal": 4, "allocated": 4,
                      "signal": "reports", "points": [[2, 1.5], [4, 2.5]], "plan_note": "p"}}
ANSWERS = {
    "status": STATUS,
    "jobs": [JOB, GPU_JOB],
    "explain": EXPLAIN,
    "throttle": {"job": "a", "level": 2, "level_now": 1, "max_level": 4, "expires_in_s": 30.0, "reason": "r",
                 "in_last_sample": True},
    "exempt": {"job": "a", "level": 0, "level_now": 1, "max_level": 4, "expires_in_s": None, "reason": "",
               "in_last_sample": False},
    "size": {"job": "a", "reason": "r", "control": "pin", "cores": 2, "cores_before": 4, "state": "pinned"},
    "cap": {"job": "a", "reason": "r", "cap_bytes_per_s": 6e9, "expires_in_s": 60.0, "in_last_sample": True,
            "bandwidth_bytes_per_s": 1e9, "replaced": "throttle"},
    "label": {"job": "a", "labels": {"model": "BiDAF", "batch_size": 32}},
    "forget": {"job": "a", "labels_forgotten": True, "reservation_released": False},
    "release": {"job": "a", "override_cleared": False, "overrides": ["b"], "not_saved": "disk full"},
    "pause": {"paused": "maintenance"},
    "resume": {"paused": None},
    "model_fit": {"records": 12, "mean_abs_error": 0.1},
}


def text_of(command: str, answer) -> str:
    """nodectl's text output of an answer, as _print_result writes it (model_fit's included)."""
    shown = answertext.shown(answer)
    if command == "model_fit":
        return f"{shown['records']} {shown['mean_abs_error']:.3f}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        answertext.print_result(command, shown)
    return out.getvalue()


@pytest.mark.parametrize("command", sorted(ANSWERS))
def test_noded_shaped_answers_pass_and_format(command):
    check_reply(command, ANSWERS[command])
    assert text_of(command, ANSWERS[command])


def test_every_command_nodectl_formats_has_a_shape():
    assert set(ANSWERS) | {"admit"} == set(SHAPES)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**30, 10**30)
                    | st.floats() | st.text(max_size=8),  # NaN and Infinity too: Python's json reads them
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                max_size=3),
                    max_leaves=6)


def _paths(value, prefix=()):
    """Every place in an answer: dict keys and list indexes, outermost first."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _changed(answer, path, new, delete):
    out = copy.deepcopy(answer)
    if not path:
        return new
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return out


@settings(max_examples=200, deadline=None)
@given(command=st.sampled_from(sorted(ANSWERS)), where=st.integers(0, 10**6), new=JSON, delete=st.booleans())
# a right-sizing point's cores as null: the shape took any scalar there, and explain's
# "{cores:>5}" raised a TypeError in nodectl (found by this test)
@example(command="explain", where=19445, new=None, delete=False)
def test_an_answer_with_any_field_changed_is_refused_by_its_shape_or_formatted(command, where, new, delete):
    """Any one field replaced by any JSON value, or removed: either the shape names it
    (MalformedReply) or nodectl formats the answer without an error."""
    answer = ANSWERS[command]
    paths = list(_paths(answer))
    changed = _changed(answer, paths[where % len(paths)], new, delete)
    try:
        check_reply(command, changed)
    except MalformedReply as e:
        assert str(e)
        return
    text_of(command, changed)


def test_a_malformed_answer_names_the_field_and_what_it_should_be():
    with pytest.raises(MalformedReply, match=r"^jobs\[1\]\.kind: a string expected, got a number \(3\)$"):
        check_reply("status", _changed(STATUS, ("jobs", 1, "kind"), 3, False))
    # the loop's settings come all together (after the first tick) or not at all
    with pytest.raises(MalformedReply, match=r"^threshold: a number expected, got nothing$"):
        check_reply("status", {k: v for k, v in STATUS.items() if k != "threshold"})
    # an override's time left beyond any noded's (30 days): no clock can show its end
    with pytest.raises(MalformedReply, match=r"^expires_in_s: a number of seconds from 0 to 30 days expected"):
        check_reply("throttle", {**ANSWERS["throttle"], "expires_in_s": 1e300})
