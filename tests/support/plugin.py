"""The suite's hooks and the fixtures that bench's tests share with it, as one pytest
plugin: tests/conftest.py and bench/tests/conftest.py both name it (``pytest_plugins``),
so it is loaded once, whichever of the two folders a run collects. Its hooks see every
item of the run: numba's cache warmed once before the tests that may compile its kernels,
the test modules' rewritten bytecode written once before the workers collect, and the FUSE tests skipped with a reason where this machine has no FUSE."""

import os
import shutil
import types

import pytest
from hypothesis import HealthCheck, settings

from nodesim.resctrl_emulator import MountedEmulator
from resctrl import Resctrl
from support import bytecode
from support import numba_cache
from support.ordering import builds_first
from support.paths import REPO_ROOT

FUSE_MISSING = None
if not os.path.exists("/dev/fuse"):
    FUSE_MISSING = "/dev/fuse is absent on this machine"
elif shutil.which("fusermount3") is None:
    FUSE_MISSING = "fusermount3 (Debian package fuse3) is not installed"


# No deadline on any example: a deadline measures the machine's load, not the code, and
# the suite must pass beside other work (tests/README.md). Hypothesis's default of 200 ms
# failed a system test whose example wrote files and restarted a store (294 ms once, 25
# ms when replayed) beside a loaded run. A test that means a time bound asserts it. For
# the same reason, drawing examples slowly is no failure.
settings.register_profile("noded", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("noded")


#: the tiers whose tests start noded (or its co-location) in processes of their own
_STARTS_PROCESSES = tuple(os.path.join(REPO_ROOT, *tier) + os.sep
                          for tier in (("tests", "system"), ("tests", "integration"), ("bench", "tests", "system")))


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the run's first process (a worker's comes from it)
        config._numba_warming = numba_cache.start_warming(REPO_ROOT)
        # then the test modules rewritten once, beside that compile, before the workers start
        bytecode.collect_once_for_workers(config)


def pytest_unconfigure(config):
    numba_cache.finish(getattr(config, "_numba_warming", None))


def _may_compile_kernels(item) -> bool:
    """The test starts processes that may (a daemon with co-location or right-sizing), or
    calls the kernels itself (its module holds theirs). Not one whose noded runs from an
    install of its own (marker own_install): its kernels are cached there, never here; a
    fresh clone's package and wheel builds start at once, beside the compile."""
    if item.get_closest_marker("own_install"):
        return False
    if str(item.path).startswith(_STARTS_PROCESSES):
        return True
    module = getattr(item, "module", None)
    return module is not None and any(isinstance(v, types.ModuleType) and v.__name__ in numba_cache.KERNEL_MODULES
                                      for v in vars(module).values())


def pytest_runtest_setup(item):
    # a cold cache is compiled once, by the run's first process, not by each daemon and
    # worker at the same time
    if _may_compile_kernels(item):
        numba_cache.wait_until_warm()


def pytest_collection_modifyitems(config, items):
    builds_first(items)
    if FUSE_MISSING is None:
        return
    skip = pytest.mark.skip(reason=f"needs FUSE: {FUSE_MISSING}")
    for item in items:
        if "fuse" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def emulator(tmp_path):
    """Factory: emulator(profile, *extra_args) -> a mounted MountedEmulator, unmounted after the test."""
    started = []

    def start(profile="intel", *extra_args):
        emu = MountedEmulator(profile, workdir=str(tmp_path / f"emu{len(started)}"), extra_args=list(extra_args))
        started.append(emu)
        return emu.start()

    yield start
    for emu in started:
        emu.stop()


@pytest.fixture
def open_resctrl():
    def _open(emu, **kw):
        return Resctrl.open(emu.root, mounts=emu.mounts_file, **kw)

    return _open
