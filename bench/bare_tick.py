"""What a tick must at least do, with no noded around it: the baseline of bench.daemon_cost.

Once per --tick: open, read and close (os.open, os.pread, os.close) every MBM counter
(``mon_data/*/mbm_total_bytes``) of every monitoring group under the resctrl mount (the
root's, each control group's, and each ``mon_groups/*``), the same for ``/proc/PID/stat``
of every process in the jobs' cgroups, and make the pynvml calls noded's NVML sampler
makes per GPU. The files, the PIDs and the NVML handle are found once at the start,
before it prints ``ready N files, M pids, G gpus``; it stops when its stdin closes (or
on SIGTERM), and says ``done ticks=N mbm=S proc=S nvml=S``: the CPU seconds (its
thread's) each part took over all its ticks. Its parent measures its CPU time from
/proc. Run with the simulated node's LD_LIBRARY_PATH and NODED_SIM_NVML.

    python -m bench.bare_tick --resctrl ROOT --cgroup DIR [--tick 1.0]
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import sys
import threading
import time

import pynvml


def mbm_files(root: str) -> list[str]:
    groups = [root]
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name not in ("info", "mon_groups", "mon_data") and os.path.isdir(os.path.join(path, "mon_groups")):
            groups.append(path)  # a control group
    groups += [g for parent in list(groups) for g in sorted(glob.glob(os.path.join(parent, "mon_groups", "*")))]
    return [f for g in groups for f in sorted(glob.glob(os.path.join(g, "mon_data", "*", "mbm_total_bytes")))]


def job_pids(cgroup: str) -> list[int]:
    pids = []
    for procs in sorted(glob.glob(os.path.join(cgroup, "*", "cgroup.procs"))):
        with open(procs) as f:
            pids += [int(p) for p in f.read().split()]
    return pids


def read_file(path: str, size: int) -> None:
    """The cheapest whole read Python has: open, one pread, close (no buffered file object,
    whose extra fstat/ioctl/read are each a FUSE request on the emulator)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # a group or a process gone: the tick goes on, as noded's does
        return
    try:
        os.pread(fd, size, 0)
    except OSError:  # "Unavailable" (EIO)
        pass
    finally:
        os.close(fd)


def read_mbm(paths: list[str]) -> None:
    for p in paths:
        read_file(p, 64)


def read_stats(pids: list[int]) -> None:
    for pid in pids:
        read_file(f"/proc/{pid}/stat", 1024)


def nvml_calls(last_seen: dict[int, int]) -> None:
    """noded's per-tick calls (noded/samplers/nvml.py): the count, then per GPU the handle,
    UUID, name, utilisation, memory, compute mode, compute and MPS processes, and the
    per-process utilisation since the newest sample seen."""
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        pynvml.nvmlDeviceGetUUID(h)
        pynvml.nvmlDeviceGetName(h)
        for fn in (pynvml.nvmlDeviceGetUtilizationRates, pynvml.nvmlDeviceGetMemoryInfo,
                   pynvml.nvmlDeviceGetComputeMode, pynvml.nvmlDeviceGetComputeRunningProcesses,
                   pynvml.nvmlDeviceGetMPSComputeRunningProcesses):
            try:
                fn(h)
            except pynvml.NVMLError:
                pass
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, last_seen.get(i, 0))
            if samples:
                last_seen[i] = max(s.timeStamp for s in samples)
        except pynvml.NVMLError:
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bare_tick", description=__doc__.splitlines()[0])
    ap.add_argument("--resctrl", required=True)
    ap.add_argument("--cgroup", required=True)
    ap.add_argument("--tick", type=float, default=1.0)
    args = ap.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    pynvml.nvmlInit()
    paths, pids = mbm_files(args.resctrl), job_pids(args.cgroup)
    gpus = pynvml.nvmlDeviceGetCount()
    print(f"ready {len(paths)} files, {len(pids)} pids, {gpus} gpus", flush=True)
    last_seen: dict[int, int] = {}
    ticks, next_t = 0, time.monotonic()
    spent = {"mbm": 0.0, "proc": 0.0, "nvml": 0.0}  # CPU seconds of each part (this thread's)
    while not stop.is_set():
        c0 = time.thread_time()
        read_mbm(paths)
        c1 = time.thread_time()
        read_stats(pids)
        c2 = time.thread_time()
        nvml_calls(last_seen)
        c3 = time.thread_time()
        spent["mbm"] += c1 - c0
        spent["proc"] += c2 - c1
        spent["nvml"] += c3 - c2
        ticks += 1
        next_t += args.tick
        stop.wait(max(0.0, next_t - time.monotonic()))  # a fixed rate: --tick a tick, as noded's
    pynvml.nvmlShutdown()
    print(f"done ticks={ticks} " + " ".join(f"{k}={v:.6f}" for k, v in spent.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
