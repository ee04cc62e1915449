"""The test modules rewritten once before the workers collect (support.bytecode): on a
fresh clone `make test`'s four workers each rewrote and compiled every test module at the
same moment. The run's first process collects once where most modules have no cached
rewrite and there are workers to share it, and does nothing where they are cached."""

import os
import sys
import types
from pathlib import Path

import pytest

from support import bytecode

MODULE = '''
def test_{name}():
    value = {name!r}
    assert value.upper() == {upper!r}, value
'''


def tiny_suite(top: Path) -> list[str]:
    """Two test modules and a conftest under ``top``, none of them collected yet."""
    (top / "sub").mkdir(parents=True)
    modules = [top / "test_a.py", top / "sub" / "test_b.py", top / "conftest.py"]
    for path in modules[:2]:
        path.write_text(MODULE.format(name=path.stem, upper=path.stem.upper()))
    modules[2].write_text("")
    (top / "node_modules").mkdir()
    (top / "node_modules" / "test_not_ours.py").write_text("")  # never a test module of ours
    return sorted(map(str, modules))


def run_config(top: Path, workers: int | None, args=(".",), collect_only=False):
    """What collect_once_for_workers reads of pytest's config: a run of ``args`` from
    ``top`` with ``workers`` (xdist's -n; None: no xdist)."""
    return types.SimpleNamespace(option=types.SimpleNamespace(numprocesses=workers, collectonly=collect_only),
                                 args=list(args), invocation_params=types.SimpleNamespace(dir=top), rootpath=top,
                                 inipath=None)


@pytest.fixture
def writes_bytecode(monkeypatch):
    if sys.dont_write_bytecode:
        pytest.skip("Python writes no bytecode here (PYTHONDONTWRITEBYTECODE): nothing is cached")
    monkeypatch.delenv(bytecode.PRIMING_ENV, raising=False)


def test_a_fresh_tree_is_collected_once_and_then_every_module_is_cached(tmp_path, writes_bytecode):
    modules = tiny_suite(tmp_path)
    assert sorted(bytecode.test_modules([str(tmp_path)])) == modules
    assert bytecode.stale(modules) == modules
    assert bytecode.collect_once_for_workers(run_config(tmp_path, 4))
    assert bytecode.stale(modules) == []
    assert all(os.path.isfile(bytecode.rewritten_pyc(m)) for m in modules)
    # cached now: a second run's workers find them, and nothing is collected again
    assert not bytecode.collect_once_for_workers(run_config(tmp_path, 4))
    # a module edited since its rewrite is stale; one in three: the workers rewrite it themselves
    edited = modules[-1]
    pyc = os.stat(bytecode.rewritten_pyc(edited))
    os.utime(edited, ns=(pyc.st_atime_ns, pyc.st_mtime_ns + 2_000_000_000))
    assert bytecode.stale(modules) == [edited]
    assert not bytecode.collect_once_for_workers(run_config(tmp_path, 2))


@pytest.mark.parametrize("workers", [None, 0, 1])
def test_a_run_without_two_workers_collects_nothing_first(tmp_path, writes_bytecode, workers):
    modules = tiny_suite(tmp_path)
    assert not bytecode.collect_once_for_workers(run_config(tmp_path, workers))
    assert bytecode.stale(modules) == modules


def test_a_collection_alone_collects_nothing_first(tmp_path, writes_bytecode):
    """pytest -n 4 --collect-only: xdist starts no worker, the run collects once itself."""
    modules = tiny_suite(tmp_path)
    assert not bytecode.collect_once_for_workers(run_config(tmp_path, 4, collect_only=True))
    assert bytecode.stale(modules) == modules


def test_a_run_of_named_files_and_tests_is_collected_as_named(tmp_path, writes_bytecode):
    modules = tiny_suite(tmp_path)
    assert bytecode.collect_once_for_workers(run_config(tmp_path, 2, ["sub/test_b.py::test_test_b"]))
    # test_b.py, and the conftest above it that pytest loads with it; not test_a.py
    assert bytecode.stale(modules) == [str(tmp_path / "test_a.py")]


def test_the_collecting_process_collects_nothing_first_itself(tmp_path, writes_bytecode, monkeypatch):
    modules = tiny_suite(tmp_path)
    monkeypatch.setenv(bytecode.PRIMING_ENV, "1")
    assert not bytecode.collect_once_for_workers(run_config(tmp_path, 4))
    assert bytecode.stale(modules) == modules
