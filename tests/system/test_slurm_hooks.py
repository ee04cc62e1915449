"""noded's Slurm hooks without a Slurm: what a job's comment asks (parsed as bytes), the
site's settings, the environment file, failing safe (exit 0, said on stderr), and the
shipped scripts against a real noded admin socket (a simulated node's daemon): what the
Epilog cleans whatever the comment says by then, admission at the label cap, a refusal
while MPS starts asked again, a comment that never passes through an exec. tests/slurm/
runs them under a real one-host Slurm."""

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from contextlib import ExitStack

import pytest
from hypothesis import given, settings as hypothesis_settings
from hypothesis import strategies as st

from support.waiting import wait_for
from noded.integrations.slurm import JobRequest, PrologOutcome, Settings, main, prolog, settle, write_env
from noded.jobs.labelwords import MAX_COMMENT_BYTES, MAX_NODED_BYTES, LabelWordError, comment_words
from support.paths import REPO_ROOT

REPO = REPO_ROOT
HOOKS = os.path.join(REPO, "integrations", "slurm")
SHARED = b"noded: model=BiDAF batch_size=32 share=mps"


def test_what_a_comment_asks():
    assert JobRequest.from_job(SHARED) == JobRequest({"model": "BiDAF", "batch_size": 32}, "mps")
    assert JobRequest.from_job(b"nightly run") == JobRequest({}, None)
    # gres/mps from Slurm asks for admission where the comment names model and batch size
    assert JobRequest.from_job(b"noded: model=BiDAF batch_size=32", gres_mps=True).share == "mps"
    assert JobRequest.from_job(b"noded: model=BiDAF", gres_mps=True).share is None
    with pytest.raises(LabelWordError, match="share=mps needs model= and batch_size="):
        JobRequest.from_job(b"noded: share=mps model=BiDAF")
    with pytest.raises(LabelWordError, match="the one way to share a GPU is share=mps"):
        JobRequest.from_job(b"noded: share=mig")


# -- the comment's grammar, over bytes

def test_a_comment_is_parsed_as_bytes_by_its_grammar():
    assert comment_words(b"my sweep; noded: model=A batch_size=2; for others noded: x") == ["model=A", "batch_size=2"]
    assert comment_words(b"noded:model=A\tbatch_size=2\r\n") == ["model=A", "batch_size=2"]
    assert comment_words(b"xnoded: model=A; noded: model=B") == ["model=B"]  # a word that begins with the marker
    assert comment_words(b"\xff\xfe free text \x00 noded: model=A") == ["model=A"]  # the rest is not noded's
    with pytest.raises(LabelWordError, match=r"word 1 of the comment's noded part, 'model=\\xff', is not UTF-8"):
        comment_words(b"noded: model=\xff")
    with pytest.raises(LabelWordError, match="holds a character that is not printable"):
        comment_words(b"noded: model=a\x1bb")
    with pytest.raises(LabelWordError, match=f"noded part is {MAX_NODED_BYTES + 1} bytes long: at most"):
        comment_words(b"noded:" + b" " * (MAX_NODED_BYTES + 1))
    with pytest.raises(LabelWordError, match=f"longer than {MAX_COMMENT_BYTES} bytes"):
        JobRequest.from_job(SHARED + b" " * MAX_COMMENT_BYTES)


@hypothesis_settings(max_examples=500)
@given(st.binary(max_size=300) | st.lists(st.sampled_from([b"noded:", b";", b" ", b"\n", b"model=A", b"=", b"\xff",
                                                           b"batch_size=3", b"share=mps", b"\x00", b"x"]),
                                          max_size=30).map(b"".join))
def test_any_bytes_give_words_or_a_named_error(comment):
    try:
        words = comment_words(comment)
    except LabelWordError as e:
        assert str(e)
        return
    for word in words:
        assert word and word.isprintable() and not any(c.isspace() or c == ";" for c in word if c.isascii())
    assert comment_words(("noded: " + " ".join(words)).encode()) == words  # the words say the same again
    try:
        JobRequest.from_job(comment)
    except LabelWordError as e:
        assert str(e)


# -- settings, files, failing safe

def test_settings_are_checked():
    assert Settings.from_environ({}) == Settings()
    s = Settings.from_environ({"NODED_SOCKET": "/x.sock", "NODED_SLURM_ON_REFUSAL": "requeue",
                               "NODED_SLURM_ENV_DIR": "/e", "NODED_SLURM_TIMEOUT_S": "2", "NODED_SLURM_RETRY_S": "0",
                               "NODED_SLURM_ON_NOT_READY": "run", "NODED_SLURM_RECORD_DIR": "/r"})
    assert (s.socket, s.on_refusal, s.env_dir, s.timeout_s, s.retry_s, s.on_not_ready, s.record_dir) == \
        ("/x.sock", "requeue", "/e", 2.0, 0.0, "run", "/r")
    with pytest.raises(ValueError, match="NODED_SLURM_ON_REFUSAL must be one of hold, requeue, not 'drop'"):
        Settings.from_environ({"NODED_SLURM_ON_REFUSAL": "drop"})
    with pytest.raises(ValueError, match="NODED_SLURM_ON_NOT_READY must be one of requeue, hold, run, not 'x'"):
        Settings.from_environ({"NODED_SLURM_ON_NOT_READY": "x"})
    with pytest.raises(ValueError, match=r"NODED_SLURM_TIMEOUT_S must be in \(0, 60\]"):
        Settings.from_environ({"NODED_SLURM_TIMEOUT_S": "600"})
    with pytest.raises(ValueError, match=r"NODED_SLURM_RETRY_S must be in \[0, 300\]"):
        Settings.from_environ({"NODED_SLURM_RETRY_S": "-1"})


