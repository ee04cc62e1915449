"""Building and finding the stand-in ``libnvidia-ml.so.1`` (``native/nvml/``).

Two builds from one source, each in a directory of its own so that a process picks one
through ``LD_LIBRARY_PATH`` as a host's library search would: ``current`` (every entry
point noded uses, ``_v3`` process queries included) and ``no_v3`` (a driver from before
them: pynvml then raises ``NVMLLibraryMismatchError``). The system C compiler builds them
into ``build/nvml/`` of the source tree, again whenever the source is newer.

``python -m noded.sim.nvml_lib`` builds both (what ``make`` runs) and prints where.
"""

from __future__ import annotations

import os
import subprocess
import sys

TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the source tree
SOURCE_DIR = os.path.join(TREE, "native", "nvml")
SOURCES = ("simnvml.c", "processes.c", "monitoring.c", "simnvml.h", "internal.h")
C_FILES = tuple(s for s in SOURCES if s.endswith(".c"))
BUILD_DIR = os.path.join(TREE, "build", "nvml")
LIBRARY = "libnvidia-ml.so.1"
VARIANTS = {"current": (), "no_v3": ("-DSIMNVML_NO_V3",)}
CFLAGS = ("-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror", "-std=gnu11")


class BuildError(RuntimeError):
    """The library could not be built (the compiler's own message)."""


def library_dir(variant: str = "current") -> str:
    """The directory holding the variant's ``libnvidia-ml.so.1``, built if missing or stale."""
    if variant not in VARIANTS:
        raise ValueError(f"no NVML variant {variant!r}: one of {', '.join(VARIANTS)}")
    out_dir = os.path.join(BUILD_DIR, variant)
    target = os.path.join(out_dir, LIBRARY)
    newest = max(os.stat(os.path.join(SOURCE_DIR, s)).st_mtime for s in SOURCES)
    try:
        if os.stat(target).st_mtime >= newest:
            return out_dir
    except FileNotFoundError:
        pass
    os.makedirs(out_dir, exist_ok=True)
    partial = f"{target}.{os.getpid()}.tmp"
    cc = os.environ.get("CC", "cc")
    cmd = [cc, *CFLAGS, *VARIANTS[variant], "-o", partial,
           *(os.path.join(SOURCE_DIR, c) for c in C_FILES), "-lpthread"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise BuildError(f"no C compiler ({cc}): install gcc (make system-deps does)") from None
    if done.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()}")
    os.replace(partial, target)  # atomic: a process loading it never sees half a library
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
