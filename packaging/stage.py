#!/usr/bin/env python3
"""The tree a build packs (the image's context, the Debian package's source), made from
this checkout, and the names that build carries.

    packaging/stage.py describe PATH...        -> VERSION REVISION CONTENT_HASH
    packaging/stage.py tree DEST PATH...       copies PATH... into DEST (emptied first),
                                               with noded/util/_revision.py naming the revision

Files are git's view of the checkout: tracked ones as they are on disk, and untracked ones
git does not ignore (a new module not yet committed is built; .venv, build/ and caches
never are). The revision is noded.util.buildinfo's from git (``-dirty`` where tracked files
differ from the commit); the content hash covers every staged file's path, mode and bytes
and the revision, so two builds of one revision from different trees differ, and a build
of the same tree is recognised (make image and make deb skip it).

Standard library only: it runs with the system's python3 before any venv exists.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from noded.util.buildinfo import revision, source_date_epoch  # noqa: E402  (the checkout's, by path above)

REVISION_MODULE = os.path.join("noded", "util", "_revision.py")


def version() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["version"]


def source_files(paths: list[str]) -> list[str]:
    """Files under ``paths`` (relative to the checkout) that git tracks or does not
    ignore, present on disk, sorted; never the generated revision module."""
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                          *paths], capture_output=True, check=True).stdout
    names = {n.decode() for n in out.split(b"\0") if n}
    return sorted(n for n in names if n != REVISION_MODULE and os.path.isfile(os.path.join(ROOT, n)))


def content_hash(files: list[str], rev: str) -> str:
    h = hashlib.sha256(rev.encode() + b"\0")
    for name in files:
        path = os.path.join(ROOT, name)
        h.update(name.encode() + b"\0" + oct(os.stat(path).st_mode & 0o777).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def revision_module(rev: str) -> str:
    return ('"""The source revision this package was built from: written by packaging/stage.py, never\n'
            'committed (noded.util.buildinfo reads it where no checkout\'s git is at hand)."""\n\n'
            f"REVISION = {rev!r}\n")


def stage(dest: str, files: list[str], rev: str, epoch: int | None = None) -> None:
    """``files`` copied into ``dest`` (emptied first) with the revision module; each file's
    time ``epoch`` where given (0 or None: as copied)."""
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    for name in files:
        target = os.path.join(dest, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), target)
    with open(os.path.join(dest, REVISION_MODULE), "w") as f:
        f.write(revision_module(rev))
    # a fixed time on everything, so the build's archives do not depend on when it was staged
    # (0 as unset: a wheel's zip cannot hold a time before 1980)
    if epoch:
        for dirpath, _, names in os.walk(dest):
            for n in names:
                os.utime(os.path.join(dirpath, n), (epoch, epoch))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("describe", "tree") or (argv[0] == "tree" and len(argv) < 3):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    rev = revision()
    if argv[0] == "describe":
        files = source_files(argv[1:])
        print(version(), rev, content_hash(files, rev))
        return 0
    dest, paths = argv[1], argv[2:]
    try:  # read before anything is staged: a bad value leaves DEST as it was
        epoch = source_date_epoch()
    except ValueError as e:
        print(f"stage.py: {e}", file=sys.stderr)
        return 2
    stage(dest, source_files(paths), rev, epoch)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
