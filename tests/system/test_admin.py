"""The admin socket and nodectl (issue #5): commands, overrides that persist and
expire, peers checked with SO_PEERCRED, and requests that are garbage, too big,
unknown or silent."""

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import time

import pytest

from support.clocks import WallClock
from support.metrics import scrape
from support.sockets import unix_exchange
from noded.admin import nodectl
from noded.util.journal import NOTICE
from noded.loop.overrides import Override, OverrideStore
from noded.admin.protocol import MAX_REQUEST_BYTES

pytestmark = pytest.mark.fuse


def ctl(server, *argv, capsys):
    code = nodectl.main(["--socket", server.path, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_status_jobs_explain_and_overrides_through_nodectl(admin, capsys, caplog):
    h, server, clock = admin
    h.until(lambda r: "sim:hog" in r.levels, 15, "the hog throttled")
    code, out, _ = ctl(server, "status", capsys=capsys)
    assert code == 0 and "throttling with mba" in out and "sim:hog" in out and "sim:bert" in out
    code, out, _ = ctl(server, "--json", "jobs", capsys=capsys)
    jobs = {j["job"]: j for j in json.loads(out)}
    assert jobs["sim:hog"]["level"] >= 1 and jobs["sim:bert"]["kind"] == "gpu"
    code, out, _ = ctl(server, "explain", "sim:hog", capsys=capsys)
    assert "throttle 0->1 (contention)" in out and "GPU job sim:bert" in out
    level = h.results[-1].levels["sim:hog"]
    with caplog.at_level(logging.DEBUG, logger="noded.changes"):
        code, out, _ = ctl(server, "exempt", "sim:hog", "--ttl", "10m", "--reason", "debugging", capsys=capsys)
    # What it did, in words: until when (local time), why, and what happens to the job now.
    assert code == 0 and re.fullmatch(r"sim:hog is exempt from throttling until (\d\d:){2}\d\d \(reason: debugging\); "
                                      rf"it was at level {level} and will be released next tick\n", out), out
    # a change an operator asked for, at notice (5) as every change: not in `journalctl -p warning`
    [set_line] = [r for r in caplog.records if "override-set job=sim:hog level=0 kind=exempt uid=0" in r.message]
    assert set_line.levelno == NOTICE
    h.until(lambda r: "sim:hog" not in r.levels, 5, "the exemption in force")
    assert 'noded_override_active{job_id="sim:hog",kind="exempt",uid="0"} 1.0' in scrape(h)
    code, out, _ = ctl(server, "status", capsys=capsys)
    assert "sim:hog: exempt level 0 by uid 0, 10m left (debugging)" in out
    code, out, _ = ctl(server, "release", "sim:hog", capsys=capsys)
    assert out == "sim:hog: override removed\n"
    code, out, _ = ctl(server, "pause", "--reason", "maintenance", capsys=capsys)
    assert out == "paused: maintenance\n"
    for _ in range(8):
        assert h.tick().levels == {}  # paused: nothing throttled automatically
    assert ctl(server, "throttle", "sim:hog", "--level", "2", capsys=capsys)[0] == 0
    assert h.tick().levels == {"sim:hog": 2}  # an operator's override holds even while paused
    ctl(server, "resume", capsys=capsys)
    code, _, err = ctl(server, "throttle", "sim:hog", "--cores", "1", capsys=capsys)
    assert code == 1 and "this host throttles with mba: use --level" in err
    code, _, err = ctl(server, "explain", "nope", capsys=capsys)
    assert code == 1 and err.startswith("nodectl: no job 'nope' at noded's last tick: the jobs are sim:bert, sim:hog")
    # Not a terminal (captured): each refresh appended under a time line, no screen control codes.
    code, out, _ = ctl(server, "top", "--iterations", "2", "--interval", "0.05", capsys=capsys)
    assert code == 0 and "\x1b" not in out and out.count("JOB ") == 2
    assert len(re.findall(r"^--- (\d\d:){2}\d\d$", out, re.M)) == 2


def test_overrides_persist_across_restarts_and_expire(tmp_path):
    clock = WallClock()
    store = OverrideStore(str(tmp_path), clock)
    store.set(Override("a", 2, 1000, "r", clock(), clock() + 60))
    store.set(Override("b", 0, 0, "", clock(), None))
    again = OverrideStore(str(tmp_path), clock)  # the daemon restarted
    assert set(again.active()) == {"a", "b"} and again.active()["a"].set_by_uid == 1000
    clock.t += 61
    assert set(again.active()) == {"b"}
    assert set(OverrideStore(str(tmp_path), clock).active()) == {"b"}  # the expiry was persisted
    (tmp_path / "overrides.json").write_text('{"a": {"level": 2}}')
    broken = OverrideStore(str(tmp_path), clock)  # moved aside, noded starts (tests/system/test_state_dir.py)
    assert broken.active() == {} and "not overrides (override 'a'" in broken.notes[0]


def raw(path, payload: bytes, timeout=5.0) -> bytes:
    return unix_exchange(path, payload, timeout)


@pytest.mark.parametrize("payload,error", [
    (b"garbage\n", "not a JSON object"),
    (b"[1,2]\n", "not a JSON object"),
    (b'{"version": 2, "command": "status"}\n', "unsupported protocol version 2"),
    (b'{"version": 1, "command": "reboot"}\n', "unknown command 'reboot'"),
    (b'{"version": 1, "command": "status", "extra": 1}\n', "unknown request field(s) ['extra']"),
    (b'{"version": 1, "command": "throttle", "args": {"job": "x"}}\n', "give exactly one of level or cores"),
    (b'{"version": 1, "command": "throttle", "args": {"job": "x", "level": 0}}\n', "level must be an integer from 1"),
    (b'{"version": 1, "command": "exempt", "args": {"job": "x", "ttl_s": -5}}\n', "ttl_s must be a number"),
    (b'{"version": 1, "command": "explain", "args": {}}\n', "missing argument 'job'"),
])
def test_bad_requests_get_an_error_reply(admin, payload, error):
    _, server, _ = admin
    reply = json.loads(raw(server.path, payload))
    assert reply["ok"] is False and error in reply["error"]


def test_oversized_and_silent_clients_neither_crash_nor_block_the_server(admin):
    h, server, _ = admin
    reply = json.loads(raw(server.path, b"x" * (MAX_REQUEST_BYTES + 100) + b"\n"))
    assert reply == {"ok": False, "error": f"request larger than {MAX_REQUEST_BYTES} bytes", "version": 1}
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(server.path)
    try:
        h.tick()
        # Served while the silent one waits; then the silent one is dropped after timeout_s.
        assert json.loads(raw(server.path, b'{"version": 1, "command": "status"}\n'))["ok"] is True
        silent.settimeout(5)
        t0 = time.monotonic()
        reply = silent.recv(4096)
        assert json.loads(reply) == {"ok": False, "error": "no complete request within 0.5s: dropped", "version": 1}
        assert silent.recv(100) == b""
        assert time.monotonic() - t0 < 2
    finally:
        silent.close()


def test_a_command_that_fails_is_answered_with_its_error_not_a_closed_connection(admin, capsys, caplog):
    h, server, _ = admin
    h.until(lambda r: "sim:hog" in r.sample.jobs, 10, "the hog")  # noded refuses a job it does not know
    # The override store cannot save: its file's place is taken by a directory that
    # is not empty, so the atomic rename fails (a real failure, from the kernel).
    os.makedirs(os.path.join(h.daemon.control.overrides.path, "in-the-way"))
    with caplog.at_level(logging.ERROR, logger="noded.admin.server"):
        code, out, err = ctl(server, "throttle", "sim:hog", "--level", "1", capsys=capsys)
    assert code == 1 and out == ""
    assert err.startswith("nodectl: throttle failed: ") and "closed the connection" not in err, err
    assert any("throttle from uid 0 failed" in r.message for r in caplog.records)
    # The server is still there for the next request.
    assert ctl(server, "status", capsys=capsys)[0] == 0


def test_nodectl_gives_up_at_its_deadline_with_a_clear_message(tmp_path, capsys):
    # A "daemon" that accepts and never answers: nodectl's deadline covers the whole call.
    path = str(tmp_path / "mute.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(path)
        mute.listen(4)
        t0 = time.monotonic()
        code = nodectl.main(["--socket", path, "--timeout", "0.5", "status"])
        took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert code == 1 and err == f"nodectl: {path}: noded did not answer within 0.5s; " \
                                "is it overloaded or stopped? (a request it has not read yet is not carried " \
                                "out: nodectl gave up on it)\n"
    assert took < 5
    code = nodectl.main(["--socket", str(tmp_path / "absent.sock"), "status"])
    assert code == 1 and "is noded running?" in capsys.readouterr().err


CLIENT = ("import json,socket,sys\n"
          "s=socket.socket(socket.AF_UNIX);\n"
          "try:\n  s.connect(sys.argv[1])\nexcept OSError as e:\n  print('connect', e.strerror); sys.exit(0)\n"
          "s.sendall(b'{\"version\":1,\"command\":\"status\"}\\n'); print(s.recv(4096).decode().strip())")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_non_admin_user_is_refused(admin, tmp_path):
    _, server, _ = admin
    assert oct(os.stat(server.path).st_mode & 0o777) == "0o660"
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", CLIENT,
                 server.path]
    # The socket's mode keeps them out...
    out = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "connect Permission denied", out.stderr
    # ...and were it opened up by mistake, SO_PEERCRED still does.
    os.chmod(server.path, 0o666)
    out = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30)
    reply = json.loads(out.stdout)
    assert reply["ok"] is False and reply["error"] == "permission denied: uid 65534 is neither root nor in the admin group"
