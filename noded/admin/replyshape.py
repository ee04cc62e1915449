"""The shape of noded's answers, as nodectl reads them.

An answer is checked whole against its command's shape before anything of it is formatted:
a malformed answer (not noded's, or another version's) is one ``MalformedReply`` naming the
field and what it should be, and an error raised while formatting a checked answer is
nodectl's own, never blamed on noded. A shape names only what nodectl reads: fields it does
not read may be added by a later noded.
"""

from __future__ import annotations

from typing import Any, Callable

#: checks one value at a place in the answer (``where``), raising MalformedReply
Shape = Callable[[Any, str], None]


class MalformedReply(Exception):
    """An answer that is not of the shape noded gives: ``where`` in it, and what was expected."""

    def __init__(self, where: str, expected: str, got: Any):
        self.where, self.expected = where, expected
        super().__init__(f"{where or 'the answer'}: {expected} expected, got {_kind(got)}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if value is _MISSING:
        return "nothing"
    name = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)
    text = repr(value)
    return name if len(text) > 40 else f"{name} ({text})"


def _leaf(expected: str, test: Callable[[Any], bool]) -> Shape:
    def check(value: Any, where: str) -> None:
        if not test(value):
            raise MalformedReply(where, expected, value)
    return check


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


STR = _leaf("a string", lambda v: isinstance(v, str))
BOOL = _leaf("a boolean", lambda v: isinstance(v, bool))
INT = _leaf("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool))
NUMBER = _leaf("a number", _is_number)
#: noded's longest override (30 days) left, in seconds: beyond it a clock cannot place it
SECONDS_LEFT = _leaf("a number of seconds from 0 to 30 days", lambda v: _is_number(v) and 0 <= v <= 30 * 86400)
#: what an f-string shows as it is: a JSON scalar (not a list or an object)
SCALAR = _leaf("a string, number, boolean or null", lambda v: v is None or isinstance(v, (str, int, float, bool)))


def maybe(shape: Shape) -> Shape:
    def check(value: Any, where: str) -> None:
        if value is not None:
            shape(value, where)
    return check


def list_of(shape: Shape) -> Shape:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise MalformedReply(where, "a list", value)
        for i, item in enumerate(value):
            shape(item, f"{where}[{i}]")
    return check


def pair(first: Shape, second: Shape) -> Shape:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, list) or len(value) != 2:
            raise MalformedReply(where, "a list of two", value)
        first(value[0], f"{where}[0]")
        second(value[1], f"{where}[1]")
    return check


def map_of(shape: Shape) -> Shape:
    """An object of any keys (JSON's are strings), each value of ``shape``."""
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise MalformedReply(where, "an object", value)
        for key, item in value.items():
            shape(item, f"{where}.{key}" if where else str(key))
    return check


def obj(required: dict[str, Shape], optional: dict[str, Shape] | None = None) -> Shape:
    """An object with every ``required`` field, and ``optional`` ones of their shape where given."""
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise MalformedReply(where, "an object", value)
        for name, shape in required.items():
            at = f"{where}.{name}" if where else name
            if name not in value:
                raise MalformedReply(at, _describe(shape), _MISSING)
            shape(value[name], at)
        for name, shape in (optional or {}).items():
            if name in value:
                shape(value[name], f"{where}.{name}" if where else name)
    return check


def when(field: str, then: Shape, otherwise: Shape, *, present: bool = False) -> Shape:
    """``then`` for an answer whose ``field`` is true (or, with ``present``, is there at
    all: as nodectl tells the two apart), ``otherwise`` for any other."""
    def check(value: Any, where: str) -> None:
        chosen = otherwise
        if isinstance(value, dict) and (field in value if present else value.get(field)):
            chosen = then
        chosen(value, where)
    return check


class _Missing:
    def __repr__(self) -> str:
        return "nothing"


_MISSING = _Missing()


def _describe(shape: Shape) -> str:
    """What a missing field should have been (a leaf's words, else 'a value')."""
    try:
        shape(_MISSING, "")
    except MalformedReply as e:
        return e.expected
    return "a value"


_OVERRIDE = obj({"job": STR, "kind": STR, "level": SCALAR, "set_by_uid": SCALAR, "reason": maybe(STR),
                 "expires_in_s": maybe(SECONDS_LEFT)}, {"cap_bytes_per_s": maybe(NUMBER)})

_JOB = obj({"job": STR, "kind": STR, "bandwidth_bytes_per_s": maybe(NUMBER), "gpu_util": maybe(NUMBER),
            "level": maybe(INT), "override": SCALAR, "exempt": SCALAR, "monitoring": STR},
           {"cap_bytes_per_s": maybe(NUMBER), "pod": maybe(obj({"qos": STR}))})

_TICK_FAILURES = obj({"in_a_row": INT}, {"last": maybe(obj({"seconds_ago": maybe(NUMBER), "error": STR}))})

