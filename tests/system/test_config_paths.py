"""Config keys that name paths are checked like paths (issue #22, item 5).

Seen before: ``colocation.mps.pipe_dir`` naming an existing directory had it emptied at
start and removed at stop; a pipe_dir equal to state_dir deleted noded's own state;
``admin.socket`` naming an existing file unlinked it; an admin socket at the report
socket's path became the 0666 report socket. check-config passed all four. Now noded
removes only what it made (the pipe directory recorded in its state before it is made,
a socket only where no process listens on it, and at stop only the one it bound), and
every path key is checked against the others and the kernel's trees by one function
(noded.commands.hostcheck, for check-config and run alike).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mps.control import MpsControl, made_dir_key
from mps.errors import MpsError
from support.mps import STANDIN, end_serving, processes_serving
from support.in_process import noded_in_process
from noded import config as config_module
from noded.admin.server import AdminServer, SocketPathError
from noded.config import Config, parse_config
from noded.commands.configpaths import named_paths, overlap_problems
from noded.stores.originals import OriginalValues

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPUSET = "/sys/fs/cgroup/cpuset"


def noded(*args: str, env=None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "noded", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


def write_config(tmp_path, text: str, name="c.yaml"):
    """A config of ``text``, its state and runtime directories in ``tmp_path`` unless it names them."""
    base = {"state_dir": f"{tmp_path}/state", "runtime_dir": f"{tmp_path}/run", "nvml": "false",
            "metrics": "{address: 127.0.0.1, port: 0}"}
    path = tmp_path / name
    path.write_text("".join(f"{k}: {v}\n" for k, v in base.items() if f"{k}:" not in text) + text)
    return path


def line_of(path, key: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if f"{key}:" in line)


def refused(p: subprocess.CompletedProcess, *expected: str) -> None:
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "Traceback" not in out, out
    for e in expected:
        assert e in p.stderr, out


def tree(path) -> dict[str, bytes]:
    """Every file under ``path`` and its content."""
    out = {}
    for top, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(top, f), "rb") as fh:
                out[os.path.relpath(os.path.join(top, f), path)] = fh.read()
    return out


# ------------------------------------------------------------ every path key, one function


def _path_fields(cls, prefix=""):
    """Dotted keys of every str field of the config's dataclasses whose name says it is a path."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if dataclasses.is_dataclass(tp):
            yield from _path_fields(tp, key + ".")
        elif typing.get_origin(tp) is tuple and inner and dataclasses.is_dataclass(inner[0]):
            yield from _path_fields(inner[0], key + ".")
        elif (tp is str or str in inner) and f.name.endswith(("dir", "root", "socket", "labels", "profiles",
                                                               "control", "mounts")):
            yield key


def test_every_key_that_names_a_path_is_checked_as_one():
    keys = set(_path_fields(Config))
    assert keys == set(config_module._PATH_KEYS)  # each is absolute and normalised (noded.config)
    everything = parse_config(
        "state_dir: /s\nruntime_dir: /r\nadmin: {socket: /a/admin.sock}\n"
        "resctrl: {root: /res, mounts: /m}\n"
        "jobs: {labels: /l.yaml, sources: [{kind: cgroup, root: /cg, patterns: [x]}]}\n"
        "colocation: {enabled: true, profiles: /p.yaml, mps: {control: /bin/c, pipe_dir: /pipe, log_dir: /log}}\n")
    named = {p.key.replace("[0]", "") for p in named_paths(everything)}
    assert keys <= named  # and each meets the others only where noded can take it (overlap_problems)
    assert overlap_problems(named_paths(everything)) == []


