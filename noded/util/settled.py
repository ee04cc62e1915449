"""Whether a file read whole was read while nobody was writing it.

An editor's save or ``cat > file`` rewrites a file in place: truncated, then written in
one or more writes. A read that falls between two of them gets a file cut short, which
may still parse (a list cut short, a mapping missing its later keys, which then take
their defaults). No check around the read can tell a writer that began before it and
paused from one that finished, so a file is taken only where both hold:

* the file did not change while it was read: its (device, inode, size, mtime, ctime)
  before the read, after it on the open file, and at its path after it, all agree (a
  file renamed over the path while it was read fails the last);
* its last change (``st_ctime``: every write sets it, and unlike the mtime nobody can
  set it to another time) is at least ``settle_s`` in the past on the wall clock.

A writer that stops for longer than ``settle_s`` in the middle of a rewrite is not caught:
a file written elsewhere and renamed into place is the one safe way (it is complete the
moment its name appears, and it too is taken ``settle_s`` after the rename).
"""

from __future__ import annotations

import os

#: how long a file must have been unchanged to be taken as a writer's whole file
SETTLE_S = 1.0


class Unsettled(Exception):
    """The file changed while it was read, or too recently to be taken whole: read it
    again later. The message names the file and says which."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when a file is rewritten in place or replaced."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def unsettled_reason(before: os.stat_result, after: os.stat_result, at_path: os.stat_result | None,
                     now_ns: int, settle_s: float) -> str | None:
    """Why a file whose open descriptor was ``before`` the read and ``after`` it, and whose
    path was ``at_path`` after it (None: nothing there), may not have been read whole at
    ``now_ns`` (wall clock, ns since the epoch); None where it was."""
    if identity(after) != identity(before):
        size = f" (size {before.st_size} -> {after.st_size} bytes)" if after.st_size != before.st_size else ""
        return f"it changed while it was read{size}"
    if at_path is None:
        return "it was removed or renamed while it was read"
    if identity(at_path) != identity(after):
        return "another file took its name while it was read"
    age_s = (now_ns - after.st_ctime_ns) / 1e9
    if age_s < 0:
        return f"its last change is {-age_s:.2f} s in the future (the clock went back?)"
    if age_s < settle_s:
        return (f"it changed {age_s:.2f} s ago, less than the {settle_s:g} s it must stay unchanged "
                "(a writer may not be done)")
    return None