def test_the_environment_file_is_the_jobs_users_and_one_line_a_variable(tmp_path):
    settings = Settings(env_dir=str(tmp_path / "env"))
    write_env(settings, "7", 65534, {"CUDA_VISIBLE_DEVICES": "GPU-1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"})
    path = tmp_path / "env/job_7.env"
    assert path.read_text() == "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\nexport CUDA_VISIBLE_DEVICES=GPU-1\n"
    st_ = os.stat(path)
    assert st_.st_uid == 65534 and st_.st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="not one line"):
        write_env(settings, "8", 0, {"A": "x\nexport LD_PRELOAD=/evil.so"})
    assert not (tmp_path / "env/job_8.env").exists()


@pytest.mark.parametrize("careless", ["others may write it", "another user's"])
def test_no_environment_file_is_left_where_others_may_change_it(tmp_path, careless):
    """A site that names an environment directory others may write (a path under /tmp a
    user made first): whoever may write it could swap a job's file for their own lines
    (LD_PRELOAD=...) before its TaskProlog reads it. The Prolog leaves no file there."""
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    if careless == "others may write it":
        env_dir.chmod(0o1777)
    else:
        os.chown(env_dir, 65534, 65534)
    settings = Settings(env_dir=str(env_dir))
    with pytest.raises(OSError, match=f"{env_dir} is not a directory only this user"):
        write_env(settings, "7", 65534, {"CUDA_VISIBLE_DEVICES": "GPU-1"})
    assert os.listdir(env_dir) == []


@pytest.fixture
def public_tmp():
    """A directory any user may read (pytest's tmp_path is root's alone)."""
    import pathlib

    path = tempfile.mkdtemp(prefix="noded-hooks-")
    os.chmod(path, 0o755)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_the_task_prolog_hands_over_only_the_jobs_users_own_file(public_tmp):
    """The TaskProlog runs as the job's user, and the Prolog chowns the job's file to them:
    a file there of anyone else's (another user's, planted where the site let them) is not
    handed to the task, but said."""
    tmp_path = public_tmp
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    (env_dir / "job_5.env").write_text("export LD_PRELOAD=/tmp/evil.so\n")  # root's: not the job user's
    (env_dir / "job_5.env").chmod(0o644)
    # the hook as installed, where the job's user may reach it (a checkout under a private
    # directory, as a CI clone in `mktemp -d`, is not)
    hook = tmp_path / "task-prolog"
    shutil.copy(os.path.join(HOOKS, "task-prolog"), hook)
    hook.chmod(0o755)
    r = subprocess.run([str(hook)], capture_output=True, text=True, timeout=10, user=65534,
                       env={"SLURM_JOB_ID": "5", "NODED_SLURM_ENV_DIR": str(env_dir),
                            "NODED_SLURM_HOOKS_CONF": str(tmp_path / "none.conf")})
    assert (r.returncode, r.stdout) == (0, ""), r
    assert f"{env_dir}/job_5.env is not this user's: not handed to the task" in r.stderr
    os.chown(env_dir / "job_5.env", 65534, -1)  # the Prolog's: the job user's own
    r = subprocess.run([str(hook)], capture_output=True, text=True, timeout=10, user=65534,
                       env={"SLURM_JOB_ID": "5", "NODED_SLURM_ENV_DIR": str(env_dir),
                            "NODED_SLURM_HOOKS_CONF": str(tmp_path / "none.conf")})
    assert (r.returncode, r.stdout, r.stderr) == (0, "export LD_PRELOAD=/tmp/evil.so\n", ""), r


