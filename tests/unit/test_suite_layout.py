"""The suite's own layout (tests/README.md): the tests never import bench (bench's own tests
live in bench/tests, in the same tiers), nor a conftest by its name, and `make test` runs both
folders."""

from __future__ import annotations

import ast
import pathlib
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[2]  # tests/unit/ up
#: ways of importing a module by its name in a string
IMPORTERS = {"import_module", "__import__"}


def _names(module: str | None, top: str) -> bool:
    return module is not None and (module == top or module.startswith(top + "."))


def bench_imports(source: str, filename: str, top: str = "bench") -> list[str]:
    """Each import of bench (or a module of it; or of ``top``) in ``source``, as
    ``filename:line``: ``import bench.x``, ``from bench.x import y``, ``from bench import x``,
    ``importlib.import_module("bench.x")``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            named = any(_names(alias.name, top) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            named = node.level == 0 and _names(node.module, top)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            named = name in IMPORTERS and bool(node.args) and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _names(node.args[0].value, top)
        else:
            continue
        if named:
            found.append(f"{filename}:{node.lineno}")
    return found


def test_no_file_under_tests_imports_bench():
    files = sorted((REPO / "tests").rglob("*.py"))
    assert len(files) > 100, "not the suite's folder?"
    sources = {path: path.read_text() for path in files if "node_modules" not in path.parts}
    offenders = [hit for path, source in sources.items()
                 if "bench" in source  # parsed only where it could be (the whole suite takes seconds)
                 for hit in bench_imports(source, str(path.relative_to(REPO)))]
    # before: six test files of bench's own modules sat in tests/unit and tests/system
    assert offenders == [], "tests/ imports bench; bench's own tests go in bench/tests: " + ", ".join(offenders)


def test_no_test_imports_a_conftest_by_its_name():
    # Each tier's conftest.py is a module named "conftest": which one `from conftest import x`
    # finds depends on what the worker collected first (33 errors in a fresh clone's run once
    # tests/fuse/ had its own). What tests share by import lives in tests/support/.
    files = sorted((REPO / "tests").rglob("*.py")) + sorted((REPO / "bench" / "tests").rglob("*.py"))
    offenders = [hit for path in files if "node_modules" not in path.parts
                 for source in [path.read_text()] if "conftest" in source
                 for hit in bench_imports(source, str(path.relative_to(REPO)), top="conftest")]
    assert offenders == [], "import from tests/support/, not from a conftest: " + ", ".join(offenders)


def test_the_check_sees_every_way_of_importing_bench():
    source = ("import bench\nimport os, bench.stress as s\nfrom bench.scenario import plot\nfrom bench import victims\n"
              "import importlib\nimportlib.import_module('bench.report')\n__import__('bench')\n"
              "import benchmark\nfrom .bench import x\nfrom nodesim import bench_like\nprint('bench.report')\n")
    assert bench_imports(source, "t.py") == [f"t.py:{line}" for line in (1, 2, 3, 4, 6, 7)]


def test_make_test_collects_bench_tests_beside_the_suites():
    with open(REPO / "pyproject.toml", "rb") as f:
        testpaths = tomllib.load(f)["tool"]["pytest"]["ini_options"]["testpaths"]
    assert sorted(testpaths) == ["bench/tests", "tests"]
    tiers = {p.parent.name for p in (REPO / "bench" / "tests").rglob("test_*.py")}
    assert tiers and tiers <= {"unit", "kernel", "fuse", "system", "integration"}, tiers
