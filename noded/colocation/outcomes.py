"""What co-location actually gave: iteration times reported by jobs, the observed
speedup δ = Σ tᵢ / max t′ᵢ of each co-located group (thesis eq. 4.1), and the
records a model is fitted from (``nodectl model fit``), so decisions improve on
the host's own hardware.

A job reports its iteration time (seconds) now and then (``report_iteration``);
noded knows whether it ran alone on its GPU or beside others, and with whom.

Files in the state directory: ``colocation-records.jsonl`` (one record a line,
appended) and ``colocation-model.json`` (the fitted model). Their I/O is four small
functions at the end; what is read is checked (``parse_record``, ``parse_model``):
a model that is not exactly what ``fit`` writes, with finite coefficients, is
refused, and the caller decides with the ΣC rule instead.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any

import numpy as np

from noded.util.journal import words
from noded.util.ratelimit import RateLimitedLog
from noded.colocation import kernels

log = logging.getLogger(__name__)

RECORDS_FILE = "colocation-records.jsonl"
MODEL_FILE = "colocation-model.json"
#: Bounds on what is read back: a model is a few hundred bytes; records are a line per co-located group.
MAX_MODEL_BYTES = 64 * 1024
#: nesting a model file may have: what ``fit`` writes nests 2 deep; Python's parser
#: recurses once a level and gives up (RecursionError) near a thousand
MAX_MODEL_DEPTH = 8
MAX_RECORDS_BYTES = 64 * 1024 * 1024
#: Bounds on what reports keep (any local process of a job may report, as often as it
#: likes): the latest iteration times per job (alone) and per job and peers, whose median
#: a record uses, and the jobs and groups kept, those reported on longest ago dropped first.
MAX_TIMES = 256
MAX_KEYS = 4096


class ModelError(ValueError):
    """A model file that cannot be used: its path and what is wrong."""


@dataclass(frozen=True)
class CoRecord:
    """One observed co-location: its features and the speedup it gave."""

    jobs: tuple[str, ...]
    sum_c: float
    sum_m: float
    n_jobs: int
    sum_batch: float
    delta: float


def _finite(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


def parse_record(data: Any) -> CoRecord:
    """One line of the records file; raises ValueError naming what is wrong."""
    fields = {"jobs", "sum_c", "sum_m", "n_jobs", "sum_batch", "delta"}
    if not isinstance(data, dict) or set(data) != fields:
        raise ValueError(f"expected an object with exactly {sorted(fields)}")
    if not isinstance(data["jobs"], list) or not all(isinstance(j, str) for j in data["jobs"]):
        raise ValueError("jobs must be a list of job ids")
    if not all(_finite(data[k]) and data[k] >= 0 for k in ("sum_c", "sum_m", "sum_batch", "delta")):
        raise ValueError("sum_c, sum_m, sum_batch and delta must be finite numbers >= 0")
    if isinstance(data["n_jobs"], bool) or not isinstance(data["n_jobs"], int) or data["n_jobs"] < 2:
        raise ValueError("n_jobs must be an integer >= 2")
    return CoRecord(tuple(data["jobs"]), float(data["sum_c"]), float(data["sum_m"]), data["n_jobs"],
                    float(data["sum_batch"]), float(data["delta"]))


def parse_model(data: Any) -> dict:
    """The fitted model as ``fit`` writes it; raises ValueError naming what is wrong.
    Finite coefficients only: a NaN in the model would make every δ̂ NaN."""
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    for key in ("linear", "logistic"):
        coef = data.get(key)
        if not isinstance(coef, list) or len(coef) != kernels.N_FEATURES or not all(_finite(x) for x in coef):
            raise ValueError(f"{key} must be a list of {kernels.N_FEATURES} finite numbers, got {str(coef)[:120]}")
    if isinstance(data.get("records"), bool) or not isinstance(data.get("records"), int) or data["records"] < 1:
        raise ValueError("records must be a positive integer")
    threshold = data.get("threshold_c")
    if threshold is not None and not (_finite(threshold) and threshold > 0):
        raise ValueError(f"threshold_c must be a finite number > 0 or null, got {threshold!r}")
    return {**data, "linear": [float(x) for x in data["linear"]], "logistic": [float(x) for x in data["logistic"]]}


class Outcomes:
    def __init__(self, state_dir: str, min_samples: int = 3):
        self.records_path = os.path.join(state_dir, RECORDS_FILE)
        self.model_path = os.path.join(state_dir, MODEL_FILE)
        self.min_samples = min_samples
        self._solo: dict[str, list[float]] = {}
        self._shared: dict[tuple[str, frozenset[str]], list[float]] = {}
        self._recorded: set[frozenset[str]] = set()
        self._lock = threading.Lock()
        self._log = RateLimitedLog(log)
        os.makedirs(state_dir, mode=0o700, exist_ok=True)

    def report(self, job: str, seconds: float, peers: frozenset[str]) -> None:
        """An iteration time of ``job``, run alone (no peers) or beside ``peers``."""
        with self._lock:
            kept: dict = self._shared if peers else self._solo
            key = (job, peers) if peers else job
            times = kept.pop(key, [])  # put back last: the dict's order is the order of last report
            times.append(seconds)
            del times[:-MAX_TIMES]
            kept[key] = times
            while len(kept) > MAX_KEYS:
                del kept[next(iter(kept))]

    def observe(self, group: frozenset[str], features: dict[str, tuple[float, float, float]]) -> CoRecord | None:
        """Record a group's δ once every member has enough solo and shared times.

        ``features``: job -> (C, M, batch size) as admission used them.
        """
        with self._lock:
            if group in self._recorded or len(group) < 2:
                return None
            solo, shared = [], []
            for job in group:
                t = self._solo.get(job, [])
                t2 = self._shared.get((job, group - {job}), [])
                if len(t) < self.min_samples or len(t2) < self.min_samples or job not in features:
                    return None
                solo.append(median(t))
                shared.append(median(t2))
            rec = CoRecord(tuple(sorted(group)), sum(features[j][0] for j in group),
                           sum(features[j][1] for j in group), len(group),
                           sum(features[j][2] for j in group), sum(solo) / max(shared))
            try:
                _append_line(self.records_path, json.dumps(asdict(rec), allow_nan=False))
            except OSError as e:
                # at most a line per interval: every report of the group tries again
                self._log.log(logging.ERROR, "record", "%s: recording the co-location of %s failed (tried again "
                              "at the next report): %s", self.records_path, words(rec.jobs), e)
                return None
            self._recorded.add(group)
        return rec

    def records(self) -> list[CoRecord]:
        """The records on disk; a line that is not a record (a torn last line after a
        crash, an edit) is skipped with a warning naming it."""
        out = []
        for n, line in enumerate(_read_text(self.records_path, MAX_RECORDS_BYTES).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append(parse_record(json.loads(line, parse_constant=_refuse_constant)))
            except (ValueError, RecursionError) as e:  # a line nested too deep for the parser is not a record
                log.warning("%s: line %d skipped: %s", self.records_path, n, e)
        return out

    def fit(self, min_records: int = 5) -> dict:
        """Fit δ̂ (ridge linear) and P(δ > 1) (logistic) from the records; persist the model."""
        recs = self.records()
        if len(recs) < min_records:
            raise ValueError(f"only {len(recs)} co-location records; at least {min_records} are needed to fit")
        X = np.array([[1.0, r.sum_c, r.sum_m, r.n_jobs, r.sum_batch] for r in recs])
        y = np.array([r.delta for r in recs])
        linear = kernels.fit_linear(X, y, 1e-6)
        logistic = kernels.fit_logistic(X, (y > 1.0).astype(np.float64), 500, 0.5, 1e-4)
        if not (np.all(np.isfinite(linear)) and np.all(np.isfinite(logistic))):
            raise ValueError(f"fitting {len(recs)} records gave non-finite coefficients (the records do not vary "
                             "enough to fit); the model in force is unchanged")
        predicted = X @ linear
        # The ΣC at which the fitted model crosses δ = 1 for this host's typical other
        # features: the thesis's threshold, derived from the host's own data. For the
        # operator to read; the model itself decides (admission.decide).
        others = linear[0] + X[:, 2:].mean(axis=0) @ linear[2:]
        threshold = float((1.0 - others) / linear[1]) if linear[1] < 0 else None
        model = parse_model({"linear": linear.tolist(), "logistic": logistic.tolist(), "records": len(recs),
                             "mean_abs_error": float(np.mean(np.abs(predicted - y))),
                             "threshold_c": threshold if threshold is not None and 0 < threshold < math.inf
                             else None})
        _write_atomically(self.model_path, json.dumps(model, indent=1, sort_keys=True, allow_nan=False))
        return model

    def load_model(self) -> dict | None:
        """The saved model, None where none was fitted; raises ModelError (with the path
        and the problem) for a file that is not a usable model."""
        return read_model(self.model_path)


def read_model(path: str) -> dict | None:
    """The model in ``path``, None where there is no such file; raises ModelError (with
    the path and the problem) for a file that is not a usable model, whatever it holds
    (bounded in size and nesting: never a RecursionError)."""
    try:
        text = _read_text(path, MAX_MODEL_BYTES)
        if not text:
            return None
        depth = _nesting(text)
        if depth > MAX_MODEL_DEPTH:
            raise ValueError(f"nested {depth} deep; a model nests at most {MAX_MODEL_DEPTH}")
        return parse_model(json.loads(text, parse_constant=_refuse_constant))
    except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise ModelError(f"{path}: not a usable co-location model: {e}") from None


def _nesting(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings not
    counted), without parsing it."""
    brackets = re.sub(r'"(?:[^"\\]|\\.)*"', "", text)
    depth = deepest = 0
    for c in brackets:
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _refuse_constant(text: str) -> float:
    raise ValueError(f"{text} is not a finite number")


# -- the files (the only I/O here)

def _read_text(path: str, limit: int) -> str:
    """The file's text, "" when it does not exist; at most ``limit`` bytes (more is an error)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        return ""
    if len(data) > limit:
        raise ValueError(f"{path}: larger than {limit} bytes")
    return data.decode(errors="replace")


def _append_line(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def _write_atomically(path: str, text: str) -> None:
    """Write, fsync, rename over, fsync the directory: a crash leaves the old or the new file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
