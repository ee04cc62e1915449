"""The DaemonSet's image (issue #26, item 2): `make image` builds it from this checkout with
Debian's tools (a base made by mmdebstrap, podman), tagged with the version and the
revision; integrations/kubernetes names the tag it builds; inside it `noded --version`
names the revision and `noded check-config` passes the DaemonSet's own config, on a
read-only root as the DaemonSet runs it. A build of the same files is reused (make skips
it), so a rerun takes seconds; the first build takes minutes (the base, then the
dependencies from PyPI)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from noded.util.buildinfo import revision
from noded.util.buildinfo import version
from support.packaging import built_content
from support.packaging import checkout_copy
from support.packaging import stand_ins

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/TIER/ up
PODMAN = os.path.join(ROOT, "packaging", "image", "podman")
KUBERNETES = os.path.join(ROOT, "integrations", "kubernetes")
#: the image's name in this checkout's tests: the host has one IMAGE:VERSION tag, and another
#: checkout building the default name at the same time would retag it under this one's tests
TEST_IMAGE = f"localhost/noded-test-{hashlib.sha256(ROOT.encode()).hexdigest()[:12]}"


def default_image() -> str:
    """The name `make image` builds by default (the Makefile's IMAGE)."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        return re.search(r"^IMAGE \?= (\S+)$", f.read(), re.MULTILINE).group(1)


def daemonset_config() -> str:
    """The DaemonSet's noded.yaml for this host's cgroups: the base's on cgroup v2, the
    v1 overlay's on v1 (its job source is a v1 hierarchy)."""
    v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    return os.path.join(KUBERNETES, "base" if v2 else "overlays/cgroup-v1", "noded.yaml")

# one image built (the module's fixture) for the module's tests: one worker. A group of its own,
# not the package's: each build stages a tree of its own (mktemp under build/packaging), so
# the two build at once on two workers
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.xdist_group("image"),
              pytest.mark.own_install]


@pytest.fixture(scope="module")
def image() -> str:
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (make system-deps installs them)")
    if os.geteuid() != 0:
        pytest.skip("podman's rootful store and mmdebstrap's root mode need root")
    p = subprocess.run(["make", "-s", "image", f"IMAGE={TEST_IMAGE}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=1400)
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stdout.strip().splitlines()[-1]


def in_image(tag: str, *argv: str, volumes: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """A command in a container of the image as the DaemonSet runs it: read-only root, no
    network (none is needed for these)."""
    args = [arg for v in volumes for arg in ("--volume", v)]
    return subprocess.run([PODMAN, "run", "--rm", "--network=none", "--read-only", *args, tag, *argv],
                          capture_output=True, text=True, timeout=120)


def test_make_image_tags_the_version_and_the_revision_and_the_daemonset_names_that_image(image):
    name, tag = image.rsplit(":", 1)
    assert (name, tag) == (TEST_IMAGE, f"{version()}-{revision()}")
    with open(os.path.join(KUBERNETES, "base", "kustomization.yaml")) as f:
        (entry,) = [i for i in yaml.safe_load(f)["images"] if i["name"] == "noded"]
    # before: `noded:0.1.0`, an image nothing in the repository built
    assert (entry["newName"], entry["newTag"]) == (default_image(), version())
    labels = json.loads(subprocess.run(["podman", "image", "inspect", f"{name}:{version()}"], capture_output=True,
                                       text=True, check=True).stdout)[0]["Labels"]
    assert labels["org.opencontainers.image.revision"] == revision()
    assert labels["org.opencontainers.image.version"] == version()
    base = json.loads(subprocess.run(["podman", "image", "inspect", "localhost/noded-base:bookworm"],
                                     capture_output=True, text=True, check=True).stdout)[0]
    assert labels["noded.base-image-id"] == base["Id"]  # built FROM that very base, by its ID


def test_noded_and_nodectl_in_the_image_name_the_revision_it_was_built_from(image):
    for command in ("noded", "nodectl"):
        p = in_image(image, command, "--version")
        assert p.returncode == 0 and p.stdout == f"{command} {version()} (revision {revision()})\n", p


def test_the_daemonsets_config_and_the_images_default_pass_check_config_in_the_image(image, tmp_path):
    # the writable directories the DaemonSet's hostPath volumes give a read-only root (its
    # state_dir and runtime_dir: check-config refuses one it would have to create there)
    writable = []
    for where in ("/var/lib/noded", "/run/noded"):
        host = tmp_path / where.strip("/").replace("/", "-")
        host.mkdir()
        writable.append(f"{host}:{where}")
    # the host's cgroup tree as the DaemonSet's hostPath volume gives it (its job source is checked there)
    p = in_image(image, "noded", "check-config", "/etc/noded/noded.yaml",
                 volumes=(f"{daemonset_config()}:/etc/noded/noded.yaml:ro", "/sys/fs/cgroup:/sys/fs/cgroup:ro,rbind",
                          *writable))
    assert p.returncode == 0 and p.stdout == "/etc/noded/noded.yaml: ok\n", p
    p = in_image(image, "noded", "check-config", "/etc/noded/noded.yaml", volumes=tuple(writable))
    assert p.returncode == 0 and p.stdout == "/etc/noded/noded.yaml: ok\n", p
    # the default has no job source: said, not silently accepted
    assert "no job source configured" in p.stderr
    # without those volumes, the read-only root is said, naming the key
    p = in_image(image, "noded", "check-config", "/etc/noded/noded.yaml")
    assert p.returncode != 0 and "state_dir" in p.stdout + p.stderr, p


def test_the_image_holds_the_product_only_not_the_simulations_dependencies(image):
    p = in_image(image, "python3", "-c", "import importlib.util as u, sys; "
                 "sys.exit(u.find_spec('mfusepy') is not None or u.find_spec('matplotlib') is not None)")
    assert p.returncode == 0, p
    # the commands the DaemonSet and an operator run are on PATH
    p = in_image(image, "sh", "-c", "command -v noded; command -v nodectl")
    assert p.stdout.split() == ["/opt/noded/bin/noded", "/opt/noded/bin/nodectl"], p


def test_an_image_built_by_another_recipe_or_base_is_not_taken_for_this_ones(tmp_path):
    """The content an image is labelled with (make image reuses one with the same label)
    covers the recipe too: before, only the sources, so after an edit of the Containerfile
    (or of the base's script) in a tree already dirty, make image said "built already" and
    tagged the image of the old recipe. And the base image it is built on, by its ID: before,
    after the base was made again (a later mmdebstrap, the same recipe) make image kept the
    image on the old base. Run in a copy, with stand-ins for podman and mmdebstrap
    (support.packaging); podman's names the base's ID from $STANDIN_BASE_ID."""
    checkout = checkout_copy(tmp_path / "checkout")
    env = stand_ins(tmp_path / "bin")
    with open(tmp_path / "bin" / "podman", "w") as f:
        f.write('#!/bin/sh\ncase "$*" in *"{{.Id}}"*) echo "$STANDIN_BASE_ID" ;; esac\nexit 0\n')
    build = [os.path.join(checkout, "packaging", "image", "build")]
    base_a, base_b = {**env, "STANDIN_BASE_ID": "a" * 64}, {**env, "STANDIN_BASE_ID": "b" * 64}
    first = built_content(build, base_a, checkout)
    assert built_content(build, base_a, checkout) == first  # the same recipe, sources and base: the same content
    assert built_content(build, base_b, checkout) != first  # the base made again
    with open(os.path.join(checkout, "packaging", "image", "Containerfile"), "a") as f:
        f.write("LABEL a.recipe.change=1\n")
    assert built_content(build, base_a, checkout) != first
