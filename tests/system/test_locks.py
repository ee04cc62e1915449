"""One noded per host, whatever its runtime directory (issue #11, item 7).

The lock guards what is shared (the resctrl mount, the cgroup roots): real flocks from
real processes, a holder SIGKILLed, lock files planted by another user, and a mount
that stays unmountable while it is locked.
"""

import os
import re
import signal
import stat
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from noded.stores.lockfile import AlreadyRunning, HostLock, InstanceLock, LockFileRefused, lock_name
from noded.stores.securedir import UnsafeDirectory

NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts, chown to another user")

HOLDER = """
import sys
from noded.stores.lockfile import HostLock
lock = HostLock(sys.argv[2:], lock_dir=sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()  # hold until the test closes stdin (or kills this process)
lock.release()
print("released", flush=True)
"""


class Holder:
    """Another process holding a HostLock."""

    def __init__(self, lock_dir, *resources):
        self.p = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock_dir), *map(str, resources)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()  # ends at the line or at EOF
        if line != "locked\n":
            self.p.kill()
            out, err = self.p.communicate(timeout=30)
            raise AssertionError(f"the holder did not lock: {line + out!r} {err!r}")

    def finish(self) -> str:
        out, err = self.p.communicate("", timeout=30)
        assert self.p.returncode == 0, err
        return out

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.communicate(timeout=30)


@pytest.fixture
def holders():
    started = []

    def start(*args):
        h = Holder(*args)
        started.append(h)
        return h

    yield start
    for h in started:
        if h.p.poll() is None:
            h.kill()


@pytest.fixture
def lock_dir(tmp_path):
    d = tmp_path / "lock"
    d.mkdir()
    d.chmod(0o1777)  # as /run/lock: shared, sticky
    return d


@pytest.fixture
def resource(tmp_path):
    d = tmp_path / "resctrl"
    d.mkdir()
    return d


def test_a_second_noded_fails_naming_the_resource_and_the_holders_pid(holders, lock_dir, resource):
    first = holders(lock_dir, resource)
    with pytest.raises(AlreadyRunning) as e:
        HostLock([str(resource)], lock_dir=str(lock_dir)).acquire()
    assert f"another noded (pid {first.p.pid}) holds {resource} (lock {lock_dir}/{lock_name(str(resource))})" \
        == str(e.value)
    assert first.finish() == "released\n"
    with HostLock([str(resource)], lock_dir=str(lock_dir)):
        pass


def test_the_lock_goes_with_a_killed_holder(holders, lock_dir, resource):
    first = holders(lock_dir, resource)
    first.kill()
    with HostLock([str(resource)], lock_dir=str(lock_dir)) as lock:
        path = lock.paths()[str(resource)]
        assert open(path).read() == f"{os.getpid()}\n"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_a_lock_file_is_left_in_place_and_says_nothing_once_released(lock_dir, resource):
    lock = HostLock([str(resource)], lock_dir=str(lock_dir)).acquire()
    path = lock.paths()[str(resource)]
    lock.release()
    assert os.path.exists(path) and open(path).read() == ""  # no stale pid for the next one to report


def test_the_lock_is_per_resource_and_whole_or_nothing(holders, lock_dir, tmp_path):
    resctrl, cgroups, other = tmp_path / "resctrl", tmp_path / "cpuset", tmp_path / "other"
    for d in (resctrl, cgroups, other):
        d.mkdir()
    holder = holders(lock_dir, cgroups)
    with HostLock([str(other)], lock_dir=str(lock_dir)):  # another resource: no conflict
        pass
    with pytest.raises(AlreadyRunning, match=f"pid {holder.p.pid}\\) holds {cgroups}"):
        HostLock([str(resctrl), str(cgroups)], lock_dir=str(lock_dir)).acquire()
    holders(lock_dir, resctrl).finish()  # the failed attempt kept nothing


def test_two_spellings_of_one_resource_take_one_lock(holders, lock_dir, resource, tmp_path):
    os.symlink(resource, tmp_path / "alias")
    first = holders(lock_dir, tmp_path / "alias")
    with pytest.raises(AlreadyRunning, match=f"pid {first.p.pid}"):
        HostLock([str(resource) + "/"], lock_dir=str(lock_dir)).acquire()


def test_the_instance_lock_still_holds_per_runtime_dir(tmp_path):
    with InstanceLock(str(tmp_path / "run")):
        with pytest.raises(AlreadyRunning, match=f"noded is already running on this host \\(pid {os.getpid()}; "
                                                 f"lock {tmp_path}/run/noded.pid\\)"):
            InstanceLock(str(tmp_path / "run")).acquire()


@ROOT_ONLY
def test_a_locked_resctrl_mount_can_still_be_unmounted(tmp_path, lock_dir):
    """No descriptor inside the mount, and not its root locked: umount must not say EBUSY."""
    mnt = tmp_path / "resctrl"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        with HostLock([str(mnt)], lock_dir=str(lock_dir)):
            r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# -- a lock file noded did not make is refused, and left as it is



def test_a_link_planted_as_the_lock_file_is_refused(lock_dir, resource, secret):
    planted = lock_dir / lock_name(str(resource))
    os.symlink(secret, planted)
    with pytest.raises(LockFileRefused, match=re.escape(f"lock file {planted} is a symbolic link")):
        HostLock([str(resource)], lock_dir=str(lock_dir)).acquire()
    assert secret.read_text() == "root's own data\n"


@ROOT_ONLY
def test_another_users_file_as_the_lock_file_is_refused(lock_dir, resource):
    planted = lock_dir / lock_name(str(resource))
    planted.write_text("theirs\n")
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(LockFileRefused, match="is owned by uid 65534, not by noded's uid 0"):
        HostLock([str(resource)], lock_dir=str(lock_dir)).acquire()
    assert planted.read_text() == "theirs\n"