def test_a_hook_exits_0_whatever_fails_and_says_why(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_JOB_UID", "0")
    monkeypatch.setenv("NODED_SOCKET", str(tmp_path / "nobody.sock"))
    monkeypatch.setenv("NODED_SLURM_RECORD_DIR", str(tmp_path / "records"))
    assert main(["prolog"], io.BytesIO(SHARED)) == 0
    assert "job 12: noded did not answer (no admin socket at" in capsys.readouterr().err
    assert main(["prolog"], io.BytesIO(b"noded: batch_size=huge")) == 0
    assert "its comment is not for noded ('batch_size=huge': batch_size must be a whole number)" in \
        capsys.readouterr().err
    monkeypatch.setenv("NODED_SLURM_ON_REFUSAL", "sometimes")
    assert main(["prolog"], io.BytesIO(SHARED)) == 0
    assert "prolog failed (ValueError: NODED_SLURM_ON_REFUSAL must be one of" in capsys.readouterr().err
    monkeypatch.delenv("SLURM_JOB_UID")
    assert main(["prolog"], io.BytesIO(b"")) == 0 and "SLURM_JOB_ID and SLURM_JOB_UID must be set" in \
        capsys.readouterr().err
    assert main(["neither"]) == 2


def test_the_epilog_cleans_whatever_else_the_sites_settings_get_wrong(tmp_path, capsys, monkeypatch):
    """A setting the Epilog does not use (what a refusal does, the retry budget) that is
    wrong, or a wrong timeout, must not keep it from cleaning: the job's environment file,
    its record and (asked of noded) its labels and reservation would stay behind, job after
    job. Only the timeout is said (its default is used); the Prolog says the rest."""
    for name in ("env", "records"):
        (tmp_path / name).mkdir()
    (tmp_path / "env/job_12.env").write_text("export CUDA_VISIBLE_DEVICES=GPU-1\n")
    (tmp_path / "records/job_12").write_text(json.dumps({"job": "slurm:12", "env_file": None}))
    for name, value in {"SLURM_JOB_ID": "12", "SLURM_JOB_UID": "0", "NODED_SOCKET": str(tmp_path / "nobody.sock"),
                        "NODED_SLURM_ENV_DIR": str(tmp_path / "env"), "NODED_SLURM_RECORD_DIR": str(tmp_path / "records"),
                        "NODED_SLURM_ON_REFUSAL": "sometimes", "NODED_SLURM_ON_NOT_READY": "never",
                        "NODED_SLURM_RETRY_S": "ages", "NODED_SLURM_TIMEOUT_S": "0"}.items():
        monkeypatch.setenv(name, value)
    assert main(["epilog"]) == 0
    assert os.listdir(tmp_path / "env") == [] and os.listdir(tmp_path / "records") == []
    err = capsys.readouterr().err
    assert "NODED_SLURM_TIMEOUT_S must be in (0, 60] seconds, not 0: the Epilog waits 5s" in err
    assert "noded did not forget it (no admin socket at" in err
    assert "ON_REFUSAL" not in err and "RETRY" not in err and "failed" not in err


def test_a_hung_slurmctld_holds_the_prolog_for_its_scontrol_budget_at_most(tmp_path, capsys, monkeypatch):
    """scontrol waits on slurmctld: one hung held each of the Prolog's two calls (requeue,
    AdminComment) for 30 s apiece. They share one budget: the requeue first, then the
    AdminComment with what is left, or not run, said."""
    import time

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/sh\nexec sleep 60\n")  # one process: the timeout's kill ends it
    (fake / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    started = time.monotonic()
    settle("7", PrologOutcome(put_back="hold", admin_comment="noded: refused: full"), budget_s=1.0)
    assert time.monotonic() - started < 2.0
    err = capsys.readouterr().err
    assert "scontrol requeuehold 7 failed: Command '['scontrol', 'requeuehold', '7']' timed out" in err
    assert "scontrol update JobId=7 AdminComment=noded: refused: full not run: the Prolog's 1s for scontrol " \
           "are spent" in err


def test_a_comment_too_long_or_not_text_is_refused_in_the_jobs_admin_comment(tmp_path, capsys, monkeypatch):
    """Read as bytes, bounded: a comment of 128 KiB is no crash and no exec failure, but a
    refusal said where the user sees it (the job then runs without noded)."""
    settings = Settings(socket=str(tmp_path / "nobody.sock"), record_dir=str(tmp_path / "records"))
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_UID": "0"}
    out = prolog(env, settings, SHARED + b" " + b"x" * (128 * 1024))
    assert out == PrologOutcome(admin_comment=f"noded: comment not read: the comment is longer than "
                                              f"{MAX_COMMENT_BYTES} bytes: noded reads no further")
    out = prolog(env, settings, b"noded: model=Bi\xffDAF batch_size=32")
    assert out.admin_comment == ("noded: comment not read: word 1 of the comment's noded part, 'model=Bi\\xffDAF', "
                                 "is not UTF-8") and out.put_back is None
    # main reads no more of its stdin than the bound, and says so (scontrol, absent here, is tried)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_JOB_UID", "0")
    monkeypatch.setenv("NODED_SLURM_RECORD_DIR", str(tmp_path / "records"))
    stdin = io.BytesIO(SHARED + b"x" * (4 * MAX_COMMENT_BYTES))
    assert main(["prolog"], stdin) == 0 and stdin.tell() == MAX_COMMENT_BYTES + 1
    err = capsys.readouterr().err
    assert f"its comment is not for noded (the comment is longer than {MAX_COMMENT_BYTES} bytes" in err
    assert "AdminComment=noded: comment not read: the comment is longer than" in err


def test_the_prolog_hands_the_comment_to_python_through_a_pipe_not_an_exec(tmp_path):
    """The comment is passed to no exec (arguments or environment): the Python the script
    starts finds it on its stdin, whole, and not in its environment."""
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\nenv > {tmp_path}/env\ncat > {tmp_path}/stdin\n")
    fake_python.chmod(0o755)
    comment = SHARED + b" " + b"\xff" * (100 * 1024)
    r = subprocess.run([os.path.join(HOOKS, "prolog")], capture_output=True, timeout=30,
                       env={"SLURM_JOB_ID": "5", "SLURM_JOB_UID": "0", "SLURM_JOB_COMMENT": comment,
                            "NODED_PYTHON": str(fake_python), "NODED_SLURM_HOOKS_CONF": str(tmp_path / "none.conf")})
    assert r.returncode == 0, r
    assert (tmp_path / "stdin").read_bytes() == comment
    assert b"SLURM_JOB_COMMENT" not in (tmp_path / "env").read_bytes()


@pytest.mark.parametrize("hook", ["prolog", "epilog", "task-prolog"])
def test_a_job_without_noded_in_its_comment_costs_no_python(hook, tmp_path):
    """The scripts' fast path: with no "noded:" in the comment the Prolog leaves an empty
    record, the Epilog takes it as "nothing to clean", and the TaskProlog finds no
    environment file: none starts Python, here one that does not exist."""
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_UID": "0", "SLURM_JOB_COMMENT": "plain job",
           "NODED_PYTHON": str(tmp_path / "no-python"), "NODED_SLURM_HOOKS_CONF": str(tmp_path / "none.conf"),
           "NODED_SLURM_ENV_DIR": str(tmp_path), "NODED_SLURM_RECORD_DIR": str(tmp_path / "records")}
    if hook == "epilog":
        run_hook("prolog", env)
        assert (tmp_path / "records/job_5").read_bytes() == b""
    r = run_hook(hook, env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    if hook == "epilog":
        assert os.listdir(tmp_path / "records") == []


def test_the_prolog_writes_no_record_through_a_link(tmp_path):
    """A link planted where a record goes (a record directory others may write: a site's
    mistake) is neither followed nor taken for the Prolog's empty record."""
    (tmp_path / "records").mkdir()
    (tmp_path / "victim").write_text("kept")
    os.symlink(tmp_path / "victim", tmp_path / "records/job_5")
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_UID": "0", "SLURM_JOB_COMMENT": "plain job",
           "NODED_PYTHON": str(tmp_path / "no-python"), "NODED_SLURM_HOOKS_CONF": str(tmp_path / "none.conf"),
           "NODED_SLURM_RECORD_DIR": str(tmp_path / "records"), "NODED_SLURM_ENV_DIR": str(tmp_path / "env")}
    assert run_hook("prolog", env).returncode == 0
    assert (tmp_path / "victim").read_text() == "kept"
    r = run_hook("epilog", env)  # not the Prolog's empty record: Python is asked to clean (here, none)
    assert r.returncode == 0 and "no-python" in r.stderr and (tmp_path / "victim").read_text() == "kept"


def test_the_prolog_writes_no_record_where_others_may_write(tmp_path):
    """A record directory others may write (NODED_SLURM_RECORD_DIR=/tmp, say): a user's
    FIFO where the next job's empty record goes held the Prolog's fast path forever (sh's
    noclobber opens an existing file that is not a regular one), and slurmd drains a node
    whose Prolog outlives PrologEpilogTimeout. The fast path, like Python's, writes records
    only in a directory only root may write, and says so where it is not."""
    records = tmp_path / "records"
    records.mkdir()
    records.chmod(0o1777)
    os.mkfifo(records / "job_5")
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_UID": "0", "SLURM_JOB_COMMENT": "plain job",
           "NODED_PYTHON": str(tmp_path / "no-python"), "NODED_SLURM_HOOKS_CONF": str(tmp_path / "none.conf"),
           "NODED_SLURM_RECORD_DIR": str(records), "NODED_SLURM_ENV_DIR": str(tmp_path / "env")}
    r = subprocess.run([os.path.join(HOOKS, "prolog")], capture_output=True, text=True, timeout=10,
                       env={"PYTHONPATH": REPO, **env})
    assert r.returncode == 0, r
    assert f"{records} is not a directory only root may write: no record kept" in r.stderr
    assert os.listdir(records) == ["job_5"]  # the FIFO, untouched: the Epilog cleans all for the job


