"""What noded changed that it does not own, recorded before the first write.

Like tuned: before noded first writes a cpuset or an affinity it did not create,
the original value goes into ``originals.json`` in the state directory (written
atomically and durably through ``SecureDir``). It is restored when the throttle ends,
when the daemon stops, and at the next start after a crash.

Memory follows the file, never leads it: ``record`` and ``forget`` change what is
believed only after the file says so, and raise ``StateWriteError`` otherwise, so a
caller that could not record an original does not go on to change the value.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

from noded.stores.securedir import (ABSENT, DirectoryMissing, SecureDir, SecureDirError, StateFileError,  # noqa: F401 (re-exported)
                        StateReadError, StateWriteError)

log = logging.getLogger(__name__)

FILE = "originals.json"
_MAX_CPU = 1 << 16  # far above any kernel's NR_CPUS; a bigger number is not a CPU
_CPU_LIST = re.compile(r"\s*(\d+(-\d+)?(,\d+(-\d+)?)*)?\s*")
_AFFINITY_KEY = re.compile(r"affinity:\d+:\d+")
_GPU_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]{1,80}")


def open_state_dir(state_dir: str | SecureDir) -> SecureDir:
    """The state directory, opened and checked (0700 when noded creates it)."""
    return state_dir if isinstance(state_dir, SecureDir) else SecureDir(state_dir, mode=0o700)


def _check_cpu_list(text: Any) -> None:
    if not isinstance(text, str) or len(text) > 65536 or not _CPU_LIST.fullmatch(text):
        raise ValueError(f"not a CPU list: {str(text)[:80]!r}")
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        if int(hi or lo) >= _MAX_CPU or int(hi or lo) < int(lo):
            raise ValueError(f"bad CPU range {part!r}")


def _check_cpus(value: Any) -> None:
    if (not isinstance(value, list) or not value or len(value) > _MAX_CPU
            or not all(type(c) is int and 0 <= c < _MAX_CPU for c in value)):
        raise ValueError(f"not a list of CPU numbers: {str(value)[:80]}")


def _check_affinity_job(key: str, value: Any) -> None:
    if not isinstance(value, dict) or set(value) != {"original", "cgroup", "root"}:
        raise ValueError(f"{key}: expected original, cgroup and root")
    _check_cpus(value["original"])
    if value["cgroup"] is not None and (not isinstance(value["cgroup"], str) or not value["cgroup"].startswith("/")):
        raise ValueError(f"{key}: cgroup must be an absolute path or null")
    root = value["root"]
    if root is not None and not (isinstance(root, list) and len(root) == 2 and type(root[0]) is int and root[0] > 0
                                 and isinstance(root[1], str) and root[1].isdigit()):
        raise ValueError(f"{key}: root must be [pid, start time] or null")


_SOFT_LIMIT = {1: re.compile(r"[0-9]{1,20}"), 2: re.compile(r"[0-9]{1,20}|max")}  # as the kernel shows them


def _check_memory(key: str, value: Any) -> None:
    where = key.partition(":")[2]
    if os.path.normpath(where) != where or "\0" in where:
        raise ValueError(f"{key[:200]}: not a normalised absolute cgroup path")
    if (not isinstance(value, dict) or set(value) != {"job", "original", "version"} or not isinstance(value["job"], str)
            or len(value["job"]) > 4096 or type(value["version"]) is not int or value["version"] not in (1, 2)
            or not isinstance(value["original"], str)
            or not _SOFT_LIMIT[value["version"]].fullmatch(value["original"])):
        raise ValueError(f"{key[:200]}: expected {{job, original, version}} of a soft memory limit (the original as "
                         "the kernel shows it: bytes, or max on v2)")


def parse_originals(data: Any) -> dict[str, Any]:
    """The records in ``originals.json``: ``cpuset:<cgroup dir>`` -> a CPU list as the kernel
    writes it, ``affinity:<pid>:<start time>`` -> a list of CPUs, ``affinity_job:<job id>`` ->
    the original CPUs, cgroup and root process of a job halved by affinity,
    ``compute_mode:<GPU UUID>`` -> an NVML compute mode, ``memory:<cgroup dir>`` -> the job,
    the cgroup version and its soft memory limit as the kernel showed it, ``made_dir:<path>``
    -> null: a directory noded made (recorded before it made it), the only kind it removes.
    Raises ValueError."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    for key, value in data.items():
        kind, _, where = key.partition(":")
        if kind == "cpuset" and where.startswith("/"):
            _check_cpu_list(value)
        elif kind == "affinity" and _AFFINITY_KEY.fullmatch(key):
            _check_cpus(value)
        elif kind == "affinity_job" and where:
            _check_affinity_job(key, value)
        elif kind == "memory" and where.startswith("/"):
            _check_memory(key, value)
        elif kind == "made_dir" and where.startswith("/") and os.path.normpath(where) == where and "\0" not in where:
            if value is not None:
                raise ValueError(f"{key[:200]}: expected null")
        elif kind == "compute_mode" and _GPU_UUID.fullmatch(where):
            if type(value) is not int or not 0 <= value <= 3:
                raise ValueError(f"{key}: not an NVML compute mode: {str(value)[:40]}")
        else:
            raise ValueError(f"unknown record {key[:200]!r}")
    return data


