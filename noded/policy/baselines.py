"""GPU jobs' uncontended utilisation, kept across restarts (CODA's trigger needs it).

The policy learns each GPU job's baseline only while the node is quiet, so a job
that has run beside a hog since noded started (or since a restart) would otherwise
never have one, and its slowdown would never be seen. ``baselines.json`` in the state
directory keeps:

* each running GPU job's learned baseline, so a restart does not forget it;
* per model (the job's ``model`` label, with its ``batch_size`` where given), this
  host's history: a moving average of the baselines its jobs reached, so a new job
  of a model this host has run before starts with a baseline.

A job with neither has none, and the metrics say so.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from noded.jobs.model import JobMeta
from noded.stores.securedir import SecureDir, StateWriteError

log = logging.getLogger(__name__)

FILE = "baselines.json"
#: how much one job's baseline moves its model's history
MODEL_ALPHA = 0.3
#: baselines are written at most this often (and at stop)
SAVE_EVERY_S = 60.0

LEARNED = "learned"  # learned by this run while the node was quiet
JOB = "job"  # this job's own, learned before a restart
MODEL = "model"  # this host's history of the job's model


def model_key(meta: JobMeta) -> str | None:
    if not meta.model:
        return None
    return f"{meta.model}@{meta.batch_size}" if meta.batch_size else meta.model


def _check_util(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= 100:
        raise ValueError(f"{where}: {value!r} is not a utilisation in (0, 100] %")
    return float(value)


def parse_baselines(data: Any) -> tuple[dict[str, float], dict[str, float]]:
    """(job id -> baseline, model -> baseline) from the file's JSON; ValueError on any other shape."""
    if not isinstance(data, dict) or set(data) != {"jobs", "models"}:
        raise ValueError("expected an object with exactly 'jobs' and 'models'")
    out = []
    for part in ("jobs", "models"):
        entries = data[part]
        if not isinstance(entries, dict) or not all(isinstance(k, str) and 0 < len(k) <= 512 for k in entries):
            raise ValueError(f"{part}: expected an object of names to utilisations")
        out.append({k: _check_util(v, f"{part}.{k}") for k, v in entries.items()})
    return out[0], out[1]


@dataclass(frozen=True)
class Known:
    baseline: float  # percent
    source: str  # job | model


class BaselineStore:
    def __init__(self, state_dir: SecureDir, clock: Callable[[], float], *, persist: bool = True):
        self.dir = state_dir
        self.persist = persist  # False (dry run): read, never written
        self.clock = clock
        loaded, note = state_dir.load_json(FILE, "learned GPU baselines", parse_baselines)
        self.jobs, self.models = loaded or ({}, {})
        self.notes = [note] if note else []
        self._saved_at: float | None = None
        self._failed: str | None = None

    def known(self, jobs: Mapping[str, JobMeta]) -> Mapping[str, Known]:
        """What is known of each of these jobs' baselines besides this run's learning."""
        out = {}
        for job_id, meta in jobs.items():
            if job_id in self.jobs:
                out[job_id] = Known(self.jobs[job_id], JOB)
            elif (key := model_key(meta)) in self.models:
                out[job_id] = Known(self.models[key], MODEL)
        return MappingProxyType(out)

    def update(self, baselines: Mapping[str, float], sources: Mapping[str, str], metas: Mapping[str, JobMeta],
               *, force: bool = False) -> None:
        """Take this tick's baselines of the GPU jobs running now; written to disk at most
        every SAVE_EVERY_S, or now with ``force`` (at stop). A model's history learns only
        from baselines learned on this host (not from ones it handed out itself)."""
        now = self.clock()
        if not force and self._saved_at is not None and now - self._saved_at < SAVE_EVERY_S:
            return
        jobs = {j: round(b, 3) for j, b in baselines.items() if sources.get(j) in (LEARNED, JOB) and 0 < b <= 100}
        models = dict(self.models)
        for job_id, baseline in jobs.items():
            key = model_key(metas[job_id]) if job_id in metas and sources.get(job_id) == LEARNED else None
            if key is not None:
                old = models.get(key)
                models[key] = round(baseline if old is None else old + MODEL_ALPHA * (baseline - old), 3)
        self._saved_at = now
        if jobs == self.jobs and models == self.models:
            return
        try:
            if self.persist:
                self.dir.write_json(FILE, {"jobs": jobs, "models": models})
        except StateWriteError as e:
            if self._failed != str(e):
                log.warning("baselines not saved (kept in memory, tried again in %.0fs): %s", SAVE_EVERY_S, e)
            self._failed = str(e)
            return
        self._failed = None
        self.jobs, self.models = jobs, models
