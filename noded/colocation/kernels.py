"""numba kernels for co-location decisions, over plain numpy arrays.

Each kernel has a plain-Python twin in ``reference.py`` that tests use as the
oracle on random inputs. ``cache=True`` writes the compiled code to numba's cache
(``NUMBA_CACHE_DIR``; the systemd unit points it into the state directory), so a
host pays the JIT cost once, not at every daemon start.

Features of a candidate co-location (one GPU's jobs after admitting one more):
``[1, ΣC, ΣM, n_jobs, Σbatch]``, with C and M time-normalised (%, see profiles).
"""

from __future__ import annotations

import numba
import numpy as np

N_FEATURES = 5


@numba.njit(cache=True)
def features(sum_c: float, sum_m: float, n_jobs: float, sum_batch: float) -> np.ndarray:
    out = np.empty(N_FEATURES)
    out[0] = 1.0
    out[1] = sum_c
    out[2] = sum_m
    out[3] = n_jobs
    out[4] = sum_batch
    return out


@numba.njit(cache=True)
def predict_speedup(coef: np.ndarray, sum_c: float, sum_m: float, n_jobs: float, sum_batch: float) -> float:
    """δ̂ from the linear model (NaN when no model is fitted: coef all NaN)."""
    x = features(sum_c, sum_m, n_jobs, sum_batch)
    s = 0.0
    for i in range(N_FEATURES):
        s += coef[i] * x[i]
    return s


#: Why ``place_explained`` left a job where it did (one code per job).
PLACED = 0
NOT_REACHED = 1  # an earlier job stopped the packing (Algorithm 2 stops at the first refusal)
NO_FREE_SLOT = 2  # every GPU already holds max_per_gpu jobs
OVER_THRESHOLD = 3  # no model fitted, and ΣC on the GPU would exceed the threshold
SLOWDOWN = 4  # the fitted model predicts δ̂ < 1 on the GPU
NOT_FINITE = 5  # an input is NaN or infinite: nothing is placed


@numba.njit(cache=True)
def _all_finite(a) -> bool:
    for x in a.ravel():
        if not np.isfinite(x):
            return False
    return True


@numba.njit(cache=True)
def place(job_c, job_m, job_batch, gpu_c, gpu_m, gpu_n, gpu_batch, max_per_gpu, threshold_c, coef):
    """``place_explained`` without the why: (gpu index per job, -1 for not placed;
    predicted δ̂ per job, NaN where no model is fitted or the job runs alone)."""
    assign, delta, _why, _where = place_explained(job_c, job_m, job_batch, gpu_c, gpu_m, gpu_n, gpu_batch,
                                                  max_per_gpu, threshold_c, coef)
    return assign, delta


@numba.njit(cache=True)
def place_explained(job_c, job_m, job_batch, gpu_c, gpu_m, gpu_n, gpu_batch, max_per_gpu, threshold_c, coef):
    """The thesis's Algorithm 2: take pending jobs by ascending C, put each on the GPU
    with the lowest ΣC among those with a free slot; stop at the first job that
    cannot go there. What stops it: with a fitted model (``coef`` finite), a
    predicted slowdown δ̂ < 1, as the thesis uses its regression; without one
    (``coef`` all NaN), ΣC over ``threshold_c``. A job alone on its GPU always fits.

    Returns (gpu index per job or -1; δ̂ per job where the model was asked, else
    NaN; why per job (PLACED, NOT_REACHED, ...); the GPU index the reason is about,
    or -1). Any non-finite input, or a model only partly finite, places nothing
    (NOT_FINITE): a NaN compares false with every threshold and would pass them all.
    """
    m = job_c.shape[0]
    n = gpu_c.shape[0]
    assign = np.full(m, -1, dtype=np.int64)
    delta = np.full(m, np.nan)
    why = np.full(m, NOT_REACHED, dtype=np.int64)
    where = np.full(m, -1, dtype=np.int64)
    n_nan = 0
    for x in coef:
        if np.isnan(x):
            n_nan += 1
    unfitted = n_nan == coef.shape[0]  # no model: every coefficient NaN
    fitted = _all_finite(coef)
    if not (fitted or unfitted) or not (_all_finite(job_c) and _all_finite(job_m) and _all_finite(job_batch)
                                        and _all_finite(gpu_c) and _all_finite(gpu_m) and _all_finite(gpu_batch)
                                        and (fitted or np.isfinite(threshold_c))):
        why[:] = NOT_FINITE
        return assign, delta, why, where
    c = gpu_c.copy()
    mm = gpu_m.copy()
    cnt = gpu_n.copy()
    bs = gpu_batch.copy()
    order = np.argsort(job_c, kind="mergesort")
    for k in range(m):
        j = order[k]
        best = -1
        for g in range(n):
            if cnt[g] < max_per_gpu and (best < 0 or c[g] < c[best]):
                best = g
        if best < 0:
            why[j] = NO_FREE_SLOT
            break
        where[j] = best
        if cnt[best] > 0:
            sc = c[best] + job_c[j]
            if fitted:
                d = predict_speedup(coef, sc, mm[best] + job_m[j], cnt[best] + 1.0, bs[best] + job_batch[j])
                delta[j] = d
                if not d >= 1.0:
                    why[j] = SLOWDOWN
                    break
            elif sc > threshold_c:
                why[j] = OVER_THRESHOLD
                break
        why[j] = PLACED
        assign[j] = best
        c[best] += job_c[j]
        mm[best] += job_m[j]
        cnt[best] += 1
        bs[best] += job_batch[j]
    return assign, delta, why, where