@pytest.mark.parametrize("text, key, reason", [
    # an admin socket at the report socket's path would be the 0666 report socket
    ("runtime_dir: /r\nadmin: {socket: /r/report.sock}\n", "admin.socket", "is also the report socket"),
    ("runtime_dir: /r\nadmin: {socket: /r/noded.pid}\n", "admin.socket", "is also the pid file"),
    ("state_dir: /s\nadmin: {socket: /s/admin.sock}\n", "admin.socket", "whose entries are all noded's own"),
    ("state_dir: /s\ncolocation: {enabled: true, mps: {pipe_dir: /s}}\n", "colocation.mps.pipe_dir",
     "is also the state directory"),
    ("state_dir: /s/mps\ncolocation: {enabled: true, mps: {pipe_dir: /s}}\n", "state_dir",
     "whose content noded removes"),
    ("colocation: {enabled: true, mps: {pipe_dir: /var/log/noded/mps}}\n", "colocation.mps.log_dir",
     "is also the MPS pipe directory"),
    ("state_dir: /sys/fs/resctrl/state\n", "state_dir", "is inside the resctrl mount"),
    ("runtime_dir: /cg/run\njobs: {sources: [{kind: cgroup, root: /cg, patterns: [x]}]}\n", "runtime_dir",
     "is inside a job source's cgroup root"),
    ("jobs: {labels: /run/noded/mps/labels.yaml}\ncolocation: {enabled: true}\n", "jobs.labels",
     "whose content noded removes"),
    ("state_dir: /run/noded-locks\n", "state_dir", "is also the host lock directory"),
    ("state_dir: /r\nruntime_dir: /r\n", "state_dir", "is also the runtime directory"),
])
def test_paths_that_meet_are_refused_at_the_key_that_made_them(text, key, reason):
    problems = overlap_problems(named_paths(parse_config(text)))
    # (where the runtime directory is refused, or its files are inside the other, they are too)
    assert {k for k, _ in problems} <= {key, "runtime_dir"}, problems
    assert reason in dict(problems)[key]


@pytest.mark.parametrize("text", [
    "",  # the defaults
    "colocation: {enabled: true}\n",  # the pipe directory in the runtime directory, as shipped
    "state_dir: /run/noded/state\n",  # inside the runtime directory, beside its files
    "jobs: {sources: [{kind: slurm, root: /sys/fs/cgroup}, {kind: kubernetes, root: /sys/fs/cgroup}], "
    "labels: /var/lib/noded/labels.yaml}\n",  # two sources on one tree; labels beside the state
])
def test_paths_that_do_not_meet_are_taken(text):
    assert overlap_problems(named_paths(parse_config(text))) == []


def test_a_link_that_makes_two_paths_one_is_seen(tmp_path):
    (tmp_path / "state").mkdir()
    os.symlink(tmp_path / "state", tmp_path / "pipe")
    cfg = write_config(tmp_path, f"colocation: {{enabled: true, mps: {{pipe_dir: {tmp_path}/pipe}}}}\n")
    refused(noded_in_process("check-config", str(cfg)),
            f"{cfg}:{line_of(cfg, 'pipe_dir')}: colocation.mps.pipe_dir: the MPS pipe directory {tmp_path}/pipe "
            f"(that is {tmp_path}/state) is also the state directory")


# ------------------------------------------------------------ the pipe directory


def test_an_existing_pipe_dir_is_neither_emptied_nor_removed(tmp_path, request):
    """Before: emptied at start (shutil.rmtree) and removed at stop."""
    mine = tmp_path / "mine"
    request.addfinalizer(lambda: end_serving(str(mine)))  # a start that wrongly went ahead leaves nothing
    mine.mkdir()
    (mine / "thesis.tex").write_text("four years\n")
    control = MpsControl(STANDIN, str(mine), str(tmp_path / "log"))
    with pytest.raises(MpsError, match=f"{mine} exists \\(a directory\\) and noded did not make it"):
        control.start()
    control.stop()
    assert tree(mine) == {"thesis.tex": b"four years\n"}
    assert processes_serving(str(mine)) == []


