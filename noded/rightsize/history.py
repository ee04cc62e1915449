"""What right-sizing found before, so the next job starts near its answer (CODA Sec. V-A, V-B1).

CODA records each finished job's cores with its owner and starts the owner's next job of
the same category at "the largest core number" of those (V-B1), on the grounds that "a
user tends to submit similar training jobs". ``rightsize.json`` in the state directory
keeps two tables, oldest first:

* ``jobs``: per (owner, model, batch size), the last answer: its cores, GPUs, category,
  the throughput measured there and the signal it was measured with. A new job with the
  same key, GPUs and signal only confirms that answer (one measurement); a job of the same
  model otherwise (another batch size, another owner) starts at its cores per GPU
  (``same_model``, ours: before CODA's category rule);
* ``owners``: per (owner, category), the cores per GPU of that owner's last
  ``RECENT_PER_OWNER`` answers, so that one odd job is forgotten in time rather than
  setting everybody's start for ever. A job with no category uses all of its owner's.

Both are capped (``max_jobs``, ``max_owners``); recording past a cap evicts the entry
recorded longest ago. Only answers that were searched or confirmed are recorded (a pinned
or stopped size says nothing about the job, nor one cut to the plan's ceiling, ``limited``).

The file is written like ``baselines.json``: through the state directory's ``SecureDir``,
atomically and durably; a file that cannot be trusted is moved aside at load and noded
starts without history (``notes`` says so). ``record`` changes memory only after the
file says so and raises ``StateWriteError`` otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from noded.jobs.model import CATEGORIES
from noded.stores.securedir import SecureDir
from noded.rightsize.signal import KINDS

if TYPE_CHECKING:
    from noded.rightsize.sizing import JobSpec, Sized

FILE = "rightsize.json"
VERSION = 1
MAX_JOBS = 1024
MAX_OWNERS = 1024
RECENT_PER_OWNER = 8
_MAX_NAME = 256
_MAX_CORES = 1 << 16

JobKey = tuple[str, str, "int | None"]  # owner, model, batch size
OwnerKey = tuple[str, "str | None"]  # owner, category


@dataclass(frozen=True)
class Remembered:
    """The last answer for one (owner, model, batch size)."""

    owner: str
    model: str
    batch_size: int | None
    category: str | None
    gpus: int
    cores: int
    throughput: float
    signal: str  # the signal kind the throughput was measured with

    def to_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "model": self.model, "batch_size": self.batch_size, "category": self.category,
                "gpus": self.gpus, "cores": self.cores, "throughput": self.throughput, "signal": self.signal}


@dataclass(frozen=True)
class HistoryView:
    """An immutable snapshot for the pure allocator: lookups only."""

    jobs: Mapping[JobKey, Remembered] = field(default_factory=lambda: MappingProxyType({}))
    owners: Mapping[OwnerKey, tuple[float, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def exact(self, owner: str | None, model: str | None, batch_size: int | None) -> Remembered | None:
        if owner is None or model is None:
            return None
        return self.jobs.get((owner, model, batch_size))

    def same_model(self, model: str | None, owner: str | None = None) -> Remembered | None:
        """The newest answer for ``model``: the owner's (any batch size) when there is one,
        else any owner's; None when nobody's job of that model was sized. The allocator's
        start after the exact job and before CODA's category rule (a model's cores per GPU
        carry over from one batch size or one owner to the next better than another model's)."""
        if model is None:
            return None
        newest = None
        for (o, m, _), remembered in reversed(self.jobs.items()):
            if m != model:
                continue
            if o == owner:
                return remembered
            newest = newest or remembered
        return newest

    def largest_per_gpu(self, owner: str | None, category: str | None) -> float | None:
        """CODA V-B1: the largest cores per GPU among the owner's recent answers in this
        category (any category when it is None); None when the owner has none."""
        if owner is None:
            return None
        if category is not None:
            recent = self.owners.get((owner, category), ())
        else:
            recent = tuple(c for (o, _), values in self.owners.items() if o == owner for c in values)
        return max(recent) if recent else None


