"""Whether something is at a path, as the kernel says: absent only where it says so.

``os.path.exists``, ``isdir``, ``isfile`` and ``lexists`` answer False for any error: a
directory shut to noded (EACCES: a tenant's delegated cgroup subtree, chmod 000, where
noded's unit runs without CAP_DAC_OVERRIDE), a symlink loop, an I/O error. Read as "no
such file", such an error becomes a fact noded plans from (a job's cgroup taken for gone
and its record forgotten, a v2 cgroup taken for v1). These answer False only for ENOENT
and ENOTDIR and raise every other error (observe, don't believe).
"""

from __future__ import annotations

import os
import stat

#: what the kernel answers where nothing is at a path
ABSENT = (FileNotFoundError, NotADirectoryError)


def stat_or_none(path: str, *, follow: bool = True) -> os.stat_result | None:
    """``path``'s stat (``follow``: a link followed), None where the kernel says nothing is
    there. Raises OSError where that cannot be told."""
    try:
        return os.stat(path, follow_symlinks=follow)
    except ABSENT:
        return None


def exists(path: str) -> bool:
    """Whether ``path`` names something (a link followed; a dangling one: False). Raises
    OSError where that cannot be told."""
    return stat_or_none(path) is not None


def lexists(path: str) -> bool:
    """Whether ``path`` names something, a link itself included. Raises OSError where
    that cannot be told."""
    return stat_or_none(path, follow=False) is not None


def isdir(path: str) -> bool:
    """Whether ``path`` names a directory (a link followed). Raises OSError where that
    cannot be told."""
    st = stat_or_none(path)
    return st is not None and stat.S_ISDIR(st.st_mode)
