"""The run's order: the builds first.

`make test` runs the suite in xdist workers with ``--dist loadgroup``, which hands out
work in units (a group's tests, or one test alone) as the workers free up: the groups of
several tests first (the most tests first), then the single tests in the order collected.
The tests marked ``own_install`` build what they test (the Debian package, the image, the
wheel, ``make install``): the run's longest items, which wait on nobody (they never use
this checkout's numba cache). Collected where their files sort they start late, behind
some dozens of short tests, and the run waits for them at its end; moved to the front of
the collection (each in the order it had) they start among the first, beside the rest.
Their module's other tests move with them, so a module's fixture is still made once in
a run of one process. Nothing else changes order."""

from __future__ import annotations


def builds_first(items: list) -> None:
    """Reorders ``items`` (pytest's, in place): the modules that hold an ``own_install``
    test first, each whole and in the order collected, then the rest as they were."""
    building = {item.path for item in items if item.get_closest_marker("own_install") is not None}
    items[:] = sorted(items, key=lambda item: item.path not in building)  # stable
