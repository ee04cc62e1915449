"""Admin requests and replies: one JSON object per line, each way.

Request: {"version": 1, "command": NAME, "args": {...}}. Every command's
arguments are checked here, strictly (unknown keys, wrong types, out-of-range
values are errors); a bad request gets an error reply naming what was wrong.
"""

from __future__ import annotations

import json
import math
from typing import Any

VERSION = 1
MAX_REQUEST_BYTES = 64 * 1024


class RequestError(ValueError):
    pass


def _job(v: Any) -> str:
    if not isinstance(v, str) or not v or len(v) > 256 or "\n" in v:
        raise RequestError("job must be a non-empty string of at most 256 characters")
    return v


def _ttl(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 30 * 86400:
        raise RequestError("ttl_s must be a number of seconds in (0, 30 days], or null for no expiry")
    return float(v)


def _level(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 64:
        raise RequestError("level must be an integer from 1 to 64")
    return v


def _cores(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096:
        raise RequestError("cores must be an integer from 1 to 4096")
    return v


def _model(v: Any) -> str:
    if not isinstance(v, str) or not v or len(v) > 128:
        raise RequestError("model must be a non-empty string of at most 128 characters")
    return v


def _batch(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 20:
        raise RequestError("batch_size must be a positive integer")
    return v


def _gpu(v: Any) -> str:
    if not isinstance(v, str) or not (v == "auto" or v.startswith("GPU-")) or len(v) > 96:
        raise RequestError("gpu must be 'auto' or a GPU UUID (GPU-...)")
    return v


def _profile(v: Any) -> dict | None:
    from noded.colocation.profiles import check_profile_numbers

    if v is None:
        return None
    if not isinstance(v, dict) or set(v) != {"c", "m", "window_us", "source"}:
        raise RequestError("profile must be an object with exactly c, m, window_us and source")
    for name in ("c", "m", "window_us"):
        x = v[name]
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise RequestError(f"profile.{name} must be a finite number, got {str(x)[:40]}")
    problem = check_profile_numbers(float(v["c"]), float(v["m"]), float(v["window_us"]), names=("c", "m", "window_us"))
    if problem:
        raise RequestError(f"profile: {problem}")
    if not isinstance(v["source"], str) or len(v["source"]) > 512:
        raise RequestError("profile: source must be a string of at most 512 characters")
    return v


def _seconds(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 86400:
        raise RequestError("iteration_s must be a number of seconds in (0, 86400]")
    return float(v)


def _uid(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**32:
        raise RequestError("uid must be a user id (a non-negative integer)")
    return v


def _bytes_per_s(v: Any) -> float:
    from noded.capping.units import MAX_BYTES_PER_S

    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_BYTES_PER_S:
        raise RequestError(f"bytes_per_s must be a number of bytes a second in (0, {MAX_BYTES_PER_S:g}], "
                           f"got {str(v)[:40]}")
    return float(v)


def _reason(v: Any) -> str:
    if not isinstance(v, str) or len(v) > 500:
        raise RequestError("reason must be a string of at most 500 characters")
    return v


#: at most this many labels in one `label` request (JobMeta has fewer fields)
MAX_LABELS = 16


def _labels(v: Any) -> dict[str, Any]:
    """A `label` request's labels: names to strings, numbers or booleans (what they mean is
    JobMeta's to check)."""
    if not isinstance(v, dict) or len(v) > MAX_LABELS:
        raise RequestError(f"labels must be an object of at most {MAX_LABELS} labels")
    for name, value in v.items():
        if len(name) > 64:
            raise RequestError(f"label name {name[:64]!r}... is longer than 64 characters")
        if not isinstance(value, (str, int, float, bool)) or (isinstance(value, str) and len(value) > 128):
            raise RequestError(f"label {name!r} must be a string of at most 128 characters, a number or a boolean")
    return v


def _flag(name: str):
    def check(v: Any) -> bool:
        if v is not True:
            raise RequestError(f"{name} must be true where given")
        return v
    return check


# command -> {arg: (required, validator)}
COMMANDS: dict[str, dict[str, tuple[bool, Any]]] = {
    "status": {},
    "jobs": {},
    "explain": {"job": (True, _job)},
    "throttle": {"job": (True, _job), "level": (False, _level), "cores": (False, _cores),
                 "ttl_s": (False, _ttl), "reason": (False, _reason)},
    "release": {"job": (True, _job)},
    # hold a job at a bandwidth (bytes a second; nodectl reads 6GB/s), or release its cap
    "cap": {"job": (True, _job), "bytes_per_s": (False, _bytes_per_s), "release": (False, _flag("release")),
            "ttl_s": (False, _ttl), "reason": (False, _reason)},
    "exempt": {"job": (True, _job), "ttl_s": (False, _ttl), "reason": (False, _reason)},
    "pause": {"reason": (False, _reason)},
    "resume": {},
    "admit": {"job": (True, _job), "model": (True, _model), "batch_size": (True, _batch), "gpu": (False, _gpu),
              "profile": (False, _profile), "uid": (False, _uid)},
    "report": {"job": (True, _job), "iteration_s": (True, _seconds)},
    # a job manager's hooks: a job's labels at its start (a Slurm prolog), all it holds at its end
    "label": {"job": (True, _job), "labels": (True, _labels)},
    "forget": {"job": (True, _job)},
    "model_fit": {},
    # right-sizing: pin a job's cores (cores), stop probing it (stop) or search again (reprobe)
    "size": {"job": (True, _job), "cores": (False, _cores), "stop": (False, _flag("stop")),
             "reprobe": (False, _flag("reprobe")), "reason": (False, _reason)},
}


class _NotFinite:
    """What a JSON number that is not a finite float64 parses to: never a float, so it
    cannot reach a comparison (NaN passes every ``>`` test by failing it)."""

    def __init__(self, text: str, why: str = "is not a finite number"):
        self.problem = f"{text} {why}"


#: An integer longer than this is refused (Python would parse any length, slowly).
_MAX_INT_DIGITS = 20


def _float(text: str) -> float | _NotFinite:
    x = float(text)
    return x if math.isfinite(x) else _NotFinite(text[:24], "is beyond a float's range")  # 1e400 parses to inf


def _int(text: str) -> int | _NotFinite:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= _MAX_INT_DIGITS else _NotFinite(f"an integer of {digits} digits", "is too large")


#: Deeper JSON than this is refused (requests are 3 levels deep; recursion is bounded).
_MAX_DEPTH = 32


def _first_not_finite(value: Any, path: str = "", depth: int = 0) -> tuple[str, str] | None:
    """(dotted path, text) of the first number in ``value`` that is not finite, or None."""
    if depth > _MAX_DEPTH:
        raise RequestError(f"{path}: nested more than {_MAX_DEPTH} levels deep")
    if isinstance(value, _NotFinite):
        return path or "the request", value.problem
    if isinstance(value, dict):
        children = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        children = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, v in children:
        found = _first_not_finite(v, where, depth + 1)
        if found is not None:
            return found
    return None


def parse_request(line: bytes) -> tuple[str, dict[str, Any]]:
    if len(line) > MAX_REQUEST_BYTES:
        raise RequestError(f"request larger than {MAX_REQUEST_BYTES} bytes")
    try:
        # NaN, Infinity and numbers beyond float64 are JSON Python accepts and the
        # standard does not: they parse to a marker and are refused by field below.
        data = json.loads(line, parse_constant=_NotFinite, parse_float=_float, parse_int=_int)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"not a JSON object: {e}") from None
    except RecursionError:
        raise RequestError("not a JSON object: nested too deeply") from None
    bad = _first_not_finite(data)
    if bad is not None:
        raise RequestError(f"{bad[0]}: {bad[1]}")
    if not isinstance(data, dict):
        raise RequestError("not a JSON object")
    unknown = set(data) - {"version", "command", "args"}
    if unknown:
        raise RequestError(f"unknown request field(s) {sorted(unknown)}")
    if data.get("version") != VERSION:
        raise RequestError(f"unsupported protocol version {data.get('version')!r}; this noded speaks {VERSION}")
    command = data.get("command")
    if command not in COMMANDS:
        raise RequestError(f"unknown command {command!r}; known: {', '.join(sorted(COMMANDS))}")
    args = data.get("args", {})
    if not isinstance(args, dict):
        raise RequestError("args must be a JSON object")
    spec = COMMANDS[command]
    unknown = set(args) - set(spec)
    if unknown:
        raise RequestError(f"{command}: unknown argument(s) {sorted(unknown)}")
    out = {}
    for name, (required, check) in spec.items():
        if name in args:
            try:
                out[name] = check(args[name])
            except RequestError as e:
                raise RequestError(f"{command}: {e}") from None
        elif required:
            raise RequestError(f"{command}: missing argument {name!r}")
    if command == "throttle" and ("level" in out) == ("cores" in out):
        raise RequestError("throttle: give exactly one of level or cores")
    if command == "cap" and ("bytes_per_s" in out) == ("release" in out):
        raise RequestError("cap: give exactly one of bytes_per_s or release")
    if command == "cap" and "release" in out and ("ttl_s" in out or "reason" in out):
        raise RequestError("cap: release takes no ttl_s or reason")
    if command == "size" and sum(k in out for k in ("cores", "stop", "reprobe")) != 1:
        raise RequestError("size: give exactly one of cores, stop or reprobe")
    return command, out


def encode(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode() + b"\n"


def reply_ok(result: Any) -> bytes:
    return encode({"version": VERSION, "ok": True, "result": result})


def reply_error(message: str) -> bytes:
    return encode({"version": VERSION, "ok": False, "error": message})
