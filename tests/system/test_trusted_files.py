"""Files noded reads or runs as root must be ones no other local user can change.

Before: `noded check-config` said "ok" and `noded run` started on a config file owned by
`nobody` with mode 0666, and on a config naming as colocation.mps.control a program any
user could rewrite (noded runs it as root); the labels file (which jobs are exempt) and
the co-location profiles likewise. Now each is refused at the key that names it (the
config file itself as "(file)"), by check-config, at start (nothing made) and on reload
(the running config kept), as directories already were (SecureDir).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from support.sockets import NotifySocket
from support.in_process import noded_in_process
from support.system import popen_noded
from noded.stores.trustedfile import untrusted_reason

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files are given to another user")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOBODY = 65534


def noded(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "noded", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=env)


def base(tmp_path) -> str:
    return (f"state_dir: {tmp_path}/state\nruntime_dir: {tmp_path}/run\nnvml: false\n"
            "metrics: {address: 127.0.0.1, port: 0}\n")


def refused_by_both(cfg, line: str, env=None) -> None:
    check = noded("check-config", str(cfg), env=env) if env is not None else noded_in_process("check-config", str(cfg))
    assert check.returncode == 1 and line in check.stderr, check.stdout + check.stderr
    start = noded("run", "--config", str(cfg), env=env)
    assert start.returncode == 1 and "Traceback" not in start.stderr, start.stderr
    assert line.split(": ", 1)[1] in start.stderr, start.stderr
    assert not os.path.exists(cfg.parent / "run") and not os.path.exists(cfg.parent / "state")  # nothing made


@pytest.mark.parametrize("owner, mode, why", [
    (NOBODY, 0o644, f"is owned by uid {NOBODY}, not by root or noded's uid 0"),
    (0, 0o666, "is writable by group and others (mode 0666)"),
    (0, 0o646, "is writable by others (mode 0646)"),
])
def test_a_config_file_another_user_may_change_is_refused(tmp_path, owner, mode, why):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(base(tmp_path))
    os.chown(cfg, owner, -1)
    os.chmod(cfg, mode)
    refused_by_both(cfg, f"{cfg}:1: (file): the config file {cfg} {why}")


def test_a_config_in_a_directory_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # not sticky: anyone may replace the file
    cfg = shared / "c.yaml"
    cfg.write_text(base(tmp_path))
    check = noded_in_process("check-config", str(cfg))
    assert check.returncode == 1 and f"{cfg}:1: (file): the config file {cfg}: refused: {shared} is writable by " \
        "group and others (mode 0777) and not sticky" in check.stderr, check.stderr


def test_an_mps_control_program_another_user_may_rewrite_is_refused(tmp_path):
    from nodesim.nvml_lib import library_dir

    program = tmp_path / "mps-control"
    program.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(program, 0o755)
    os.chown(program, NOBODY, -1)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(base(tmp_path) + f"colocation:\n  enabled: true\n  mps:\n    control: {program}\n"
                   f"    log_dir: {tmp_path}/mps-log\n")
    env = {**os.environ, "LD_LIBRARY_PATH": library_dir("current")}
    refused_by_both(cfg, f"{cfg}:8: colocation.mps.control: the MPS control binary {program} is owned by uid "
                         f"{NOBODY}, not by root or noded's uid 0", env=env)


def test_a_labels_file_others_may_write_is_refused(tmp_path):
    labels = tmp_path / "labels.yaml"
    labels.write_text("'cgroup:mine': {exempt: true}\n")
    os.chmod(labels, 0o666)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(base(tmp_path) + f"jobs: {{labels: {labels}}}\n")
    refused_by_both(cfg, f"{cfg}:5: jobs.labels: the labels file {labels} is writable by group and others")


def test_a_link_planted_by_another_user_is_refused_and_roots_own_files_are_taken(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("x")
    assert untrusted_reason(str(mine), "the file") is None
    assert untrusted_reason(str(tmp_path / "absent"), "the file") is None  # its reader says it is missing
    link = tmp_path / "link.yaml"
    link.symlink_to(mine)
    assert untrusted_reason(str(link), "the file") is None
    os.lchown(link, NOBODY, -1)
    assert untrusted_reason(str(link), "the file") == \
        f"the file {link} is a symbolic link owned by uid {NOBODY}, not by root or noded's uid 0: " \
        "that user could change what noded does as root"


def test_a_reload_refuses_a_config_file_made_writable_by_others(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(base(tmp_path) + "tick_s: 0.1\n")
    notify = NotifySocket(tmp_path / "notify")
    p = popen_noded(["run", "--config", str(cfg)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True, env={**os.environ, "NOTIFY_SOCKET": notify.path})
    try:
        notify.ready()
        cfg.write_text(base(tmp_path) + "tick_s: 0.2\n")
        os.chmod(cfg, 0o666)
        p.send_signal(signal.SIGHUP)
        notify.until("RELOADING", "1")
        status = notify.until("READY", "1")
        assert status.get("STATUS", "").startswith("config reload refused"), status
    finally:
        p.terminate()
        out, err = p.communicate(timeout=30)
        notify.close()
    assert p.returncode == 0, err
    assert f"config reload refused, keeping the running config: {cfg}:1: (file): the config file {cfg} is writable " \
           "by group and others (mode 0666)" in err, err
