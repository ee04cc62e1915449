"""Finding the resctrl mount and its options in /proc/mounts."""

from __future__ import annotations

import re
from dataclasses import dataclass

from resctrl.errors import NotMountedError

_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    fstype: str
    options: tuple[str, ...]

    @property
    def cdp(self) -> bool:
        return "cdp" in self.options

    @property
    def mba_mbps(self) -> bool:
        return "mba_MBps" in self.options


def unescape_mount_field(field: str) -> str:
    """Undo the kernel's octal escaping of space, tab, newline and backslash."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    """Parse /proc/mounts (or /etc/mtab) text; malformed lines are skipped."""
    mounts = []
    # The kernel separates lines by "\n" and fields by " " and escapes only those
    # (and tab, backslash); any other byte, "\r" included, is part of a field.
    for line in text.split("\n"):
        fields = [f for f in line.split(" ") if f]
        if len(fields) < 4:
            continue
        source, target, fstype, options = (unescape_mount_field(f) for f in fields[:4])
        mounts.append(Mount(source, target, fstype, tuple(options.split(","))))
    return mounts


def find_resctrl_mount(mounts_path: str = "/proc/mounts", root: str | None = None) -> Mount:
    """The resctrl mount (at ``root`` if given); the last one wins, as in the kernel's view."""
    # Any user may mount (FUSE, through fusermount) at a path whose name is not UTF-8:
    # decoded as os.fsdecode does, so such a line is read, not a UnicodeDecodeError.
    with open(mounts_path, encoding="utf-8", errors="surrogateescape") as f:
        mounts = [m for m in parse_mounts(f.read()) if m.fstype == "resctrl"]
    if root is not None:
        mounts = [m for m in mounts if m.target.rstrip("/") == root.rstrip("/")]
    if not mounts:
        where = f" at {root}" if root else ""
        raise NotMountedError("find mount", mounts_path, status=f"no resctrl filesystem mounted{where}")
    return mounts[-1]
