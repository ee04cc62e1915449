#!/usr/bin/env python3
"""The Python packages an installed noded needs, from pyproject.toml: its dependencies
without the simulation's. The simulated node and the resctrl emulator (mfusepy, a binding
over libfuse3) are no part of what runs on a host; once pyproject.toml has them in the
extra ``sim`` this leaves nothing out.

    python3 packaging/requirements.py [pyproject.toml] > requirements.txt
        the ranges, one a line (pip's requirements format)
    .venv/bin/python packaging/requirements.py --lock [pyproject.toml] > packaging/requirements.lock
        (make lock) the lock every install of noded uses: those requirements and everything
        they pull in, at the versions installed in the Python that runs this (the .venv the
        tests run in), each with the sha256 of its files on the package index

The lock's versions are read from the running Python's installed distributions, never
resolved afresh: it pins what the test suite ran against. Each version's hashes are those
the index lists for its files that a Linux host can install (its Linux and pure-Python
wheels, its sdist), from the index's simple API (PEP 691), the page pip itself reads:
``pip install --require-hashes -r`` then checks each file it downloads against them.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import sys
import tomllib
import urllib.request

#: distributions only the simulation uses (nodesim, nodesim.resctrl_emulator)
SIMULATION_ONLY = frozenset({"mfusepy"})

#: where ``--lock`` reads the files' hashes unless PIP_INDEX_URL names another index
DEFAULT_INDEX = "https://pypi.org/simple"
#: the most of an index page read (numpy's, some 4400 files: 2 MB)
MAX_PAGE_BYTES = 64 << 20

HEADER = """\
# noded's runtime dependencies and all they pull in, each at one version, with the sha256 of
# each of its files on the package index that a Linux host can install. `make deb`, `make
# install` and the image install from it alone (pip install --require-hashes -r), noded itself
# then with --no-deps; .venv is made with it as constraints (make deps), so the tests run
# against these very versions. Made by `make lock` (packaging/requirements.py --lock) from
# pyproject.toml's dependencies (not the simulation's) and the versions installed in .venv;
# to change a version: pip install it into .venv (or change pyproject.toml's range and
# reinstall), make lock, make test, commit both (docs/development.md). Do not edit by hand.
# Resolved on {python}; hashes from {index}.
"""


def distribution(requirement: str) -> str:
    """A requirement's distribution name, normalised as PEP 503 says."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if name is None:
        raise ValueError(f"pyproject.toml: not a requirement: {requirement!r}")
    return normalised(name.group(1))


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_requirements(pyproject: str) -> list[str]:
    with open(pyproject, "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return [d for d in deps if distribution(d) not in SIMULATION_ONLY]


# -- the lock file: reading it (the tests, anyone) -------------------------------------------

_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def read_lock(path: str) -> dict[str, tuple[str, list[str]]]:
    """A lock file's pins: normalised name -> (version, its sha256 hashes), read as pip reads
    a requirements file (comments from a # at a line's start or after a space; a backslash
    at a line's end continues it). Any requirement that is not an exact pin with at least
    one hash is an error naming the file and the line."""
    with open(path, encoding="utf-8") as f:
        return parse_lock(f.read(), path)


def parse_lock(content: str, path: str) -> dict[str, tuple[str, list[str]]]:
    """read_lock's parser, of the text of the file at ``path``."""
    pins: dict[str, tuple[str, list[str]]] = {}
    logical, first = "", 0
    physical = content.split("\n")
    for number, line in enumerate(physical + [""], 1):
        text = re.sub(r"(^|\s)#.*", "", line).strip()
        if not logical:
            first = number
        if text.endswith("\\"):
            logical += " " + text[:-1]
            continue
        logical, whole = "", (logical + " " + text).split()
        if not whole:
            continue
        where = f"{path}:{first}"
        pin = _PIN.fullmatch(whole[0])
        hashes = [_HASH.fullmatch(w) for w in whole[1:]]
        if pin is None or not hashes or not all(hashes):
            raise ValueError(f"{where}: not an exact pin (name==version) with its --hash=sha256: options: "
                             f"{' '.join(whole)[:200]!r}")
        name = normalised(pin.group(1))
        if name in pins:
            raise ValueError(f"{where}: {name} pinned twice")
        pins[name] = (pin.group(2), [h.group(1) for h in hashes])
    return pins


# -- making it (make lock) ------------------------------------------------------------------

def installed_closure(requirements: list[str]) -> dict[str, tuple[str, set[str]]]:
    """The running Python's installed distributions that ``requirements`` pull in, the
    requirements' own included: normalised name -> (installed version, who requires it).
    Each installed version must lie in every range that asks for it."""
    import importlib.metadata

    from packaging.requirements import Requirement

    found: dict[str, tuple[str, set[str]]] = {}
    queue = [(Requirement(r), "pyproject.toml") for r in requirements]
    while queue:
        req, by = queue.pop(0)
        name = normalised(req.name)
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"requirements.py --lock: {req} (required by {by}) is not installed in "
                             f"{sys.executable}: make lock reads the versions .venv has (make deps)") from None
        version = dist.version
        if not req.specifier.contains(version, prereleases=True):
            raise SystemExit(f"requirements.py --lock: {name} {version} in {sys.executable} is outside "
                             f"{req} (required by {by}): install a version in range, then make lock")
        if name in found:
            found[name][1].add(by)
            continue
        found[name] = (version, {by})
        for text in dist.requires or []:
            dep = Requirement(text)
            if dep.marker is not None and not any(dep.marker.evaluate({"extra": e}) for e in (req.extras or {""})):
                continue  # another platform's, or an extra nobody asked for
            queue.append((dep, name))
    return found


