"""What noded changed that it does not own, recorded before the first write.

Like tuned: before noded first writes a cpuset or an affinity it did not create,
the original value goes into ``originals.json`` in the state directory (written
atomically: temp file, fsync, rename). It is restored when the throttle ends, when
the daemon stops, and at the next start after a crash.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any


def read_json_object(path: str, what: str) -> dict[str, Any]:
    """A JSON object from the state directory; {} when the file does not exist yet."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); expected {what}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of {what}")
    return data


def write_json_atomically(path: str, data: Any) -> None:
    """Write, fsync, rename over, fsync the directory: a crash leaves the old or the new file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class OriginalValues:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, "originals.json")
        self._lock = threading.Lock()
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self._values: dict[str, Any] = self._load()

    def _load(self) -> dict[str, Any]:
        return read_json_object(self.path, "recorded original values")

    def _save(self) -> None:
        write_json_atomically(self.path, self._values)

    def record(self, key: str, value: Any) -> None:
        """Keep the first value seen for ``key`` (an earlier crash's record wins)."""
        with self._lock:
            if key not in self._values:
                self._values[key] = value
                self._save()

    def get(self, key: str) -> Any:
        with self._lock:
            return self._values.get(key)

    def forget(self, key: str) -> None:
        with self._lock:
            if self._values.pop(key, None) is not None:
                self._save()

    def items(self) -> list[tuple[str, Any]]:
        with self._lock:
            return list(self._values.items())
