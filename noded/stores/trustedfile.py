"""Whether a file noded reads or runs as root is one no other local user can change.

noded runs as root and takes its orders from files an operator names: the config, the
MPS control binary it executes, the labels file (which jobs are exempt), the co-location
profiles. A file another user may write, or may replace through a directory on its way,
lets that user choose what root does (name their own program as the MPS control binary,
exempt their own job). As SecureDir does for directories (OpenSSH's StrictModes), such a
file is refused: every directory on its way passes SecureDir's checks (owned by root or
noded's uid, not writable by others unless sticky, a link followed only where such a
user made it), a link at the file itself is held to the same, and the file is owned by
root or noded's uid and not writable by group or others.
"""

from __future__ import annotations

import os
import stat

from noded.stores.securedir import DirectoryMissing, SecureDir, SecureDirError

#: links followed at the file itself at most (as the kernel's path walk)
_MAX_SYMLINKS = 40


def untrusted_reason(path: str, what: str) -> str | None:
    """Why another user could change what ``path`` names (None: nobody but root and
    noded's uid can, or nothing is there: its absence is for the file's reader to say)."""
    euid = os.geteuid()
    for _ in range(_MAX_SYMLINKS):
        directory, name = os.path.split(os.path.abspath(path))
        try:
            SecureDir(directory, create=False, shared=True, what=f"the directory of {what}").close()
        except DirectoryMissing:
            return None
        except SecureDirError as e:
            return f"{what} {path}: {e.reason}"
        try:
            st = os.lstat(os.path.join(directory, name))
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"{what} {path}: cannot examine it: {e.strerror}"
        if st.st_uid not in (0, euid):
            kind = "a symbolic link " if stat.S_ISLNK(st.st_mode) else ""
            return (f"{what} {path} is {kind}owned by uid {st.st_uid}, not by root or noded's uid {euid}: "
                    "that user could change what noded does as root")
        if not stat.S_ISLNK(st.st_mode):
            who = [w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if st.st_mode & bit]
            if who:
                return (f"{what} {path} is writable by {' and '.join(who)} (mode {stat.S_IMODE(st.st_mode):04o}): "
                        "another user could change what noded does as root")
            return None
        try:
            target = os.readlink(os.path.join(directory, name))
        except OSError as e:  # replaced since the lstat
            return f"{what} {path}: cannot read the link: {e.strerror}"
        path = os.path.join(directory, target)
    return f"{what} {path}: too many symbolic links"
