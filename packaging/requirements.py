#!/usr/bin/env python3
"""The Python packages an installed noded needs, one a line (pip's requirements format),
from pyproject.toml: its dependencies without the simulation's. The simulated node and the
resctrl emulator (mfusepy, a binding over libfuse3) are no part of what runs on a host;
once pyproject.toml has them in the extra ``sim`` this leaves nothing out.

    python3 packaging/requirements.py [pyproject.toml] > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib

#: distributions only the simulation uses (nodesim, nodesim.resctrl_emulator)
SIMULATION_ONLY = frozenset({"mfusepy"})


def distribution(requirement: str) -> str:
    """A requirement's distribution name, normalised as PEP 503 says."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if name is None:
        raise ValueError(f"pyproject.toml: not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", name.group(1)).lower()


def runtime_requirements(pyproject: str) -> list[str]:
    with open(pyproject, "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return [d for d in deps if distribution(d) not in SIMULATION_ONLY]


if __name__ == "__main__":
    print("\n".join(runtime_requirements(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml")))
