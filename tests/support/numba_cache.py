"""numba's cache warmed once per test run, before the tests that need it.

noded's kernels are compiled with ``cache=True``: a daemon loads them from numba's cache
(here the source tree's ``__pycache__``, as no ``NUMBA_CACHE_DIR`` is set) or compiles
them, 15 s of a core idle and 45 s on a loaded machine, and writes them there. On a cold
cache (a fresh clone) every process that needs them before the first has written them
compiles them too: the daemons of the system tests, the workers' own kernel tests. So the
run's first process starts one compile of every kernel at once, holding a lock for its
length; a test that may need the kernels waits for the lock (at once when they are
cached), and then loads them. Nothing of noded changes: its processes find the same cache
they would have filled themselves."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile

#: where the run's first process tells its workers (and their processes) the lock's path
LOCK_ENV = "NODED_TESTS_NUMBA_WARM_LOCK"

#: noded's modules of numba kernels, each compiled by ``WARM_UP``
KERNEL_MODULES = ("noded.colocation.kernels", "noded.rightsize.split_kernels")

WARM_UP = """
import numpy as np
from noded.colocation import kernels
from noded.rightsize import split_kernels
kernels.warm_up()
split_kernels.best_split(np.zeros((1, 2, 2)), 1, 1)
"""


def start_warming(repo: str) -> subprocess.Popen | None:
    """In the run's first process: every kernel compiled into the cache by a process of
    its own, which holds the lock (an exclusive ``flock``, taken here before it starts, so
    no test can pass before it) until it exits. None where a parent run already did."""
    if os.environ.get(LOCK_ENV):
        return None
    fd, path = tempfile.mkstemp(prefix="noded-tests-numba-", suffix=".lock")
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.environ[LOCK_ENV] = path
    try:
        # the lock is the open file's: the child's copy of fd holds it after this process closes its own
        return subprocess.Popen([sys.executable, "-c", WARM_UP], cwd=repo, pass_fds=(fd,),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        os.close(fd)


def wait_until_warm() -> None:
    """Returns once the run's compile has ended (at once when none runs, or it ended)."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # the run that made it has removed it: its compile is long over
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def finish(warming: subprocess.Popen | None) -> None:
    """At the end of the run's first process: its compile ended (a short run needs no
    kernel, and numba writes each one whole: a compile cut short leaves none half
    written), its lock file gone."""
    if warming is None:
        return
    if warming.poll() is None:
        warming.kill()
    warming.wait()
    path = os.environ.pop(LOCK_ENV, None)
    if path:
        os.unlink(path)
