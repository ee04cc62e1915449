"""nodectl as an operator runs it, against a socket a test serves."""

from __future__ import annotations


def nodectl_run(path, *argv, capsys):
    """(exit code, stdout, stderr) of nodectl against the socket at ``path``."""
    from noded.admin import nodectl

    code = nodectl.main(["--socket", path, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err
