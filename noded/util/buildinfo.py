"""Which noded this is: the package's version and the source revision it was built from.

Two builds of one version are told apart by the revision (``noded --version``,
``nodectl --version``, the ``noded_build_info`` metric). Where it comes from, first found:

1. a git checkout that this package runs from (``PYTHONPATH=. python -m noded``, an
   editable install): ``git rev-parse`` of that checkout, ``-dirty`` where tracked files
   differ from the commit;
2. ``noded/util/_revision.py``, written into the tree that a build packs (``make image``,
   ``make deb``, ``make wheel``: packaging/stage) and never into a checkout's git;
3. ``unknown``.

A checkout's git wins over a ``_revision.py`` lying in it: a stale one, left by a build,
would name a revision the code no longer is.

Standard library only: ``--version`` is read before anything heavy is imported.
"""

from __future__ import annotations

import functools
import os
import subprocess
from importlib import metadata

DISTRIBUTION = "noded"
UNKNOWN = "unknown"
#: characters a revision is made of (hex, ``-dirty``, a content hash's ``+``): anything
#: else in a baked file is not a revision
_REVISION_ALPHABET = frozenset("0123456789abcdefghijklmnopqrstuvwxyz-+.")
_GIT_TIMEOUT_S = 5.0


@functools.cache
def version() -> str:
    """The installed distribution's version; ``unknown`` where noded runs uninstalled."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN


@functools.cache
def revision() -> str:
    """The source revision this code was built from (see the module's docstring)."""
    return _checkout_revision() or _baked_revision() or UNKNOWN


def describe(prog: str) -> str:
    """The ``--version`` line: ``noded 0.2.0 (revision 1a2b3c4d5e6f)``."""
    return f"{prog} {version()} (revision {revision()})"


def _checkout_root() -> str | None:
    """The checkout this package lies in (its parent directory holds ``.git``: a
    directory, or a worktree's file), or None where it is installed elsewhere."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # noded/util/ up
    return root if os.path.exists(os.path.join(root, ".git")) else None


def _git(root: str, *args: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=_GIT_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None  # no git on this host, or one that hangs: the revision is not known from it


def _checkout_revision() -> str | None:
    root = _checkout_root()
    if root is None:
        return None
    head = _git(root, "rev-parse", "--short=12", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    # tracked files only: an untracked scratch file beside the code does not change the build
    changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    dirty = changed is not None and changed.returncode == 0 and changed.stdout.strip() != ""
    return head.stdout.strip() + ("-dirty" if dirty else "")


def _baked_revision() -> str | None:
    try:
        from noded.util._revision import REVISION  # written by packaging/stage; absent in a checkout
    except ImportError:
        return None
    if not isinstance(REVISION, str) or not REVISION or set(REVISION) - _REVISION_ALPHABET or len(REVISION) > 80:
        return None
    return REVISION


#: the latest SOURCE_DATE_EPOCH taken (9999-12-31 23:59:59 UTC): past it no date prints in 4 digits
SOURCE_DATE_EPOCH_MAX = 253402300799


def source_date_epoch(environ=os.environ) -> int | None:
    """``SOURCE_DATE_EPOCH`` as reproducible-builds.org's specification reads it: unset or
    empty, None (the build chooses its own time: the specification says a missing or empty
    value is one not following it); else seconds since 1970-01-01 UTC in ASCII digits, as
    ``date +%s`` prints them. Raises ValueError naming the variable and its value for
    anything else (the specification: a malformed value SHOULD fail the build)."""
    text = environ.get("SOURCE_DATE_EPOCH")
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > SOURCE_DATE_EPOCH_MAX:
        raise ValueError(f"SOURCE_DATE_EPOCH={text!r} is not a time: it must be seconds since 1970-01-01 UTC, "
                         f"digits only (as `date +%s` prints them), at most {SOURCE_DATE_EPOCH_MAX}; unset it "
                         "or leave it empty for no fixed time")
    return int(text)