def test_a_pipe_dir_noded_made_is_known_as_its_own_after_a_sigkill(tmp_path, request):
    """Recorded in the state before it is made: a new noded (a new object, the same state)
    takes it over, kills the daemon left on it, and removes it, and its record, at stop."""
    state = OriginalValues(str(tmp_path / "state"))
    pipe = str(tmp_path / "run" / "mps")
    # ``first`` stands for a SIGKILLed noded (never stopped): should the test fail before
    # ``second`` takes over, or after, whatever serves the pipe directory is ended here
    request.addfinalizer(lambda: end_serving(pipe))
    first = MpsControl(STANDIN, pipe, str(tmp_path / "log"), recorder=state)
    first.start()
    left = first.pid()
    assert made_dir_key(pipe) in json.loads((tmp_path / "state" / "originals.json").read_text())
    # SIGKILL of noded here: nothing of ``first`` runs again
    second = MpsControl(STANDIN, pipe, str(tmp_path / "log"), recorder=OriginalValues(str(tmp_path / "state")))
    second.start()
    assert second.pid() != left and processes_serving(pipe) == [second.pid()]
    second.stop()
    assert not os.path.exists(pipe) and processes_serving(pipe) == []
    assert json.loads((tmp_path / "state" / "originals.json").read_text()) == {}


def test_check_config_and_run_refuse_pipe_dir_at_the_state_dir_and_keep_the_state(tmp_path):
    """Before: check-config passed; run emptied the state directory, then failed forever
    with "originals could not be recorded"."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "originals.json").write_text('{"cpuset:/sys/fs/cgroup/cpuset/job": "0-3"}\n')
    before = tree(state)
    cfg = write_config(tmp_path, f"colocation: {{enabled: true, mps: {{control: {STANDIN}, pipe_dir: {state}}}}}\n")
    where = f"{cfg}:{line_of(cfg, 'pipe_dir')}: colocation.mps.pipe_dir: "
    refused(noded_in_process("check-config", str(cfg)), where + f"the MPS pipe directory {state} is also the state directory")
    refused(noded("run", "--config", str(cfg)), f"colocation.mps.pipe_dir: the MPS pipe directory {state} is also")
    assert tree(state) == before


def test_check_config_refuses_an_existing_pipe_dir_noded_did_not_make(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    cfg = write_config(tmp_path, f"colocation: {{enabled: true, mps: {{pipe_dir: {mine}}}}}\n")
    refused(noded_in_process("check-config", str(cfg)),
            f"{cfg}:{line_of(cfg, 'pipe_dir')}: colocation.mps.pipe_dir: {mine} exists (a directory) and noded did "
            "not make it")


# ------------------------------------------------------------ sockets


class _Daemon:
    """What AdminServer reads of a daemon: nothing is asked of it here."""

    class control:
        registered_labels = None

    class parts:
        colocation = rightsize = None

    last = None


def test_an_admin_socket_at_an_existing_file_is_refused_and_the_file_kept(tmp_path):
    """Before: the file was unlinked at start."""
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0::/root:/bin/sh\n")
    with pytest.raises(SocketPathError, match="exists and is a regular file, not a socket"):
        AdminServer(str(victim), _Daemon(), group=None).start()
    assert victim.read_text() == "root:x:0:0::/root:/bin/sh\n"
    cfg = write_config(tmp_path, f"admin: {{socket: {victim}}}\n")
    refused(noded_in_process("check-config", str(cfg)),
            f"{cfg}:{line_of(cfg, 'socket')}: admin.socket: {victim} exists and is a regular file, not a socket")
    refused(noded("run", "--config", str(cfg)), f"admin.socket: {victim} exists and is a regular file")
    assert victim.read_text() == "root:x:0:0::/root:/bin/sh\n"


def test_a_socket_a_process_listens_on_is_left_to_it_and_a_stale_one_replaced(tmp_path):
    path = str(tmp_path / "s.sock")
    theirs = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.bind(path)
    theirs.listen()
    try:
        with pytest.raises(SocketPathError, match="a process listens on the socket"):
            AdminServer(path, _Daemon(), group=None).start()
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(path)  # still theirs, still answering
        client.close()
    finally:
        theirs.close()  # gone: its socket is stale now, and noded takes the path
    server = AdminServer(path, _Daemon(), group=None).start()
    server.stop()
    assert not os.path.exists(path)


def test_stop_removes_only_the_socket_it_made(tmp_path):
    path = tmp_path / "admin.sock"
    server = AdminServer(str(path), _Daemon(), group=None).start()
    os.rename(path, tmp_path / "moved.sock")
    path.write_text("someone's file now\n")
    server.stop()
    assert path.read_text() == "someone's file now\n"


def test_check_config_refuses_the_admin_socket_at_the_report_socket(tmp_path):
    """Before: passed; run made the admin socket the 0666 report socket, and root's status was refused."""
    cfg = write_config(tmp_path, f"admin: {{socket: {tmp_path}/run/report.sock}}\n")
    refused(noded_in_process("check-config", str(cfg)),
            f"{cfg}:{line_of(cfg, 'socket')}: admin.socket: the admin socket {tmp_path}/run/report.sock is also the "
            "report socket (runtime_dir)")


