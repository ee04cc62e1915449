"""noded's Debian package (issue #26, item 3): `make deb` builds it with dh-virtualenv; it
is installed, upgraded from version N to N+1, removed and purged in a throwaway root (a
minimal bookworm made by mmdebstrap, entered with chroot; never this machine's own root).

What an operator relies on, checked there: the unit where Debian's units are, pointing at
the package's commands; /etc/noded's files as conffiles, an edit kept across the upgrade
and the remove; the service neither enabled nor started on install (a job source must be
configured first), and `systemctl try-restart` on upgrade, so a running noded runs the new
version and a stopped one stays stopped; a purge removes the config and the state
directory; `noded --version` names the revision the package was built from.

The throwaway root is entered with chroot in a mount namespace of its own (its /proc is
mounted there, never on this machine). It has no systemd running: /run/systemd/system is made there (what the
maintainer scripts test for) and its systemctl is a recorder of what they ask of it.

Built packages are kept in build/packaging (a build of the same files at the same version
is reused), the root's tarball in the machine's cache (ROOT_CACHE), so a rerun takes well
under a minute; the first run builds one package and, at the same time, the root
(mmdebstrap waits on the mirror as much as it computes). The test's packages are not
compressed: gzip's level 0 (dpkg-deb's own DPKG_DEB_COMPRESSOR_LEVEL), which dpkg-deb takes
as its compressor none, not the product's default 9: the same files, in members control.tar
and data.tar where the product's are .tar.gz (what dpkg does with a package does not depend
on how its members are compressed). The venv's 280 MB took 41 s of a core at 9 and 6.5 s at
1 on this machine, and each of the test's two installs unpacked them again."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import struct
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from noded.util.buildinfo import revision
from noded.util.buildinfo import version
from support.packaging import built_content
from support.packaging import checkout_copy
from support.packaging import stand_ins

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/TIER/ up
CACHE = os.path.join(ROOT, "build", "packaging")
DEBDIR = os.path.join(CACHE, "deb-test")
#: where the throwaway root's tarball is kept: it is Debian's bookworm, nothing of this
#: checkout, so it is kept for the machine (as podman's store keeps the image's base), and a
#: fresh clone's run does not make it again (mmdebstrap: 46 s of a core and the mirror's time)
ROOT_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "noded-tests")
#: the throwaway root: bookworm's minbase, what the package depends on, and deb-systemd-helper
ROOT_PACKAGES = "python3,adduser,init-system-helpers"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
#: what the maintainer scripts find of systemd: a recorder (systemd does not run in a chroot)
SYSTEMCTL_RECORDER = """#!/bin/sh
echo "$*" >> /var/log/systemctl.calls
case "$1" in is-enabled) echo disabled; exit 1;; is-active) exit 3;; esac
exit 0
"""

# the packages built (the module's fixture) for the module's tests: one worker. A group of its
# own, not the image's: each build stages a tree of its own (mktemp under build/packaging), so
# the two build at once on two workers
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.xdist_group("deb"),
              pytest.mark.own_install]


def need_tools():
    missing = [t for t in ("mmdebstrap", "dh_virtualenv", "dpkg-buildpackage", "chroot", "unshare")
               if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (make system-deps installs them)")
    if os.geteuid() != 0:
        pytest.skip("chroot and mmdebstrap's root mode need root")


#: dpkg-deb's compression level for the test's packages (packaging/debian/rules names the
#: type, gzip; at 0 dpkg-deb uses none)
COMPRESSION_LEVEL = "0"


def build(deb_version: str) -> str:
    p = subprocess.run(["make", "-s", "deb", f"DEBDIR={DEBDIR}", f"DEB_VERSION={deb_version}"], cwd=ROOT,
                       env={**os.environ, "DPKG_DEB_COMPRESSOR_LEVEL": COMPRESSION_LEVEL},
                       capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stderr[-4000:]
    return os.path.join(ROOT, p.stdout.strip().splitlines()[-1])


def root_tarball() -> str:
    """bookworm's minbase with ROOT_PACKAGES, made once for each recipe on this machine
    (delete ROOT_CACHE's file to take Debian's updates)."""
    recipe = hashlib.sha256(f"{ROOT_PACKAGES} {MIRROR}".encode()).hexdigest()[:12]
    tarball = os.path.join(ROOT_CACHE, f"test-root-{recipe}.tar")
    if not os.path.exists(tarball):
        os.makedirs(ROOT_CACHE, exist_ok=True)
        making = f"{tarball}.{os.getpid()}.new"  # two runs at once (two clones) each make their own
        try:
            subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", "--format=tar", f"--include={ROOT_PACKAGES}",
                            "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
                            "bookworm", making, f"deb {MIRROR} bookworm main"], check=True, timeout=1200)
            os.rename(making, tarball)
        finally:
            if os.path.exists(making):
                os.unlink(making)
    return tarball


@pytest.fixture(scope="module")
def packages():
    """(N, N+1): a build of this checkout, and the same package at the next version. What an
    upgrade does (the maintainer scripts, conffiles, try-restart) does not depend on what the
    files hold, so N+1 is N repacked with its version raised (seconds, where a second
    dh-virtualenv build takes minutes). The throwaway root's tarball is made meanwhile, in
    a thread of its own."""
    need_tools()
    base = f"{version()}+test"
    with ThreadPoolExecutor(max_workers=1) as beside:
        tarball = beside.submit(root_tarball)
        first = build(f"{base}1-1")
        packages = first, next_version(first, f"{base}2-1")
        tarball.result()  # its failure is the fixture's
    return packages


def next_version(deb: str, new_version: str) -> str:
    """``deb`` repacked as ``new_version``: its control file's Version field changed,
    nothing else. Only the control member of the package's ar archive is written again;
    the data member (the venv's 280 MB) is copied as it is, where unpacking and packing
    it again took 5 s of a core and 11 s here."""
    out = os.path.join(os.path.dirname(deb), os.path.basename(deb).replace("1-1_", "2-1_"))
    assert out != deb, deb
    members = ar_members(deb)
    (control, content) = members[1]
    assert members[0][0] == "debian-binary" and control.startswith("control.tar"), [n for n, _ in members]
    members[1] = (control, with_version(content, control.removeprefix("control.tar").lstrip("."), new_version))
    write_ar(out, members)
    shown = subprocess.run(["dpkg-deb", "-f", out, "Version"], capture_output=True, text=True, check=True, timeout=60)
    assert shown.stdout.strip() == new_version, shown
    return out


#: an ar archive's magic and each member's header (name, mtime, uid, gid, mode, size, end)
AR_MAGIC = b"!<arch>\n"
AR_HEADER = struct.Struct("16s12s6s6s8s10s2s")


def ar_members(path: str) -> list[tuple[str, bytes]]:
    """The members of an ar archive (a .deb), in order: (name, content)."""
    with open(path, "rb") as f:
        assert f.read(len(AR_MAGIC)) == AR_MAGIC, path
        members = []
        while header := f.read(AR_HEADER.size):
            name, _, _, _, _, size, end = AR_HEADER.unpack(header)
            assert end == b"`\n", (path, header)
            members.append((name.decode().rstrip().rstrip("/"), f.read(int(size))))
            f.read(int(size) % 2)  # members start at even offsets
    return members


def write_ar(path: str, members: list[tuple[str, bytes]]) -> None:
    """An ar archive as dpkg-deb writes one: root's, mode 0644, time 0."""
    with open(path, "wb") as f:
        f.write(AR_MAGIC)
        for name, content in members:
            f.write(AR_HEADER.pack(name.encode().ljust(16), b"0".ljust(12), b"0".ljust(6), b"0".ljust(6),
                                   b"100644".ljust(8), str(len(content)).encode().ljust(10), b"`\n"))
            f.write(content + b"\n" * (len(content) % 2))


def with_version(control_tar: bytes, compression: str, new_version: str) -> bytes:
    """A package's control.tar (compressed as ``compression`` says: "" or gz, tarfile's
    names) with its control file's Version field ``new_version``; every other member,
    owner and mode as it was."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(control_tar), mode="r:*") as old, \
            tarfile.open(fileobj=out, mode=f"w:{compression}", format=old.format) as new:
        for member in old.getmembers():
            content = old.extractfile(member).read() if member.isfile() else None
            if member.name in ("./control", "control"):
                content = "".join(f"Version: {new_version}\n" if line.startswith("Version:") else line
                                  for line in content.decode().splitlines(keepends=True)).encode()
                member.size = len(content)
            new.addfile(member, io.BytesIO(content) if content is not None else None)
    return out.getvalue()


@pytest.fixture
def throwaway_root(tmp_path):
    need_tools()
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", root_tarball()], check=True, timeout=300)
    (root / "run" / "systemd" / "system").mkdir(parents=True)
    # dpkg without an fsync of each file it unpacks (as Debian's build chroots and mmdebstrap
    # itself run it): a root thrown away after the test needs no file on the disk at a crash,
    # and the venv's some 4000 files made dpkg wait on the disk for most of its time
    (root / "etc" / "dpkg" / "dpkg.cfg.d" / "unsafe-io").write_text("force-unsafe-io\n")
    systemctl = root / "usr" / "bin" / "systemctl"
    systemctl.write_text(SYSTEMCTL_RECORDER)
    systemctl.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def inside(root, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A command in the throwaway root, with a /proc of its own (noded reads
    /proc/self/mountinfo): mounted in a mount namespace that ends with the command, so
    nothing is mounted on this machine."""
    enter = 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
    p = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", enter, str(root), *argv],
                       capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    if check:
        assert p.returncode == 0, p
    return p


def put(root, deb: str) -> str:
    """The package inside the root, by a hard link where it can be (no 90 MB copy)."""
    target = root / "tmp" / os.path.basename(deb)
    try:
        os.link(deb, target)
    except OSError:
        shutil.copyfile(deb, target)
    return "/tmp/" + target.name


def systemctl_calls(root) -> list[str]:
    path = root / "var" / "log" / "systemctl.calls"
    calls = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return calls


def field(root, name: str) -> str:
    return inside(root, "dpkg-query", "--showformat", f"${{{name}}}", "--show", "noded", check=False).stdout


def test_install_upgrade_remove_and_purge_in_a_throwaway_root(packages, throwaway_root):
    n, n_plus_1 = packages
    root = throwaway_root

    # install N: files in the package's places, conffiles, a group, nothing started
    inside(root, "dpkg", "-i", put(root, n))
    assert field(root, "Version") == f"{version()}+test1-1"
    unit = (root / "lib" / "systemd" / "system" / "noded.service").read_text()
    assert "ExecStart=/usr/bin/noded run --config /etc/noded/noded.yaml" in unit
    assert "ExecStartPre=/usr/bin/noded check-config /etc/noded/noded.yaml" in unit
    assert "/usr/local/" not in unit
    conffiles = {line.split()[0] for line in field(root, "Conffiles").splitlines() if line.strip()}
    assert conffiles == {"/etc/noded/noded.yaml", "/etc/noded/slurm-hooks.conf"}
    assert inside(root, "getent", "group", "noded-admin").stdout.startswith("noded-admin:")
    assert inside(root, "noded", "--version").stdout == f"noded {version()} (revision {revision()})\n"
    assert inside(root, "nodectl", "--version").stdout == f"nodectl {version()} (revision {revision()})\n"
    checked = inside(root, "noded", "check-config", "/etc/noded/noded.yaml")
    assert checked.stdout == "/etc/noded/noded.yaml: ok\n"
    # the simulation's dependencies are not installed on a host
    assert inside(root, "/opt/venvs/noded/bin/python", "-c", "import mfusepy", check=False).returncode != 0
    calls = systemctl_calls(root)
    assert not [c for c in calls if c.split()[0] in ("start", "restart", "try-restart", "enable")], calls

    # the operator configures it, and noded keeps state
    config = root / "etc" / "noded" / "noded.yaml"
    config.write_text(config.read_text() + "\n# edited by the operator\n")
    state = root / "var" / "lib" / "noded"
    state.mkdir(mode=0o700)
    (state / "originals.json").write_text("{}\n")

    # upgrade to N+1: the running noded is restarted if it runs, the edited config kept
    inside(root, "dpkg", "-i", "--force-confold", put(root, n_plus_1))
    assert field(root, "Version") == f"{version()}+test2-1"
    calls = systemctl_calls(root)
    assert "try-restart noded.service" in calls, calls
    assert not [c for c in calls if c.split()[0] in ("start", "restart", "enable")], calls
    assert config.read_text().endswith("# edited by the operator\n")
    assert (state / "originals.json").exists()

    # remove: the code goes, the config and the state stay
    inside(root, "dpkg", "-r", "noded")
    assert not (root / "opt" / "venvs" / "noded").exists() and not (root / "usr" / "bin" / "noded").exists()
    assert not (root / "lib" / "systemd" / "system" / "noded.service").exists()
    assert config.read_text().endswith("# edited by the operator\n")
    assert (state / "originals.json").exists()

    # purge: the config and the state go too
    inside(root, "dpkg", "-P", "noded")
    assert not (root / "etc" / "noded").exists()
    assert not state.exists()
    assert inside(root, "dpkg-query", "-W", "noded", check=False).returncode != 0


def test_a_package_built_by_another_recipe_is_not_taken_for_this_ones(tmp_path):
    """The content a package names (make deb reuses one with the same Noded-Content-Hash)
    covers the recipe too: packaging/debian was among the sources, but not the script that
    writes the changelog and the fields (packaging/deb/build). Run in a copy, with a
    stand-in for dpkg-buildpackage (support.packaging)."""
    checkout = checkout_copy(tmp_path / "checkout")
    env = stand_ins(tmp_path / "bin")

    def content(outdir: str) -> str:
        return built_content([os.path.join(checkout, "packaging", "deb", "build"), str(tmp_path / outdir),
                              "0.1.0+test1-1"], env, checkout)

    first = content("a")
    assert content("b") == first  # the same recipe and sources: the same content
    with open(os.path.join(checkout, "packaging", "deb", "build"), "a") as f:
        f.write("# a change of the recipe\n")
    assert content("c") != first


def test_the_package_names_no_path_it_was_built_in(packages):
    """Two builds of one revision from two paths gave two packages (dpkg-deb -R trees
    diffed): pyvenv.cfg's command, noded's direct_url.json and each .pyc ensurepip compiled
    named the build's tree (build/packaging/deb-work.XXXXXX/...), and RECORD held the hashes
    of bin/'s scripts before their first line was rewritten. None of it is in the package
    now (packaging/debian/venv-independent-of-path), and every hash RECORD gives of a
    script is the script's."""
    data = dict(ar_members(packages[0]))["data.tar"]  # COMPRESSION_LEVEL 0: not compressed
    records, files = [], {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            assert "__pycache__" not in member.name and not member.name.endswith("direct_url.json"), member.name
            if member.isfile():
                content = tar.extractfile(member).read()
                assert b"/deb-work." not in content, member.name
                files[os.path.normpath(member.name)] = content
                if member.name.endswith(".dist-info/RECORD"):
                    records.append(os.path.normpath(member.name))
    checked = 0
    for record in records:
        site = os.path.dirname(os.path.dirname(record))
        for line in files[record].decode().splitlines():
            path, digest, _ = line.rsplit(",", 2)
            if path.startswith("..") and digest:
                content = files[os.path.normpath(os.path.join(site, path))]
                assert digest == "sha256=" + base64.urlsafe_b64encode(
                    hashlib.sha256(content).digest()).rstrip(b"=").decode(), (record, path)
                checked += 1
    assert checked >= 3  # bin/noded, bin/nodectl, numba's and numpy's scripts
