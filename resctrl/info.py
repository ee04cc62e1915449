"""Platform capabilities, read once from ``info/`` into a frozen struct."""

from __future__ import annotations

import os
from dataclasses import dataclass

from resctrl.errors import NotMountedError, ResctrlError
from resctrl.schemata import MB, MbFlavour, MbLimits, parse_schemata

AMD_MB_MAX = 2048
PERCENT_MB_MAX = 100


@dataclass(frozen=True)
class CacheInfo:
    name: str  # L3, L3CODE, L3DATA, L2…
    num_closids: int
    cbm_mask: int
    min_cbm_bits: int


@dataclass(frozen=True)
class MbInfo:
    num_closids: int
    limits: MbLimits
    delay_linear: bool
    thread_throttle_mode: str | None  # "max", "per-thread", or None where absent (AMD)


@dataclass(frozen=True)
class MonInfo:
    num_rmids: int
    features: tuple[str, ...]
    max_threshold_occupancy: int | None


@dataclass(frozen=True)
class Capabilities:
    caches: tuple[CacheInfo, ...]
    mb: MbInfo | None
    mon: MonInfo | None
    domains: tuple[int, ...]  # L3 cache ids at the time of reading; may have gaps
    cdp: bool
    mba_mbps: bool

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.caches) + ((MB,) if self.mb else ())

    @property
    def alloc_capable(self) -> bool:
        return bool(self.caches or self.mb)

    @property
    def max_ctrl_groups(self) -> int:
        """CTRL_MON groups that can exist besides the root."""
        counts = [c.num_closids for c in self.caches] + ([self.mb.num_closids] if self.mb else [])
        return min(counts) - 1 if counts else 0

    @property
    def max_groups(self) -> int:
        """CTRL_MON plus MON groups besides the root, as RMIDs allow."""
        return self.mon.num_rmids - 1 if self.mon else 0


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _read_int(path: str) -> int:
    return int(_read(path), 0)


def read_capabilities(root: str, *, mba_mbps: bool, mb_flavour: MbFlavour | None = None) -> Capabilities:
    """Read ``info/`` under ``root``.

    ``mba_mbps`` comes from the mount options (``Mount.mba_mbps``). The MB flavour
    is inferred unless given: MBps under mba_MBps; AMD when ``thread_throttle_mode``
    is absent and the granularity is 1 (AMD's absolute units); Intel percent otherwise.
    """
    info = os.path.join(root, "info")
    try:
        names = sorted(os.listdir(info))
    except FileNotFoundError:
        raise NotMountedError("listdir", info, status="no resctrl info/ directory: not mounted?") from None
    try:
        caches = []
        for name in names:
            if name.startswith(("L2", "L3")) and not name.endswith("_MON"):
                d = os.path.join(info, name)
                caches.append(CacheInfo(name, _read_int(f"{d}/num_closids"), int(_read(f"{d}/cbm_mask"), 16),
                                        _read_int(f"{d}/min_cbm_bits")))
        mb = None
        if "MB" in names:
            d = os.path.join(info, "MB")
            ttm_path = f"{d}/thread_throttle_mode"
            ttm = _read(ttm_path) if os.path.exists(ttm_path) else None
            min_bw, gran = _read_int(f"{d}/min_bandwidth"), _read_int(f"{d}/bandwidth_gran")
            flavour = mb_flavour or (
                MbFlavour.MBPS if mba_mbps else MbFlavour.AMD_UNITS if ttm is None and gran == 1 else MbFlavour.PERCENT
            )
            max_bw = {MbFlavour.PERCENT: PERCENT_MB_MAX, MbFlavour.AMD_UNITS: AMD_MB_MAX,
                      MbFlavour.MBPS: 0xFFFFFFFF}[flavour]
            mb = MbInfo(_read_int(f"{d}/num_closids"), MbLimits(flavour, min_bw, gran, max_bw),
                        _read(f"{d}/delay_linear") == "1", ttm)
        mon = None
        if "L3_MON" in names:
            d = os.path.join(info, "L3_MON")
            mto = f"{d}/max_threshold_occupancy"
            mon = MonInfo(_read_int(f"{d}/num_rmids"), tuple(_read(f"{d}/mon_features").split()),
                          _read_int(mto) if os.path.exists(mto) else None)
        domains = read_domains(root, mon is not None)
    except OSError as e:
        raise ResctrlError("read", e.filename or info, e.errno) from None
    cdp = any(c.name.endswith(("CODE", "DATA")) for c in caches)
    return Capabilities(tuple(caches), mb, mon, domains, cdp, mba_mbps)


def read_domains(root: str, has_mon: bool) -> tuple[int, ...]:
    """L3 domain ids now online: from ``mon_data/`` where monitoring exists, else the schemata."""
    if has_mon:
        ids = [int(n[len("mon_L3_"):]) for n in os.listdir(os.path.join(root, "mon_data")) if n.startswith("mon_L3_")]
        return tuple(sorted(ids))
    with open(os.path.join(root, "schemata")) as f:
        schemata = parse_schemata(f.read())
    first = next(iter(schemata.values()), {})
    return tuple(sorted(first))
