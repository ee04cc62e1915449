"""Shared by the MPS tests: the stand-in's path and what is left on the host."""

import atexit
import os
import shutil
import signal
import tempfile

from noded.util.procstat import PPID, stat_fields
from nodesim.mps_standin import write_launcher

# The stand-in is no installed command: one launcher for the whole session, in a
# directory of its own that goes when the session ends.
_LAUNCHER_DIR = tempfile.mkdtemp(prefix="noded-mps-standin-")
atexit.register(shutil.rmtree, _LAUNCHER_DIR, ignore_errors=True)
STANDIN = write_launcher(_LAUNCHER_DIR)


def _live_processes():
    """(pid, its /proc/PID/stat fields from the state on) of every process there now."""
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := stat_fields("/proc", int(name))) is not None:
            yield int(name), fields


def processes_serving(pipe_dir: str) -> list[int]:
    """Live (not zombie) processes whose environment names ``pipe_dir``: the control
    daemon, its servers, and any control binary still running for it. Each process's
    environment is read once, its state only where that names ``pipe_dir``: the tests poll
    this while noded starts and acts, and reading every process's stat as well cost twice
    the reads (23 ms of a core a call among 400 processes, 11 with this)."""
    entry = b"\0" + f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if entry not in b"\0" + f.read() + b"\0":
                    continue
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = stat_fields("/proc", int(name))
        if fields is not None and fields[0] != b"Z":
            found.append(int(name))
    return found


def end_serving(pipe_dir: str, timeout: float = 10.0) -> list[int]:
    """A test's last resort, registered before anything that may start MPS on ``pipe_dir``
    (request.addfinalizer, ExitStack): every process still serving it SIGKILLed and waited
    for. Returns those it found: none where the test's own stop worked."""
    from support.waiting import wait_for

    found = processes_serving(pipe_dir)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: all(gone(pid) for pid in found), timeout=timeout, interval=0.05,
             what=f"the processes serving {pipe_dir} gone")
    return found


def not_left_serving(pipe_dir: str) -> None:
    """A fixture's teardown, after its own stops: fails if a process still served
    ``pipe_dir`` (ended here first, so the failure leaves nothing running)."""
    left = end_serving(pipe_dir)
    assert not left, f"processes left serving {pipe_dir} after every stop (killed now): {left}"


def zombie_children() -> list[int]:
    """Children of this (test) process that exited and were never reaped."""
    me = str(os.getpid()).encode()
    return [pid for pid, fields in _live_processes() if fields[0] == b"Z" and fields[PPID] == me]


def control_log(log_dir: str) -> str:
    try:
        with open(os.path.join(log_dir, "control.log")) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def gone(pid: int) -> bool:
    """The process exited (a zombie that is not ours to reap counts as gone)."""
    fields = stat_fields("/proc", pid)
    return fields is None or fields[0] == b"Z"
