"""Runs of a script's ``run(*args)``, each in a process of its own forked from one that
imported the script's modules once: for tests that kill a run at each of its steps
(SIGKILL from an audit hook) and start a run per step, where a fresh interpreter per run
was most of the test's time. Nothing of ``run`` executes in the forking process: each
run starts from the imports alone, as a fresh process would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_SERVE = """

# one run per line of arguments: its own process, forked; its end said in one line
import json as _json, os as _os, traceback as _traceback
for _line in sys.stdin:
    _pid = _os.fork()
    if _pid == 0:
        try:
            print("done", _json.dumps(run(*_json.loads(_line))), flush=True)
            _os._exit(0)
        except BaseException:
            print("error", _json.dumps(_traceback.format_exc()), flush=True)
            _os._exit(1)
    _, _status = _os.waitpid(_pid, 0)
    print("exit", _os.waitstatus_to_exitcode(_status), flush=True)
"""


class ForkedRuns:
    """``script`` (it imports ``sys`` and defines ``run``) served from ``cwd``; the serving
    process starts at the first run and ends at ``close``."""

    def __init__(self, script: str, cwd: str):
        self.script = script + _SERVE
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def run(self, *args) -> tuple[int, object]:
        """(the run's exit code, -9 for a SIGKILL; what ``run`` returned, or, where it
        raised, its traceback; None where it was killed)."""
        if self.proc is None:
            self.proc = subprocess.Popen([sys.executable, "-c", self.script], cwd=self.cwd, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         env={**os.environ, "PYTHONPATH": self.cwd})
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        said = None
        while True:
            line = self.proc.stdout.readline()
            assert line, f"the forking process ended ({self.proc.wait()})"
            kind, _, rest = line.partition(" ")
            if kind == "exit":
                return int(rest), said
            said = json.loads(rest)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.stdout.close()
            self.proc.wait(timeout=60)
            self.proc = None