def test_the_task_prolog_hands_the_file_to_the_task(tmp_path):
    (tmp_path / "job_5.env").write_text("export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n")
    r = subprocess.run([os.path.join(HOOKS, "task-prolog")], capture_output=True, text=True, timeout=10,
                       env={"SLURM_JOB_ID": "5", "NODED_SLURM_ENV_DIR": str(tmp_path),
                            "NODED_SLURM_HOOKS_CONF": str(tmp_path / "none.conf")})
    assert (r.returncode, r.stdout) == (0, "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n")


def test_the_prolog_with_a_dead_noded_exits_0(tmp_path):
    """The shipped script, Python and all, against a socket nobody serves: exit 0, said."""
    conf = tmp_path / "hooks.conf"
    conf.write_text(f"NODED_SOCKET={tmp_path}/nobody.sock\nNODED_SLURM_TIMEOUT_S=1\n"
                    f"NODED_SLURM_RECORD_DIR={tmp_path}/records\n")
    r = subprocess.run([os.path.join(HOOKS, "prolog")], capture_output=True, text=True, timeout=30,
                       env={"SLURM_JOB_ID": "9", "SLURM_JOB_UID": "0", "SLURM_JOB_COMMENT": "noded: model=A",
                            "NODED_PYTHON": sys.executable, "NODED_SLURM_HOOKS_CONF": str(conf),
                            "PYTHONPATH": REPO})
    assert r.returncode == 0 and "job 9: noded did not answer" in r.stderr, r



