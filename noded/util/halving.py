"""Core halving's arithmetic, shared by everyone who halves a job's CPUs (contention on hosts
without MBA, the CPU plan, a bandwidth cap below MBA's lowest value): level L keeps the lowest
``len >> L`` CPUs, never fewer than one."""

from __future__ import annotations

from typing import Iterable, Sequence


def kept_cpus(original: Sequence[int], level: int) -> list[int]:
    """The CPUs a job keeps at a contention level: halved per level, never below one."""
    cpus = sorted(original)
    return cpus[: max(1, len(cpus) >> level)]


def max_level(ncpus: int) -> int:
    return max(0, ncpus.bit_length() - 1)  # halvings until one CPU is left


def halvings(original: Iterable[int]) -> list[frozenset[int]]:
    """Every set core halving can leave of ``original`` (levels 1 and up)."""
    cpus = sorted(original)
    return [frozenset(kept_cpus(cpus, lvl)) for lvl in range(1, max_level(len(cpus)) + 1)]
