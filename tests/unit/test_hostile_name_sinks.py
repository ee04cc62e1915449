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
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from noded.admin import nodectl
from noded.loop.overrides import Override, OverrideStore
from noded.config import Config
from noded.loop.daemon import TickResult
from noded.jobs.discovery import RegisteredLabels
from noded.jobs.model import JobMeta
from noded.samplers.mongroups import group_name
from noded.util.journal import LineHandler, _UNPRINTABLE, encode_native, log_change, printable, word
from noded.loop.metrics import NodedCollector
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
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def exposition_label(job_id: str) -> str:
    """The one escaped form of a job id where text must be UTF-8 (metrics, logs, nodectl):
    each lone surrogate as Python writes it, \\udcff for the byte 0xff."""
    return job_id.encode("utf-8", "backslashreplace").decode()


@SETTINGS
@given(st.lists(JOB_ID, min_size=1, max_size=12, unique=True))
def test_resctrl_group_names_are_valid_stable_and_distinct(ids):
    names = [group_name("noded-", j) for j in ids]
    for j, name in zip(ids, names):
        assert re.fullmatch(r"noded-job-[A-Za-z0-9_.-]{0,40}-[0-9a-f]{8}", name), name
        group_name.cache_clear()
        assert group_name("noded-", j) == name  # a pure function of the id: the same after a restart
        try:
            old = hashlib.sha1(j.encode()).hexdigest()[:8]  # what noded named it before: kept
        except UnicodeEncodeError:
            continue
        assert name.endswith("-" + old)
    assert len(set(names)) == len(names)


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
    nodectl.shown(answer)["job"].encode("utf-8")


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
