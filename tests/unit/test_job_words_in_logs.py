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


def in_noded(check) -> list[str]:
    """What ``check(path)`` finds in every module of noded/."""
    found = []
    for dirpath, _, names in os.walk(os.path.join(REPO_ROOT, "noded")):
        found += [hit for n in sorted(names) if n.endswith(".py") for hit in check(os.path.join(dirpath, n))]
    return found


def test_every_log_message_puts_a_job_id_in_as_one_word():
    found = in_noded(bare_job_ids)
    assert not found, f"a job id put in a log message as it is (write job=%s, or word(job)): {found}"


def test_the_check_sees_a_bare_id(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('log.warning("cap %s: stopped: %s", self.job, e)\nlog.info("job=%s ok", job)\n'
                      'log.info("from %s", word(job_id))\n')
    assert bare_job_ids(str(source)) == [f"{os.path.relpath(str(source), REPO_ROOT)}:1"]


#: what names a list of job ids in noded's code (the join's argument names one of these), or of
#: other names a tenant chooses: cgroup paths, a pod's containers
JOB_LISTS = JOB_NAMES | {"jobs", "job_ids", "held", "slowed", "slowed_gpu_jobs", "peers", "shared_with",
                         "steered_for", "sized", "known", "beyond", "twice", "paths", "unread", "containers",
                         "left"}  # left: what a stop could not put back (cgroup paths, records named by them)
#: what makes each name of a list one to one: ``word`` (no space of its own), or Python's repr
QUOTERS = {"word", "repr", "_name"}  # noded.rightsize.split._name is repr


def _mentions_a_job_list(node: ast.AST) -> bool:
    return any((isinstance(n, ast.Name) and n.id in JOB_LISTS) or (isinstance(n, ast.Attribute) and n.attr in JOB_LISTS)
               or (isinstance(n, ast.Constant) and n.value in JOB_LISTS) for n in ast.walk(node))


def _quoter(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) and node.id in QUOTERS else None


def _each_quoted(arg: ast.expr) -> str | None:
    """The quoter each item of a join's argument goes through (None: some item goes in as it is)."""
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "map" and arg.args:
        return _quoter(arg.args[0])
    if isinstance(arg, (ast.GeneratorExp, ast.ListComp)):
        elt = arg.elt
        if isinstance(elt, ast.Call):
            return _quoter(elt.func)
        if isinstance(elt, ast.JoinedStr):  # f"{_name(c.job_id)}: {c.gpus}": each id in it quoted
            # the name each item of a list of names is bound to: `for p, why in unread` binds p
            named = {t.id for g in arg.generators if _mentions_a_job_list(g.iter)
                     for t in ([g.target.elts[0]] if isinstance(g.target, ast.Tuple) else [g.target])
                     if isinstance(t, ast.Name)}
            quoters = set()
            for part in elt.values:
                if isinstance(part, ast.FormattedValue) and (
                        _mentions_a_job_list(part.value) or any(isinstance(n, ast.Name) and n.id in named
                                                                for n in ast.walk(part.value))):
                    quoters.add("repr" if part.conversion == ord("r") else
                                _quoter(part.value.func) if isinstance(part.value, ast.Call) else None)
            return quoters.pop() if len(quoters) == 1 else None
    return None


def joined_job_ids(path: str) -> list[str]:
    """``file:line`` of each list of job ids joined into text whose items are not each one
    word (or a repr): a tenant's cgroup named ``a, b`` read as two jobs, or two lists as one.
    A list of words is joined by a space (", "), which no word holds."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "join"
                and isinstance(call.func.value, ast.Constant) and isinstance(call.func.value.value, str)
                and call.args and _mentions_a_job_list(call.args[0])):
            continue
        quoter, sep = _each_quoted(call.args[0]), call.func.value.value
        if quoter in ("repr", "_name") or (quoter == "word" and any(c.isspace() for c in sep)):
            continue
        out.append(f"{os.path.relpath(path, REPO_ROOT)}:{call.lineno}")
    return out


def test_every_list_of_job_ids_in_text_is_a_list_of_words():
    found = in_noded(joined_job_ids)
    assert not found, f"job ids joined into text as they are (write words(jobs), from noded.util.journal): {found}"


def test_the_check_sees_a_list_of_bare_ids(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('a = ", ".join(held)\nb = ",".join(record.jobs)\nc = ",".join(map(word, jobs))\n'
                      'd = ", ".join(map(word, jobs))\ne = ", ".join(f"{_name(c.job_id)}: {c.gpus}" for c in x)\n'
                      'f = ", ".join(f"{c.job_id}: {c.gpus}" for c in x)\ng = words(jobs)\nh = ", ".join(levels)\n'
                      'i = "; ".join(f"{p}: {why}" for p, why in self.unread)\n'
                      'j = "; ".join(f"{word(p)}: {why}" for p, why in self.unread)\n')
    where = os.path.relpath(str(source), REPO_ROOT)
    assert joined_job_ids(str(source)) == [f"{where}:{n}" for n in (1, 2, 3, 6, 9)]
