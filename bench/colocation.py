"""Co-location kernels: placement of 64 pending jobs on 8 GPUs and model fitting on
10⁵ records, numba against numpy and pure Python in the same run; and the kernels'
cold (empty JIT cache) and warm (cached) first-call times in a fresh process.

    python -m bench.colocation [--records 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile

import numpy as np

from bench.timing import first_call_s, median_time
from noded.colocation import kernels, reference

NAN = np.full(kernels.N_FEATURES, np.nan)


def place_numpy(job_c, job_m, job_batch, gpu_c, gpu_m, gpu_n, gpu_batch, max_per_gpu, threshold, coef):
    """Algorithm 2 with numpy doing the per-step work (the loop itself is sequential)."""
    c, mm, cnt, bs = gpu_c.copy(), gpu_m.copy(), gpu_n.copy(), gpu_batch.copy()
    assign = np.full(len(job_c), -1)
    x = np.ones(kernels.N_FEATURES)
    fitted = not np.isnan(coef[0])
    for j in np.argsort(job_c, kind="mergesort"):
        room = np.where(cnt < max_per_gpu, c, np.inf)
        g = int(np.argmin(room))
        if not np.isfinite(room[g]):
            break
        if cnt[g] > 0:
            if c[g] + job_c[j] > threshold:
                break
            if fitted:
                x[1:] = (c[g] + job_c[j], mm[g] + job_m[j], cnt[g] + 1, bs[g] + job_batch[j])
                if float(coef @ x) < 1.0:
                    break
        assign[j] = g
        c[g] += job_c[j]
        mm[g] += job_m[j]
        cnt[g] += 1
        bs[g] += job_batch[j]
    return assign


def fit_linear_numpy(X, y, l2):
    A = X.T @ X + l2 * np.diag([0.0] + [1.0] * (X.shape[1] - 1))
    return np.linalg.solve(A, X.T @ y)


def fit_logistic_numpy(X, y, iterations, lr, l2):
    mean, std = X.mean(0), X.std(0)
    mean[0], std[0] = 0.0, 1.0
    std[std == 0] = 1.0
    Z = (X - mean) / std
    w = np.zeros(X.shape[1])
    reg = np.array([0.0] + [l2] * (X.shape[1] - 1))
    for _ in range(iterations):
        w -= lr * (Z.T @ (1 / (1 + np.exp(-(Z @ w))) - y) / len(y) + reg * w)
    raw = w / std
    raw[0] = w[0] - np.sum(w[1:] * mean[1:] / std[1:])
    return raw




COLD = ("import time; t0 = time.perf_counter(); import numpy as np; from noded.colocation import kernels; "
        "kernels.place(np.ones(4), np.ones(4), np.ones(4), np.zeros(2), np.zeros(2), np.zeros(2, dtype=np.int64), "
        "np.zeros(2), 3, 60.0, np.full(5, np.nan)); kernels.fit_linear(np.ones((8, 5)), np.ones(8), 1e-3); "
        "kernels.fit_logistic(np.ones((8, 5)), np.ones(8), 2, 0.1, 0.0); print(time.perf_counter() - t0)")




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--python-records", type=int, default=10_000, help="pure Python is timed on fewer, scaled up")
    ap.add_argument("--json", default="bench/out/colocation.json")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    m, n = 64, 8
    place_args = (rng.uniform(5, 40, m), rng.uniform(5, 40, m), rng.choice([32.0, 64.0, 128.0], m),
                  np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n), 3, 1e9,
                  np.array([2.0, -0.01, -0.005, -0.05, -0.001]))
    kernels.place(*place_args)  # compile (or load from cache) outside the timing
    ref_args = [a.tolist() if isinstance(a, np.ndarray) else a for a in place_args]
    assert kernels.place(*place_args)[0].tolist() == reference.place(*ref_args)[0]
    assert kernels.place(*place_args)[0].tolist() == place_numpy(*place_args).tolist()
    rows = {"place 64 jobs x 8 GPUs": {
        "numba": median_time(lambda: kernels.place(*place_args), 200),
        "numpy": median_time(lambda: place_numpy(*place_args), 50),
        "python": median_time(lambda: reference.place(*ref_args), 50)}}
    N = args.records
    X = np.column_stack([np.ones(N), rng.uniform(0, 120, N), rng.uniform(0, 80, N), rng.integers(2, 4, N),
                         rng.choice([64.0, 128.0, 256.0], N)])
    y = 2.2 - 0.02 * X[:, 1] + rng.normal(scale=0.05, size=N)
    labels = (y > 1).astype(np.float64)
    kernels.fit_linear(X[:10], y[:10], 1e-6)
    kernels.fit_logistic(X[:10], labels[:10], 2, 0.5, 1e-4)
    k = args.python_records
    Xl, yl, ll = X[:k].tolist(), y[:k].tolist(), labels[:k].tolist()
    scale = N / k
    rows[f"fit linear, {N:.0e} records"] = {
        "numba": median_time(lambda: kernels.fit_linear(X, y, 1e-6), 5),
        "numpy": median_time(lambda: fit_linear_numpy(X, y, 1e-6), 5),
        "python": median_time(lambda: reference.fit_linear(Xl, yl, 1e-6), 1) * scale}
    iters = 50
    rows[f"fit logistic, {N:.0e} records x {iters} steps"] = {
        "numba": median_time(lambda: kernels.fit_logistic(X, labels, iters, 0.5, 1e-4), 3),
        "numpy": median_time(lambda: fit_logistic_numpy(X, labels, iters, 0.5, 1e-4), 3),
        "python": median_time(lambda: reference.fit_logistic(Xl, ll, iters, 0.5, 1e-4), 1) * scale}
    np.testing.assert_allclose(kernels.fit_logistic(X, labels, iters, 0.5, 1e-4),
                               fit_logistic_numpy(X, labels, iters, 0.5, 1e-4), rtol=1e-6, atol=1e-9)
    with tempfile.TemporaryDirectory() as cache:
        cold = first_call_s(COLD, cache)
        warm = statistics.median(first_call_s(COLD, cache) for _ in range(3))
    print(f"co-location kernels (median; pure Python timed on {k} records and scaled to {N})")
    print(f"  {'task':<38} {'numba ms':>10} {'numpy ms':>10} {'python ms':>11} {'numpy/numba':>12} {'python/numba':>13}")
    for task, r in rows.items():
        print(f"  {task:<38} {r['numba'] * 1e3:10.3f} {r['numpy'] * 1e3:10.3f} {r['python'] * 1e3:11.1f} "
              f"{r['numpy'] / r['numba']:12.1f} {r['python'] / r['numba']:13.0f}")
    print(f"  first call in a fresh process: cold (empty JIT cache) {cold:.2f} s, warm (cached) {warm:.2f} s, "
          f"ratio {cold / warm:.1f}x")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "colocation", "seconds": rows, "first_call_s": {"cold": cold, "warm": warm},
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
