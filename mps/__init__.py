"""Managing NVIDIA's MPS control daemon, as a library (it imports nothing of noded's):
``control`` (start, health, stop of nvidia-cuda-mps-control), ``computemodes`` (EXCLUSIVE_PROCESS
and back), ``limits`` (clients per GPU), ``errors``, ``deadline`` (the one way a call into NVML,
which may hang, is bounded: the tick's samples and the calls that change a GPU), ``supervisor``
(keeping the daemon up from its own thread)."""
