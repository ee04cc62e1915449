"""The kernel's side of a job's CPUs, raw: a cgroup's ``cpuset.cpus`` read and written (never
through a link, never creating a file) and the affinity of every thread of a process; a
refused write raised as OSError naming the file or thread, with the kernel's message."""

from __future__ import annotations

import os

from resctrl.cpulist import format_cpu_list


def read_cpuset(path: str) -> str:
    """A cgroup's cpuset.cpus, never through a link (only records noded made name cgroups)."""
    fd = os.open(os.path.join(path, "cpuset.cpus"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def write_cpuset(path: str, text: str) -> None:
    """Write a cgroup's cpuset.cpus: never creating a file, never through a link."""
    fd = os.open(os.path.join(path, "cpuset.cpus"), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    except OSError as e:  # the kernel's refusal (EBUSY, EINVAL): say which file and what
        raise OSError(e.errno, f"{e.strerror} writing {text!r} into", os.path.join(path, "cpuset.cpus")) from None
    finally:
        os.close(fd)


def set_affinity(proc: str, pid: int, cpus) -> None:
    """Every thread of a process (new threads and children inherit it)."""
    try:
        tids = [int(t) for t in os.listdir(f"{proc}/{pid}/task")]
    except FileNotFoundError:
        return  # exited
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            pass
        except OSError as e:  # EINVAL: none of them allowed by its cpuset; EPERM
            raise OSError(e.errno, f"{e.strerror}: sched_setaffinity of thread {tid} of {pid} to "
                          f"{format_cpu_list(sorted(cpus))}") from None
