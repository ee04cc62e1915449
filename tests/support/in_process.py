"""A noded command run by its entry function in the test's own process, for the commands
that change nothing process-wide (``check-config``): what a process start would cost
(importing noded and what the command needs, 0.6 core-seconds a call) is paid once per
worker. The answer has a process's shape (exit code, stdout, stderr as text), so a test
reads it as it reads ``subprocess.run``'s. What only a process shows stays with one: the
exit code as the shell sees it, stderr's encoding of odd bytes, a command that must not
block (each test module that uses this keeps such a start of its own)."""

from __future__ import annotations

import contextlib
import io
import subprocess


def noded_in_process(*args: str) -> subprocess.CompletedProcess:
    """``noded ARGS`` through noded.commands.cli.main, its stdout and stderr captured."""
    from noded.commands.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's refusals and --help, as the process would exit
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(["noded", *args], code, out.getvalue(), err.getvalue())