BROKEN_CONFS = {"an unclosed quote": 'NODED_SOCKET="/run/noded/noded.sock\n',
                "a stray keyword": "NODED_SLURM_TIMEOUT_S=5\nfi\n",
                "an exit": "NODED_SLURM_TIMEOUT_S=5\nexit 3\n"}


@pytest.mark.parametrize("mistake", sorted(BROKEN_CONFS))
@pytest.mark.parametrize("hook", ["prolog", "epilog", "task-prolog"])
def test_a_hooks_conf_that_is_not_shell_drains_no_node(hook, mistake, tmp_path):
    """A careless edit of slurm-hooks.conf (an unclosed quote: a syntax error, which ends the
    sh that sources it, with status 2) must not fail the hook: slurmd drains a node whose
    Prolog or Epilog exits non-zero. The hook says so, and does its work with its defaults
    (here the environment's)."""
    conf = tmp_path / "hooks.conf"
    conf.write_text(BROKEN_CONFS[mistake])
    (tmp_path / "env").mkdir()
    (tmp_path / "env/job_5.env").write_text("export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n")
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_UID": "0", "SLURM_JOB_COMMENT": "plain job",
           "NODED_PYTHON": str(tmp_path / "no-python"), "NODED_SLURM_HOOKS_CONF": str(conf),
           "NODED_SLURM_ENV_DIR": str(tmp_path / "env"), "NODED_SLURM_RECORD_DIR": str(tmp_path / "records")}
    if hook == "epilog":
        (tmp_path / "records").mkdir()
        (tmp_path / "records/job_5").write_bytes(b"")  # the Prolog's empty record
    r = run_hook(hook, env)
    assert r.returncode == 0, r
    assert f"noded slurm hook: {conf} does not source whole as sh" in r.stderr, r
    if hook == "prolog":
        assert (tmp_path / "records/job_5").read_bytes() == b""
    elif hook == "epilog":
        assert os.listdir(tmp_path / "records") == []
    else:
        assert r.stdout == "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n"


def test_what_the_hooks_conf_prints_reaches_no_tasks_environment(tmp_path):
    """slurmstepd reads a TaskProlog's stdout as the task's environment: a line the site's
    conf prints (a debugging echo) goes to stderr, not into the task."""
    conf = tmp_path / "hooks.conf"
    conf.write_text("echo export LD_PRELOAD=/tmp/x.so\n")
    (tmp_path / "job_5.env").write_text("export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n")
    r = run_hook("task-prolog", {"SLURM_JOB_ID": "5", "NODED_SLURM_ENV_DIR": str(tmp_path),
                                 "NODED_SLURM_HOOKS_CONF": str(conf)})
    assert (r.returncode, r.stdout) == (0, "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n"), r
    assert "LD_PRELOAD" in r.stderr



