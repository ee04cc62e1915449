"""Admin requests and replies: one JSON object per line, each way.

Request: {"version": 1, "command": NAME, "args": {...}}. Every command's
arguments are checked here, strictly (unknown keys, wrong types, out-of-range
values are errors); a bad request gets an error reply naming what was wrong.
"""

from __future__ import annotations

import json
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
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) != {"c", "m", "window_us", "source"}:
        raise RequestError("profile must be an object with exactly c, m, window_us and source")
    nums = [v["c"], v["m"], v["window_us"]]
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0 for x in nums) or not nums[2]:
        raise RequestError("profile: c and m must be >= 0 and window_us > 0")
    if not isinstance(v["source"], str) or len(v["source"]) > 512:
        raise RequestError("profile: source must be a string")
    return v


def _seconds(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 86400:
        raise RequestError("iteration_s must be a number of seconds in (0, 86400]")
    return float(v)


def _uid(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**32:
        raise RequestError("uid must be a user id (a non-negative integer)")
    return v


def _reason(v: Any) -> str:
    if not isinstance(v, str) or len(v) > 500:
        raise RequestError("reason must be a string of at most 500 characters")
    return v


# command -> {arg: (required, validator)}
COMMANDS: dict[str, dict[str, tuple[bool, Any]]] = {
    "status": {},
    "jobs": {},
    "explain": {"job": (True, _job)},
    "throttle": {"job": (True, _job), "level": (False, _level), "cores": (False, _cores),
                 "ttl_s": (False, _ttl), "reason": (False, _reason)},
    "release": {"job": (True, _job)},
    "exempt": {"job": (True, _job), "ttl_s": (False, _ttl), "reason": (False, _reason)},
    "pause": {"reason": (False, _reason)},
    "resume": {},
    "admit": {"job": (True, _job), "model": (True, _model), "batch_size": (True, _batch), "gpu": (False, _gpu),
              "profile": (False, _profile), "uid": (False, _uid)},
    "report": {"job": (True, _job), "iteration_s": (True, _seconds)},
    "model_fit": {},
}


def parse_request(line: bytes) -> tuple[str, dict[str, Any]]:
    if len(line) > MAX_REQUEST_BYTES:
        raise RequestError(f"request larger than {MAX_REQUEST_BYTES} bytes")
    try:
        data = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"not a JSON object: {e}") from None
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
    return command, out


def encode(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode() + b"\n"


def reply_ok(result: Any) -> bytes:
    return encode({"version": VERSION, "ok": True, "result": result})


def reply_error(message: str) -> bytes:
    return encode({"version": VERSION, "ok": False, "error": message})
