import os
import re
import shutil
import subprocess
import time
import uuid

import pytest

from bench.timing import wait_for  # noqa: F401 (the tests import it from here)
from resctrl import Resctrl
from nodesim.resctrl_emulator import MountedEmulator

FUSE_MISSING = None
if not os.path.exists("/dev/fuse"):
    FUSE_MISSING = "/dev/fuse is absent on this machine"
elif shutil.which("fusermount3") is None:
    FUSE_MISSING = "fusermount3 (Debian package fuse3) is not installed"


def noded_lock_holder(*paths: str) -> str | None:
    """Why a noded that a test starts on ``paths`` (the cgroup roots and resctrl mount of its
    config) could not run now: the host-wide lock's own message, naming the other noded's
    pid; None where nothing holds it. Asked as noded asks (a non-blocking flock, let go at
    once), so that a test that needs the lock skips at once instead of failing its start."""
    from noded.stores.lockfile import AlreadyRunning, HostLock

    try:
        HostLock.for_filesystems(list(paths)).acquire().release()
    except AlreadyRunning as e:
        return str(e)
    return None


def skip_if_another_noded(output: str) -> None:
    """Skips the test where a noded it started refused to run beside another one (its
    output says whose pid holds the lock)."""
    held = re.search(r"another noded \(pid [^)]*\) holds [^\n]*", output)
    if held:
        pytest.skip(f"needs the host-wide noded lock: {held.group(0)}")


def pytest_collection_modifyitems(config, items):
    if FUSE_MISSING is None:
        return
    skip = pytest.mark.skip(reason=f"needs FUSE: {FUSE_MISSING}")
    for item in items:
        if "fuse" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def emulator(tmp_path):
    """Factory: emulator(profile, *extra_args) -> a mounted MountedEmulator, unmounted after the test."""
    started = []

    def start(profile="intel", *extra_args):
        emu = MountedEmulator(profile, workdir=str(tmp_path / f"emu{len(started)}"), extra_args=list(extra_args))
        started.append(emu)
        return emu.start()

    yield start
    for emu in started:
        emu.stop()


@pytest.fixture
def open_resctrl():
    def _open(emu, **kw):
        return Resctrl.open(emu.root, mounts=emu.mounts_file, **kw)

    return _open


@pytest.fixture
def sleeper():
    """Factory for real placeholder processes, killed after the test."""
    procs = []

    def start(*args):
        p = subprocess.Popen(list(args) or ["sleep", "300"])
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


_readers: dict[int, tuple] = {}


def rebuilt(daemon, **parts):
    """``daemon`` built again from its parts but ``parts`` (a co-location, an overrides' store
    with the test's clock ...), as the wiring would have built it: nothing is set on a Daemon
    once built. The new daemon starts afresh (it has not ticked)."""
    import dataclasses

    from noded.loop.daemon import Daemon

    return Daemon(daemon.config, dataclasses.replace(daemon.parts, **parts), clock=daemon.clock,
                  extra_info=daemon.extra_info)


def read_until(stream, text, what, timeout=30.0):
    """The next line of a process's output holding ``text``. Fails at EOF or at the
    deadline with everything read so far: a reader never spins on EOF nor waits forever.
    (A thread per stream feeds a queue, so lines Python has buffered are never missed.)"""
    import queue
    import threading

    if id(stream) not in _readers:
        q: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [q.put(line) for line in iter(stream.readline, "")] + [q.put(None)],
                         daemon=True).start()
        _readers[id(stream)] = (stream, q, [])
    _, q, seen = _readers[id(stream)]
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = q.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {what} within {timeout}s; output so far:\n{''.join(seen)}") from None
        if line is None:
            q.put(None)
            raise AssertionError(f"the process ended before {what}; its output:\n{''.join(seen)}")
        seen.append(line)
        if text in line:
            return line


@pytest.fixture
def sim_gpus(tmp_path):
    """Two simulated GPUs that this process's pynvml sees through the stand-in library, for
    the length of a test (``publish`` after changing them; ``compute_mode(i)`` is NVML's)."""
    from nodesim.gpus import SimGpus, make_gpus

    gpus = SimGpus(str(tmp_path / "nvml.shm"), make_gpus(2))
    gpus.install()
    yield gpus
    gpus.close()


