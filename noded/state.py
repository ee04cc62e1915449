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


class OriginalValues:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, "originals.json")
        self._lock = threading.Lock()
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self._values: dict[str, Any] = self._load()

    def _load(self) -> dict[str, Any]:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        if not isinstance(data, dict):
            raise ValueError(f"{self.path}: expected a JSON object of recorded original values")
        return data

    def _save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self._values, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(os.path.dirname(self.path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

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
