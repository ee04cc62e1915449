"""Shared by the MPS tests: the stand-in's path and what is left on the host."""

import os
import sys

STANDIN = os.path.join(os.path.dirname(sys.executable), "nvidia-cuda-mps-control-standin")


def processes_serving(pipe_dir: str) -> list[int]:
    """Live (not zombie) processes whose environment names ``pipe_dir``: the control
    daemon, its servers, and any control binary still running for it."""
    mark = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.append(int(name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def zombie_children() -> list[int]:
    """Children of this (test) process that exited and were never reaped."""
    me = str(os.getpid()).encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] == b"Z" and fields[1] == me:
            out.append(int(name))
    return out


def control_log(log_dir: str) -> str:
    try:
        with open(os.path.join(log_dir, "control.log")) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def gone(pid: int) -> bool:
    """The process exited (a zombie that is not ours to reap counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True
