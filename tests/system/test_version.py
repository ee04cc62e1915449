"""Two builds of one version are told apart (issue #26, item 3): `--version` and
noded_build_info carry the source revision: from git where noded runs from a checkout,
baked into the tree a build packs (packaging/stage.py: the image, the Debian package, the
wheel: tests/integration/test_wheel.py installs `make wheel`'s and asks it), and
"unknown" otherwise; noded_build_info carries what was built only, and how a run was
started (throttle method, dry run) is in gauges of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from prometheus_client import generate_latest

from noded.util.buildinfo import version
from noded.loop.metrics import make_registry
from test_metrics import parse, value
from test_metrics_and_cli import fixed_daemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/TIER/ up


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=True).stdout.strip()


def checkout_revision() -> str:
    dirty = git("status", "--porcelain", "--untracked-files=no") != ""
    return git("rev-parse", "--short=12", "HEAD") + ("-dirty" if dirty else "")


def version_line(command: str, where: str) -> str:
    """`command --version` run with the noded package found in ``where`` only."""
    module = "noded" if command == "noded" else "noded.admin.nodectl"
    p = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60,
                       cwd=where, env={**os.environ, "PYTHONPATH": where})
    assert p.returncode == 0 and p.stderr == "", p
    return p.stdout


def test_from_a_checkout_both_commands_name_the_commit_they_run_from():
    # before: "noded 0.1.0", the same for every build of 0.1.0
    for command in ("noded", "nodectl"):
        assert version_line(command, ROOT) == f"{command} {version()} (revision {checkout_revision()})\n"


def test_a_staged_tree_carries_its_revision_where_no_git_is(tmp_path):
    staged = tmp_path / "staged"
    subprocess.run([sys.executable, os.path.join(ROOT, "packaging", "stage.py"), "tree", str(staged),
                    "noded", "pyproject.toml"], check=True, cwd=ROOT)
    assert not (staged / ".git").exists()
    assert version_line("noded", str(staged)) == f"noded {version()} (revision {checkout_revision()})\n"


def test_a_stale_revision_file_in_a_checkout_does_not_outrank_git(tmp_path):
    # a build left noded/util/_revision.py in the tree; the code has moved on since
    tree = tmp_path / "tree"
    shutil.copytree(os.path.join(ROOT, "noded"), tree / "noded", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "noded" / "util" / "_revision.py").write_text("REVISION = '0123456789ab'\n")
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True)
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert version_line("noded", str(tree)) == f"noded {version()} (revision {head})\n"


def test_without_git_or_a_baked_revision_it_says_unknown_and_a_malformed_one_is_not_believed(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(os.path.join(ROOT, "noded"), tree / "noded",
                    ignore=shutil.ignore_patterns("__pycache__", "_revision.py"))
    assert version_line("noded", str(tree)) == f"noded {version()} (revision unknown)\n"
    (tree / "noded" / "util" / "_revision.py").write_text("REVISION = 'abc\\nnoded_build_info{version=\"9\"} 1'\n")
    assert version_line("nodectl", str(tree)) == f"nodectl {version()} (revision unknown)\n"


def test_build_info_carries_the_revision_and_the_runs_settings_are_gauges_of_their_own():
    values, types = parse(generate_latest(make_registry(fixed_daemon())).decode())
    build = [labels for (name, labels) in values if name == "noded_build_info"]
    assert len(build) == 1
    labels = dict(build[0])
    # before: {dry_run, python, throttle, version}: a dry run's hosts counted as another build
    assert set(labels) == {"version", "revision", "python"}
    assert labels["revision"] == checkout_revision() and labels["version"] == version()
    assert value(values, "noded_throttle_method", method="mba") == 1
    assert value(values, "noded_dry_run") == 0
    assert types["noded_throttle_method"] == "gauge" and types["noded_dry_run"] == "gauge"


def stage_tree(dest, source_date_epoch: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "packaging", "stage.py"), "tree", str(dest),
                           "noded/util", "pyproject.toml"], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "SOURCE_DATE_EPOCH": source_date_epoch})


def test_an_empty_source_date_epoch_is_unset_and_a_malformed_one_fails_the_staging_by_name(tmp_path):
    # Before: an empty SOURCE_DATE_EPOCH (a CI's `SOURCE_DATE_EPOCH=$(git log ... )` in a
    # shallow checkout) crashed stage.py with int('')'s traceback; reproducible-builds.org's
    # specification: empty is not following it (the build's own choice), malformed fails.
    p = stage_tree(tmp_path / "empty", "")
    assert p.returncode == 0 and p.stderr == "", p
    assert (tmp_path / "empty" / "pyproject.toml").exists()
    p = stage_tree(tmp_path / "fixed", "1700000000")
    assert p.returncode == 0 and os.stat(tmp_path / "fixed" / "pyproject.toml").st_mtime == 1700000000
    before = tmp_path / "fixed"
    for bad in ("abc", "1.5", "-1", " 12", "١٢"):
        p = stage_tree(before, bad)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p
        assert p.stderr.startswith(f"stage.py: SOURCE_DATE_EPOCH={bad!r} is not a time"), p.stderr
        assert os.stat(before / "pyproject.toml").st_mtime == 1700000000  # nothing half-done: the tree as it was
