"""The host's L3 topology, read from sysfs, for an emulator that matches the machine.

The kernel names each L3 domain by its cache id (``cpuN/cache/index3/id``) and gives it
the CPUs that share that cache. A tool such as pqos reads the same sysfs (and CPUID) to
learn the domains it will find in ``schemata`` and ``mon_data``; an emulator that
answers with other domains makes it print garbage. ``read_host_topology`` gives the
domains and their CPUs as the kernel would see them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from resctrl.cpulist import parse_cpu_list

SYSFS_CPU = "/sys/devices/system/cpu"


@dataclass(frozen=True)
class HostTopology:
    domains: dict[int, frozenset[int]]  # L3 cache id -> online CPUs sharing it
    l3_bytes: int | None  # one L3's size, where sysfs says

    @property
    def cpus(self) -> frozenset[int]:
        return frozenset().union(*self.domains.values())


class TopologyError(ValueError):
    """sysfs does not describe the host's L3 caches (or describes them inconsistently)."""


def has_l3_ids(sysfs_cpu: str = SYSFS_CPU) -> bool:
    """Whether sysfs names an L3 cache id for any CPU (the kernel resctrl uses as domain id)."""
    try:
        entries = os.listdir(sysfs_cpu)
    except OSError:
        return False
    return any(re.fullmatch(r"cpu\d+", e) and _l3_index(os.path.join(sysfs_cpu, e)) for e in entries)


def read_host_topology(sysfs_cpu: str = SYSFS_CPU) -> HostTopology:
    """Domains (L3 ids) and their online CPUs, as ``cpuN/cache/indexM`` (level 3) tell."""
    online = _read_online(sysfs_cpu)
    domains: dict[int, set[int]] = {}
    sizes: set[int] = set()
    for cpu in sorted(online):
        index = _l3_index(os.path.join(sysfs_cpu, f"cpu{cpu}"))
        if index is None:
            raise TopologyError(f"{sysfs_cpu}/cpu{cpu}/cache: no level 3 cache with an id")
        domains.setdefault(int(_read(os.path.join(index, "id"))), set()).add(cpu)
        size = _parse_size(_read_or_none(os.path.join(index, "size")))
        if size is not None:
            sizes.add(size)
    if not domains:
        raise TopologyError(f"{sysfs_cpu}: no online CPU")
    return HostTopology({d: frozenset(c) for d, c in sorted(domains.items())},
                        sizes.pop() if len(sizes) == 1 else None)


def _read_online(sysfs_cpu: str) -> set[int]:
    text = _read_or_none(os.path.join(sysfs_cpu, "online"))
    if text is not None:
        try:
            return set(parse_cpu_list(text.strip()))
        except ValueError:
            raise TopologyError(f"{sysfs_cpu}/online: not a CPU list: {text.strip()!r}") from None
    # No 'online' file (an unusual sysfs): every cpuN directory counts.
    try:
        entries = os.listdir(sysfs_cpu)
    except OSError as e:
        raise TopologyError(f"{sysfs_cpu}: {e.strerror}") from None
    return {int(e[3:]) for e in entries if re.fullmatch(r"cpu\d+", e)}


def _l3_index(cpu_dir: str) -> str | None:
    """The cache/indexM directory of the CPU's L3 (unified or data) that has an id."""
    cache = os.path.join(cpu_dir, "cache")
    try:
        names = sorted(e for e in os.listdir(cache) if re.fullmatch(r"index\d+", e))
    except OSError:
        return None
    for name in names:
        index = os.path.join(cache, name)
        if _read_or_none(os.path.join(index, "level")) == "3\n" and os.path.exists(os.path.join(index, "id")):
            return index
    return None


def _parse_size(text: str | None) -> int | None:
    # sysfs prints cache sizes as "32768K"
    m = re.fullmatch(r"(\d+)([KMG]?)\n?", text or "")
    if not m:
        return None
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise TopologyError(f"{path}: {e.strerror}") from None
    if not text.strip().isdigit():
        raise TopologyError(f"{path}: not a number: {text.strip()!r}")
    return text


def _read_or_none(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None