class OriginalValues:
    """``state_dir``: a path (opened here as a ``SecureDir``) or an open ``SecureDir``.

    ``notes`` says what was found corrupt at load and where it was moved aside.
    """

    def __init__(self, state_dir: str | SecureDir):
        self.dir = open_state_dir(state_dir)
        self.path = self.dir.file_path(FILE)
        self._lock = threading.Lock()
        loaded, note = self.dir.load_json(FILE, "recorded original values", parse_originals)
        self._values: dict[str, Any] = loaded or {}
        self.notes: list[str] = [note] if note else []

    def _save(self, values: dict[str, Any]) -> None:
        self.dir.write_json(FILE, values)

    def record(self, key: str, value: Any) -> None:
        """Keep the first value seen for ``key`` (an earlier crash's record wins).

        Raises StateWriteError when it could not be made durable; then nothing is recorded.
        """
        with self._lock:
            if key not in self._values:
                values = {**self._values, key: value}
                self._save(values)
                self._values = values

    def get(self, key: str) -> Any:
        with self._lock:
            return self._values.get(key)

    def forget(self, key: str) -> None:
        """Drop a record once its value is back; raises StateWriteError (and keeps it) on failure."""
        with self._lock:
            if key in self._values:
                values = {k: v for k, v in self._values.items() if k != key}
                self._save(values)
                self._values = values

    def items(self) -> list[tuple[str, Any]]:
        with self._lock:
            return list(self._values.items())

    def probe(self) -> str | None:
        """Whether records can be made durable now: None, or the reason not (see SecureDir.probe)."""
        return self.dir.probe()


# -- transitional: path-based helpers for callers not yet holding a SecureDir


def read_json_object(path: str, what: str) -> dict[str, Any]:
    """A JSON object from a file in a checked directory; {} when the file or directory does not
    exist. Raises StateFileError (a ValueError) naming the file when it cannot be trusted."""
    try:
        d = SecureDir(os.path.dirname(os.path.abspath(path)), create=False)
    except DirectoryMissing:
        return {}
    with d:
        data = d.read_json(os.path.basename(path))
    if data is ABSENT:
        return {}
    if not isinstance(data, dict):
        raise StateFileError(d.file_path(os.path.basename(path)), f"expected a JSON object of {what}")
    return data


def write_json_atomically(path: str, data: Any) -> None:
    """Write ``data`` as JSON through a checked directory (see SecureDir.write_bytes).
    Raises StateWriteError, or UnsafeDirectory for a directory another user could change."""
    with SecureDir(os.path.dirname(os.path.abspath(path)), mode=0o700) as d:
        d.write_json(os.path.basename(path), data)
