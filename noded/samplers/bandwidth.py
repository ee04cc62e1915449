"""Memory bandwidth from resctrl MBM: the node's per domain and each job's.

The node's bandwidth is the sum over every control group (the root and each
CTRL_MON group, ours or not), since a task counts in exactly one. Descriptors are
kept open between ticks (``MbmReader``); a reading that is missing makes that
rate None, never zero, so policy can tell "quiet" from "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass

from resctrl import BandwidthMeter, Resctrl
from resctrl.info import read_domains
from resctrl.mbm import MBM_TOTAL, MbmReader

from ..jobs.monitoring import JobMonitor


@dataclass(frozen=True)
class BandwidthSample:
    domains: tuple[int, ...]
    node_bps: dict[int, float | None]  # per domain
    job_bps: dict[str, dict[int, float | None]]  # job id -> domain -> bytes/s
    missing: tuple[str, ...]  # what could not be measured, in words


class BandwidthSampler:
    name = "resctrl"

    def __init__(self, rc: Resctrl, monitor: JobMonitor, reader: MbmReader | None = None):
        self.rc = rc
        self.monitor = monitor
        self.reader = reader or MbmReader(events=(MBM_TOTAL,))
        self._meters: dict[str, BandwidthMeter] = {}

    def forget(self, path: str) -> None:
        self.reader.forget(path)
        self._meters.pop(path, None)

    def _rates(self, path: str, domains: tuple[int, ...], now: float) -> dict[int, float | None]:
        meter = self._meters.setdefault(path, BandwidthMeter(MBM_TOTAL))
        rates = meter.update(self.reader.read(path, domains), now)
        return {d: rates.get(d) for d in domains}

    def sample(self, now: float) -> BandwidthSample:
        domains = read_domains(self.rc.root, True)
        missing: list[str] = []
        ctrl_paths = [self.rc.root] + [g.path for g in self.rc.list_ctrl_groups()]
        node: dict[int, float | None] = {d: 0.0 for d in domains}
        for path in ctrl_paths:
            for d, r in self._rates(path, domains, now).items():
                node[d] = None if r is None or node[d] is None else node[d] + r
        for d, r in node.items():
            if r is None:
                missing.append(f"node bandwidth on L3 domain {d}")
        jobs = {job_id: self._rates(g.path, domains, now) for job_id, g in self.monitor.groups().items()}
        live = set(ctrl_paths) | {g.path for g in self.monitor.groups().values()}
        for path in [p for p in self._meters if p not in live]:
            self.forget(path)
        return BandwidthSample(domains, node, jobs, tuple(missing))
