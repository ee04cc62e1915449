"""The durable records of a job's CPUs: their keys in originals.json (a cpuset, a process's
affinity, a job's affinity as a whole; the format: ``noded.stores.originals.parse_originals``),
and ``cpus_written.json``, every CPU set noded wrote or was about to write into each of them,
so a value that is none of them is known to be someone else's."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from resctrl.cpulist import parse_cpu_list

from noded.stores.securedir import SecureDir
from noded.util.cputree import CpuSet

#: what noded wrote (or was about to write) into each cpuset and affinity it recorded
WRITTEN_FILE = "cpus_written.json"
_MAX_CPU = 1 << 16
_MAX_VALUES = 8  # values kept per record: a change leaves at most four (now, shrunk, union, target)
_KINDS = ("cpuset", "affinity", "affinity_job")


def cpuset_key(path: str) -> str:
    return f"cpuset:{path}"


def affinity_key(pid: int, starttime: str) -> str:
    # The start time tells a reused pid from the process we recorded.
    return f"affinity:{pid}:{starttime}"


def affinity_job_key(job: str) -> str:
    return f"affinity_job:{job}"


def cpus_of(value: Any) -> CpuSet:
    """A recorded value (a cpuset's list text, or an affinity's CPU ids) as a set."""
    return frozenset(parse_cpu_list(value)) if isinstance(value, str) else frozenset(value)


def parse_written(data: Any) -> dict[str, list[list[int]]]:
    """``cpus_written.json``: a record's key (as in originals.json) -> the CPU sets noded may
    have left there, each a sorted list of CPU ids. Raises ValueError."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    for key, values in data.items():
        if key.partition(":")[0] not in _KINDS or not key.partition(":")[2]:
            raise ValueError(f"unknown record {key[:200]!r}")
        if not isinstance(values, list) or len(values) > _MAX_VALUES or not all(
                isinstance(v, list) and v and all(type(c) is int and 0 <= c < _MAX_CPU for c in v) for v in values):
            raise ValueError(f"{key[:200]}: expected up to {_MAX_VALUES} lists of CPU numbers")
    return data


class WrittenValues:
    """Per record, the CPU sets noded wrote or was about to write there (see the module's
    docstring); what noded may have left in the kernel, so a value that is none of them
    is someone else's. Memory follows the file: ``update`` raises StateWriteError and then
    changes nothing. ``notes`` says what was found corrupt at load."""

    def __init__(self, directory: SecureDir):
        self.dir = directory
        loaded, note = directory.load_json(WRITTEN_FILE, "the CPUs noded wrote", parse_written)
        self._values: dict[str, tuple[CpuSet, ...]] = {
            k: tuple(frozenset(v) for v in vs) for k, vs in (loaded or {}).items()}
        self.notes: list[str] = [note] if note else []

    def get(self, key: str) -> tuple[CpuSet, ...] | None:
        return self._values.get(key)

    def keys(self) -> list[str]:
        return list(self._values)

    def update(self, changes: Mapping[str, Sequence[CpuSet] | None]) -> None:
        """Set (a sequence) or drop (None) records, in one durable write when anything differs."""
        values = dict(self._values)
        for key, new in changes.items():
            if new is None or not new:
                values.pop(key, None)
            else:
                values[key] = tuple(dict.fromkeys(new))[-_MAX_VALUES:]
        if values == self._values:
            return
        self.dir.write_json(WRITTEN_FILE, {k: [sorted(v) for v in vs] for k, vs in values.items()})
        self._values = values