class SlowNoded:
    """An admin socket served as an overloaded noded would: each label answered
    ``label_delay_s`` late, each admission refused as transient (MPS starting) for
    ``transient_s`` after the first, and from then on never answered (noded hung, as
    SIGSTOP leaves it)."""

    def __init__(self, path, label_delay_s, transient_s):
        import socket
        import time

        self.label_delay_s, self.transient_s, self.time = label_delay_s, transient_s, time
        self.first_admit = None
        self.done = threading.Event()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.path = str(path)
        self.held = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            request = json.loads(conn.makefile("rb").readline())
            command = request["command"]
            if command == "label":
                self.done.wait(self.label_delay_s)  # noded slow to answer
                # in noded's own shape (nodectl refuses any other as not noded's)
                args = request.get("args", {})
                answer = {"job": args.get("job", ""), "labels": args.get("labels", {})}
                conn.sendall(json.dumps({"ok": True, "result": answer}).encode() + b"\n")
            elif self.first_admit is None or self.time.monotonic() - self.first_admit < self.transient_s:
                self.first_admit = self.first_admit or self.time.monotonic()
                conn.sendall(json.dumps({"ok": True, "result": {
                    "admit": False, "job": request.get("args", {}).get("job", ""), "transient": True,
                    "refusal": "mps-not-ready", "reason": "MPS is not running (starting)"}}).encode() + b"\n")
            else:
                self.held.append(conn)  # read, never answered
                continue
            conn.close()

    def close(self):
        self.done.set()
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_the_prologs_waits_for_a_slow_noded_end_within_timeout_and_retry_together(tmp_path):
    """Each request is bounded by NODED_SLURM_TIMEOUT_S and the asks again by
    NODED_SLURM_RETRY_S, but a noded slow to label (just under the timeout), then hung on
    the last ask again, held the Prolog for both timeouts besides the retries: the job's
    start delayed past what the site set (and past Slurm's BatchStartTimeout). All of the
    Prolog's waits for noded end within TIMEOUT_S + RETRY_S of its start."""
    import time

    # labels answered 0.8 s inside the timeout (a loaded test machine must not push them past it)
    slow = SlowNoded(tmp_path / "noded.sock", label_delay_s=1.2, transient_s=1.5)
    settings = Settings(socket=slow.path, timeout_s=2.0, retry_s=2.0, record_dir=str(tmp_path / "records"),
                        env_dir=str(tmp_path / "env"))
    try:
        started = time.monotonic()
        out = prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "0"}, settings, SHARED)
        took = time.monotonic() - started
    finally:
        slow.close()
    assert out == PrologOutcome(labelled=True)  # not admitted: it runs without an MPS share
    # each request bounded alone took label + retries + a whole timeout more: about 5 s here
    assert took < settings.timeout_s + settings.retry_s + 0.5, took


# -- the shipped scripts against a noded's admin socket

def run_hook(hook: str, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(HOOKS, hook)], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": REPO, **env}, **kw)


class MpsStartingUntilLetGo:
    """An MPS control whose start lasts until the test lets it go (a GPU slow to come up
    under nvidia-cuda-mps-control), for noded's own MPS supervisor."""

    pipe_dir = "/run/noded-test/mps"

    def __init__(self):
        self.go, self.stopping = threading.Event(), threading.Event()

    def start(self):
        from mps.errors import MpsStopping

        while not self.go.wait(0.05):
            if self.stopping.is_set():
                raise MpsStopping("closing")

    def check(self, timeout):
        return None

    def reset(self):
        pass

    def interrupt(self):
        self.stopping.set()

    def stop(self, budget):
        pass


class NodedBeside:
    """A simulated node's daemon, with co-location (one GPU, a BiDAF profile; ``mps``: its
    supervisor, started) and its admin socket, ticked once (admission needs a sample); the
    hooks' config pointing at it."""

    def __init__(self, tmp_path, *, label_limit=4096, mps=None, retry_s=20):
        from noded.admin.server import AdminServer
        from noded.colocation.admission import ColocationRule
        from noded.colocation.profiles import JobProfile
        from noded.colocation.service import Colocation
        from noded.jobs import RegisteredLabels
        from support.eliminator import Harness

        with ExitStack() as undo:  # a step that fails undoes those before it: the fixture never gets this object
            self.h = Harness(tmp_path, "  []", gpus=1)
            undo.callback(self.h.stop)
            profiles = {("BiDAF", 32): JobProfile("BiDAF", 32, 12e6, 10e6, 1e6, "test")}
            self.colocation = Colocation(ColocationRule(), profiles,
                                         mps=mps, clock=self.h.daemon.clock).start()  # its kernels compiled first
            undo.callback(self.colocation.close)
            self.labels = RegisteredLabels(label_limit)
            self.h.rebuild(colocation=self.colocation, registered_labels=self.labels)
            self.h.tick()
            self.rundir = tempfile.mkdtemp(prefix="noded-hooks-")
            undo.callback(shutil.rmtree, self.rundir, ignore_errors=True)
            os.chmod(self.rundir, 0o755)
            self.server = AdminServer(os.path.join(self.rundir, "noded.sock"), self.h.daemon, group=None).start()
            undo.pop_all()  # started whole: close() undoes it from here on
        self.env_dir, self.record_dir = tmp_path / "env", tmp_path / "records"
        self.conf = tmp_path / "hooks.conf"
        self.conf.write_text(f"NODED_SOCKET={self.server.path}\nNODED_SLURM_ENV_DIR={self.env_dir}\n"
                             f"NODED_SLURM_RECORD_DIR={self.record_dir}\nNODED_SLURM_RETRY_S={retry_s}\n")

    def env(self, job_id: str, comment: bytes) -> dict:
        return {"SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_COMMENT": comment,
                "NODED_PYTHON": sys.executable, "NODED_SLURM_HOOKS_CONF": str(self.conf)}

    def holds(self, job_id: str) -> dict:
        """What noded and the node hold for the job."""
        job = f"slurm:{job_id}"
        return {"labels": job in self.labels.snapshot(),
                "reservation": job in {r.job for r in self.colocation.reservations()},
                "env_file": (self.env_dir / f"job_{job_id}.env").exists(),
                "record": (self.record_dir / f"job_{job_id}").exists()}

    def close(self):
        self.server.stop()
        self.colocation.close()
        self.h.stop()
        shutil.rmtree(self.rundir, ignore_errors=True)


