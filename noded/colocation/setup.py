"""Building the co-location service from a Config: its rule, profiles, outcomes and
the MPS control daemon it supervises, with the defaults every MPS server gets.

``build_colocation`` is a transaction: it returns the service started, or raises
with nothing left running. The caller owns what it returns and closes it
(``Colocation.close``, safe at any point and twice) when a later start step fails
and at shutdown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from mps.computemodes import ComputeModes, Recorder

from mps.control import MpsControl, MpsDefaults

from mps.deadline import call_within
from mps.errors import MpsError

from mps.limits import max_clients_per_device
from mps.supervisor import MpsSupervisor

from noded.config import Config
from noded.colocation.admission import ColocationRule, pinned_mem_limit
from noded.colocation.outcomes import Outcomes
from noded.colocation.profiles import load_profiles
from noded.colocation.service import Colocation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedGpu:
    uuid: str
    memory_total: int  # bytes
    compute_major: int


def served_gpus(uuids: list[str]) -> list[ServedGpu]:
    """What MPS will serve, from NVML: the GPUs named (all of them where none are), in
    that order."""
    import pynvml

    pynvml.nvmlInit()
    try:
        if not uuids:
            uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                     for i in range(pynvml.nvmlDeviceGetCount())]
        out = []
        for uuid in uuids:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            out.append(ServedGpu(uuid, int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                                 pynvml.nvmlDeviceGetCudaComputeCapability(handle)[0]))
        return out
    finally:
        pynvml.nvmlShutdown()


def mps_defaults(gpus: list[ServedGpu], max_jobs_per_gpu: int) -> MpsDefaults:
    """The defaults noded wants on every MPS server: each client's pinned device memory
    capped at an equal share, memory / max_jobs_per_gpu, on every device served.

    Why: admission exports the same cap in each admitted job's environment, but a
    client that ignores it (started by hand, or its environment lost) could take a
    GPU's memory and make every later admission there fail with out-of-memory; the
    server-wide default holds for every client. It is the admission's number, so
    the two never disagree. The active thread percentage is left at MPS's default
    (100): admission sets each client's own share, and a client can only lower it.

    Device ordinals are positions in CUDA_VISIBLE_DEVICES, which the daemon is given
    in this order (see ``build_colocation``).
    """
    return MpsDefaults(pinned_mem_limits={i: pinned_mem_limit(g.memory_total, max_jobs_per_gpu)
                                          for i, g in enumerate(gpus) if g.memory_total})


def build_colocation(config: Config, clock: Callable[[], float], originals: Recorder | None = None) -> Colocation:
    """The co-location service, started (MPS starts in its supervisor's thread)."""
    cc = config.colocation
    profiles = load_profiles(cc.profiles) if cc.profiles else {}
    import pynvml

    try:
        # a driver that hangs must not hold noded's start (the unit's start timeout is 60 s)
        gpus = call_within(cc.mps.nvml_timeout_s, "listing the GPUs MPS would serve",
                           lambda _cancelled: served_gpus(list(cc.mps.gpus)))
    except pynvml.NVMLError as e:
        raise MpsError(f"co-location needs NVML to list the GPUs MPS would serve: {e}") from None
    max_jobs = cc.max_jobs_per_gpu
    limit = min((max_clients_per_device(g.compute_major) for g in gpus), default=max_jobs)
    if max_jobs > limit:
        log.warning("colocation.max_jobs_per_gpu %d exceeds MPS's %d clients per device on these GPUs; using %d",
                    max_jobs, limit, limit)
        max_jobs = limit
    uuids = [g.uuid for g in gpus]
    modes = ComputeModes(uuids, originals) if cc.mps.exclusive_process else None
    # CUDA_VISIBLE_DEVICES always lists the served GPUs, so the daemon's device
    # ordinals are NVML's order (CUDA's own default order is fastest first).
    # MPS's deadlines run on the monotonic clock whatever ``clock`` is: a process that
    # hangs is waited for in real seconds.
    control = MpsControl(cc.mps.control, config.mps_pipe_dir, cc.mps.log_dir, gpus=uuids or None,
                         compute_modes=modes, defaults=mps_defaults(gpus, max_jobs),
                         nvml_timeout=cc.mps.nvml_timeout_s, recorder=originals)
    service = Colocation(ColocationRule(cc.threshold_c, max_jobs, multi_user=cc.mps.multi_user), profiles,
                         mps=MpsSupervisor(control), clock=clock, outcomes=Outcomes(config.state_dir))
    try:
        return service.start()
    except BaseException:
        service.close()
        raise
