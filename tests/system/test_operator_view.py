"""What an operator sees, fed by a hostile user or a careless operator (issue #12 red team).

Text that reaches a log line, the operator's terminal or systemd comes partly from
people other than the operator: job ids from cgroup names (a user with a delegated
subtree names its own), override and pause reasons from any member of the admin group,
keys of a config file someone handed over. None of it may end a line early, forge a
line (at another priority: journald's stream reader ends a line at NUL and reads a
``<N>`` after it), drive a terminal (ESC, CR, C1 controls), or add an assignment to a
notify message.
"""

import io
import json
import logging
import os
import re
import time
import socket
import subprocess
import sys
from types import MappingProxyType

import pytest

from support.admin import nodectl_run

from noded.admin import nodectl
from noded.config import Config, ConfigError, parse_config
from noded.loop.daemon import TickResult
from noded.jobs.model import JobMeta
from noded.util.journal import JournalHandler, LineHandler, configure_logging, log_change, printable
from noded.policy.contention import Decision
from noded.samplers.sample import CPU, JobSample, Sample
from noded.commands.sdnotify import SystemdNotifier

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GB = 1e9
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="nodectl talks only to a socket served by root")

#: what a hostile value carries: a NUL then a forged emergency, a terminal's clear screen
#: and title change, a carriage return, a C1 CSI, a line separator, a bidi override
HOSTILE = "x\0<0>forged \x1b[2J\x1b]0;owned\x07 \rover \x9b31m \u2028 \u202egnp.exe"
#: what must not be written as it is (the newline is checked per line)
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def assert_lines_clean(text, priorities=None):
    assert not RAW.search(text), repr(text)
    for line in text.splitlines():
        if priorities is not None:
            assert re.match(r"<(\d)>", line) and int(line[1]) in priorities, repr(line)


# ------------------------------------------------------------ the journal's <N> lines


def test_a_hostile_value_in_a_logged_line_cannot_forge_a_line_or_drive_a_terminal(root_logging):
    out = io.StringIO()
    configure_logging(False, stream=out, env={})  # off a terminal: <N> lines, as journald's stream reads them
    log_change("override-set", "cgroup:" + HOSTILE, level_to=1, severity=logging.WARNING, uid=1000, reason=HOSTILE)
    logging.getLogger("noded.jobs.discovery").error("labels=%s rejected: %s", "/x", HOSTILE)
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        logging.getLogger("noded.loop.daemon").exception("tick failed")
    text = out.getvalue()
    assert_lines_clean(text, priorities={3, 4})
    # NUL, journald's other line end: none, so "<0>forged" stays inside a <4> or <3> line
    assert "\0" not in text and not re.search(r"(^|\n)<0>", text)
    assert text.count("\\x00<0>forged") == 4 and "\\x1b[2J" in text and "\\u202e" in text


def test_the_journal_fallback_lines_are_escaped_too(tmp_path, root_logging):
    """Under journald, a record the journal socket refuses goes to stderr as <N> lines."""
    out = io.StringIO()
    h = JournalHandler(str(tmp_path / "no-journal-here"), fallback=LineHandler(out, prefix=True))
    h.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger = logging.getLogger("noded.test_operator_view")
    logger.addHandler(h)
    try:
        logger.warning("job %s", HOSTILE)
    finally:
        logger.removeHandler(h)
        h.close()
    assert h.last_error is not None
    assert_lines_clean(out.getvalue(), priorities={4})
    assert out.getvalue().count("\n") == 1


def test_on_a_terminal_no_escape_sequence_of_a_job_id_reaches_it(root_logging):
    master, slave = os.openpty()
    with open(slave, "w", closefd=True) as tty, open(master, "rb", buffering=0) as reader:
        configure_logging(False, stream=tty, env={})
        log_change("admit", "slurm:7\x1b]52;c;ZWNobyBwd25lZA==\x07", reason="GPU 0 is free\x1b[1A\x1b[2K")
        got = reader.read(4096).decode()
    assert "\x1b" not in got and "\x07" not in got
    # (the id's '=' escaped too: one word after job=, no key of its own)
    assert got == ("noded.changes: admit job=slurm:7\\x1b]52;c;ZWNobyBwd25lZA\\x3d\\x3d\\x07: "
                   "GPU 0 is free\\x1b[1A\\x1b[2K\r\n")


