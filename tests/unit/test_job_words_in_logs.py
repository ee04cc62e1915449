"""Every log message that names a job puts its id in one way only: after ``key=`` (the
handlers make it one word, ``noded.util.journal.word``) or through ``word()`` itself. A job id
put in as it is reaches a line with only its control characters escaped: a tenant's cgroup
named ``x job=slurm:42`` then wrote ``cap x job=slurm:42: stopped steering``, a line a search
for job=slurm:42 finds, and two names could give one text. A check of the source (as the
layout tests are), so a new message cannot go back to it."""

from __future__ import annotations

import ast
import os

from noded.util.journal import _PLACEHOLDER
from support.paths import REPO_ROOT

LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
#: what names a job id in noded's code
JOB_NAMES = {"job", "job_id"}


def _names_a_job(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in JOB_NAMES) or \
        (isinstance(node, ast.Attribute) and node.attr in JOB_NAMES)


def bare_job_ids(path: str) -> list[str]:
    """``file:line`` of each log call that puts a job id in as it is, not after ``=``."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in LEVELS
                and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
            continue
        msg, args = call.args[0].value, call.args[1:]
        specs = [m for m in _PLACEHOLDER.finditer(msg) if m.group() != "%%"]
        for m, arg in zip(specs, args):
            if _names_a_job(arg) and msg[m.start() - 1:m.start()] != "=":
                out.append(f"{os.path.relpath(path, REPO_ROOT)}:{call.lineno}")
    return out


def test_every_log_message_puts_a_job_id_in_as_one_word():
    found = []
    for dirpath, _, names in os.walk(os.path.join(REPO_ROOT, "noded")):
        found += [hit for n in sorted(names) if n.endswith(".py") for hit in bare_job_ids(os.path.join(dirpath, n))]
    assert not found, f"a job id put in a log message as it is (write job=%s, or word(job)): {found}"


def test_the_check_sees_a_bare_id(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('log.warning("cap %s: stopped: %s", self.job, e)\nlog.info("job=%s ok", job)\n'
                      'log.info("from %s", word(job_id))\n')
    assert bare_job_ids(str(source)) == [f"{os.path.relpath(str(source), REPO_ROOT)}:1"]
