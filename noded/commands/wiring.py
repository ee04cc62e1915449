"""Putting a daemon together from a Config, and running it with its metrics server."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

from resctrl import Resctrl

from mps.computemodes import COMPUTE_MODE, ComputeModes

from mps.deadline import call_within
from mps.errors import NvmlTimeout

from noded.actuators.cores import CoreHalving
from noded.actuators.mba import MbaThrottle
from noded.actuators.memsoft import MemorySoftLimits
from noded.policy.baselines import BaselineStore
from noded.config import DEFAULT_PEAK_GBPS, Config
from noded.loop.daemon import Daemon
from noded.loop.overrides import OverrideStore
from noded.loop.parts import Notifier, Parts
from noded.admin.server import ReportBudget
from noded.capping.service import CapService
from noded.jobs import CgroupSource, JobDiscovery, LabelFile, RegisteredLabels
from noded.samplers.mongroups import JobMonitor
from noded.loop.metrics import make_registry
from noded.samplers.cpus import CpuPlacementSampler
from noded.samplers.memcgroups import MemoryCgroupSampler
from noded.samplers.nvml import NvmlSampler
from noded.samplers.resctrl import ResctrlSession
from noded.server.budget import METRICS
from noded.server.metrics_http import MetricsServer
from noded.stores.calibration import calibration_path, read_calibration
from noded.stores.securedir import DirectoryMissing, SecureDir
from noded.stores.originals import OriginalValues
from noded.samplers.telemetry import Telemetry

log = logging.getLogger(__name__)


@dataclass
class Built:
    daemon: Daemon
    resctrl: Resctrl | None
    state: SecureDir  # the state directory, checked and open
    notes: list[str] = field(default_factory=list)
    # what was found corrupt in the overrides and moved aside: `noded run` prints it after its first lines
    operator_notes: list[str] = field(default_factory=list)


def open_state(path: str, dry_run: bool) -> SecureDir:
    """The state directory; a dry run creates nothing, so where it does not exist yet
    it reads an empty one (a temporary directory, removed at exit)."""
    if not dry_run:
        return SecureDir(path, mode=0o700)
    try:
        return SecureDir(path, create=False)
    except DirectoryMissing:
        scratch = tempfile.mkdtemp(prefix="noded-dry-run-")
        atexit.register(shutil.rmtree, scratch, True)
        log.warning("dry run: %s does not exist; reading an empty state directory instead", path)
        return SecureDir(scratch, create=False)


def build_daemon(config: Config, *, dry_run: bool = False, discovery: JobDiscovery | None = None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 reloader: Callable[[], Config | None] | None = None, notifier: Notifier | None = None) -> Built:
    """The daemon for ``config``, built whole (noded.loop.parts), with what a crash left
    behind put right first (unless ``dry_run``). The caller holds the host lock
    (noded.stores.lockfile.HostLock). ``wall_clock``: the overrides' expiry (they outlive a
    restart); ``reloader`` reads the config again on SIGHUP; ``notifier`` hears of reloads."""
    notes: list[str] = []
    session, rc = _resctrl(config, notes)
    state = open_state(config.state_dir, dry_run)
    originals = OriginalValues(state)
    baselines = BaselineStore(state, clock, persist=not dry_run)
    notes += originals.notes + baselines.notes
    cores = CoreHalving(originals, dry_run=dry_run)
    notes += cores.owner.notes  # cpus_written.json found corrupt and moved aside
    memory = MemorySoftLimits(originals, dry_run=dry_run)
    notes += memory.notes
    if not dry_run:
        notes += _put_back_what_a_crash_left(config, originals, cores, memory, rc)
    if discovery is None:
        discovery = _job_discovery(config, state, dry_run, notes)
    monitor = JobMonitor(session, clock=clock, retry_s=config.jobs.rmid_retry_s)
    # The tick waits for NVML at most half a tick (a hung driver must not stop it)
    nvml = NvmlSampler(deadline_s=max(0.1, config.tick_s / 2)) if config.nvml else None
    throttle = _throttle(config, session, rc, cores, dry_run, notes)
    rightsize = config.rightsize.enabled
    caps = isinstance(throttle, MbaThrottle)  # bandwidth caps are held through MBA's groups
    # where each job's CPUs are: what halving cores, right-sizing and a cap's fewer cores read
    # (observe, don't believe)
    sizing = _rightsize_parts(config, state, cores, memory, clock, dry_run, notes) if rightsize else {}
    sized_memory = sizing.get("memory")
    cap_service = CapService(lambda: throttle.session.rc, throttle.cap_name, dry_run=throttle.dry_run,
                             places=lambda: throttle.cap_places) if caps else None
    telemetry = Telemetry(discovery, session, monitor, nvml, clock=clock, process_events=config.jobs.process_events,
                          exec_events_per_uid=config.jobs.exec_events_per_uid,
                          cpus=_placement_sampler(throttle is cores or rightsize, cap_service, cores,
                                                  config.jobs.max_polled_per_source),
                          memory=MemoryCgroupSampler() if sized_memory is not None else None,
                          memory_jobs=sizing["rightsize"].gpu_jobs if sized_memory is not None else lambda s: ())
    if caps and not rightsize:
        sizing["cpu_owner"] = cores.owner  # the one writer of every job's CPUs: a cap's fewer cores too
    overrides = OverrideStore(state, wall_clock, persist=not dry_run)
    notes_for_operators = list(overrides.notes)  # printed where `noded run` prints them, after its first lines
    # Co-location last: it starts MPS, which nothing stops until the Daemon exists and the
    # caller has registered its shutdown; whatever fails after it closes it (MPS stopped,
    # compute modes put back) before the error goes on.
    colocation = _colocation(config, clock, originals, dry_run, notes)
    try:
        # the controllers that are on follow from these parts (Parts.tick_controllers); a new
        # controller is a file of its package, registered here in controllers=(...)
        parts = Parts(
            telemetry=telemetry, throttle=throttle, baselines=baselines,
            caps=cap_service,
            colocation=colocation, overrides=overrides,
            # the labels job managers' hooks register: admin state, as the overrides are
            registered_labels=telemetry.discovery.registered_labels,
            state_probe=None if dry_run else originals.probe,
            state_failed_writes=None if dry_run else (lambda: state.failed_writes),
            reloader=reloader, notifier=notifier,
            # the report socket listens where a tenant's reports are read: co-location or right-sizing
            report_budget=ReportBudget(config.admin.reports_per_uid, config.admin.reports_per_job)
            if colocation is not None or sizing else None,
            **sizing)
        daemon = Daemon(config, parts, clock=clock,
                        extra_info={"throttle": throttle.kind if throttle else "none", "dry_run": str(dry_run).lower()})
    except BaseException:
        if colocation is not None:
            colocation.close()
        raise
    for n in notes:
        log.warning(n)
    return Built(daemon, rc, state, notes, notes_for_operators)


def _resctrl(config: Config, notes: list[str]) -> tuple[ResctrlSession, Resctrl | None]:
    """The resctrl session, and its mount as found now (None: not mounted, said in ``notes``)."""
    session = ResctrlSession(config.resctrl.root, mounts=config.resctrl.mounts, prefix=config.resctrl.prefix)
    rc = session.refresh()
    if rc is None:
        notes.append(f"resctrl unavailable ({session.unavailable}): no bandwidth monitoring, no MBA until it is "
                     "mounted (noded looks every tick)")
    return session, rc


def _colocation(config: Config, clock: Callable[[], float], originals: OriginalValues, dry_run: bool,
                notes: list[str]):
    """Co-location's parts where it is on; a dry run never starts MPS (said in ``notes``)."""
    if not config.colocation.enabled:
        return None
    if dry_run:
        notes.append("dry run: co-location is not started (it would start MPS and change GPUs' compute modes)")
        return None
    from noded.colocation.setup import build_colocation  # numba and MPS are loaded only where co-location is on

    return build_colocation(config, clock, originals)


