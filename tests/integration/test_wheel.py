"""noded installed from its wheel (issue #24, item 4): the wheel carries the stand-in NVML
library's C source, an installed `noded run --sim` builds it at first use into the user's
cache and runs, from outside any checkout; without a compiler the error names the compiler,
and `noded run --sim` reports the node's real failure (its exit status and last words), at
once, not a 60 s wait."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile

import pytest
from support.system import CPUSET, REPO

from support.host import skip_if_another_noded

from noded.util.buildinfo import version

pytestmark = [pytest.mark.fuse, pytest.mark.slow, pytest.mark.own_install,
              pytest.mark.xdist_group("wheel"),  # one wheel built and installed (its fixture), so one worker
              pytest.mark.skipif(not os.path.isdir(CPUSET), reason="no v1 cpuset hierarchy")]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh virtual environment with noded's wheel installed (no dependencies: it sees
    the test environment's site-packages for those); its ``noded`` command. noded's wheel
    is `make wheel`'s (the product's: built from a staged tree of the files git tracks, so
    no build output of the checkout, build/nvml, may make up for what the wheel lacks, with
    the revision baked in); the simulated node's is built from a copy of sim/ (setuptools
    writes its egg-info into the tree it builds)."""
    tmp = tmp_path_factory.mktemp("wheel")
    made = subprocess.run(["make", "-s", "wheel", f"PYTHON={sys.executable}", f"WHEELDIR={tmp}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    if made.returncode != 0 and "matching distribution" in made.stderr:
        pytest.skip(f"pip cannot fetch the build backend (no package index?): {made.stderr.strip()[-300:]}")
    assert made.returncode == 0, made.stderr
    source = tmp / "sim-source"
    shutil.copytree(os.path.join(REPO, "sim"), source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    # the product and the simulated node are two wheels: a host installs only the first
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(tmp)],
                           env=outside_checkout(tmp), capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = [f for f in os.listdir(tmp) if f.startswith("noded-") and f.endswith(".whl")]
    (sim_wheel,) = [f for f in os.listdir(tmp) if f.startswith("noded_sim-") and f.endswith(".whl")]
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "test-dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")  # the dependencies, not noded: only its wheel
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q",
                    str(tmp / wheel), str(tmp / sim_wheel)], env=outside_checkout(tmp), check=True, timeout=120)
    assert os.path.exists(venv / "bin" / "noded")
    return {"wheel": str(tmp / wheel), "sim_wheel": str(tmp / sim_wheel), "noded": str(venv / "bin" / "noded"),
            "dir": tmp}


def test_the_product_wheel_carries_no_simulation_and_no_fuse(installed):
    """A GPU host installs noded's wheel alone: no simulated node, no resctrl emulator, no
    mfusepy; the simulation is its own wheel."""
    with zipfile.ZipFile(installed["wheel"]) as whl:
        names = whl.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line for line in whl.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    assert not [n for n in names if n.startswith("nodesim/") or "emulator" in n], names
    assert not [r for r in requires if "fuse" in r.lower()], requires



def test_the_installed_wheel_names_the_revision_it_was_built_from(installed, tmp_path):
    """`make wheel` bakes the checkout's revision into the tree it packs: noded and nodectl
    installed from it, away from any checkout, name it (from test_version, whose own build
    of the same wheel this one replaces)."""
    bin_dir = os.path.dirname(installed["noded"])
    for command in ("noded", "nodectl"):
        p = subprocess.run([os.path.join(bin_dir, command), "--version"], cwd=tmp_path, env=outside_checkout(tmp_path),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stderr == "", p
        assert p.stdout == f"{command} {version()} (revision {checkout_revision()})\n"


def checkout_revision() -> str:
    """The checkout's commit, as noded's build info spells it (-dirty where a tracked file
    differs from it)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, check=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no") != ""
    return git("rev-parse", "--short=12", "HEAD") + ("-dirty" if dirty else "")


def outside_checkout(tmp_path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "NODED_SIM_NVML")}
    return {**env, "XDG_CACHE_HOME": str(tmp_path / "cache"), **extra}


def scenario_here(tmp_path) -> tuple[str, str]:
    for name in ("contention.yaml", "demo-config.yaml"):
        shutil.copy(os.path.join(REPO, "scenarios", name), tmp_path / name)
    return str(tmp_path / "contention.yaml"), str(tmp_path / "demo-config.yaml")


def test_the_sim_wheel_carries_the_stand_in_librarys_source(installed):
    names = zipfile.ZipFile(installed["sim_wheel"]).namelist()
    for source in ("simnvml.c", "processes.c", "monitoring.c", "simnvml.h", "internal.h"):
        assert f"nodesim/nvml_native/{source}" in names


def test_an_installed_noded_run_sim_builds_the_library_at_first_use_and_ticks(installed, tmp_path):
    scenario, config = scenario_here(tmp_path)
    done = subprocess.run([installed["noded"], "run", "--sim", scenario, "--config", config, "--duration", "3"],
                          cwd=tmp_path, env=outside_checkout(tmp_path), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        skip_if_another_noded(done.stderr)
    assert done.returncode == 0, done.stderr
    assert "noded: metrics at http://" in done.stdout and "t=" in done.stdout  # the daemon, then the node's ticks
    assert "bert[gpu] util" in done.stdout
    assert os.path.isfile(tmp_path / "cache" / "noded" / "nvml" / "current" / "libnvidia-ml.so.1")


def test_without_a_compiler_the_error_names_it_and_run_sim_reports_the_nodes_failure_at_once(installed, tmp_path):
    scenario, config = scenario_here(tmp_path)
    env = outside_checkout(tmp_path, CC="no-such-cc")
    node = subprocess.run([installed["noded"], "sim-node", scenario], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert node.returncode == 2 and "Traceback" not in node.stderr
    assert "no C compiler 'no-such-cc' on PATH" in node.stderr
    t0 = time.monotonic()
    run = subprocess.run([installed["noded"], "run", "--sim", scenario, "--config", config], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert run.returncode == 2 and took < 30, (took, run.stderr)
    said = run.stderr
    assert "the simulated node exited before it was ready (exit status 2)" in said, said
    assert "no C compiler 'no-such-cc' on PATH" in said and "Traceback" not in said
