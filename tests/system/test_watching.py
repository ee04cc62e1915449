"""Loud defaults (issue #26, item 1): a noded that watches no job source, no GPU or no
resctrl says so at start, in `nodectl status` (text and --json), in the gauge
``noded_watching{what}`` and in the journal when each such state begins and ends."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import urllib.request

from support.waiting import read_until
from noded.config import Config, JobSourceConfig
from noded.commands.hostcheck import start_check
from noded.loop.lasting import LastingStates
from noded.samplers.sample import build_sample
from noded.samplers.nvml import NvmlSample
from noded.loop.watching import watching
from support.paths import REPO_ROOT
from support.system import popen_noded

ROOT = REPO_ROOT


def test_a_noded_that_watches_nothing_says_so_at_start_in_status_and_in_its_metrics(tmp_path):
    config = tmp_path / "noded.yaml"
    config.write_text(f"state_dir: {tmp_path}/state\nruntime_dir: {tmp_path}/run\n"
                      f"metrics: {{address: 127.0.0.1, port: 0}}\nresctrl: {{root: {tmp_path}/no-resctrl}}\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}  # no NVML library: no GPU
    env["PYTHONPATH"] = ROOT
    p = popen_noded(["run", "--config", str(config)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # at start, before the loop: what the config leaves out
        line = read_until(p.stdout, "jobs.sources", "the start's line on the job sources")
        assert "no job source configured" in line and "Slurm, Kubernetes and plain cgroups" in line
        url = read_until(p.stdout, "metrics at", "the metrics URL").split("metrics at ")[1].strip()
        for what in ("gpus", "jobs", "resctrl"):  # in the order logged: by name
            read_until(p.stdout, f"state=not_watching_{what} entered", f"the loop's line on {what}")
        socket = str(tmp_path / "run" / "noded.sock")
        st = json.loads(subprocess.run([sys.executable, "-m", "noded.admin.nodectl", "--socket", socket, "--json",
                                        "status"], env=env, capture_output=True, text=True, check=True).stdout)
        watched = {w["what"]: w for w in st["watching"]}
        assert {w: watched[w]["watching"] for w in watched} == {"jobs": False, "gpus": False, "resctrl": False}
        assert "jobs.sources is empty" in watched["jobs"]["why"] and "NVML" in watched["gpus"]["why"]
        text = subprocess.run([sys.executable, "-m", "noded.admin.nodectl", "--socket", socket, "status"], env=env,
                              capture_output=True, text=True, check=True).stdout
        assert re.search(r"^NOT WATCHING jobs: no job source configured", text, re.M), text
        assert re.search(r"^NOT WATCHING gpus: NVML unavailable", text, re.M), text
        assert re.search(r"^NOT WATCHING resctrl: resctrl unavailable", text, re.M), text
        metrics = urllib.request.urlopen(url, timeout=5).read().decode()
        for what in ("jobs", "gpus", "resctrl"):
            assert f'noded_watching{{what="{what}"}} 0.0' in metrics, metrics
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)


def test_check_config_warns_of_a_config_without_a_job_source_and_not_of_one_with_one(tmp_path):
    base = Config(state_dir=str(tmp_path / "state"), runtime_dir=str(tmp_path / "run"))
    assert any(key == "jobs.sources" and "no job source configured" in what for key, what in start_check(base).warnings)
    with_source = Config(state_dir=base.state_dir, runtime_dir=base.runtime_dir,
                         jobs=type(base.jobs)(sources=(JobSourceConfig(kind="slurm", root="/sys/fs/cgroup"),)))
    assert not any(key == "jobs.sources" for key, _ in start_check(with_source).warnings)


def _sample(nvml: NvmlSample | None, sources=()):
    return build_sample(0.0, {}, None, nvml, None, job_sources=sources)


def test_nvml_that_answers_with_no_gpu_is_not_watching_gpus():
    config = Config()
    none = {w.what: w for w in watching(_sample(NvmlSample(True, None, "550.54", ()), ("slurm /sys/fs/cgroup",)), config)}
    assert not none["gpus"].watching and "lists no GPU" in none["gpus"].why
    assert none["jobs"].watching and "slurm /sys/fs/cgroup" in none["jobs"].why
    off = {w.what: w for w in watching(_sample(None), Config(nvml=False))}
    assert not off["gpus"].watching and "nvml is false" in off["gpus"].why
    assert not off["jobs"].watching and not off["resctrl"].watching


def test_a_lasting_state_is_logged_once_when_it_begins_and_once_when_it_ends(caplog):
    states = LastingStates()
    with caplog.at_level(logging.DEBUG, logger="noded.changes"):
        for t in range(3):
            states.update({"not_watching_gpus": "NVML unavailable"}, float(t))
        states.update({}, 3.0)
        states.update({}, 4.0)
        # one that lapses for less than its grace has not ended; away that long, it has
        states.update({"contention": "nothing left"}, 10.0, grace_s=5)
        states.update({}, 11.0, grace_s=5)
        states.update({"contention": "nothing left"}, 12.0, grace_s=5)
        states.update({}, 13.0, grace_s=5)
        states.update({}, 17.0, grace_s=5)
        states.update({}, 18.0, grace_s=5)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "noded.changes"]
    assert lines == [(logging.WARNING, "state=not_watching_gpus entered: NVML unavailable"),
                     (25, "state=not_watching_gpus ended: no longer: NVML unavailable"),
                     (logging.WARNING, "state=contention entered: nothing left"),
                     (25, "state=contention ended: no longer (5s without it): nothing left")]