def _name(value: Any, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_NAME:
        raise ValueError(f"{where}: not a name of 1..{_MAX_NAME} characters: {str(value)[:60]!r}")
    return value


def _count(value: Any, where: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if type(value) is not int or not 1 <= value <= _MAX_CORES:
        raise ValueError(f"{where}: not a whole number in 1..{_MAX_CORES}: {str(value)[:40]}")
    return value


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: not a positive number: {str(value)[:40]}")
    return float(value)


def _category(value: Any, where: str) -> str | None:
    if value is not None and value not in CATEGORIES:
        raise ValueError(f"{where}: category must be one of {CATEGORIES} or null, not {str(value)[:40]!r}")
    return value


def parse_history(data: Any, max_jobs: int = MAX_JOBS, max_owners: int = MAX_OWNERS) -> HistoryView:
    """The history in ``rightsize.json``; ValueError on any other shape. Entries past the caps
    (a file written with larger caps) are dropped oldest first."""
    if not isinstance(data, dict) or set(data) != {"version", "jobs", "owners"}:
        raise ValueError("expected an object with exactly 'version', 'jobs' and 'owners'")
    if data["version"] != VERSION:
        raise ValueError(f"version {str(data['version'])[:20]} is not {VERSION}")
    if not isinstance(data["jobs"], list) or not isinstance(data["owners"], list):
        raise ValueError("'jobs' and 'owners' must be lists")
    jobs: dict[JobKey, Remembered] = {}
    for i, entry in enumerate(data["jobs"]):
        where = f"jobs[{i}]"
        if not isinstance(entry, dict) or set(entry) != set(Remembered.__dataclass_fields__):
            raise ValueError(f"{where}: expected {', '.join(Remembered.__dataclass_fields__)}")
        if entry["signal"] not in KINDS:
            raise ValueError(f"{where}.signal: one of {KINDS}, not {str(entry['signal'])[:40]!r}")
        r = Remembered(_name(entry["owner"], f"{where}.owner"), _name(entry["model"], f"{where}.model"),
                       _count(entry["batch_size"], f"{where}.batch_size", optional=True),
                       _category(entry["category"], f"{where}.category"), _count(entry["gpus"], f"{where}.gpus"),
                       _count(entry["cores"], f"{where}.cores"), _positive(entry["throughput"], f"{where}.throughput"),
                       entry["signal"])
        key = (r.owner, r.model, r.batch_size)
        jobs.pop(key, None)  # a repeated key: the later entry is the newer
        jobs[key] = r
    owners: dict[OwnerKey, tuple[float, ...]] = {}
    for i, entry in enumerate(data["owners"]):
        where = f"owners[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"owner", "category", "cores_per_gpu"}:
            raise ValueError(f"{where}: expected owner, category, cores_per_gpu")
        recent = entry["cores_per_gpu"]
        if not isinstance(recent, list) or not recent:
            raise ValueError(f"{where}.cores_per_gpu: expected a non-empty list")
        values = tuple(_positive(v, f"{where}.cores_per_gpu") for v in recent)[-RECENT_PER_OWNER:]
        key = (_name(entry["owner"], f"{where}.owner"), _category(entry["category"], f"{where}.category"))
        owners.pop(key, None)
        owners[key] = values
    return HistoryView(MappingProxyType(_newest(jobs, max_jobs)), MappingProxyType(_newest(owners, max_owners)))


def _newest(table: dict, cap: int) -> dict:
    return dict(list(table.items())[-cap:]) if len(table) > cap else table


def history_json(view: HistoryView) -> dict[str, Any]:
    return {"version": VERSION,
            "jobs": [r.to_dict() for r in view.jobs.values()],
            "owners": [{"owner": o, "category": c, "cores_per_gpu": list(v)} for (o, c), v in view.owners.items()]}


class SizingHistory:
    """``rightsize.json`` in the state directory. ``persist=False`` (dry run): read, never written."""

    def __init__(self, state_dir: SecureDir, *, persist: bool = True, max_jobs: int = MAX_JOBS,
                 max_owners: int = MAX_OWNERS):
        if max_jobs < 1 or max_owners < 1:
            raise ValueError("max_jobs and max_owners must be >= 1")
        self.dir = state_dir
        self.persist = persist
        self.max_jobs, self.max_owners = max_jobs, max_owners
        loaded, note = state_dir.load_json(FILE, "right-sizing history",
                                           lambda data: parse_history(data, max_jobs, max_owners))
        self._view = loaded or HistoryView()
        self.notes = [note] if note else []

    def view(self) -> HistoryView:
        return self._view

    def record(self, spec: "JobSpec", sized: "Sized") -> bool:
        """Remember a measured answer; False when there was nothing to remember (not measured,
        no owner, or a name the file cannot hold). Raises StateWriteError, and remembers
        nothing, when the file could not be written."""
        if spec.owner is None or sized.throughput is None or sized.reason not in ("searched", "confirmed"):
            return False
        jobs = dict(self._view.jobs)
        if spec.model is not None:
            key = (spec.owner, spec.model, spec.batch_size)
            jobs.pop(key, None)
            jobs[key] = Remembered(spec.owner, spec.model, spec.batch_size, spec.category, spec.gpus, sized.cores,
                                   sized.throughput, spec.signal)
        owners = dict(self._view.owners)
        okey = (spec.owner, spec.category)
        recent = owners.pop(okey, ())
        owners[okey] = (*recent, round(sized.cores / spec.gpus, 3))[-RECENT_PER_OWNER:]
        view = HistoryView(MappingProxyType(_newest(jobs, self.max_jobs)),
                           MappingProxyType(_newest(owners, self.max_owners)))
        data = history_json(view)
        try:
            # never write what the next start would refuse to read (and move aside, with
            # everything else in it): an owner or model name too long, say
            parse_history(data, self.max_jobs, self.max_owners)
        except ValueError:
            return False
        if self.persist:
            self.dir.write_json(FILE, data)
        self._view = view
        return True
