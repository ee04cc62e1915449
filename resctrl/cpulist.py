"""CPU lists as the kernel writes them ("0-3,8,10-11") and CPU masks ("ff,00000001")."""

from __future__ import annotations


def format_cpu_list(cpus) -> str:
    ranges: list[list[int]] = []
    for c in sorted(set(cpus)):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def parse_cpu_list(text: str) -> set[int]:
    """Parse "0-3,8"; raises ValueError naming the bad part."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return cpus
    for part in text.split(","):
        a, sep, b = part.partition("-")
        try:
            lo, hi = int(a), int(b) if sep else int(a)
        except ValueError:
            raise ValueError(f"bad CPU list part {part!r} in {text!r}") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"bad CPU range {part!r} in {text!r}")
        cpus.update(range(lo, hi + 1))
    return cpus


def parse_cpu_mask(text: str) -> set[int]:
    value = int(text.strip().replace(",", ""), 16) if text.strip() else 0
    return {i for i in range(value.bit_length()) if value >> i & 1}
