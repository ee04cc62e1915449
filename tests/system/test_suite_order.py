"""The builds start first: `make test` hands the suite's work to xdist workers with
--dist loadgroup, which sends the groups of several tests first (the most tests first),
then single tests in the order collected. The package's test is one test, collected after
some dozens of others (bench's, test_clidoc's): it started behind them. The suite's plugin
(support.ordering) moves the modules that hold an own_install test to the front. This runs
a tiny suite the same way, in one worker, and looks at the order."""

import os
import subprocess
import sys

from support.paths import TESTS_DIR

RECORD = '''
import os


def record(name):
    with open(os.environ["ORDER"], "a") as f:
        f.write(name + "\\n")
'''

CONFTEST = '''
from support.ordering import builds_first


def pytest_collection_modifyitems(items):
    builds_first(items)
'''

SHORT = RECORD + '''

def test_short_1():
    record("short_1")


def test_short_2():
    record("short_2")
'''

GROUPED = RECORD + '''
import pytest

pytestmark = pytest.mark.xdist_group("several")


@pytest.mark.parametrize("i", range(3))
def test_grouped(i):
    record(f"grouped_{i}")
'''

BUILD = RECORD + '''
import pytest


@pytest.mark.own_install
def test_build():
    record("build")


def test_beside_the_build():
    record("beside")
'''


def run(tmp_path, conftest: str) -> list[str]:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    own_install: builds what it tests\n")
    (suite / "conftest.py").write_text(conftest)
    for name, text in (("test_a_short.py", SHORT), ("test_b_grouped.py", GROUPED), ("test_c_build.py", BUILD)):
        (suite / name).write_text(text)
    order = tmp_path / "order"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", "--dist",
                        "loadgroup", str(suite)], cwd=suite,
                       env={**os.environ, "ORDER": str(order), "PYTHONPATH": TESTS_DIR}, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return order.read_text().split()


def test_a_build_starts_right_after_the_groups_of_several_not_behind_the_single_tests(tmp_path):
    assert run(tmp_path, CONFTEST) == ["grouped_0", "grouped_1", "grouped_2", "build", "beside", "short_1",
                                       "short_2"]


def test_without_the_reordering_the_build_is_last(tmp_path):
    """What xdist does alone (the plugin's reason to be)."""
    assert run(tmp_path, "") == ["grouped_0", "grouped_1", "grouped_2", "short_1", "short_2", "build", "beside"]