@pytest.fixture
def noded(tmp_path):
    made = []

    def make(**kw):
        made.append(NodedBeside(tmp_path, **kw))
        return made[-1]

    yield make
    for n in made:
        n.close()


NOTHING = {"labels": False, "reservation": False, "env_file": False, "record": False}


@pytest.mark.fuse
def test_the_epilog_cleans_what_the_prolog_did_whatever_the_comment_says_by_then(noded):
    """The submitter changes the comment after the Prolog (scontrol update JobId=N
    Comment=...): the Epilog, which never reads it, leaves nothing behind; nor where the
    Prolog's record is gone; and a second run finds nothing to do."""
    n = noded()
    for job_id, record in (("7", "kept"), ("8", "lost"), ("9", "garbled")):
        r = run_hook("prolog", n.env(job_id, SHARED))
        assert r.returncode == 0 and r.stderr == "", r
        assert {k: v for k, v in n.holds(job_id).items() if k != "record"} == \
            {"labels": True, "reservation": True, "env_file": True}
        if record == "lost":
            (n.record_dir / f"job_{job_id}").unlink(missing_ok=True)
        elif record == "garbled":
            (n.record_dir / f"job_{job_id}").write_bytes(b'{"env_file": "/etc/passwd"')
        r = run_hook("epilog", n.env(job_id, b"changed since; nothing for noded here"))
        assert r.returncode == 0 and r.stderr == ("" if record != "garbled" else
                                                  f"noded slurm hook: job {job_id}: its Prolog's record is not one: "
                                                  "all noded may hold for it is cleaned\n"), r
        assert n.holds(job_id) == NOTHING
        r = run_hook("epilog", n.env(job_id, b""))  # again: nothing to do, nothing said
        assert (r.returncode, r.stderr, n.holds(job_id)) == (0, "", NOTHING), r
    # a record removes no file but the job's environment file, whatever it names
    victim = n.record_dir.parent / "victim"
    victim.write_text("kept")
    (n.record_dir / "job_10").write_text(json.dumps({"job": "slurm:10", "env_file": str(victim)}))
    assert run_hook("epilog", n.env("10", b"")).returncode == 0
    assert victim.read_text() == "kept" and n.holds("10") == NOTHING


@pytest.mark.fuse
def test_at_the_label_cap_a_shared_job_is_still_admitted(noded):
    """noded keeps registered labels for at most label_limit jobs: one more job's labels are
    refused, and its admission is asked all the same, with its comment's model and batch
    size (the Epilog then forgets its reservation)."""
    n = noded(label_limit=1)
    n.labels.set("slurm:1", {"model": "other"})
    r = run_hook("prolog", n.env("7", SHARED))
    assert r.returncode == 0 and "noded refused its labels (1 jobs hold registered labels already" in r.stderr, r
    assert "admission is asked all the same" in r.stderr
    assert n.holds("7") == {"labels": False, "reservation": True, "env_file": True, "record": True}
    # the Prolog's record, kept before noded was asked anything: what the Epilog cleans
    assert json.loads((n.record_dir / "job_7").read_text()) == \
        {"job": "slurm:7", "env_file": str(n.env_dir / "job_7.env")}
    assert "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100" in (n.env_dir / "job_7.env").read_text()
    run_hook("epilog", n.env("7", b""))
    assert n.holds("7") == NOTHING


@pytest.mark.fuse
def test_labels_noded_refuses_are_said_in_the_jobs_admin_comment(noded):
    """A value noded refuses (category=nlp: the categories are CV, NLP, Speech) leaves the job
    unlabelled: said where its submitter sees it (scontrol show job: AdminComment), as a
    comment noded cannot read is, not only in slurmd's log; beside an admission's word."""
    n = noded()
    settings = Settings.from_environ({"NODED_SOCKET": n.server.path, "NODED_SLURM_ENV_DIR": str(n.env_dir),
                                      "NODED_SLURM_RECORD_DIR": str(n.record_dir)})
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "0"}
    out = prolog(env, settings, b"noded: model=BiDAF category=nlp")
    assert out == PrologOutcome(admin_comment="noded: labels refused: labels of slurm:7: category must be one of "
                                              "('CV', 'NLP', 'Speech'), not 'nlp'")
    out = prolog({**env, "SLURM_JOB_ID": "8"}, settings, b"noded: model=BiDAF batch_size=7 category=nlp share=mps")
    assert out.put_back == "hold" and out.admin_comment.startswith(
        "noded: labels refused: labels of slurm:8: category must be one of ('CV', 'NLP', 'Speech'), not 'nlp'; "
        "noded: refused: no profile for BiDAF")
    assert prolog({**env, "SLURM_JOB_ID": "9"}, settings, b"noded: model=BiDAF category=NLP") == \
        PrologOutcome(labelled=True)