# ------------------------------------------------------------ the kernel's trees


@pytest.mark.skipif(not os.path.isdir(CPUSET), reason=f"no {CPUSET} here")
def test_a_state_dir_in_a_cgroup_filesystem_is_refused_before_anything_is_made(tmp_path):
    where = f"{CPUSET}/noded-state-{os.getpid()}"
    cfg = write_config(tmp_path, f"state_dir: {where}\n")
    refused(noded_in_process("check-config", str(cfg)), f"state_dir: the state directory {where} is on a cgroup filesystem")
    refused(noded("run", "--config", str(cfg)), "state_dir: the state directory")
    assert not os.path.exists(where)


def test_an_mps_log_dir_another_user_may_change_is_refused(tmp_path):
    """MPS, as root, appends to control.log there: a user who may write the directory
    could plant a link for root to write through."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    cfg = write_config(tmp_path, f"colocation: {{enabled: true, mps: {{log_dir: {shared}}}}}\n")
    refused(noded_in_process("check-config", str(cfg)),
            f"{cfg}:{line_of(cfg, 'log_dir')}: colocation.mps.log_dir: refused: {shared} is writable by group and others (mode 1777)")


_POOL = ["/a", "/a/b", "/a/b/c", "/a/c", "/r", "/r/mps", "/r/report.sock", "/r/noded.pid", "/r/noded.sock",
         "/var/lib/noded", "/sys/fs/resctrl", "/sys/fs/resctrl/x", "/run/noded-locks"]


@given(st.fixed_dictionaries({k: st.sampled_from(_POOL) for k in
                              ("state_dir", "runtime_dir", "socket", "pipe_dir", "log_dir", "labels")}))
@settings(max_examples=400, deadline=None)
def test_whatever_the_paths_none_noded_makes_is_another_or_in_its_private_directories(paths):
    text = (f"state_dir: {paths['state_dir']}\nruntime_dir: {paths['runtime_dir']}\n"
            f"admin: {{socket: {paths['socket']}}}\njobs: {{labels: {paths['labels']}}}\n"
            f"colocation: {{enabled: true, mps: {{pipe_dir: {paths['pipe_dir']}, log_dir: {paths['log_dir']}}}}}\n")
    config = parse_config(text)
    named = named_paths(config)
    if overlap_problems(named):
        return
    made = [p for p in named if p.role == "made"]
    assert len({p.path for p in made}) == len(made), made  # no two the same
    for p in named:
        assert not any(p.path == q.path for q in made if q is not p), (p, made)
        for d in (config.state_dir, config.mps_pipe_dir, config.colocation.mps.log_dir):
            if p.role != "read" or d == config.mps_pipe_dir:
                assert not p.path.startswith(d + "/"), (p, d)
        assert not (p.role == "made" and p.path.startswith(config.resctrl.root + "/")), p
