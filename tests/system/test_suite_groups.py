"""The suite's xdist groups hold: `make test` runs with --dist loadgroup, and the tests of
one group (the image's tests, sharing one build; the package's; the wheel's; the SIGKILL tests) must
run in one worker, one after another. pytest 9.2 with xdist 3.8 grouped nothing, silently
(pytest-xdist issue #1386): this runs a tiny suite the same way and looks."""

import os
import subprocess
import sys

SUITE = '''
import os
import pytest

pytestmark = pytest.mark.xdist_group("one")


@pytest.mark.parametrize("i", range(6))
def test_where(i):
    with open(os.path.join(os.environ["OUT"], f"{i}"), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
'''


def test_the_tests_of_one_group_run_in_one_worker(tmp_path):
    suite, out = tmp_path / "suite", tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    (suite / "test_grouped.py").write_text(SUITE)
    (suite / "pytest.ini").write_text("[pytest]\n")  # not the project's options
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                        "loadgroup", str(suite)], cwd=suite, env={**os.environ, "OUT": str(out)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    workers = {f.read_text() for f in out.iterdir()}
    assert len(list(out.iterdir())) == 6 and len(workers) == 1, workers
