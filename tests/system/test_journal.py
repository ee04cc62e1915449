"""noded in the journal (issue #12): every change to a job, at the default level, with
its priority and fields; the native protocol; RELOADING=1 / READY=1 around reloads."""

import errno
import io
import logging
import os
import re
import signal
import socket
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.sockets import NotifySocket
from support.waiting import ended, read_until
from noded.util.journal import (CHANGES, NOTICE, JournalHandler, LineHandler, configure_logging, encode_native,
                           log_change, syslog_priority)


# -- the journal's side of the protocol, written from its description, to read datagrams back
def decode_native(data: bytes) -> list[tuple[str, bytes]]:
    fields, i = [], 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            name, value = line.split(b"=", 1)
            i = nl + 1
        else:  # binary form: NAME \n, 64-bit little-endian length, the value, \n
            name = line
            size = int.from_bytes(data[nl + 1:nl + 9], "little")
            value = data[nl + 9:nl + 9 + size]
            assert data[nl + 9 + size:nl + 10 + size] == b"\n", "the value is not followed by a newline"
            i = nl + 10 + size
        fields.append((name.decode("ascii"), value))
    return fields


class Journal:
    """A datagram socket standing in for journald's /run/systemd/journal/socket."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def entries(self, timeout=0.0) -> list[dict[str, str]]:
        """Every entry received so far (waiting up to ``timeout`` for the first)."""
        out = []
        self.sock.settimeout(timeout or None)
        try:
            if timeout:
                out.append(self.sock.recv(1 << 20))
            self.sock.setblocking(False)
            while True:
                out.append(self.sock.recv(1 << 20))
        except (BlockingIOError, socket.timeout):
            pass
        return [{k: v.decode() for k, v in decode_native(d)} for d in out]

    def close(self):
        self.sock.close()


@pytest.fixture
def journal(tmp_path):
    j = Journal(tmp_path / "journal.sock")
    yield j
    j.close()


@pytest.fixture
def on_changes():
    """attach(handler): the handler receives noded.changes' records for this test."""
    logger = logging.getLogger(CHANGES)
    attached = []

    def attach(handler):
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)
        attached.append(handler)
        return handler

    yield attach
    for h in attached:
        logger.removeHandler(h)
        h.close()


def test_a_change_goes_to_the_journal_with_its_fields(journal, on_changes):
    fallback = io.StringIO()
    h = on_changes(JournalHandler(journal.path, fallback=LineHandler(fallback, prefix=True)))
    line = sys._getframe().f_lineno + 1
    log_change("throttle", "slurm:42", level_from=0, level_to=2, cause="contention",
               reason="node at 91% of peak, bert slowed to 40% of baseline", throttle="mba")
    [entry] = journal.entries(timeout=5)
    assert entry["MESSAGE"] == ("noded.changes: throttle job=slurm:42 level=0->2 cause=contention throttle=mba: "
                                "node at 91% of peak, bert slowed to 40% of baseline")
    assert entry["PRIORITY"] == "5" and entry["SYSLOG_IDENTIFIER"] == "noded" and entry["LOGGER"] == CHANGES
    # Where the change was made, not where it was logged.
    assert entry["CODE_FILE"] == __file__ and entry["CODE_LINE"] == str(line)
    assert entry["CODE_FUNC"] == "test_a_change_goes_to_the_journal_with_its_fields"
    assert {k: v for k, v in entry.items() if k.startswith("NODED_")} == {
        "NODED_ACTION": "throttle", "NODED_JOB": "slurm:42", "NODED_LEVEL": "2", "NODED_LEVEL_FROM": "0",
        "NODED_CAUSE": "contention", "NODED_THROTTLE": "mba"}
    assert fallback.getvalue() == "" and h.last_error is None


def test_a_multi_line_message_and_any_extra_field_in_binary_form(journal):
    logger = logging.getLogger("noded.test_journal")
    h = JournalHandler(journal.path, fallback=LineHandler(io.StringIO(), prefix=True))
    h.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(h)
    try:
        try:
            raise OSError(errno.EIO, "Input/output error")
        except OSError:
            logger.exception("write failed\nsecond line", extra={"job": "sim:hog", "schemata line": "MB:0=10\n1=20"})
    finally:
        logger.removeHandler(h)
        h.close()
    data = journal.sock.recv(1 << 20)
    assert b"\nMESSAGE\n" in b"\n" + data and b"\nNODED_SCHEMATA_LINE\n" in data  # the length-prefixed form
    entry = {k: v.decode() for k, v in decode_native(data)}
    assert entry["MESSAGE"].startswith("write failed\nsecond line\nTraceback (most recent call last):")
    assert entry["MESSAGE"].endswith("OSError: [Errno 5] Input/output error")
    assert entry["PRIORITY"] == "3" and entry["NODED_JOB"] == "sim:hog"
    assert entry["NODED_SCHEMATA_LINE"] == "MB:0=10\n1=20"