def _put_back_what_a_crash_left(config: Config, originals: OriginalValues, cores: CoreHalving,
                                memory: MemorySoftLimits, rc: Resctrl | None) -> list[str]:
    """Every value an earlier run recorded and did not put back (it crashed, or was killed)
    put back before this one changes anything; resctrl groups it left removed. Its notes."""
    notes: list[str] = []
    restored = cores.restore_all()
    put_back, not_put_back = memory.restore_recorded()  # whether or not memory is sized now: an earlier run's
    restored += put_back
    if not_put_back:
        notes.append(f"could not restore {len(not_put_back)} soft memory limits changed before a crash (kept "
                     f"recorded, tried again at stop): {'; '.join(not_put_back)}")
    if any(key.startswith(COMPUTE_MODE) for key, _ in originals.items()):
        try:  # a driver that hangs must not hold the start
            restored += call_within(config.colocation.mps.nvml_timeout_s,
                                    "putting back the compute modes an earlier run recorded",
                                    lambda cancelled: ComputeModes.restore_recorded(originals, cancelled))
        except NvmlTimeout as e:
            notes.append(f"{e}: their records are kept, for the stop or the next start to put them back")
    if restored:
        notes.append(f"restored {len(restored)} values changed before a crash: {'; '.join(restored)}")
    if rc is not None:
        removed = rc.remove_orphans()
        if removed:
            notes.append(f"removed {len(removed)} resctrl groups left by an earlier run")
    return notes


