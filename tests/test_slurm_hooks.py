"""noded's Slurm hooks without a Slurm: what a job's comment asks, the site's settings, the
environment file, and failing safe (exit 0, said on stderr). tests/slurm/ runs them under
a real one-host Slurm."""

import os
import subprocess
import sys

import pytest

from noded.integrations.slurm import JobRequest, Settings, main, write_env
from noded.labelwords import LabelWordError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOKS = os.path.join(REPO, "integrations", "slurm")


def test_what_a_comment_asks():
    assert JobRequest.from_job("noded: model=BiDAF batch_size=32 share=mps") == \
        JobRequest({"model": "BiDAF", "batch_size": 32}, "mps")
    assert JobRequest.from_job("nightly run") == JobRequest({}, None)
    # gres/mps from Slurm asks for admission where the comment names model and batch size
    assert JobRequest.from_job("noded: model=BiDAF batch_size=32", gres_mps=True).share == "mps"
    assert JobRequest.from_job("noded: model=BiDAF", gres_mps=True).share is None
    with pytest.raises(LabelWordError, match="share=mps needs model= and batch_size="):
        JobRequest.from_job("noded: share=mps model=BiDAF")
    with pytest.raises(LabelWordError, match="the one way to share a GPU is share=mps"):
        JobRequest.from_job("noded: share=mig")


def test_settings_are_checked():
    assert Settings.from_environ({}) == Settings()
    s = Settings.from_environ({"NODED_SOCKET": "/x.sock", "NODED_SLURM_ON_REFUSAL": "requeue",
                               "NODED_SLURM_ENV_DIR": "/e", "NODED_SLURM_TIMEOUT_S": "2"})
    assert (s.socket, s.on_refusal, s.env_dir, s.timeout_s) == ("/x.sock", "requeue", "/e", 2.0)
    with pytest.raises(ValueError, match="NODED_SLURM_ON_REFUSAL must be one of hold, requeue, not 'drop'"):
        Settings.from_environ({"NODED_SLURM_ON_REFUSAL": "drop"})
    with pytest.raises(ValueError, match=r"NODED_SLURM_TIMEOUT_S must be in \(0, 60\]"):
        Settings.from_environ({"NODED_SLURM_TIMEOUT_S": "600"})


def test_the_environment_file_is_the_jobs_users_and_one_line_a_variable(tmp_path):
    settings = Settings(env_dir=str(tmp_path / "env"))
    write_env(settings, "7", 65534, {"CUDA_VISIBLE_DEVICES": "GPU-1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"})
    path = tmp_path / "env/job_7.env"
    assert path.read_text() == "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\nexport CUDA_VISIBLE_DEVICES=GPU-1\n"
    st = os.stat(path)
    assert st.st_uid == 65534 and st.st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="not one line"):
        write_env(settings, "8", 0, {"A": "x\nexport LD_PRELOAD=/evil.so"})
    assert not (tmp_path / "env/job_8.env").exists()


def test_a_hook_exits_0_whatever_fails_and_says_why(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_JOB_UID", "0")
    monkeypatch.setenv("NODED_SOCKET", str(tmp_path / "nobody.sock"))
    monkeypatch.setenv("SLURM_JOB_COMMENT", "noded: model=BiDAF batch_size=32 share=mps")
    assert main(["prolog"]) == 0
    assert "job 12: noded did not answer (no admin socket at" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_JOB_COMMENT", "noded: batch_size=huge")
    assert main(["prolog"]) == 0
    assert "its comment is not for noded ('batch_size=huge': batch_size must be a whole number)" in \
        capsys.readouterr().err
    monkeypatch.setenv("NODED_SLURM_ON_REFUSAL", "sometimes")
    assert main(["epilog"]) == 0
    assert "epilog failed (ValueError: NODED_SLURM_ON_REFUSAL must be one of" in capsys.readouterr().err
    monkeypatch.delenv("SLURM_JOB_UID")
    assert main(["prolog"]) == 0 and "SLURM_JOB_ID and SLURM_JOB_UID must be set" in capsys.readouterr().err
    assert main(["neither"]) == 2


@pytest.mark.parametrize("hook", ["prolog", "epilog", "task-prolog"])
def test_a_job_without_noded_in_its_comment_costs_no_python(hook, tmp_path):
    """The scripts' fast path: with no "noded:" in the comment (and, for the TaskProlog, no
    environment file) they exit 0 without starting Python, here one that does not exist."""
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_UID": "0", "SLURM_JOB_COMMENT": "plain job",
           "NODED_PYTHON": str(tmp_path / "no-python"), "NODED_SLURM_HOOKS_CONF": str(tmp_path / "none.conf"),
           "NODED_SLURM_ENV_DIR": str(tmp_path)}
    r = subprocess.run([os.path.join(HOOKS, hook)], env=env, capture_output=True, text=True, timeout=10)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_the_task_prolog_hands_the_file_to_the_task(tmp_path):
    (tmp_path / "job_5.env").write_text("export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n")
    r = subprocess.run([os.path.join(HOOKS, "task-prolog")], capture_output=True, text=True, timeout=10,
                       env={"SLURM_JOB_ID": "5", "NODED_SLURM_ENV_DIR": str(tmp_path),
                            "NODED_SLURM_HOOKS_CONF": str(tmp_path / "none.conf")})
    assert (r.returncode, r.stdout) == (0, "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n")


def test_the_prolog_with_a_dead_noded_exits_0(tmp_path):
    """The shipped script, Python and all, against a socket nobody serves: exit 0, said."""
    conf = tmp_path / "hooks.conf"
    conf.write_text(f"NODED_SOCKET={tmp_path}/nobody.sock\nNODED_SLURM_TIMEOUT_S=1\n")
    r = subprocess.run([os.path.join(HOOKS, "prolog")], capture_output=True, text=True, timeout=30,
                       env={"SLURM_JOB_ID": "9", "SLURM_JOB_UID": "0", "SLURM_JOB_COMMENT": "noded: model=A",
                            "NODED_PYTHON": sys.executable, "NODED_SLURM_HOOKS_CONF": str(conf)})
    assert r.returncode == 0 and "job 9: noded did not answer" in r.stderr, r
