"""Plain-Python twins of the numba kernels: slow, obvious, and the tests' oracle."""

from __future__ import annotations

import math


def predict_speedup(coef, sum_c, sum_m, n_jobs, sum_batch):
    x = [1.0, sum_c, sum_m, n_jobs, sum_batch]
    return sum(a * b for a, b in zip(coef, x))


PLACED, NOT_REACHED, NO_FREE_SLOT, OVER_THRESHOLD, SLOWDOWN, NOT_FINITE = range(6)


def place(job_c, job_m, job_batch, gpu_c, gpu_m, gpu_n, gpu_batch, max_per_gpu, threshold_c, coef):
    assign, delta, _why, _where = place_explained(job_c, job_m, job_batch, gpu_c, gpu_m, gpu_n, gpu_batch,
                                                  max_per_gpu, threshold_c, coef)
    return assign, delta


def place_explained(job_c, job_m, job_batch, gpu_c, gpu_m, gpu_n, gpu_batch, max_per_gpu, threshold_c, coef):
    m = len(job_c)
    assign, delta, why, where = [-1] * m, [math.nan] * m, [NOT_REACHED] * m, [-1] * m
    unfitted = all(math.isnan(x) for x in coef)
    fitted = all(math.isfinite(x) for x in coef)
    inputs = list(job_c) + list(job_m) + list(job_batch) + list(gpu_c) + list(gpu_m) + list(gpu_batch)
    if not (fitted or unfitted) or not all(math.isfinite(x) for x in inputs) or not (fitted or math.isfinite(threshold_c)):
        return assign, delta, [NOT_FINITE] * m, where
    c, mm, cnt, bs = list(gpu_c), list(gpu_m), list(gpu_n), list(gpu_batch)
    for j in sorted(range(m), key=lambda j: (job_c[j], j)):
        room = [g for g in range(len(c)) if cnt[g] < max_per_gpu]
        if not room:
            why[j] = NO_FREE_SLOT
            break
        best = min(room, key=lambda g: (c[g], g))
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


def _solve(A, b):
    """Gaussian elimination with partial pivoting."""
    n = len(A)
    M = [row[:] + [b[i]] for i, row in enumerate(A)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(M[r][col]))
        M[col], M[piv] = M[piv], M[col]
        for r in range(col + 1, n):
            f = M[r][col] / M[col][col]
            for k in range(col, n + 1):
                M[r][k] -= f * M[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (M[r][n] - sum(M[r][k] * x[k] for k in range(r + 1, n))) / M[r][r]
    return x


def fit_linear(X, y, l2):
    p = len(X[0])
    A = [[sum(row[i] * row[j] for row in X) for j in range(p)] for i in range(p)]
    for i in range(1, p):
        A[i][i] += l2
    b = [sum(row[i] * yi for row, yi in zip(X, y)) for i in range(p)]
    return _solve(A, b)


def fit_logistic(X, y, iterations, learning_rate, l2):
    n, p = len(X), len(X[0])
    mean = [0.0] + [sum(r[j] for r in X) / n for j in range(1, p)]
    std = [1.0] + [math.sqrt(sum((r[j] - mean[j]) ** 2 for r in X) / n) or 1.0 for j in range(1, p)]
    Z = [[1.0] + [(r[j] - mean[j]) / std[j] for j in range(1, p)] for r in X]
    w = [0.0] * p
    for _ in range(iterations):
        grad = [0.0] * p
        for zr, yi in zip(Z, y):
            e = 1.0 / (1.0 + math.exp(-sum(a * b for a, b in zip(zr, w)))) - yi
            for j in range(p):
                grad[j] += e * zr[j]
        w = [w[j] - learning_rate * (grad[j] / n + (l2 * w[j] if j > 0 else 0.0)) for j in range(p)]
    raw = [w[0] - sum(w[j] * mean[j] / std[j] for j in range(1, p))] + [w[j] / std[j] for j in range(1, p)]
    return raw