def test_a_hard_link_to_another_file_as_the_lock_file_is_refused(lock_dir, resource, secret):
    os.link(secret, lock_dir / lock_name(str(resource)))
    with pytest.raises(LockFileRefused, match="has 2 links"):
        HostLock([str(resource)], lock_dir=str(lock_dir)).acquire()
    assert secret.read_text() == "root's own data\n"


def test_a_lock_dir_others_may_change_is_refused(tmp_path, resource):
    d = tmp_path / "lock"
    d.mkdir()
    d.chmod(0o777)  # not sticky: anyone could swap a lock file
    with pytest.raises(UnsafeDirectory, match=f"lock directory {d}: refused: {d} is writable by group and others"):
        HostLock([str(resource)], lock_dir=str(d)).acquire()
    with HostLock([str(resource)], lock_dir=str(tmp_path / "absent")):  # made, root's and 0755
        assert stat.S_IMODE(os.stat(tmp_path / "absent").st_mode) == 0o755


def test_the_default_lock_dir_is_one_only_root_may_write(resource):
    """/run/noded-locks: under /run, where no other user can plant a lock file before noded
    first starts (in the world-writable /run/lock anyone could, and keep noded out)."""
    with HostLock([str(resource)]) as lock:
        assert lock.paths()[str(resource)].startswith("/run/noded-locks/noded-")
        st = os.stat("/run/noded-locks")
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) & 0o022 == 0
    os.unlink(lock.paths()[str(resource)])


def test_run_lock_itself_is_accepted(resource):
    """The system's shared lock directory (root's, sticky, world-writable), where asked for."""
    if not os.path.isdir("/run/lock"):
        pytest.skip("this machine has no /run/lock")
    with HostLock([str(resource)], lock_dir="/run/lock") as lock:
        assert lock.paths()[str(resource)].startswith("/run/lock/noded-")
    os.unlink(lock.paths()[str(resource)])


def test_one_lock_per_filesystem_a_bind_mount_or_a_subtree_included(holders, lock_dir, tmp_path):
    a, b = tmp_path / "a", tmp_path / "a" / "below"
    b.mkdir(parents=True)
    with HostLock.for_filesystems([str(a)], lock_dir=str(lock_dir)):
        with pytest.raises(AlreadyRunning, match=f"holds {b} \\(the filesystem it is on"):
            HostLock.for_filesystems([str(b)], lock_dir=str(lock_dir)).acquire()


# -- names


def test_lock_names_escape_paths_as_systemd_does():
    assert lock_name("/sys/fs/resctrl") == "noded-sys-fs-resctrl.lock"
    assert lock_name("/sys/fs/cgroup/cpuset/") == "noded-sys-fs-cgroup-cpuset.lock"
    assert lock_name("/a-b") == "noded-a\\x2db.lock" != lock_name("/a/b")
    assert lock_name("/") == "noded--.lock"


paths = st.lists(st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1,
                         max_size=12).filter(lambda p: p not in (".", "..")), min_size=1, max_size=5).map(
    lambda parts: "/" + "/".join(parts))


@given(paths, paths)
def test_lock_names_are_file_names_and_tell_paths_apart(a, b):
    for p in (a, b):
        name = lock_name(p)
        assert "/" not in name and len(name.encode()) <= 255
    if os.path.normpath(a) != os.path.normpath(b) and max(len(a), len(b)) < 40:
        assert lock_name(a) != lock_name(b)


def test_disjoint_subtrees_of_one_filesystem_run_side_by_side_and_its_root_keeps_out_both(lock_dir, tmp_path):
    """Two simulated nodes' cgroups below one hierarchy are two things to guard; a noded on
    the whole hierarchy (a host's) conflicts with each, whichever starts first; two roots
    below one top directory are one."""
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(fs)], check=True)
    try:
        for d in ("a/x", "a/y", "b"):
            (fs / d).mkdir(parents=True)
        with HostLock.for_filesystems([str(fs / "a" / "x")], lock_dir=str(lock_dir)), \
                HostLock.for_filesystems([str(fs / "b")], lock_dir=str(lock_dir)):
            with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}, {os.getpid()}\\) holds {fs} \\(the filesystem"):
                HostLock.for_filesystems([str(fs)], lock_dir=str(lock_dir)).acquire()
            with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}\\) holds {fs / 'a' / 'y'}"):
                HostLock.for_filesystems([str(fs / "a" / "y")], lock_dir=str(lock_dir)).acquire()
        with HostLock.for_filesystems([str(fs)], lock_dir=str(lock_dir)):
            with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}\\) holds {fs / 'b'}"):
                HostLock.for_filesystems([str(fs / "b")], lock_dir=str(lock_dir)).acquire()
        # a holder killed leaves its pid in its subtree's lock file: not named once it is gone
        holder = HOLDER.replace("HostLock(", "HostLock.for_filesystems(")
        killed = subprocess.Popen([sys.executable, "-c", holder, str(lock_dir), str(fs / "b")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert killed.stdout.readline().strip() == "locked"
        killed.kill()
        killed.wait()
        with HostLock.for_filesystems([str(fs / "a" / "x")], lock_dir=str(lock_dir)):
            with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}\\) holds {fs} \\(the filesystem"):
                HostLock.for_filesystems([str(fs)], lock_dir=str(lock_dir)).acquire()
        # all released: each starts again
        HostLock.for_filesystems([str(fs / "b"), str(fs)], lock_dir=str(lock_dir)).acquire().release()
    finally:
        subprocess.run(["umount", str(fs)], check=True)
