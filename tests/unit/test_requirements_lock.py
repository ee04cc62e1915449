"""packaging/requirements.lock (make lock): every build of noded (make deb, make install, the
image) installs its Python dependencies from it alone, at exact versions with their files'
hashes, so two builds of one revision ship the same versions, the ones the tests ran
against. It pins every runtime requirement of pyproject.toml inside its range, all they pull
in, nothing of the simulation, and exactly what this .venv has; the files that install use it;
its parser (packaging/requirements.py's read_lock) and the index filter are checked here."""

from __future__ import annotations

import importlib.util
import os
import re
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.requirements import Requirement

from support.examples import examples
from support.paths import REPO_ROOT

LOCK = os.path.join(REPO_ROOT, "packaging", "requirements.lock")
PYPROJECT = os.path.join(REPO_ROOT, "pyproject.toml")


def _load_requirements_module():
    # by path: packaging/ is no package (and its name is the PyPI library's)
    spec = importlib.util.spec_from_file_location("noded_packaging_requirements",
                                                  os.path.join(REPO_ROOT, "packaging", "requirements.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


requirements = _load_requirements_module()


def _read(path: str) -> str:
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
        return f.read()


def _logical_lines(text: str) -> list[str]:
    """A shell/make/Containerfile text's lines with backslash continuations joined."""
    return re.sub(r"\\\n", " ", text).splitlines()


# -- what the lock pins -----------------------------------------------------------------------

def test_the_lock_pins_every_runtime_requirement_of_pyproject_inside_its_range():
    pins = requirements.read_lock(LOCK)
    runtime = requirements.runtime_requirements(PYPROJECT)
    assert runtime, "pyproject.toml names no runtime dependency"
    for text in runtime:
        req = Requirement(text)
        name = requirements.normalised(req.name)
        assert name in pins, f"{LOCK} pins no version of {name} ({text}): make lock"
        version, hashes = pins[name]
        assert req.specifier.contains(version, prereleases=True), f"{name}=={version} is outside {text}"
        assert hashes, f"{name}=={version} has no --hash: pip cannot check what it downloads"


def test_the_lock_holds_nothing_of_the_simulation():
    pins = requirements.read_lock(LOCK)
    assert "mfusepy" in requirements.SIMULATION_ONLY
    assert not set(pins) & {"mfusepy", "noded", "noded-sim"}
    with open(os.path.join(REPO_ROOT, "sim", "pyproject.toml"), "rb") as f:
        sim = tomllib.load(f)["project"]["dependencies"]
    only_sim = {requirements.distribution(r) for r in sim} - {"noded"}
    assert only_sim and not set(pins) & only_sim, only_sim


def test_the_lock_is_exactly_what_this_venv_tests_with():
    """Every locked version is the one installed here, and the lock holds each distribution
    the runtime requirements pull in here (no more, none missing): the tests ran against
    what the package ships. After a pip install into .venv: make lock."""
    pins = {name: version for name, (version, _) in requirements.read_lock(LOCK).items()}
    installed = {name: version for name, (version, _)
                 in requirements.installed_closure(requirements.runtime_requirements(PYPROJECT)).items()}
    assert pins == installed, "the lock and .venv differ: make lock (or make deps to install the lock)"


# -- the files that install use it ------------------------------------------------------------

def _pip_installs(text: str) -> list[str]:
    return [line.strip() for line in _logical_lines(text)
            if re.search(r"\bpip install\b", line) and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("path", ["Makefile", "packaging/debian/rules", "packaging/image/Containerfile"])
def test_every_pip_install_that_builds_noded_takes_the_lock_or_no_dependencies(path):
    """Each `pip install` of a recipe that builds noded either installs the lock in
    hash-checking mode or installs without dependencies; only the dev .venv's editable install
    of the extras may resolve (after the lock is in)."""
    installs = _pip_installs(_read(path))
    assert installs, f"{path}: no pip install found"
    for line in installs:
        for command in re.split(r"&&|;", line):
            if not re.search(r"\bpip install\b", command):
                continue
            locked = re.search(r"--require-hashes -r \S*requirements\.lock\b", command)
            editable_dev = path == "Makefile" and "-e '.[test,bench]' -e ./sim" in command
            assert locked or "--no-deps" in command or editable_dev, f"{path}: unpinned install: {command.strip()}"


def test_make_install_and_the_dev_venv_install_the_lock_first():
    makefile = _read("Makefile")
    recipe = makefile.split("\ninstall:\n", 1)[1].split("\n\n", 1)[0]
    lock_at = recipe.index("--require-hashes -r packaging/requirements.lock")
    assert lock_at < recipe.index('--no-deps "$$src"') < recipe.index("pip check")
    stamp = makefile.split("\n$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert stamp.split("\n", 1)[0].split() [-1] == "packaging/requirements.lock", "a new lock must remake .venv"
    assert stamp.index("--require-hashes -r packaging/requirements.lock") < stamp.index("-e '.[test,bench]'")
    assert re.search(r"^lock:", makefile, re.MULTILINE) and "packaging/requirements.py --lock" in makefile


def test_the_package_installs_the_lock_with_hashes_required():
    rules = " ".join(_logical_lines(_read("packaging/debian/rules")))
    assert re.search(r"dh_virtualenv [^\n]*--requirements packaging/requirements\.lock [^\n]*"
                     r"--extra-pip-arg --require-hashes", rules)
    assert "pip check" in rules
    # what the package is built from (staged, and in its content hash) holds the lock
    assert re.search(r'^SOURCES="[^"]*\bpackaging/requirements\.lock\b', _read("packaging/deb/build"), re.MULTILINE)


def test_the_image_installs_the_lock_with_hashes_required():
    containerfile = _read("packaging/image/Containerfile")
    assert "COPY packaging/requirements.lock /tmp/requirements.lock" in containerfile
    assert "--require-hashes -r /tmp/requirements.lock" in containerfile
    assert "pip check" in containerfile
    assert re.search(r'^SOURCES="[^"]*\bpackaging/requirements\.lock\b', _read("packaging/image/build"), re.MULTILINE)


# -- the parser and the index filter ----------------------------------------------------------


_names = st.builds("{}{}".format, st.sampled_from(["numba", "py-yaml", "x", "a1"]), st.integers(0, 99))
_versions = st.lists(st.integers(0, 999), min_size=1, max_size=4).map(lambda parts: ".".join(map(str, parts)))
_hashes = st.lists(st.binary(min_size=32, max_size=32).map(bytes.hex), min_size=1, max_size=4, unique=True)


@settings(max_examples=examples(100))
@given(st.dictionaries(_names, st.tuples(_versions, _hashes), max_size=6))
def test_a_lock_as_make_lock_writes_it_reads_back_the_same(pins):
    text = "# a header\n# of comments\n" + "".join(
        f"{name}=={version} \\\n" + " \\\n".join(f"    --hash=sha256:{h}" for h in hashes) + "\n    # via x\n"
        for name, (version, hashes) in pins.items())
    assert requirements.parse_lock(text, "requirements.lock") == {name: (v, h) for name, (v, h) in pins.items()}


@pytest.mark.parametrize("text, line", [
    ("numba>=0.59 \\\n    --hash=sha256:" + "a" * 64 + "\n", 1),        # a range, not a pin
    ("# header\nnumba==0.68.1\n", 2),                                     # no hash
    ("numba==0.68.1 \\\n    --hash=sha256:" + "a" * 63 + "\n", 1),       # not a sha256
    ("numba==0.68.1 \\\n    --hash=md5:" + "a" * 32 + "\n", 1),           # another algorithm
    ("a==1 --hash=sha256:" + "a" * 64 + "\n\nA==2 --hash=sha256:" + "b" * 64 + "\n", 3),  # twice
    ("-e .\n", 1),
])
def test_anything_but_hashed_exact_pins_is_an_error_naming_the_file_and_line(tmp_path, text, line):
    path = tmp_path / "requirements.lock"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:{line}: "):
        requirements.read_lock(str(path))


def _file(filename: str, digest: str, yanked=False) -> dict:
    return {"filename": filename, "hashes": {"sha256": digest}, "yanked": yanked}


def test_the_hashes_are_of_the_versions_linux_wheels_and_sdist_only():
    h = [f"{i:064x}" for i in range(10)]
    files = [
        _file("numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", h[0]),
        _file("numpy-2.4.6-cp312-cp312-musllinux_1_2_aarch64.whl", h[1]),
        _file("numpy-2.4.6.tar.gz", h[2]),
        _file("numpy-2.4.6-cp311-cp311-macosx_14_0_arm64.whl", h[3]),     # another OS
        _file("numpy-2.4.6-cp311-cp311-win_amd64.whl", h[4]),
        _file("numpy-2.4.5-cp311-cp311-manylinux_2_28_x86_64.whl", h[5]),  # another version
        _file("numpy-2.4.6-cp313-cp313-manylinux_2_28_x86_64.whl", h[6], yanked="broken"),
        _file("numpy-2.4.6.zip", h[7]),                                     # no format pip takes here
        _file("not a file name.whl", h[8]),
        {"filename": "numpy-2.4.6-py3-none-any.whl", "hashes": {"sha256": "z" * 64}},  # not a sha256
        _file("numpyx-2.4.6-py3-none-any.whl", h[9]),                      # another distribution's
    ]
    assert requirements.linux_hashes(files, "numpy", "2.4.6") == sorted([h[0], h[1], h[2]])
    assert requirements.linux_hashes(files, "numpy", "2.4.5") == [h[5]]
    assert requirements.linux_hashes(files, "NumPy", "2.4.7") == []
    assert requirements.linux_hashes([_file("prometheus_client-0.26.0-py3-none-any.whl", h[9])],
                                     "prometheus-client", "0.26.0") == [h[9]]
