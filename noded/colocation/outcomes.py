"""What co-location actually gave: iteration times reported by jobs, the observed
speedup δ = Σ tᵢ / max t′ᵢ of each co-located group (thesis eq. 4.1), and the
records a model is fitted from (``nodectl model fit``), so decisions improve on
the host's own hardware.

A job reports its iteration time (seconds) now and then (``report_iteration``);
noded knows whether it ran alone on its GPU or beside others, and with whom.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from statistics import median

import numpy as np

from ..state import read_json_object, write_json_atomically
from . import kernels


@dataclass(frozen=True)
class CoRecord:
    """One observed co-location: its features and the speedup it gave."""

    jobs: tuple[str, ...]
    sum_c: float
    sum_m: float
    n_jobs: int
    sum_batch: float
    delta: float


class Outcomes:
    def __init__(self, state_dir: str, min_samples: int = 3):
        self.records_path = os.path.join(state_dir, "colocation-records.jsonl")
        self.model_path = os.path.join(state_dir, "colocation-model.json")
        self.min_samples = min_samples
        self._solo: dict[str, list[float]] = {}
        self._shared: dict[tuple[str, frozenset[str]], list[float]] = {}
        self._recorded: set[frozenset[str]] = set()
        self._lock = threading.Lock()
        os.makedirs(state_dir, mode=0o700, exist_ok=True)

    def report(self, job: str, seconds: float, peers: frozenset[str]) -> None:
        """An iteration time of ``job``, run alone (no peers) or beside ``peers``."""
        with self._lock:
            if peers:
                self._shared.setdefault((job, peers), []).append(seconds)
            else:
                self._solo.setdefault(job, []).append(seconds)

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
            self._recorded.add(group)
            with open(self.records_path, "a") as f:
                f.write(json.dumps(asdict(rec)) + "\n")
        return rec

    def records(self) -> list[CoRecord]:
        try:
            with open(self.records_path) as f:
                return [CoRecord(**{**json.loads(line), "jobs": tuple(json.loads(line)["jobs"])})
                        for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def fit(self, min_records: int = 5) -> dict:
        """Fit δ̂ (ridge linear) and P(δ > 1) (logistic) from the records; persist the model."""
        recs = self.records()
        if len(recs) < min_records:
            raise ValueError(f"only {len(recs)} co-location records; at least {min_records} are needed to fit")
        X = np.array([[1.0, r.sum_c, r.sum_m, r.n_jobs, r.sum_batch] for r in recs])
        y = np.array([r.delta for r in recs])
        linear = kernels.fit_linear(X, y, 1e-6)
        logistic = kernels.fit_logistic(X, (y > 1.0).astype(np.float64), 500, 0.5, 1e-4)
        predicted = X @ linear
        # The ΣC at which the fitted model crosses δ = 1 for this host's typical other
        # features: the thesis's threshold, derived from the host's own data.
        others = linear[0] + X[:, 2:].mean(axis=0) @ linear[2:]
        threshold = float((1.0 - others) / linear[1]) if linear[1] < 0 else None
        model = {"linear": linear.tolist(), "logistic": logistic.tolist(), "records": len(recs),
                 "mean_abs_error": float(np.mean(np.abs(predicted - y))),
                 "threshold_c": threshold if threshold is not None and threshold > 0 else None}
        write_json_atomically(self.model_path, model)
        return model

    def load_model(self) -> dict | None:
        model = read_json_object(self.model_path, "a fitted co-location model")
        return model or None