@pytest.fixture
def secret(tmp_path):
    """A root-only file that a planted link points at; it must never change."""
    path = tmp_path / "secret"
    path.write_text("root's own data\n")
    path.chmod(0o600)
    return path


def unix_exchange(path, payload: bytes, timeout=5.0) -> bytes:
    """Send raw bytes to a Unix stream socket; what comes back up to a newline or the close."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(payload)
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return buf


class NotifySocket:
    """The datagram socket systemd would give noded (NOTIFY_SOCKET)."""

    def __init__(self, path):
        import socket

        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(30)

    def recv(self) -> dict[str, str]:
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines())

    def until(self, key, value=None) -> dict[str, str]:
        """The next message with ``key`` (equal to ``value``, if given)."""
        while True:
            message = self.recv()
            if key in message and (value is None or message[key] == value):
                return message

    def ready(self) -> dict[str, str]:
        """The READY message (before it: STATUS=starting, as the handlers are installed)."""
        while True:
            message = self.recv()
            if "READY" in message:
                return message
            assert message == {"STATUS": "starting"}, message

    def close(self):
        self.sock.close()


CPUSET = "/sys/fs/cgroup/cpuset"


@pytest.fixture
def v1_cpuset():
    """A private subtree of this machine's real cgroup v1 cpuset hierarchy."""
    if not os.access(CPUSET, os.W_OK):
        pytest.skip(f"{CPUSET} is not writable here")
    base = f"{CPUSET}/noded-test-{uuid.uuid4().hex[:8]}"
    made = []

    def mkcg(rel):
        path = base
        for part in [""] + rel.split("/"):
            path = os.path.join(path, part) if part else path
            if not os.path.isdir(path):
                os.mkdir(path)
                made.append(path)
                parent = os.path.dirname(path)
                for f in ("cpuset.cpus", "cpuset.mems"):
                    with open(f"{parent}/{f}") as src, open(f"{path}/{f}", "w") as dst:
                        dst.write(src.read())
        return path

    yield base, mkcg
    for path in reversed(made):
        with open(f"{path}/cgroup.procs") as f:
            for pid in f.read().split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
        wait_for(lambda: open(f"{path}/cgroup.procs").read() == "", what=f"{path} to empty")
        os.rmdir(path)


@pytest.fixture
def root_logging():
    """For a test that configures the root logger (noded.util.journal.configure_logging): puts
    its level and handlers back afterwards."""
    import logging

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for h in root.handlers:
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)


@pytest.fixture
def admin_socket(tmp_path):
    """serve(last, rightsize=None) -> an admin socket served as noded serves it, over a last
    tick the test sets (``.path``, ``.daemon``), with a fixed wall clock and the right-sizing
    service given; stopped after the test."""
    from types import SimpleNamespace

    from noded.loop.overrides import OverrideStore
    from noded.admin.server import AdminServer
    from noded.loop.control import ControlState

    servers = []

    def serve(last, rightsize=None):
        clock = lambda: 1_700_000_000.0  # noqa: E731
        daemon = SimpleNamespace(control=ControlState(OverrideStore(str(tmp_path / "state"), clock)), last=last,
                                 parts=SimpleNamespace(colocation=None, rightsize=rightsize), last_failure=None,
                                 failures_in_a_row=0)
        os.chmod(tmp_path, 0o755)
        # a socket of its own for each server: noded never takes over a socket another listens on
        name = f"noded-{len(servers)}.sock" if servers else "noded.sock"
        server = AdminServer(str(tmp_path / name), daemon, group=None, timeout_s=2, wall_clock=clock).start()
        servers.append(server)
        return SimpleNamespace(path=server.path, daemon=daemon)

    yield serve
    for server in servers:
        server.stop()


def nodectl_run(path, *argv, capsys):
    """(exit code, stdout, stderr) of nodectl against the socket at ``path``."""
    from noded.admin import nodectl

    code = nodectl.main(["--socket", path, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def tmpfs(tmp_path):
    """Factory: tmpfs(size="256k", name=None, read_only=False) -> a freshly mounted tmpfs
    directory (mode 0700) under tmp_path; unmounted after the test."""
    mounted = []

    def mount(size="256k", name=None, read_only=False):
        where = tmp_path / (name or f"mnt{len(mounted)}")
        where.mkdir()
        options = f"size={size},mode=0700" + (",ro" if read_only else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        if subprocess.run(["umount", str(where)], capture_output=True, text=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)
