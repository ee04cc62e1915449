"""Whose error nodectl reports (F2, leftover 1): an answer that is not of noded's shape is
said to be noded's (one line naming the field), an error of nodectl's own, or of the
terminal it writes to, is never blamed on noded's answer. Against a real socket served by
root, as noded's is."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from noded.admin import answertext, nodectl

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="nodectl talks only to a socket served by root")
JOB = {"job": "slurm:日本-\x1b[2J", "kind": "cpu", "bandwidth_bytes_per_s": 1e9, "gpu_util": None, "level": 0,
       "override": False, "exempt": False, "monitoring": "own", "cap_bytes_per_s": None, "pod": None}


class OneAnswer:
    """A socket that answers one request with ``result`` (ok), as noded would, or with the
    bytes ``line`` as they are."""

    def __init__(self, path: str, result=None, line: bytes | None = None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1)
        if line is None:
            line = json.dumps({"version": 1, "ok": True, "result": result}).encode() + b"\n"
        self.thread = threading.Thread(target=self._serve, args=(line,), daemon=True)
        self.thread.start()

    def _serve(self, line: bytes) -> None:
        c, _ = self.sock.accept()
        with c:
            c.makefile("rb").readline()
            c.sendall(line)

    def close(self) -> None:
        self.thread.join(10)
        self.sock.close()


@AS_ROOT
def test_a_job_name_stdouts_encoding_lacks_is_shown_escaped_not_blamed_on_noded(tmp_path):
    """PYTHONIOENCODING=ascii (or a latin-1 terminal): a tenant's UTF-8 job name was a
    UnicodeEncodeError that nodectl blamed on noded ('a shape noded does not give')."""
    path = str(tmp_path / "noded.sock")
    served = OneAnswer(path, [JOB])
    p = subprocess.run([sys.executable, "-m", "noded.admin.nodectl", "--socket", path, "jobs"], capture_output=True,
                       timeout=60, cwd=REPO, env={**os.environ, "PYTHONIOENCODING": "ascii"})
    served.close()
    assert p.returncode == 0, p.stderr
    assert p.stderr == b""
    assert b"slurm:\\u65e5\\u672c-\\x1b[2J" in p.stdout  # the name's escapes: no ESC reaches the terminal
    assert b"\x1b" not in p.stdout


@AS_ROOT
def test_an_override_ending_past_any_clock_is_noded_shape_error_in_one_line(tmp_path, capsys):
    """expires_in_s of 1e300 was an OverflowError traceback from time.localtime."""
    path = str(tmp_path / "noded.sock")
    served = OneAnswer(path, {"job": "a", "level": 1, "level_now": 0, "max_level": 4, "expires_in_s": 1e300,
                              "reason": "", "in_last_sample": True})
    code = nodectl.main(["--socket", path, "throttle", "a", "--level", "1"])
    served.close()
    err = capsys.readouterr().err
    assert code == 1
    assert err == (f"nodectl: {path}: an answer to 'throttle' of a shape noded does not give (expires_in_s: a number "
                   "of seconds from 0 to 30 days expected, got a number (1e+300)); is it noded, of this version?\n")


@AS_ROOT
def test_an_error_of_nodectls_own_is_not_blamed_on_noded(tmp_path, capsys, monkeypatch):
    """A bug in nodectl's formatting (stood in for by a formatter that raises) was reported
    as 'an answer of a shape noded does not give': the operator was sent after noded."""
    def broken(jobs):
        raise ValueError("nodectl's own mistake")

    monkeypatch.setattr(answertext, "format_jobs", broken)
    path = str(tmp_path / "noded.sock")
    served = OneAnswer(path, [JOB])
    code = nodectl.main(["--socket", path, "jobs"])
    served.close()
    err = capsys.readouterr().err
    assert code == 1
    assert "noded does not give" not in err and "is it noded" not in err
    assert err.splitlines()[-1] == ("nodectl: ValueError in nodectl itself, not in noded's answer: nodectl's own "
                                    "mistake (a bug in nodectl; with --json it prints noded's answer as it came)")
    assert "Traceback" in err  # for the bug report


@AS_ROOT
def test_an_answer_nested_past_pythons_recursion_limit_is_not_nodeds_not_a_traceback(tmp_path, capsys):
    """An answer nested 100 000 deep (well under the reply's size bound) was a RecursionError
    from json.loads that nodectl reported as a bug of its own, with a traceback."""
    path = str(tmp_path / "noded.sock")
    served = OneAnswer(path, line=b'{"version": 1, "ok": true, "result": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    code = nodectl.main(["--socket", path, "jobs"])
    served.close()
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"nodectl: {path}: not an answer from noded: nested deeper than") and "Traceback" not in err


@AS_ROOT
def test_an_age_json_spells_as_infinity_is_shown_unknown_not_a_traceback(tmp_path, capsys):
    """Python's json reads Infinity, which the standard lacks: an explain whose decision was
    Infinity seconds ago was an OverflowError in nodectl's formatting."""
    path = str(tmp_path / "noded.sock")
    explain = {"job": "a", "kind": "cpu", "level": 0, "bandwidth_bytes_per_s": None, "gpu_util": None,
               "baseline": None, "node_share_of_peak": None, "threshold": None, "slowed_gpu_jobs": [], "why": [],
               "decisions": [{"seconds_ago": 1, "action": "throttle", "from": 0, "to": 1, "cause": "c",
                              "reason": "r"}]}
    line = json.dumps({"version": 1, "ok": True, "result": explain}).encode().replace(b'"seconds_ago": 1',
                                                                                      b'"seconds_ago": Infinity')
    served = OneAnswer(path, line=line + b"\n")
    code = nodectl.main(["--socket", path, "explain", "a"])
    served.close()
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert "  unknown ago  throttle 0->1 (c): r" in out