_NODE = obj({"bandwidth_bytes_per_s": map_of(maybe(NUMBER)), "share_of_peak": maybe(NUMBER), "contention": SCALAR,
             "note": maybe(STR)})

#: the loop's settings, in a status after the first tick: all of them or none
_SETTINGS = {"tick_s": NUMBER, "throttle_method": maybe(STR), "threshold": NUMBER, "release_threshold": NUMBER,
             "peak_bytes_per_s_per_domain": NUMBER}

_STATUS_PARTS = {"paused": maybe(STR), "node": maybe(_NODE),
                 "gpus": list_of(obj({"gpu": SCALAR, "util": maybe(NUMBER), "error": maybe(STR)})),
                 "jobs": list_of(_JOB), "overrides": list_of(_OVERRIDE), "missing": list_of(STR)}
_STATUS_EXTRAS = {"tick_failures": maybe(_TICK_FAILURES),
                  "watching": list_of(obj({"watching": SCALAR, "what": STR, "why": STR}))}

STATUS = when("tick_s", obj({**_STATUS_PARTS, **_SETTINGS}, _STATUS_EXTRAS), obj(_STATUS_PARTS, _STATUS_EXTRAS),
              present=True)

_SIZING = obj({"state": SCALAR, "phase": SCALAR, "target": SCALAR, "max_cores": SCALAR, "optimal": SCALAR,
               "allocated": SCALAR, "signal": SCALAR, "points": list_of(pair(INT, NUMBER)),
               "plan_note": maybe(STR)})

EXPLAIN = obj({"job": STR, "kind": STR, "level": SCALAR, "bandwidth_bytes_per_s": maybe(NUMBER),
               "gpu_util": maybe(NUMBER), "baseline": maybe(NUMBER), "node_share_of_peak": maybe(NUMBER),
               "threshold": maybe(NUMBER), "slowed_gpu_jobs": list_of(STR), "why": list_of(STR),
               "decisions": list_of(obj({"seconds_ago": NUMBER, "action": SCALAR, "from": SCALAR, "to": SCALAR,
                                         "cause": SCALAR, "reason": SCALAR}))},
              {"pod": maybe(obj({"uid": SCALAR, "qos": SCALAR, "driver": SCALAR, "containers": list_of(STR)})),
               "held": list_of(STR), "sizing": maybe(_SIZING), "borrowed_cpus": maybe(list_of(INT)),
               # a noded before it says nothing of its rate's age: nothing is shown
               "bandwidth_read": maybe(obj({"this_tick": BOOL, "seconds_ago": NUMBER, "window_s": maybe(NUMBER)}))})

OVERRIDE_SET = obj({"job": STR, "level": SCALAR, "level_now": SCALAR, "max_level": SCALAR,
                    "expires_in_s": maybe(SECONDS_LEFT), "reason": maybe(STR), "in_last_sample": SCALAR})

SIZE = when("note", obj({"job": STR, "note": STR}),
            obj({"job": STR, "reason": maybe(STR), "control": SCALAR, "cores": SCALAR, "cores_before": SCALAR,
                 "state": SCALAR}))

_CAP_RELEASED = obj({"job": STR, "cap_released": SCALAR})
_CAP_SET = obj({"job": STR, "reason": maybe(STR), "cap_bytes_per_s": NUMBER, "expires_in_s": maybe(SECONDS_LEFT),
                "in_last_sample": SCALAR, "bandwidth_bytes_per_s": maybe(NUMBER)}, {"replaced": maybe(STR)})


CAP = when("cap_released", _CAP_RELEASED, _CAP_SET, present=True)  # a release's answer, or a cap's
ADMIT = when("admit", obj({"admit": BOOL, "job": STR, "reason": STR, "gpu_index": SCALAR, "gpu_uuid": STR,
                           "predicted_speedup": maybe(NUMBER), "env": map_of(STR)}),
             obj({"admit": BOOL, "job": STR, "reason": STR}))

#: what nodectl reads of each command's answer in its text output
SHAPES: dict[str, Shape] = {
    "status": STATUS,
    "jobs": list_of(_JOB),
    "explain": EXPLAIN,
    "throttle": OVERRIDE_SET,
    "exempt": OVERRIDE_SET,
    "size": SIZE,
    "cap": CAP,
    "label": obj({"job": STR, "labels": map_of(SCALAR)}),
    "forget": obj({"job": STR, "labels_forgotten": SCALAR, "reservation_released": SCALAR}),
    "release": obj({"job": STR, "override_cleared": SCALAR}, {"overrides": list_of(STR), "not_saved": maybe(STR)}),
    "pause": obj({"paused": maybe(STR)}),
    "resume": obj({"paused": maybe(STR)}),
    "admit": ADMIT,
    "model_fit": obj({"records": SCALAR, "mean_abs_error": NUMBER}),
}


def check_reply(command: str, result: Any) -> None:
    """Raise MalformedReply where ``result`` is not of the shape noded gives for ``command``."""
    SHAPES[command](result, "")
