"""The stand-in libnvidia-ml.so.1 loaded in the test's own process, as a host loads the real
one, over simulated GPUs published in shared memory: for the tests of the NVML sampler
(tests/unit/test_nvml_sampler.py, and tests/system/test_nvml_deadline.py for the one that
paces real time). The fixture over these is conftest's ``nvml_node``."""

from __future__ import annotations

import ctypes

import pynvml

from nodesim import gpus as simgpus
from nodesim.nvml_lib import library_path
from nodesim.nvml_shm import ENV, GpuState, NodeState, SharedGpus

T0 = 1_700_000_000.0  # the wall clock the samples are stamped by


class Clock:
    def __init__(self, t=T0):
        self.t = t

    def __call__(self):
        return self.t


def uuid(i):
    return f"GPU-5e3a000{i}-6f1c-4b2e-9d7a-c0ffee00000{i}"


def published_gpus(path: str, monkeypatch, count: int = 3):
    """``count`` simulated GPUs published at ``path``, the stand-in library loaded for them
    (a generator for a fixture: everything undone after its yield)."""
    shared = SharedGpus(path)
    monkeypatch.setenv(ENV, shared.path)
    shared.state = NodeState([GpuState(uuid(i)) for i in range(count)])
    shared.publish(shared.state)
    load("current")
    yield shared
    shutdown_all()
    simgpus.install(None)
    shared.close()


def load(variant):
    shutdown_all()
    simgpus.install(ctypes.CDLL(library_path(variant)))  # as pynvml's own loader would


def shutdown_all():
    """Every init of the stand-in library in this process undone, whoever made it (another
    test in this worker may have left one, through a handle pynvml no longer holds): the
    next init reads this test's shared memory, not the one the library still has open."""
    libs = [pynvml.nvmlLib] + [ctypes.CDLL(library_path(variant)) for variant in ("current", "no_v3")]
    for lib in libs:
        while lib is not None and lib.nvmlShutdown() == 0:
            pass