def index_hashes(index: str, name: str, version: str) -> list[str]:
    """The sha256 of each file of ``name`` ``version`` on the index that a Linux host can
    install: what pip verifies the file it downloads against."""
    url = f"{index.rstrip('/')}/{name}/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    cafile = os.environ.get("PIP_CERT") or None
    try:
        with urllib.request.urlopen(request, timeout=60, context=ssl.create_default_context(cafile=cafile)) as r:
            body = r.read(MAX_PAGE_BYTES + 1)
    except OSError as e:
        raise SystemExit(f"requirements.py --lock: {url}: {e}") from None
    if len(body) > MAX_PAGE_BYTES:
        raise SystemExit(f"requirements.py --lock: {url}: page over {MAX_PAGE_BYTES} bytes")
    try:
        files = json.loads(body)["files"]
        hashes = linux_hashes(files, name, version)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"requirements.py --lock: {url}: not the simple API's JSON (PEP 691): {e!r}") from None
    if not hashes:
        raise SystemExit(f"requirements.py --lock: {url} lists no file of {name} {version} a Linux host can install")
    return hashes


def linux_hashes(files: list[dict], name: str, version: str) -> list[str]:
    """Of a simple API page's ``files``: the sha256 of each of ``name`` ``version``'s that a
    Linux host can install (a wheel for Linux or any platform, the sdist), not yanked, sorted."""
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, \
        parse_wheel_filename
    from packaging.version import InvalidVersion, Version

    wanted = Version(version)
    hashes = set()
    for f in files:
        filename, digest = f.get("filename", ""), f.get("hashes", {}).get("sha256")
        if f.get("yanked") or not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            continue
        try:
            if filename.endswith(".whl"):
                n, v, _, tags = parse_wheel_filename(filename)
                if not any(t.platform == "any" or t.platform.startswith(("manylinux", "musllinux", "linux"))
                           for t in tags):
                    continue
            elif filename.endswith(".tar.gz"):
                n, v = parse_sdist_filename(filename)
            else:
                continue
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        if v == wanted and normalised(n) == normalised(name):
            hashes.add(digest)
    return sorted(hashes)


def lock_text(pyproject: str, index: str) -> str:
    found = installed_closure(runtime_requirements(pyproject))
    python = f"{sys.implementation.name} {'.'.join(map(str, sys.version_info[:2]))} {sys.platform} {os.uname().machine}"
    lines = [HEADER.format(python=python, index=index)]
    for name in sorted(found):
        version, by = found[name]
        hashes = index_hashes(index, name, version)
        lines.append(f"{name}=={version} \\\n" + " \\\n".join(f"    --hash=sha256:{h}" for h in hashes) + "\n")
        lines.append(f"    # via {', '.join(sorted(by))}\n")
    return "".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--lock"]:
        sys.stdout.write(lock_text(args[1] if len(args) > 1 else "pyproject.toml",
                                   os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX))
    else:
        print("\n".join(runtime_requirements(args[0] if args else "pyproject.toml")))
