"""Managing NVIDIA's MPS control daemon, as a library (it imports nothing of noded's):
``control`` (start, health, stop of nvidia-cuda-mps-control), ``computemodes`` (EXCLUSIVE_PROCESS
and back), ``limits`` (clients per GPU), ``errors`` (and the bounded NVML call), ``supervisor``
(keeping the daemon up from its own thread)."""
