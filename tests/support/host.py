"""What the tests share with everything else on this host: its cgroup v1 cpuset hierarchy,
its cgroup v2 hierarchy where it is a hybrid host, and the host-wide lock every noded takes
on what it acts on."""

from __future__ import annotations

import re

import pytest

CPUSET = "/sys/fs/cgroup/cpuset"
UNIFIED = "/sys/fs/cgroup/unified"  # a hybrid host's cgroup v2 hierarchy (no controllers in it)


def noded_lock_holder(*paths: str) -> str | None:
    """Why a noded that a test starts on ``paths`` (the cgroup roots and resctrl mount of its
    config) could not run now: the host-wide lock's own message, naming the other noded's
    pid; None where nothing holds it. Asked as noded asks (a non-blocking flock, let go at
    once), so that a test that needs the lock skips at once instead of failing its start."""
    from noded.stores.lockfile import AlreadyRunning, HostLock

    try:
        HostLock.for_filesystems(list(paths)).acquire().release()
    except AlreadyRunning as e:
        return str(e)
    return None


def skip_if_another_noded(output: str) -> None:
    """Skips the test where a noded it started refused to run beside another one (its
    output says whose pid holds the lock)."""
    held = re.search(r"another noded \(pid [^)]*\) holds [^\n]*", output)
    if held:
        pytest.skip(f"needs the host-wide noded lock: {held.group(0)}")