@numba.njit(cache=True)
def _solve(A, b):
    """Gaussian elimination with partial pivoting (numba's np.linalg would need SciPy's
    LAPACK, a heavy dependency for a 5x5 system)."""
    n = A.shape[0]
    M = np.empty((n, n + 1))
    M[:, :n] = A
    M[:, n] = b
    for col in range(n):
        piv = col
        for r in range(col + 1, n):
            if abs(M[r, col]) > abs(M[piv, col]):
                piv = r
        if piv != col:
            for k in range(n + 1):
                M[col, k], M[piv, k] = M[piv, k], M[col, k]
        for r in range(col + 1, n):
            f = M[r, col] / M[col, col]
            for k in range(col, n + 1):
                M[r, k] -= f * M[col, k]
    x = np.zeros(n)
    for r in range(n - 1, -1, -1):
        s = M[r, n]
        for k in range(r + 1, n):
            s -= M[r, k] * x[k]
        x[r] = s / M[r, r]
    return x


@numba.njit(cache=True)
def fit_linear(X, y, l2):
    """Ridge least squares: (XᵀX + l2·I)⁻¹ Xᵀy (the intercept column is not penalised)."""
    n, p = X.shape
    A = np.zeros((p, p))
    b = np.zeros(p)
    for r in range(n):
        for i in range(p):
            b[i] += X[r, i] * y[r]
            for j in range(p):
                A[i, j] += X[r, i] * X[r, j]
    for i in range(1, p):
        A[i, i] += l2
    return _solve(A, b)


@numba.njit(cache=True)
def fit_logistic(X, y, iterations, learning_rate, l2):
    """Logistic regression by batch gradient descent on standardised columns
    (column 0 is the intercept); returns weights for the raw features."""
    n, p = X.shape
    mean = np.zeros(p)
    std = np.ones(p)
    for j in range(1, p):
        mean[j] = X[:, j].mean()
        s = X[:, j].std()
        std[j] = s if s > 0 else 1.0
    Z = (X - mean) / std
    for i in range(n):
        Z[i, 0] = 1.0
    w = np.zeros(p)
    for _ in range(iterations):
        grad = np.zeros(p)
        for i in range(n):
            z = 0.0
            for j in range(p):
                z += Z[i, j] * w[j]
            e = 1.0 / (1.0 + np.exp(-z)) - y[i]
            for j in range(p):
                grad[j] += e * Z[i, j]
        for j in range(p):
            w[j] -= learning_rate * (grad[j] / n + (l2 * w[j] if j > 0 else 0.0))
    # Back to raw features: z = w0 + Σ w_j (x_j - mean_j) / std_j
    raw = np.empty(p)
    raw[0] = w[0]
    for j in range(1, p):
        raw[j] = w[j] / std[j]
        raw[0] -= w[j] * mean[j] / std[j]
    return raw


@numba.njit(cache=True)
def predict_admit(weights, X):
    """Probability that each row's co-location speeds things up (logistic model)."""
    n = X.shape[0]
    out = np.empty(n)
    for i in range(n):
        z = 0.0
        for j in range(X.shape[1]):
            z += X[i, j] * weights[j]
        out[i] = 1.0 / (1.0 + np.exp(-z))
    return out


def warm_up() -> None:
    """Compile (or load from the JIT cache) every kernel, at daemon start rather than
    at the first admission: each at the types its callers pass (a kernel loaded from the
    cache brings none of the kernels it calls with it: ``place_explained``, the one an
    admission calls, is warmed itself, not only through ``place``)."""
    one = np.ones(2)
    for coef in (np.full(N_FEATURES, np.nan), np.ones(N_FEATURES)):
        for kernel in (place, place_explained):
            kernel(one, one, one, np.zeros(1), np.zeros(1), np.zeros(1, dtype=np.int64), np.zeros(1), 3, 60.0, coef)
    X = np.ones((4, N_FEATURES))
    fit_linear(X, np.ones(4), 1e-3)
    predict_admit(fit_logistic(X, np.ones(4), 1, 0.1, 0.0), X)
