"""bench's own tests, in the suite's tiers (unit/, system/: tests/README.md says what goes
where), run by `make test` beside tests/ with the same markers and workers. They use the
suite's one home of helpers (tests/support) and its shared hooks and fixtures
(support.plugin: numba's warm cache, the FUSE skip, the emulator); the suite's own tests
never import bench (tests/unit/test_suite_layout.py)."""

import os
import sys

# tests/ on the path, as it is for the suite (the folder of its root conftest): ``support``
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tests"))

pytest_plugins = ["support.plugin"]