field_names = st.from_regex(r"\A[A-Z][A-Z0-9_]{0,63}\Z")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(field_names, st.one_of(st.text(), st.binary())), max_size=8))
def test_encoding_round_trips_any_field_value(fields):
    expected = [(name, v if isinstance(v, bytes) else v.encode()) for name, v in fields]
    assert decode_native(encode_native(fields)) == expected


@pytest.mark.parametrize("name", ["", "message", "_PRIVATE", "1ST", "A-B", "X" * 65, "NAME=1"])
def test_a_field_name_the_journal_would_refuse_is_refused_with_the_name(name):
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        encode_native([(name, "x")])


def test_python_levels_map_to_syslog_priorities():
    assert [syslog_priority(lvl) for lvl in (logging.CRITICAL, logging.ERROR, logging.WARNING, NOTICE,
                                             logging.INFO, logging.DEBUG)] == [2, 3, 4, 5, 6, 7]


def test_off_the_journal_lines_carry_their_priority_and_changes_show_at_the_default_level(root_logging):
    out = io.StringIO()
    handler = configure_logging(False, stream=out, env={})
    assert isinstance(handler, LineHandler) and handler.prefix  # not a terminal: <N> lines
    logging.getLogger("noded.loop.daemon").info("not at the default level")
    logging.getLogger("noded.loop.daemon").warning("two\nlines")
    log_change("release", "sim:hog", level_from=1, level_to=0, cause="calm", reason="node at 40% of peak")
    log_change("apply-failed", "sim:hog", level_from=1, level_to=0, severity=logging.WARNING, throttle="mba",
               reason="write error")
    assert out.getvalue() == ("<4>noded.loop.daemon: two\n<4>lines\n"
                              "<5>noded.changes: release job=sim:hog level=1->0 cause=calm: node at 40% of peak\n"
                              "<4>noded.changes: apply-failed job=sim:hog level=1->0 throttle=mba: write error\n")
    configure_logging(True, stream=out, env={})  # replaces the first: one line per record still
    logging.getLogger("noded.loop.daemon").info("now shown")
    assert out.getvalue().endswith("<6>noded.loop.daemon: now shown\n") and out.getvalue().count("now shown") == 1


def test_on_a_terminal_lines_are_plain(root_logging):
    master, slave = os.openpty()
    with open(slave, "w", closefd=True) as tty, open(master, "rb", buffering=0) as reader:
        configure_logging(False, stream=tty, env={})
        log_change("admit", "slurm:7", gpu="GPU-1", reason="GPU 0 is free")
        assert reader.read(4096).decode() == "noded.changes: admit job=slurm:7 gpu=GPU-1: GPU 0 is free\r\n"


def test_under_journald_records_take_the_native_protocol(tmp_path, journal, root_logging):
    with open(tmp_path / "stderr", "w") as stream:
        st = os.fstat(stream.fileno())
        ours = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        handler = configure_logging(False, stream=stream, journal_socket=journal.path, env=ours)
        assert isinstance(handler, JournalHandler)
        log_change("override-set", "sim:hog", level_to=0, severity=logging.WARNING, kind="exempt", uid=0)
        [entry] = journal.entries(timeout=5)
        assert entry["NODED_UID"] == "0" and entry["PRIORITY"] == "4" and entry["NODED_KIND"] == "exempt"
        # Another stream's JOURNAL_STREAM (inherited by a child with its stderr redirected): lines.
        other = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}
        assert isinstance(configure_logging(False, stream=stream, journal_socket=journal.path, env=other),
                          LineHandler)
        for bad in ("", "garbage", "1:", ":2"):
            assert isinstance(configure_logging(False, stream=stream, env={"JOURNAL_STREAM": bad}), LineHandler)
        # A stream with no descriptor (not the journal's).
        assert isinstance(configure_logging(False, stream=io.StringIO(), env=ours), LineHandler)


def test_no_journal_socket_means_a_line_on_stderr_instead(tmp_path, on_changes):
    out = io.StringIO()
    h = on_changes(JournalHandler(str(tmp_path / "absent.sock"), fallback=LineHandler(out, prefix=True)))
    log_change("throttle", "sim:hog", level_from=0, level_to=1, cause="contention", reason="busy")
    assert out.getvalue() == "<5>noded.changes: throttle job=sim:hog level=0->1 cause=contention: busy\n"
    assert h.last_error.errno == errno.ENOENT