def test_printable_keeps_ordinary_text_and_tabs():
    text = "throttle job=slurm:42 level=0->2 cause=contention: node at 91% of peak\tµ GB/s ü"
    assert printable(text) == text
    assert printable("a\nb\rc\0d") == "a\\nb\\rc\\x00d"


# ------------------------------------------------------------ systemd's notify socket


def test_a_newline_in_a_status_cannot_add_an_assignment(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        s.settimeout(30)
        notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
        assert notifier.status("config reload refused: key\nREADY=1\nMAINPID=1\0STOPPING=1")
        data = s.recv(4096)
    assert b"\0" not in data
    assert data.decode().split("\n") == ["STATUS=config reload refused: key\\nREADY=1\\nMAINPID=1\\x00STOPPING=1"]


# ------------------------------------------------------------ check-config


HOSTILE_CONFIG = ('"\\e]0;owned\\a\\e[2Jtick_s\\nforged.yaml:1: tick_s": 1\n'
                  'contention:\n  "\\e[31mred\\r\\u0085": 2\n  threshold: 7\n')


def test_check_config_writes_a_hostile_key_as_one_escaped_line():
    with pytest.raises(ConfigError) as e:
        parse_config(HOSTILE_CONFIG, "hostile.yaml")
    assert len(e.value.problems) == 3
    lines = str(e.value).split("\n")
    assert len(lines) == 3 and all(line.startswith("hostile.yaml:") for line in lines), lines
    assert_lines_clean(str(e.value))
    assert "\\x1b]0;owned\\x07\\x1b[2Jtick_s\\nforged.yaml:1: tick_s" in lines[0]


def test_check_config_on_a_terminal_gets_no_control_codes(tmp_path):
    path = tmp_path / "hostile.yaml"
    path.write_text(HOSTILE_CONFIG)
    p = subprocess.run([sys.executable, "-m", "noded", "check-config", str(path)], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert p.returncode == 1 and p.stdout == ""
    assert_lines_clean(p.stderr)
    assert len(p.stderr.splitlines()) == 3 and all(line.startswith(f"{path}:") for line in p.stderr.splitlines())


# ------------------------------------------------------------ nodectl's text


def job(jid, bw=1 * GB):
    return JobSample(jid, "cgroup", frozenset({1}), JobMeta(), CPU, (), None, bw, "own")


EVIL_JOB = "cgroup:user.slice/" + HOSTILE.replace("\0", "")  # a cgroup's name holds no NUL


@pytest.fixture
def served(admin_socket):
    """An admin socket over a last tick with a job named by a hostile user."""
    jobs = [job(EVIL_JOB, 7 * GB), job("slurm:1")]
    sample = Sample(10.0, MappingProxyType({j.id: j for j in jobs}), (), True, None, (0,),
                    MappingProxyType({0: 5 * GB}), (), (), True)
    last = TickResult(3, 10.0, sample, Decision(MappingProxyType({}), (), False, 0.5, (), ""), (),
                      MappingProxyType({}), "mba", MappingProxyType({EVIL_JOB: 1}),
                      config=Config(peak_gbps_per_domain=10), original_cpus=MappingProxyType({}))
    return admin_socket(last)


ctl = nodectl_run


@AS_ROOT
def test_nodectl_text_escapes_job_ids_and_reasons_and_json_keeps_them(served, capsys, root_logging):
    logging.getLogger("noded.changes").disabled = True  # the override's own log line is not this test's
    try:
        code, out, err = ctl(served.path, "throttle", EVIL_JOB, "--level", "2", "--reason", "fine\n" + HOSTILE,
                             capsys=capsys)
    finally:
        logging.getLogger("noded.changes").disabled = False
    assert code == 0 and err == ""
    assert_lines_clean(out) and out.count("\n") == 1
    for argv in (["status"], ["jobs"], ["explain", EVIL_JOB], ["top", "--iterations", "1"]):
        code, out, err = ctl(served.path, *argv, capsys=capsys)
        assert code == 0 and err == "", (argv, err)
        assert_lines_clean(out)
        assert "\\x1b[2J" in out, argv
        # a reason's newline is not a line of its own: no line begins with what followed it
        assert not any(line.startswith("x") for line in out.splitlines()), (argv, out)
    code, out, _ = ctl(served.path, "--json", "status", capsys=capsys)
    st = json.loads(out)
    assert code == 0 and EVIL_JOB in [j["job"] for j in st["jobs"]]
    assert st["overrides"][0]["reason"] == "fine\n" + HOSTILE
    assert_lines_clean(out)  # json.dumps escapes them


@AS_ROOT
def test_nodectl_errors_naming_hostile_jobs_are_escaped(served, capsys):
    code, out, err = ctl(served.path, "throttle", "slurm:2\x1b[2J", "--level", "1", capsys=capsys)
    assert code == 1 and out == ""
    assert_lines_clean(err) and err.count("\n") == 1  # the known jobs it names include EVIL_JOB
    assert "no job" in err and "\\x1b[2J" in err


def test_admit_exports_one_shell_word_per_value(capsys, monkeypatch):
    answer = {"admit": True, "job": "slurm:1", "gpu_uuid": "GPU-1", "gpu_index": 0, "predicted_speedup": None,
              "reason": "free", "env": {"NODED_JOB": "slurm:1; touch /tmp/owned", "CUDA_VISIBLE_DEVICES": "GPU-1"},
              "sources": [], "sum_c_after": 0.1, "n_jobs_after": 1}
    monkeypatch.setattr(nodectl, "request", lambda *a, **kw: answer)
    code = nodectl.main(["admit", "--job", "slurm:1", "--model", "m", "--batch-size", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "export NODED_JOB='slurm:1; touch /tmp/owned'\n" in out and "export CUDA_VISIBLE_DEVICES=GPU-1\n" in out


# ------------------------------------------------------------ the report socket's memory and log


def test_a_job_reporting_without_end_keeps_bounded_memory(tmp_path):
    """Any process of a job may send reports, as fast as it likes, for as long as it likes:
    what noded keeps of them is bounded, and the latest times are the ones used."""
    from noded.colocation.outcomes import MAX_KEYS, MAX_TIMES, Outcomes

    outcomes = Outcomes(str(tmp_path / "state"), min_samples=3)
    for i in range(20 * MAX_TIMES):
        outcomes.report("a", 1.0 if i < 19 * MAX_TIMES else 2.0, frozenset())
        outcomes.report("a", 4.0, frozenset({"b"}))
        outcomes.report("b", 1.0, frozenset())
        outcomes.report("b", 2.0, frozenset({"a"}))
    assert len(outcomes._solo["a"]) == MAX_TIMES and len(outcomes._shared[("a", frozenset({"b"}))]) == MAX_TIMES
    assert set(outcomes._solo["a"]) == {2.0}  # the latest
    for n in range(2 * MAX_KEYS):  # jobs come and go (a user making cgroups): old ones are dropped
        outcomes.report(f"cgroup:u/{n}", 1.0, frozenset())
    assert len(outcomes._solo) == MAX_KEYS and "cgroup:u/0" not in outcomes._solo and "a" not in outcomes._solo
    for _ in range(3):  # a and b, reporting again, are kept again
        outcomes.report("a", 2.0, frozenset())
        outcomes.report("b", 1.0, frozenset())
    rec = outcomes.observe(frozenset({"a", "b"}), {"a": (0.1, 0.1, 1.0), "b": (0.1, 0.1, 1.0)})
    assert rec is not None and rec.delta == pytest.approx((2.0 + 1.0) / 4.0)


def test_a_failing_record_write_is_not_a_log_line_per_report(tmp_path, caplog):
    from noded.colocation.outcomes import RECORDS_FILE, Outcomes

    state = tmp_path / "state"
    outcomes = Outcomes(str(state), min_samples=1)
    (state / RECORDS_FILE).mkdir()  # the records file cannot be opened for writing
    features = {"a": (0.1, 0.1, 1.0), "b": (0.1, 0.1, 1.0)}
    for job, peer in (("a", "b"), ("b", "a")):
        outcomes.report(job, 1.0, frozenset())
        outcomes.report(job, 2.0, frozenset({peer}))
    with caplog.at_level(logging.ERROR, logger="noded.colocation.outcomes"):
        for _ in range(1000):  # a job's process reporting in a loop
            assert outcomes.observe(frozenset({"a", "b"}), features) is None
    assert len([r for r in caplog.records if "recording the co-location" in r.getMessage()]) == 1


# ------------------------------------------------------------ nodectl's durations


@pytest.mark.parametrize("argv", [["--timeout", "99999999999999999999d", "status"],
                                  ["top", "--interval", "99999999999999999999d", "--iterations", "2"],
                                  ["--timeout", "31d", "jobs"],
                                  ["exempt", "slurm:1", "--ttl", "1000000000000000000000000h"]])
def test_a_duration_beyond_any_use_is_a_usage_error_not_a_traceback(argv, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        nodectl.main(["--socket", str(tmp_path / "none.sock"), *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "at most 30d" in err and "Traceback" not in err


# ------------------------------------------------------------ the scrape


def test_a_job_id_that_is_not_utf8_does_not_fail_the_scrape():
    """A cgroup's name is bytes: one that is not UTF-8 reaches Python as a lone surrogate,
    which the exposition cannot encode; every series but that label must still be served."""
    from prometheus_client import CollectorRegistry, generate_latest

    from noded.loop.metrics import NodedCollector

    odd = "cgroup:user.slice/\udcff"
    jobs = [job(odd, 7 * GB), job("slurm:1")]
    sample = Sample(10.0, MappingProxyType({j.id: j for j in jobs}), (), True, None, (0,),
                    MappingProxyType({0: 5 * GB}), (), (), True)
    last = TickResult(3, 10.0, sample, Decision(MappingProxyType({}), (), False, 0.5, (), ""), (),
                      MappingProxyType({}), "mba", MappingProxyType({odd: 1}),
                      config=Config(peak_gbps_per_domain=10), original_cpus=MappingProxyType({}))
    registry = CollectorRegistry()
    registry.register(NodedCollector(lambda: last, {}))
    text = generate_latest(registry).decode()
    assert 'noded_job_throttle_level{job_id="cgroup:user.slice/\\\\udcff",method="mba"} 1.0' in text
    assert 'noded_job_throttle_level{job_id="slurm:1",method="mba"} 0.0' in text


def test_a_cgroup_name_that_is_not_utf8_is_a_job_not_a_failed_discovery(v1_cpuset, sleeper):
    from noded.jobs.cgroups import CgroupSource, read_process_cgroups
    from noded.jobs.discovery import JobDiscovery

    base, mkcg = v1_cpuset
    odd = mkcg("slurm/uid_0/job_\udcff")  # b"job_\xff": any user with a delegated subtree can make one
    fine = mkcg("slurm/uid_0/job_42")
    p, q = sleeper(), sleeper()
    for where, proc in ((odd, p), (fine, q)):
        with open(f"{where}/cgroup.procs", "w") as f:
            f.write(str(proc.pid))
    assert read_process_cgroups("/proc", p.pid)["cpuset"].endswith("/job_\udcff")
    jobs = JobDiscovery([CgroupSource.create("slurm", base)]).discover()
    assert jobs["slurm:42"].pids == {q.pid}  # the other job is still seen


def test_a_reload_refused_for_thousands_of_errors_logs_a_readable_summary():
    text = "".join(f"bogus_{i}: 1\n" for i in range(3000))
    with pytest.raises(ConfigError) as e:
        parse_config(text, "/etc/noded/noded.yaml")
    assert len(e.value.problems) == 3000  # check-config prints every one
    summary = e.value.summary()
    assert len(summary.splitlines()) == 21 and summary.splitlines()[0].startswith("/etc/noded/noded.yaml:1: bogus_0")
    assert summary.endswith("... and 2980 more (`noded check-config /etc/noded/noded.yaml` lists them all)")


def test_a_notify_socket_nobody_reads_never_blocks_the_sender(tmp_path):
    """systemd's notify socket with a full queue (its reader lagging): each notify gives up at
    once (False) instead of waiting, so the loop that sends WATCHDOG=1 never stops on it."""
    import socket as socketlib

    path = str(tmp_path / "notify")
    reader = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)
    reader.bind(path)  # never read
    try:
        notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
        results = []
        start = time.monotonic()
        while time.monotonic() - start < 20 and (not results or results[-1]):
            results.append(notifier.status("x" * 1000))
        assert results[-1] is False, "the queue never filled"
        assert time.monotonic() - start < 20
    finally:
        reader.close()
