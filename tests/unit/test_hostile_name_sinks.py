"""Job ids built from cgroup names over the kernel's whole alphabet (any byte but '/' and
NUL, 1..255 of them; not UTF-8 reaches Python as lone surrogates, os.fsdecode) and from
registrations (any code point), through every sink noded has for them (issue #22, item 2):
resctrl group names, Prometheus label values, state files' JSON records, registered
labels, log lines and the journal's fields, and nodectl's text output. None may raise,
and each must give back the id (or its one escaped form) exactly."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.examples import examples
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from noded.admin import answertext
from noded.loop.overrides import Override, OverrideStore
from noded.config import Config
from noded.loop.daemon import TickResult
from noded.jobs.discovery import RegisteredLabels
from noded.jobs.model import JobMeta
from noded.samplers.mongroups import group_name
from noded.util.journal import (LineHandler, _UNPRINTABLE, encode_native, escaped, in_word, log_change, printable,
                                unescaped, word)
from noded.loop.metrics import NodedCollector, _surrogate, label_value
from noded.policy.contention import Decision
from noded.samplers.sample import CPU, JobSample, Sample
from noded.stores.securedir import SecureDir

#: a cgroup's name: any byte but '/' and NUL, 1..255 of them
NAME = st.binary(min_size=1, max_size=255).filter(lambda b: b"/" not in b and b"\0" not in b)
#: job ids as noded builds them from a cgroup source's directory names
FROM_CGROUPS = st.builds(lambda kind, name: kind + os.fsdecode(name), st.sampled_from(["cgroup:", "slurm:", "k8s:",
                                                                                      "systemd:"]), NAME)
#: a registered job id (nodectl label, the admin socket's JSON): any code point, lone surrogates too
REGISTERED = st.text(st.characters(min_codepoint=1, exclude_categories=()), min_size=1, max_size=60)
JOB_ID = st.one_of(FROM_CGROUPS, REGISTERED)
SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def exposition_label(job_id: str) -> str:
    """The one escaped form of a job id in a label value: each lone surrogate as Python
    writes it, \\udcff for the byte 0xff, a backslash doubled where it would read as one."""
    return label_value(job_id)


@SETTINGS
@given(st.lists(JOB_ID, min_size=1, max_size=12, unique=True))
def test_resctrl_group_names_are_valid_stable_and_distinct(ids):
    names = [group_name("noded-", j) for j in ids]
    for j, name in zip(ids, names):
        assert re.fullmatch(r"noded-job-[A-Za-z0-9_.-]{0,40}-[0-9a-f]{32}", name), name
        group_name.cache_clear()
        assert group_name("noded-", j) == name  # a pure function of the id: the same after a restart
        digest = hashlib.sha256(j.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        assert name.endswith("-" + digest)  # 128 bits of SHA-256 of the whole id
        assert len(group_name("n" * 32 + "cap-", j).encode()) <= 113 < 255  # the longest prefix: a kernfs name
    assert len(set(names)) == len(names)


def test_two_ids_a_tenant_chose_to_share_a_name_under_32_bits_have_two_groups():
    # Found in half a second by the birthday search over SHA-1's first 32 bits (the names
    # before 2026-11): one sanitised 40-character prefix, one 8-digit digest (f515e72d).
    # Under those names sync mapped both jobs to one group: one tenant's job read and
    # steered as the other's. With 128 bits of SHA-256 no search reaches another's name.
    a = "cgroup:/sys/fs/cgroup/tenant/delegated/job49267"
    b = "cgroup:/sys/fs/cgroup/tenant/delegated/job150425"
    assert hashlib.sha1(a.encode()).hexdigest()[:8] == hashlib.sha1(b.encode()).hexdigest()[:8]
    assert group_name("noded-", a) != group_name("noded-", b)
    assert group_name("noded-cap-", a) != group_name("noded-cap-", b)  # the cap control groups' names too


def tick_with(job_ids) -> TickResult:
    jobs = {j: JobSample(j, "cgroup", frozenset({10 + i}), JobMeta(), CPU, (), None, 1e9, "own")
            for i, j in enumerate(job_ids)}
    sample = Sample(1.0, MappingProxyType(jobs), (), False, "no NVML", (0,), MappingProxyType({0: 1e9}), (), ())
    return TickResult(1, 1.0, sample, Decision(MappingProxyType({j: 1 for j in job_ids}), (), False, 0.5, (), ""),
                      (), MappingProxyType({}), "mba", MappingProxyType({j: 1 for j in job_ids}),
                      config=Config(peak_gbps_per_domain=10))


@SETTINGS
@given(st.lists(JOB_ID, min_size=1, max_size=6, unique=True))
def test_every_job_is_exported_with_its_id_escaped_and_the_scrape_parses(ids):
    registry = CollectorRegistry()
    registry.register(NodedCollector(lambda: last, {}))
    last = tick_with(ids)
    text = generate_latest(registry).decode("utf-8")  # strict: the exposition is UTF-8
    levels = {s.labels["job_id"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "noded_job_throttle_level"}
    assert levels == {exposition_label(j): 1.0 for j in ids}
    assert {unescaped(label, _surrogate) for label in levels} == set(ids)  # one series per job, named back


@SETTINGS
@given(JOB_ID)
def test_log_lines_and_nodectl_text_take_any_id_and_show_it_escaped(job_id):
    shown = printable(job_id)
    shown.encode("utf-8")  # strict: a terminal, journald's stream, a pipe
    assert not _UNPRINTABLE.search(shown)
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", newline="")
    handler = LineHandler(stream, prefix=True)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.handleError = lambda record: pytest.fail("the log line could not be written")  # noqa: ARG005
    handler.emit(logging.LogRecord("noded", logging.WARNING, __file__, 1, "job=%s held", (job_id,), None))
    stream.seek(0)
    # one word after job= (its spaces, '=' and quotes escaped too): it cannot add keys of its own
    assert stream.buffer.getvalue().decode() == f"<4>job={word(job_id)} held\n"
    assert " " not in word(job_id) and "=" not in word(job_id)
    # nodectl's text output: every string of an answer through shown(), then a strict stdout
    answer = json.loads(json.dumps({"job": job_id, "labels": {"model": "x"}}))  # as the socket carries it
    answertext.shown(answer)["job"].encode("utf-8")


FORGERS = ["cgroup:x job=slurm:42 level=0->3 cause=operator", "cgroup:x\tjob=slurm:42", "cgroup:x\u3000job=slurm:42",
           "cgroup:x' job='slurm:42", 'cgroup:x" job="slurm:42', "cgroup:x: release job=slurm:42"]


def _change_line(job_id: str) -> str:
    """The line log_change writes for a throttle of ``job_id``, as a journald stream reads it."""
    stream = io.StringIO()
    handler = LineHandler(stream, prefix=False)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("noded.changes")
    logger.addHandler(handler)
    try:
        log_change("throttle", job_id, level_from=0, level_to=2, cause="contention", reason="r")
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


@pytest.mark.parametrize("job_id", FORGERS)
def test_a_tenants_name_adds_no_key_of_its_own_to_a_change_line(job_id):
    """A cgroup named 'x job=slurm:42 level=0->3 ...' made 'throttle job=cgroup:x job=slurm:42
    level=0->3 ...': another tenant's job, and a level, that noded never wrote, and a search
    for job=slurm:42 found a line about cgroup:x."""
    line = _change_line(job_id)
    assert line == f"throttle job={word(job_id)} level=0->2 cause=contention: r\n"
    assert "job=slurm:42" not in line and line.count("=") == 3


@SETTINGS
@given(JOB_ID)
def test_a_change_line_has_one_job_word_for_any_id(job_id):
    line = _change_line(job_id)
    m = re.fullmatch(r"throttle job=(\S+) level=0->2 cause=contention: r\n", line)
    assert m and m.group(1) == word(job_id) and "=" not in m.group(1)


@SETTINGS
@given(FROM_CGROUPS)
def test_the_journal_field_holds_the_cgroups_own_bytes(job_id):
    data = encode_native([("NODED_JOB", job_id)])
    raw = os.fsencode(job_id)
    assert data == (b"NODED_JOB=" + raw + b"\n" if b"\n" not in raw
                    else b"NODED_JOB\n" + len(raw).to_bytes(8, "little") + raw + b"\n")


@SETTINGS
@given(st.lists(JOB_ID, min_size=1, max_size=5, unique=True))
def test_state_files_keep_any_id_exactly_across_a_restart(ids):
    with tempfile.TemporaryDirectory() as tmp:
        state = os.path.join(tmp, "state")
        with SecureDir(state) as d:
            labels = RegisteredLabels(state=d)
            overrides = OverrideStore(d, lambda: 1000.0)
            for j in ids:
                labels.set(j, {"model": "ResNet-50"})
                overrides.set(Override(j, 2, 0, "test", 1000.0, None))
        with SecureDir(state) as d:  # as the next run reads them
            assert set(RegisteredLabels(state=d).snapshot()) == set(ids)
            assert set(OverrideStore(d, lambda: 1000.0).current()) == set(ids)


#: names built to collide under an escape that is not one to one: backslashes, the letters
#: and digits of escapes, and the characters noded escapes (space, newline, '=', the byte 0xff)
ESCAPE_LIKE = st.text(st.sampled_from(list("\\xuUnr0a2d9cf=- \n\t\udcff\x1b\u2028")), min_size=1, max_size=24)
NAMES = st.one_of(JOB_ID, st.builds(lambda kind, t: kind + t, st.sampled_from(["cgroup:", "systemd:"]), ESCAPE_LIKE))
#: each text a name reaches an operator as, and what it escapes
SINKS = [("log word", word, in_word), ("nodectl", answertext.shown, None), ("metric label", label_value, _surrogate)]


def _reads_back(shown, picks, name):
    text = shown(name)
    if picks is None:  # nodectl's: printable's characters
        picks = lambda c: _UNPRINTABLE.match(c) is not None  # noqa: E731
        assert text == escaped(name)
    assert not any(picks(c) for c in text)
    return unescaped(text, picks)


@SETTINGS
@given(NAMES)
@pytest.mark.parametrize("sink", SINKS, ids=[s[0] for s in SINKS])
def test_every_escaped_name_reads_back_as_the_name_it_was(sink, name):
    """One to one: the escaped text gives back the name, so no two names give one text."""
    _, shown, picks = sink
    assert _reads_back(shown, picks, name) == name


#: pairs of names that read the same where a backslash was never doubled
LOOKALIKES = [("cgroup:a b", "cgroup:a\\x20b", "log word"), ("cgroup:a=b", "cgroup:a\\x3db", "log word"),
              ("cgroup:a\nb", "cgroup:a\\nb", "log word"), ("cgroup:a\nb", "cgroup:a\\nb", "nodectl"),
              ("cgroup:a\x1b[2J", "cgroup:a\\x1b[2J", "nodectl"),
              (os.fsdecode(b"cgroup:a\xff"), "cgroup:a\\udcff", "metric label"),
              (os.fsdecode(b"cgroup:a\xff"), "cgroup:a\\udcff", "nodectl")]


@pytest.mark.parametrize("one, other, sink", LOOKALIKES)
def test_a_name_holding_an_escapes_text_does_not_pose_as_another(one, other, sink):
    """Before: cgroup:a\\x20b (its own backslash) was written as cgroup:a b is, the same
    job=cgroup:a\\x20b, and cgroup:a\\udcff as the label of the byte 0xff: a tenant could pose
    as another job in the journal, nodectl and the metrics."""
    shown = dict((s[0], s[1]) for s in SINKS)[sink]
    assert shown(one) != shown(other)


@pytest.mark.parametrize("name", ["systemd:job\\x2d1.scope", "systemd:run-u4\\x2dweb.service", "cgroup:C:\\data",
                                  "slurm:4242", "k8s:default/web-0"])
def test_common_names_and_systemds_own_escapes_read_as_they_are(name):
    """A backslash is doubled only where it would read as one of noded's escapes: a unit
    name keeps the \\x2d systemctl shows (noded never escapes '-')."""
    assert word(name) == name and answertext.shown(name) == name and label_value(name) == name


def test_the_escapes_noded_writes():
    assert word("a b\tc=d'e\"f") == "a\\x20b\\x09c\\x3dd\\x27e\\x22f"
    assert word("a\\ b") == "a\\\\\\x20b"  # a backslash before an escaped character: doubled
    assert word("a\\x20b") == "a\\\\x20b" and unescaped("a\\\\x20b", in_word) == "a\\x20b"
    assert answertext.shown("a\nb\\nc\\\\d\\q") == "a\\nb\\\\nc\\\\\\d\\q"
    assert label_value(os.fsdecode(b"a\xff")) == "a\\udcff" and label_value("a\\udcff") == "a\\\\udcff"
    assert escaped("\\Uffffffff") == "\\Uffffffff"  # not a code point: not an escape, the text as it is
    # only the one form noded writes is an escape: a newline is \n, never \x0a or \u000a
    for text in ("a\\x0ab", "a\\u000ab", "a\\u001bb", "a\\x0Ab"):
        assert escaped(text) == text and unescaped(text) == text
    assert unescaped("a\\nb\\x1bc") == "a\nb\x1bc"


@SETTINGS
@given(st.text(st.sampled_from(list("\\xuUnr0a2d9cf \n")) | st.characters(), max_size=40))
@pytest.mark.parametrize("sink", SINKS, ids=[s[0] for s in SINKS])
def test_reading_back_any_text_never_raises(sink, text):
    """unescaped is a parser of text an operator may paste: any text reads as some name."""
    picks = sink[2] or (lambda c: _UNPRINTABLE.match(c) is not None)
    assert isinstance(unescaped(text, picks), str)


@SETTINGS
@given(st.lists(JOB_ID, min_size=1, max_size=8))
def test_a_list_of_job_ids_in_prose_reads_back_as_the_list_it_was(ids):
    # the held jobs of a lasting state, the jobs co-located, those sharing a CLOSID: a
    # tenant's cgroup named "a, b" or "x job=y" is one item, never two, and adds no key
    from noded.util.journal import words

    text = words(ids)
    assert "=" not in text and printable(text) == text
    assert [unescaped(w, in_word) for w in text.split(", ")] == ids