def test_a_record_too_large_for_a_datagram_goes_to_stderr(journal, on_changes):
    out = io.StringIO()
    h = on_changes(JournalHandler(journal.path, fallback=LineHandler(out, prefix=True)))
    log_change("applied", "sim:hog", level_to=1, reason="x" * (4 << 20))
    assert h.last_error.errno == errno.EMSGSIZE
    assert out.getvalue().startswith("<5>noded.changes: applied job=sim:hog level=1: xxx")
    assert journal.entries() == []


def test_a_full_journal_never_blocks_the_caller(journal, on_changes):
    out = io.StringIO()
    h = on_changes(JournalHandler(journal.path, fallback=LineHandler(out, prefix=True)))
    t0 = time.monotonic()
    for i in range(2000):  # nobody reads: the socket's queue fills after a few
        log_change("applied", f"job{i}", level_to=1, reason="w")
    assert time.monotonic() - t0 < 5
    assert h.last_error.errno == errno.EAGAIN
    got = {e["NODED_JOB"] for e in journal.entries()} | set(re.findall(r"job=(job\d+)", out.getvalue()))
    assert got == {f"job{i}" for i in range(2000)}  # each record went one way or the other


def test_logging_disable_silences_changes_too(on_changes):
    out = io.StringIO()
    on_changes(LineHandler(out, prefix=False))
    logging.disable(logging.CRITICAL)
    try:
        log_change("throttle", "sim:hog", level_to=1)
    finally:
        logging.disable(logging.NOTSET)
    log_change("throttle", "sim:hog", level_to=1)
    assert out.getvalue() == "noded.changes: throttle job=sim:hog level=1\n"


@pytest.mark.fuse
def test_a_throttle_is_one_decision_entry_and_one_write_entry(tmp_path, journal, on_changes):
    from support.eliminator import NLP_AND_HOG, Harness

    on_changes(JournalHandler(journal.path, fallback=LineHandler(io.StringIO(), prefix=True)))
    h = Harness(tmp_path, NLP_AND_HOG)
    try:
        r = h.until(lambda r: "sim:hog" in r.levels, 15, "the hog throttled")
        entries = journal.entries(timeout=5)
    finally:
        h.stop()
    assert [a.kind for a in r.decision.actions] == ["throttle"]
    hog = [e for e in entries if e.get("NODED_JOB") == "sim:hog"]
    decisions = [e for e in hog if "NODED_CAUSE" in e]
    assert len(decisions) == 1, hog
    [d] = decisions
    assert (d["NODED_ACTION"], d["NODED_LEVEL_FROM"], d["NODED_LEVEL"], d["NODED_CAUSE"], d["PRIORITY"]) == \
        ("throttle", "0", "1", "contention", "5")
    assert d["CODE_FILE"].endswith(os.path.join("noded", "policy", "contention_controller.py"))  # the policy says why
    assert d["MESSAGE"].startswith("noded.changes: throttle job=sim:hog level=0->1 cause=contention: ")
    # The actuator's line: what was written for it, nothing about why.
    [w] = [e for e in hog if e is not d]
    assert (w["NODED_ACTION"], w["NODED_LEVEL"], w["NODED_THROTTLE"]) == ("applied", "1", "mba")
    assert "mkdir noded-mba-1" in w["MESSAGE"] and w["CODE_FILE"].endswith(os.path.join("actuators", "plan.py"))


def test_sighup_is_reloading_then_ready_whether_applied_or_refused(tmp_path):
    from test_lifecycle import cpu_only_config, start

    notify = NotifySocket(tmp_path / "notify")
    p = start(cpu_only_config(tmp_path), {"NOTIFY_SOCKET": notify.path})
    try:
        notify.ready()
        cfg = tmp_path / "noded.yaml"
        good = cfg.read_bytes()
        for tail, status, log_line in [
                (b"contention: {threshold: 0.8}\n", "config reloaded", "<4>noded.loop.daemon: config reloaded"),
                (b"contention: {treshold: 0.8}\n", "config reload refused", "<3>noded.commands.run: config reload refused")]:
            cfg.write_bytes(good + tail)
            before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            p.send_signal(signal.SIGHUP)
            reloading = notify.until("RELOADING")
            assert reloading["RELOADING"] == "1"
            assert before <= int(reloading["MONOTONIC_USEC"]) <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            # over once the file has settled: a tick or two's STATUS may come first (noded.util.settled)
            after = notify.until("READY")
            assert after["READY"] == "1" and after["STATUS"].startswith(status), after
            assert read_until(p.stderr, log_line.split(": ", 1)[1], "the reload's log line").startswith(log_line)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
    finally:
        ended(p)
        notify.close()
