"""The test modules' bytecode written once per run, before the workers collect.

pytest rewrites each test module's asserts as it imports it and caches the result beside
it (``__pycache__/<module>.<tag>-pytest-<version>.pyc``); a fresh clone has none. `make
test`'s workers (pytest-xdist, four) each collect the whole run at the same moment, so on a
fresh clone each rewrote and compiled every module itself: 10.7 core-seconds for one
collection alone, 3.7 once cached, 36-43 core-seconds for the four at once on this 2-core
VM, where one collection first and four cached ones take 29. So the run's first process,
where its workers would find most modules without their cached rewrite, collects the run
once itself (a ``pytest --collect-only`` of the same paths, in a process of its own:
nothing of this one is imported or changed) and then starts the workers, which find every
module cached. Beside it the run's numba
compile (support.numba_cache) keeps the second core busy. The collection fills
hypothesis's cache of the constants in the checkout's modules too (``.hypothesis/constants``,
which its pytest plugin reads at each collection: 1.2 core-seconds a process when absent).
A fresh clone's four collections, rewrites and constants: 45.8 core-seconds; 29.7 with this.

A run whose modules are mostly cached (a rerun, a few files edited) is not collected
first: each worker rewrites the few itself, cheaper than a collection more. Where Python
writes no bytecode (``PYTHONDONTWRITEBYTECODE``) nothing is cached and nothing is done."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: set for the collecting process: it collects, and starts no collection of its own
PRIMING_ENV = "NODED_TESTS_PRIMING"


def rewritten_pyc(module: str) -> str:
    """Where pytest caches ``module``'s rewrite (its assertion rewriter's own naming)."""
    directory, name = os.path.split(module)
    tag = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}"
    return os.path.join(directory, "__pycache__", f"{name[:-3]}.{tag}.pyc")


def test_modules(paths: list[str]) -> list[str]:
    """The ``test_*.py`` files and ``conftest.py`` files at or below ``paths`` (a run's
    arguments: folders, files, ``file::test`` ids)."""
    found = []
    for path in paths:
        path = path.split("::", 1)[0]
        if os.path.isfile(path) and path.endswith(".py"):
            found.append(path)
        for top, dirs, files in os.walk(path) if os.path.isdir(path) else ():
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules")]
            found += [os.path.join(top, f) for f in files
                      if f.endswith(".py") and (f.startswith("test_") or f == "conftest.py")]
    return found


def stale(modules: list[str]) -> list[str]:
    """Those of ``modules`` without a cached rewrite as new as their source."""
    def current(module: str) -> bool:
        try:
            return os.stat(rewritten_pyc(module)).st_mtime >= os.stat(module).st_mtime
        except FileNotFoundError:
            return False

    return [m for m in modules if not current(m)]


def collect_once_for_workers(config) -> bool:
    """In the run's first process, before its workers start: the run's paths collected
    once (so every module's rewrite is cached) where there are two workers or more and at
    least half the modules have no cached rewrite. Whether it collected."""
    workers = getattr(config.option, "numprocesses", None) or 0
    if getattr(config.option, "collectonly", False):
        return False  # xdist starts no worker for a collection alone
    if workers < 2 or sys.dont_write_bytecode or os.environ.get(PRIMING_ENV):
        return False
    paths = [str(config.invocation_params.dir / arg.split("::", 1)[0]) for arg in config.args]
    modules = test_modules(paths)
    if not modules or len(stale(modules)) * 2 < len(modules):
        return False
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
            "--rootdir", str(config.rootpath)]
    if config.inipath is not None:
        argv += ["-c", str(config.inipath)]
    # what it finds wrong, the workers' own collection reports: its output and status are
    # not this run's (a failed collection here leaves the workers to compile, as before)
    subprocess.run(argv + paths, cwd=config.invocation_params.dir, env={**os.environ, PRIMING_ENV: "1"},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return True
