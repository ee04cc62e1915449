"""Core halving's arithmetic, shared by everyone who halves a job's CPUs (contention on hosts
without MBA, the CPU plan, a bandwidth cap below MBA's lowest value): level L keeps the lowest
``len >> L`` CPUs, never fewer than one."""

from __future__ import annotations

from typing import Sequence


def kept_cpus(original: Sequence[int], level: int) -> list[int]:
    """The CPUs a job keeps at a contention level: halved per level, never below one."""
    cpus = sorted(original)
    return cpus[: max(1, len(cpus) >> level)]


def max_level(ncpus: int) -> int:
    return max(0, ncpus.bit_length() - 1)  # halvings until one CPU is left
