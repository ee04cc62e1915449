"""What `noded run` would refuse at start on this host, for `noded check-config` too.

One list of checks that both call, so the two never disagree: the state and runtime
directories (and the admin socket's) must be ones only root can change (checked as
``SecureDir`` checks them, without creating anything), each job source's root must be
on a cgroup filesystem, and a co-location profiles file must load.
"""

from __future__ import annotations

import os

from .config import Config
from .securedir import DirectoryMissing, SecureDir, SecureDirError

CGROUP_FILESYSTEMS = ("cgroup", "cgroup2")


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem ``path`` is on (the longest mount point above it)."""
    real = os.path.realpath(path)
    best, fstype = -1, None
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) < 5 or not right:
                continue
            point = fields[4].replace("\\040", " ")
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > best:
                best, fstype = len(point), right.split()[0]
    return fstype


def _directory(path: str, mode: int, what: str) -> str | None:
    try:
        SecureDir(path, mode=mode, create=False, what=what).close()
    except DirectoryMissing:
        return None  # noded makes it, under checked parents
    except SecureDirError as e:
        return e.reason
    return None


def start_problems(config: Config) -> list[tuple[str, str]]:
    """(key, reason) for each thing that would stop `noded run` at start."""
    out = []
    for key, path, mode, what in (("state_dir", config.state_dir, 0o700, "state directory"),
                                  ("runtime_dir", config.runtime_dir, 0o755, "runtime directory"),
                                  ("admin.socket", os.path.dirname(config.admin_socket), 0o755,
                                   "admin socket directory")):
        reason = _directory(path, mode, what)
        if reason:
            out.append((key, reason))
    for i, source in enumerate(config.jobs.sources):
        if not os.path.isdir(source.root):
            out.append((f"jobs.sources[{i}].root", f"{source.root} is not a directory"))
            continue
        fstype = filesystem_type(source.root)
        if fstype not in CGROUP_FILESYSTEMS:
            out.append((f"jobs.sources[{i}].root", f"{source.root} is not in a cgroup hierarchy (it is on {fstype})"))
    cc = config.colocation
    if cc.enabled and cc.profiles:
        from .colocation.profiles import ProfileError, load_profiles

        try:
            load_profiles(cc.profiles)
        except ProfileError as e:
            out.append(("colocation.profiles", str(e)))
    return out
