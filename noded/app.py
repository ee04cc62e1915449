"""Putting a daemon together from a Config, and running it with its metrics server."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from resctrl import Resctrl, ResctrlError

from .actuators.cores import CoreHalving
from .actuators.mba import MbaThrottle
from .config import Config
from .daemon import Daemon
from .jobs import CgroupSource, JobDiscovery, JobMonitor, LabelFile
from .metrics import make_registry
from .samplers.bandwidth import BandwidthSampler
from .samplers.nvml import NvmlSampler
from .server.budget import METRICS
from .server.metrics_http import MetricsServer
from .state import OriginalValues
from .telemetry import Telemetry

log = logging.getLogger(__name__)


@dataclass
class Built:
    daemon: Daemon
    resctrl: Resctrl | None
    notes: list[str] = field(default_factory=list)


def build_daemon(config: Config, *, dry_run: bool = False, discovery: JobDiscovery | None = None,
                 clock: Callable[[], float] = time.monotonic) -> Built:
    notes: list[str] = []
    rc: Resctrl | None
    try:
        rc = Resctrl.open(config.resctrl.root, mounts=config.resctrl.mounts, prefix=config.resctrl.prefix)
    except (ResctrlError, OSError) as e:
        rc = None
        notes.append(f"resctrl unavailable ({e}): no bandwidth monitoring, no MBA; noded will not throttle")
    originals = OriginalValues(config.state_dir)
    cores = CoreHalving(originals, dry_run=dry_run)
    if not dry_run:
        restored = cores.restore_all()  # a crash left these changed
        if restored:
            notes.append(f"restored {len(restored)} values changed before a crash: {'; '.join(restored)}")
        if rc is not None:
            removed = rc.remove_orphans()
            if removed:
                notes.append(f"removed {len(removed)} resctrl groups left by an earlier run")
    if discovery is None:
        sources = [CgroupSource.create(s.kind, s.root, s.patterns or None) for s in config.jobs.sources]
        discovery = JobDiscovery(sources, labels=LabelFile(config.jobs.labels))
    monitor = JobMonitor(rc, clock=clock, retry_s=config.jobs.rmid_retry_s)
    bandwidth = None
    if rc is not None and rc.caps.mon is not None:
        bandwidth = BandwidthSampler(rc, monitor, clock=clock)
        monitor.on_removed = bandwidth.forget
        monitor.on_moved = bandwidth.forget
    nvml = NvmlSampler() if config.nvml else None
    telemetry = Telemetry(discovery, monitor, nvml, bandwidth, clock=clock,
                          process_events=config.jobs.process_events)
    method = config.contention.method
    throttle = None
    if method in ("auto", "mba") and rc is not None and rc.caps.mb is not None:
        throttle = MbaThrottle(rc, monitor, config.contention.mba_levels, config.peak_bytes_per_domain,
                               dry_run=dry_run)
    elif method == "mba":
        notes.append("contention.method is mba but this host has no MBA: nothing will be throttled")
    else:
        throttle = cores
    daemon = Daemon(config, telemetry, throttle, clock=clock,
                    extra_info={"throttle": throttle.kind if throttle else "none", "dry_run": str(dry_run).lower()})
    if config.colocation.enabled:
        from .colocation.setup import build_colocation  # numba and MPS are loaded only where co-location is on

        daemon.colocation = build_colocation(config, clock)
    for n in notes:
        log.warning(n)
    return Built(daemon, rc, notes)


def serve_metrics(daemon: Daemon, address: str, port: int):
    """Start the metrics endpoint (bounded: see noded.server.stream); returns (server, url).
    The server's ``shutdown()`` (or ``stop()``) closes it. A port in use or an address
    that is not this host's raises noded.server.stream.ListenError with a message to print."""
    server = MetricsServer(make_registry(daemon), address, port, METRICS).start()
    return server, server.url
