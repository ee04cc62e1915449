"""nodectl pointed at something that is not noded's socket says what is there.

Before: `--socket /etc/passwd` (a typo, a wrong $NODED_SOCKET) was "nothing is listening
(noded stopped or is starting?)", which sends an operator to restart a noded that runs;
an empty $NODED_SOCKET (set by a script, empty) was ": Invalid argument".
"""

import os
import subprocess
import sys

import pytest

from noded.admin import nodectl
from noded.admin.request import DEFAULT_SOCKET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("make, kind", [(lambda p: p.write_text("x"), "a regular file"),
                                        (lambda p: p.mkdir(), "a directory"),
                                        (lambda p: os.mkfifo(p), "a FIFO")])
def test_a_path_that_is_not_a_socket_is_named_as_what_it_is(tmp_path, capsys, make, kind):
    path = tmp_path / "not-a-socket"
    make(path)
    code = nodectl.main(["--socket", str(path), "--timeout", "5", "status"])
    err = capsys.readouterr().err
    assert code == 1
    assert err == f"nodectl: {path} is {kind}, not a socket: --socket (or $NODED_SOCKET) must name noded's " \
                  "admin socket\n", err


def test_a_stale_socket_is_still_told_as_nothing_listening(tmp_path, capsys):
    import socket

    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # bound, never listened on: what a noded killed leaves
    assert nodectl.main(["--socket", path, "--timeout", "5", "status"]) == 1
    assert "nothing is listening (noded stopped or is starting?)" in capsys.readouterr().err


def test_an_empty_socket_option_is_refused_as_such(capsys):
    with pytest.raises(SystemExit) as exit_:
        nodectl.main(["--socket", "", "status"])
    assert exit_.value.code == 2
    assert "argument --socket: an empty path" in capsys.readouterr().err


def test_an_empty_noded_socket_variable_is_taken_as_unset(tmp_path):
    env = {**os.environ, "NODED_SOCKET": ""}
    out = subprocess.run([sys.executable, "-m", "noded.admin.nodectl", "--timeout", "5", "status"],
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert out.returncode == 1 and "Invalid argument" not in out.stderr, out.stderr
    assert f"{DEFAULT_SOCKET}" in out.stderr, out.stderr
