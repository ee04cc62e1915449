"""How many MPS clients a GPU takes: 48 from Volta on, 16 before (NVIDIA's MPS documentation)."""

from __future__ import annotations


def max_clients_per_device(compute_major: int) -> int:
    """MPS client limit per device: 48 from Volta (7.x) on, 16 before."""
    return 48 if compute_major >= 7 else 16


def client_limit(uuids: list[str]) -> int:
    """The MPS client limit that binds on these GPUs: the lowest of theirs."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return min(max_clients_per_device(pynvml.nvmlDeviceGetCudaComputeCapability(
            pynvml.nvmlDeviceGetHandleByUUID(u))[0]) for u in uuids)
    finally:
        pynvml.nvmlShutdown()