def _job_discovery(config: Config, state: SecureDir, dry_run: bool, notes: list[str]) -> JobDiscovery:
    """Discovery over the config's job sources, with the labels job managers' hooks registered."""
    sources = [CgroupSource.create(s.kind, s.root, s.patterns or None) for s in config.jobs.sources]
    registered = RegisteredLabels(state=state, persist=not dry_run)
    notes += registered.notes
    return JobDiscovery(sources, labels=LabelFile(config.jobs.labels), registered_labels=registered,
                        max_polled=config.jobs.max_polled_per_source)


def _throttle(config: Config, session: ResctrlSession, rc: Resctrl | None, cores: CoreHalving, dry_run: bool,
              notes: list[str]) -> MbaThrottle | CoreHalving | None:
    """What throttles CPU jobs here: MBA where the config allows it and the host has it,
    else halving cores; none where the config asks for MBA on a host without it (said)."""
    method = config.contention.method
    if method in ("auto", "mba") and rc is not None and rc.caps.mb is not None:
        return MbaThrottle(session, config.contention.mba_levels, config.peak_bytes_per_domain, dry_run=dry_run)
    if method == "mba":
        notes.append("contention.method is mba but this host has no MBA: nothing will be throttled")
        return None
    return cores


def _placement_sampler(every_job: bool, caps: CapService | None, cores: CoreHalving,
                       most: int) -> CpuPlacementSampler | None:
    """Where each job's CPUs are, for whatever may change them: every job's where cores are
    halved or right-sized; where only caps do, the capped jobs' and those the owner recorded.
    ``most``: cgroups read per job's tree at most (the bound discovery reads a job's with)."""
    if every_job:
        return CpuPlacementSampler(most=most)
    if caps is None:
        return None
    return CpuPlacementSampler(wanted=lambda jobs: caps.placements_wanted(jobs, (k for k, _ in cores.owner.originals.items())),
                               most=most)


def _rightsize_parts(config: Config, state: SecureDir, cores: CoreHalving, memory: MemorySoftLimits,
                     clock: Callable[[], float], dry_run: bool, notes: list[str]) -> dict:
    """Right-sizing's parts: the sizer (its history and operators' sizes kept in the state
    directory), the one writer of every job's CPUs (whatever throttles bandwidth), and the
    writer of memory soft limits where memory is sized."""
    from noded.rightsize.controls import SizeControls
    from noded.rightsize.history import SizingHistory
    from noded.rightsize.service import RightSizing

    history = SizingHistory(state, persist=not dry_run)
    notes += history.notes
    controls = SizeControls(state, persist=not dry_run)
    notes += controls.notes
    return {"rightsize": RightSizing(config.rightsize, history, clock=clock, controls=controls),
            "cpu_owner": cores.owner,
            "memory": memory if config.rightsize.memory.cache_gb is not None else None}


def serve_metrics(daemon: Daemon, address: str, port: int):
    """Start the metrics endpoint (bounded: see noded.server.stream); returns (server, url).
    The server's ``shutdown()`` (or ``stop()``) closes it. A port in use or an address
    that is not this host's raises noded.server.stream.ListenError with a message to print."""
    server = MetricsServer(make_registry(daemon), address, port, METRICS, health=daemon.liveness).start()
    return server, server.url


def with_node_peak(config: Config) -> tuple[Config, str]:
    """The config with its node peak settled, and where that peak came from."""
    if config.peak_gbps_per_domain is not None:
        return config, "from the config"
    cal = read_calibration(config.state_dir)
    if cal is None:
        return (dataclasses.replace(config, peak_gbps_per_domain=DEFAULT_PEAK_GBPS),
                f"a default: no peak_gbps_per_domain in the config and no {calibration_path(config.state_dir)}; "
                f"run `noded calibrate`")
    return (dataclasses.replace(config, peak_gbps_per_domain=cal.peak_gbps_per_domain),
            f"measured {cal.measured_at} by `{cal.command}`, {calibration_path(config.state_dir)}")
