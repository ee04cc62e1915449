"""CPU-side stand-ins for a training job's input pipeline, reporting samples/second.

Two shapes, the two CODA contrasts (its Sec. IV): ``decode`` streams through images
held in memory (decode to float, crop, flip, normalise: bandwidth-hungry, like the CV
models' loaders), ``tokenise`` cuts text held in memory into tokens, looks them up
and batches them (little bandwidth, scattered lookups and CPU work, like the NLP
models'). Run one with ``python -m bench.victims NAME``; it is an ordinary process,
so noded can discover it, and ``bench.scenario`` uses it as the GPU job of a node.
"""

from __future__ import annotations

from typing import Protocol


class Victim(Protocol):
    name: str

    def step(self) -> tuple[int, int]:
        """Make one batch; returns (samples made, bytes of memory read and written)."""
        ...


def make_victim(name: str, seed: int = 0) -> Victim:
    from .decode import DecodeAugment
    from .tokenise import TokeniseBatch

    kinds = {"decode": DecodeAugment, "tokenise": TokeniseBatch}
    if name not in kinds:
        raise ValueError(f"unknown victim {name!r}; one of {sorted(kinds)}")
    return kinds[name](seed=seed)


VICTIMS = ("decode", "tokenise")
