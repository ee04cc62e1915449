import os
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest

# The one-host Slurm harness (slurm_cluster, slurm_node) stays in tests/slurm/, where
# bench/slurm_latency.py finds it; its tests, in tests/integration/, import it from there.
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm"))

from support.host import CPUSET, UNIFIED
from support.waiting import wait_for

# the hooks and fixtures bench's tests share (numba's warm cache, the FUSE skip, the emulator)
pytest_plugins = ["support.plugin"]


def _printable(text: str) -> str:
    """``text`` with any lone surrogate (a non-UTF-8 name, decoded as the kernel's bytes are)
    spelled as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A report that the suite's workers (pytest-xdist) can send: their channel takes only
    strings that encode as UTF-8 (pytest-xdist issue 843), and the tests of non-UTF-8 cgroup
    names log and fail with such names. Spelled as escapes, as a terminal would need anyway."""
    outcome = yield
    report = outcome.get_result()
    report.sections = [(title, _printable(text)) for title, text in report.sections]
    if report.longrepr is not None:
        text = str(report.longrepr)
        if _printable(text) != text:
            report.longrepr = _printable(text)


@pytest.fixture
def harness(tmp_path):
    """Factory: harness(events, **kw) -> a support.eliminator.Harness (a simulated node and
    a daemon on it, ticked by the test); both stopped after the test."""
    from support.eliminator import Harness  # here: it imports the whole daemon (0.4 s a process)

    made = []

    def make(events, **kw):
        h = Harness(tmp_path, events, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        if h.sim.emu is not None:
            h.stop()


@pytest.fixture
def admin(tmp_path):
    """(a support.eliminator.Harness ticked by the test, an admin socket served over its
    daemon, the socket's WallClock); the socket in a directory anyone may traverse."""
    from noded.loop.overrides import OverrideStore
    from noded.admin.server import AdminServer
    from support.clocks import WallClock
    from support.eliminator import NLP_AND_HOG, Harness

    h = Harness(tmp_path, NLP_AND_HOG)
    clock = WallClock()
    store = OverrideStore(h.config.state_dir, clock)
    h.rebuild(overrides=store)
    # A directory anyone may traverse, as /run/noded is to the admin group: only the
    # socket's own mode and the peer check keep others out.
    rundir = tempfile.mkdtemp(prefix="noded-admin-")
    os.chmod(rundir, 0o755)
    server = AdminServer(os.path.join(rundir, "noded.sock"), h.daemon, group="root", timeout_s=0.5,
                         wall_clock=clock).start()
    yield h, server, clock
    server.stop()
    h.stop()
    shutil.rmtree(rundir, ignore_errors=True)


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
        if not os.path.isdir(path):
            continue  # the test removed it
        with open(f"{path}/cgroup.procs") as f:
            for pid in f.read().split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
        wait_for(lambda: open(f"{path}/cgroup.procs").read() == "", what=f"{path} to empty")
        os.rmdir(path)


@pytest.fixture
def v2_unified():
    """A private subtree of this machine's real cgroup v2 hierarchy, where it has one (a hybrid
    host's unified mount): ``(base, mkcg)``, ``mkcg(rel)`` making the cgroup ``base/rel``."""
    if not (os.path.exists(f"{UNIFIED}/cgroup.controllers") and os.access(UNIFIED, os.W_OK)):
        pytest.skip(f"no writable cgroup v2 hierarchy at {UNIFIED}")
    base = f"{UNIFIED}/noded-test-{uuid.uuid4().hex[:8]}"
    made = [base]
    os.mkdir(base)

    def mkcg(rel):
        path = os.path.join(base, rel)
        os.mkdir(path)
        made.append(path)
        return path

    yield base, mkcg
    for path in reversed(made):  # children first; a threaded child's processes are its domain's too
        if not os.path.isdir(path):
            continue  # the test removed it
        try:
            with open(f"{path}/cgroup.procs") as f:
                pids = f.read().split()
        except OSError:  # a threaded cgroup (EOPNOTSUPP): its domain lists them
            pids = []
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        wait_for(lambda: not _populated(path), what=f"{path} to empty")
        os.rmdir(path)


def _populated(path: str) -> bool:
    with open(f"{path}/cgroup.events") as f:
        return "populated 1" in f.read()


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


@pytest.fixture
def nvml_node(tmp_path, monkeypatch):
    """Three simulated GPUs published in shared memory; pynvml in this process loads the
    stand-in library (``support.nvml.load`` loads another build of it)."""
    from support.nvml import published_gpus

    yield from published_gpus(str(tmp_path / "nvml.shm"), monkeypatch)

