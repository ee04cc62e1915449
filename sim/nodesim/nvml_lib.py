"""Building and finding the stand-in ``libnvidia-ml.so.1`` (C, in ``nvml_native/`` beside
this module: package data, so an installed noded carries it).

Two builds from one source, each in a directory of its own so that a process picks one
through ``LD_LIBRARY_PATH`` as a host's library search would: ``current`` (every entry
point noded and the monitoring tools use, ``_v3`` process queries included) and ``no_v3``
(a driver from before them: pynvml then raises ``NVMLLibraryMismatchError``).

The system C compiler builds them at first use, again whenever the source or the flags
change (a digest of both is kept beside each build). Where noded runs from a checkout they
go into its ``build/nvml/`` (what ``make nvml`` fills); where it is installed (a wheel),
into the user's cache, ``$XDG_CACHE_HOME/noded/nvml/`` (default ``~/.cache``): an installed
package's directory is not the place to write. Without a compiler the error says so and how
to get one.

``python -m nodesim.nvml_lib`` builds both (what ``make`` runs) and prints where.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.join(PACKAGE_DIR, "nvml_native")
SOURCES = ("simnvml.c", "processes.c", "monitoring.c", "simnvml.h", "internal.h")
C_FILES = tuple(s for s in SOURCES if s.endswith(".c"))
LIBRARY = "libnvidia-ml.so.1"
DIGEST = "source.sha256"
VARIANTS = {"current": (), "no_v3": ("-DSIMNVML_NO_V3",)}
CFLAGS = ("-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror", "-std=gnu11")


class BuildError(RuntimeError):
    """The library could not be built (what is missing, or the compiler's own message)."""


def checkout() -> str | None:
    """The source checkout this package runs from (its root), or None when installed."""
    root = os.path.dirname(os.path.dirname(PACKAGE_DIR))
    return root if os.path.isfile(os.path.join(root, "pyproject.toml")) and \
        os.path.isdir(os.path.join(root, "sim", "nodesim", "nvml_native")) else None


def build_root() -> str:
    """Where the builds go: the checkout's ``build/nvml``, or the user's cache."""
    tree = checkout()
    if tree is not None:
        return os.path.join(tree, "build", "nvml")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "noded", "nvml")


def _digest(cc: str, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256(shlex.join([cc, *flags]).encode())
    for name in SOURCES:
        with open(os.path.join(SOURCE_DIR, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def library_dir(variant: str = "current") -> str:
    """The directory holding the variant's ``libnvidia-ml.so.1``, built if missing or stale.
    Raises BuildError where it cannot be built."""
    if variant not in VARIANTS:
        raise ValueError(f"no NVML variant {variant!r}: one of {', '.join(VARIANTS)}")
    cc = os.environ.get("CC", "cc")
    flags = (*CFLAGS, *VARIANTS[variant])
    out_dir = os.path.join(build_root(), variant)
    target = os.path.join(out_dir, LIBRARY)
    digest = _digest(cc, flags)
    if os.path.exists(target) and _read(os.path.join(out_dir, DIGEST)) == digest:
        return out_dir
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise BuildError(f"cannot make {out_dir} for the simulated node's {LIBRARY}: {e.strerror}") from None
    partial = f"{target}.{os.getpid()}.tmp"
    cmd = [*shlex.split(cc), *flags, "-o", partial, *(os.path.join(SOURCE_DIR, c) for c in C_FILES), "-lpthread"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise BuildError(f"the simulated node's stand-in {LIBRARY} is built from C at first use, and there is no "
                         f"C compiler {cc!r} on PATH: install one (Debian: apt-get install gcc) or name one in CC"
                         ) from None
    if done.returncode != 0:
        raise BuildError(f"{shlex.join(cmd)} failed:\n{done.stderr.strip()}")
    os.replace(partial, target)  # atomic: a process loading it never sees half a library
    with open(os.path.join(out_dir, f"{DIGEST}.{os.getpid()}.tmp"), "w") as f:
        f.write(digest + "\n")
    os.replace(f.name, os.path.join(out_dir, DIGEST))
    return out_dir


def library_path(variant: str = "current") -> str:
    return os.path.join(library_dir(variant), LIBRARY)


def main() -> int:
    try:
        for variant in VARIANTS:
            print(f"{variant}: {library_path(variant)}")
    except BuildError as e:
        print(f"noded: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