@pytest.mark.fuse
def test_a_refusal_while_mps_starts_is_asked_again_within_the_budget(noded):
    """MPS (re)starting is a transient refusal, typed so in noded's reply: the Prolog asks
    again until MPS is up, and the job is admitted, not held."""
    from mps.supervisor import MpsSupervisor

    control = MpsStartingUntilLetGo()
    n = noded(mps=MpsSupervisor(control, health_interval_s=0.1))
    hook = subprocess.Popen([os.path.join(HOOKS, "prolog")], env={"PYTHONPATH": REPO, **n.env("7", SHARED)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: n.colocation.decisions["refuse"], 30, what="the Prolog's first ask refused")
        control.go.set()  # MPS comes up
        _, err = hook.communicate(timeout=60)
    finally:
        hook.kill()
        hook.wait()
    assert hook.returncode == 0 and err == "", err
    assert n.holds("7") == {"labels": True, "reservation": True, "env_file": True, "record": True}


@pytest.mark.fuse
@pytest.mark.parametrize("on_not_ready", ["requeue", "hold", "run"])
def test_mps_not_up_within_the_budget_goes_as_the_site_chose(noded, on_not_ready):
    """noded's reply types its refusal (the hook reads that, not the prose); a transient one
    still there when NODED_SLURM_RETRY_S is spent goes as NODED_SLURM_ON_NOT_READY says, a
    final one as NODED_SLURM_ON_REFUSAL, at once."""
    from mps.supervisor import MpsSupervisor
    from noded.admin.request import request

    n = noded(mps=MpsSupervisor(MpsStartingUntilLetGo(), health_interval_s=0.1), retry_s=0.6)
    first = request(n.server.path, "admit", {"job": "probe", "model": "BiDAF", "batch_size": 32})
    assert (first["admit"], first["refusal"], first["transient"]) == (False, "mps-not-ready", True)
    assert "MPS is not running (starting)" in first["reason"]
    final = request(n.server.path, "admit", {"job": "probe", "model": "BiDAF", "batch_size": 7})
    assert (final["admit"], final["refusal"], final["transient"]) == (False, "no-profile", False)
    settings = Settings.from_environ({"NODED_SOCKET": n.server.path, "NODED_SLURM_ENV_DIR": str(n.env_dir),
                                      "NODED_SLURM_RECORD_DIR": str(n.record_dir), "NODED_SLURM_RETRY_S": "0.6",
                                      "NODED_SLURM_ON_NOT_READY": on_not_ready})
    refused = n.colocation.decisions["refuse"]
    out = prolog({"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "0"}, settings, SHARED)
    assert n.colocation.decisions["refuse"] - refused >= 2  # asked again
    why = "noded: not ready for 0.6s (mps-not-ready): MPS is not running (starting)"
    assert out == (PrologOutcome(True, admin_comment=f"{why}; it ran without an MPS share") if on_not_ready == "run"
                   else PrologOutcome(True, put_back=on_not_ready, admin_comment=why))
    # a final refusal is not asked again: the site's on_refusal at once
    refused = n.colocation.decisions["refuse"]
    out = prolog({"SLURM_JOB_ID": "8", "SLURM_JOB_UID": "0"}, settings, b"noded: model=BiDAF batch_size=7 share=mps")
    assert n.colocation.decisions["refuse"] - refused == 1
    assert out.put_back == "hold" and out.admin_comment.startswith("noded: refused: no profile for BiDAF")


def test_what_outlives_a_restart_of_noded_is_outside_its_runtime_directories():
    # systemd empties a unit's RuntimeDirectory whenever it stops: a job's environment file
    # (each later step's TaskProlog reads it) and its record (the Epilog's) must survive that
    unit = open(os.path.join(REPO_ROOT, "systemd", "noded.service")).read()
    runtime = [f"/run/{d}/" for line in unit.splitlines() if line.startswith("RuntimeDirectory=")
               for d in line.split("=", 1)[1].split()]
    assert runtime
    defaults = Settings.from_environ({})
    for path in (defaults.env_dir, defaults.record_dir):
        assert not any((path + "/").startswith(r) for r in runtime), (path, runtime)
    # the shell hooks' own defaults are the same directories
    assert "${NODED_SLURM_ENV_DIR:-%s}" % defaults.env_dir in open(os.path.join(HOOKS, "task-prolog")).read()
    assert "${NODED_SLURM_RECORD_DIR:-%s}" % defaults.record_dir in open(os.path.join(HOOKS, "epilog")).read()
