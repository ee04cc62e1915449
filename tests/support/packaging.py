"""A build script of packaging/ run where a test may change its recipe: a copy of the files
the image's and the package's builds read (git's view of the checkout, as packaging/stage.py
takes it), in a git repository of its own with no commit (so its revision is ``unknown``
whatever is edited), and stand-ins for the tools that would build (podman, mmdebstrap,
dpkg-buildpackage) that build nothing: what is left is the script's own work, the content
it names and whether it takes an earlier build for this one."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from support.paths import REPO_ROOT

#: what packaging/image/build and packaging/deb/build read from the checkout
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "noded", "resctrl", "mps", "config", "systemd",
                "integrations/slurm", "docs/runbook.md", "packaging")

#: stand-ins: podman knows no image (so each build goes on), mmdebstrap and podman build make
#: nothing; dpkg-buildpackage leaves an empty package where dpkg-buildpackage leaves one
STAND_INS = {
    "podman": "#!/bin/sh\nexit 0\n",
    "mmdebstrap": "#!/bin/sh\nexit 0\n",
    "dpkg-buildpackage": ("#!/bin/sh\nset -eu\n"
                          "version=$(sed -n '1s/^noded (\\(.*\\)).*/\\1/p' debian/changelog)\n"
                          ": > \"../noded_${version}_$(dpkg --print-architecture).deb\"\n"),
}


def checkout_copy(dest) -> str:
    """The build inputs copied into ``dest`` (a new git repository, nothing committed)."""
    listed = subprocess.run(["git", "-C", REPO_ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                             "--", *BUILD_INPUTS], capture_output=True, check=True, timeout=60).stdout
    for name in sorted({n.decode() for n in listed.split(b"\0") if n}):
        source = os.path.join(REPO_ROOT, name)
        if os.path.isfile(source) and not name.endswith("_revision.py"):
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(source, os.path.join(dest, name))
    subprocess.run(["git", "init", "-q", str(dest)], check=True, timeout=60)
    return str(dest)


def stand_ins(bin_dir) -> dict[str, str]:
    """An environment whose PATH finds the stand-ins first."""
    os.makedirs(bin_dir, exist_ok=True)
    for name, script in STAND_INS.items():
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(script)
        os.chmod(path, 0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def built_content(argv: list[str], env: dict[str, str], cwd: str) -> str:
    """Runs a build script; the content it says it built (it must have built, not reused)."""
    p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p
    found = re.findall(r": built \(content ([0-9a-f]+)\)$", p.stderr, re.MULTILINE)
    assert len(found) == 1, p
    return found[0]
