"""Labels a job manager's hook registers at run time (`nodectl label`, `nodectl forget`):
the words they are written in (and a Slurm comment's ``noded:`` part), what may be
registered, where they meet the label file, and the admin commands."""

import os
import subprocess
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.admin import nodectl_run
from noded.jobs import JobDiscovery, JobMeta, LabelFile, RegisteredLabels
from noded.jobs.labelwords import (BOOLEANS, INTEGERS, LabelWordError, NUMBERS, comment_words,
                                   parse_label_words)
from noded.jobs.labelwords import REGISTRABLE
from noded.stores.securedir import SecureDir, StateWriteError

# -- words


def test_words_are_typed_by_their_key():
    assert parse_label_words(["model=1", "batch_size=32", "pipelined=yes", "dataset_gb=2.5", "category=NLP"]) == \
        {"model": "1", "batch_size": 32, "pipelined": True, "dataset_gb": 2.5, "category": "NLP"}


@pytest.mark.parametrize("words, error", [
    (["model"], "'model' is not KEY=VALUE"),
    (["=x"], "is not KEY=VALUE"),
    (["model="], "is not KEY=VALUE"),
    (["exempt=true"], "unknown label 'exempt'"),
    (["priority=9"], "unknown label 'priority'"),
    (["batch_size=-1"], "batch_size must be a whole number"),
    (["batch_size=٣"], "batch_size must be a whole number"),  # a digit to str.isdigit, not to us
    (["batch_size=" + "9" * 10], "batch_size must be a whole number under 10"),  # it is one: say the bound
    (["pipelined=maybe"], "pipelined must be true or false"),
    (["dataset_gb=lots"], "dataset_gb must be a number"),
    (["model=a", "model=b"], "given twice"),
    (["model=" + "x" * 200], "longer than"),
    ([f"model{i}=x" for i in range(17)], "at most 16"),
])
def test_bad_words_are_named(words, error):
    with pytest.raises(LabelWordError, match=error):
        parse_label_words(words)


def _value(key):
    if key in INTEGERS:
        return st.integers(1, 10**6)
    if key in BOOLEANS:
        return st.booleans()
    if key in NUMBERS:
        return st.floats(0.01, 1.0)
    return st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=";"), min_size=1,
                   max_size=40)


@given(st.dictionaries(st.sampled_from(REGISTRABLE), st.none(), max_size=len(REGISTRABLE)).flatmap(
    lambda keys: st.fixed_dictionaries({k: _value(k) for k in keys})))
def test_words_round_trip_through_a_slurm_comment(labels):
    words = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in labels.items()]
    comment = "my run; noded: " + " ".join(words) + "; anything else"
    assert parse_label_words(comment_words(comment)) == labels


@given(st.text(max_size=200))
def test_any_comment_gives_words_or_a_named_error(comment):
    try:
        parse_label_words(comment_words(comment))
    except LabelWordError as e:
        assert str(e)


def test_comment_without_the_marker_has_no_words():
    assert comment_words("model=BiDAF") == [] and comment_words("xnoded: model=a") == []
    assert comment_words("noded: model=a") == ["model=a"] and comment_words("a;noded: model=a;b") == ["model=a"]


# -- the registry and discovery


def test_registered_labels_meet_the_label_file(tmp_path, sleeper):
    registry = RegisteredLabels()
    labels_file = tmp_path / "labels.yaml"
    labels_file.write_text("'pid:x': {model: VGG16}\n")
    a, b = sleeper(), sleeper()
    d = JobDiscovery([], labels=LabelFile(str(labels_file)), registered_labels=registry)
    d.register(a.pid, "pid:x")
    d.register(b.pid, "pid:y")
    registry.set("pid:x", {"model": "BiDAF"})
    registry.set("pid:y", {"model": "BiDAF", "batch_size": 32})
    jobs = d.discover()
    assert jobs["pid:x"].meta == JobMeta(model="VGG16")  # the operator's file wins, whole
    assert jobs["pid:y"].meta == JobMeta(model="BiDAF", batch_size=32)
    assert registry.forget("pid:y") and not registry.forget("pid:y")
    assert d.discover()["pid:y"].meta == JobMeta()


def test_the_registry_refuses_whole_and_is_bounded():
    registry = RegisteredLabels(limit=2)
    with pytest.raises(ValueError, match=r"\['exempt'\] cannot be registered"):
        registry.set("slurm:1", {"model": "A", "exempt": True})
    with pytest.raises(ValueError, match="labels of slurm:1: batch_size must be >= 1"):
        registry.set("slurm:1", {"batch_size": 0})
    assert registry.snapshot() == {}
    registry.set("slurm:1", {"model": "A"})
    registry.set("slurm:2", {"model": "B"})
    registry.set("slurm:2", {"model": "C"})  # a job already held is replaced, not counted again
    with pytest.raises(ValueError, match="2 jobs hold registered labels already"):
        registry.set("slurm:3", {"model": "D"})
    assert registry.snapshot() == {"slurm:1": JobMeta(model="A"), "slurm:2": JobMeta(model="C")}


# -- the admin commands


@pytest.fixture
def labelled_socket(tmp_path):
    from noded.loop.overrides import OverrideStore
    from noded.admin.server import AdminServer
    from noded.loop.control import ControlState

    registry = RegisteredLabels()
    daemon = SimpleNamespace(control=ControlState(OverrideStore(str(tmp_path / "state"), lambda: 0.0),
                                                  registered_labels=registry),
                             last=None, parts=SimpleNamespace(colocation=None, rightsize=None), last_failure=None,
                             failures_in_a_row=0)
    os.chmod(tmp_path, 0o755)
    server = AdminServer(str(tmp_path / "noded.sock"), daemon, group=None, timeout_s=2).start()
    yield SimpleNamespace(path=server.path, registry=registry)
    server.stop()


def test_nodectl_label_and_forget(labelled_socket, capsys):
    path, registry = labelled_socket.path, labelled_socket.registry
    code, out, _ = nodectl_run(path, "label", "slurm:7", "model=BiDAF", "batch_size=32", capsys=capsys)
    assert code == 0 and out == "slurm:7: batch_size=32 model=BiDAF\n"
    assert registry.snapshot() == {"slurm:7": JobMeta(model="BiDAF", batch_size=32)}
    code, out, _ = nodectl_run(path, "--json", "status", capsys=capsys)
    assert '"registered_labels": [\n    "slurm:7"\n  ]' in out
    code, _, err = nodectl_run(path, "label", "slurm:7", "exempt=true", capsys=capsys)
    assert code == 1 and "unknown label 'exempt'" in err
    code, out, _ = nodectl_run(path, "forget", "slurm:7", capsys=capsys)
    assert code == 0 and out == "slurm:7: labels forgotten, had no reservation\n" and registry.snapshot() == {}


def test_the_socket_checks_labels_sent_past_nodectl(labelled_socket):
    from noded.admin.request import NodectlError, request

    with pytest.raises(NodectlError, match=r"\['priority'\] cannot be registered"):
        request(labelled_socket.path, "label", {"job": "slurm:1", "labels": {"priority": 5}})
    with pytest.raises(NodectlError, match="label 'model' must be a string of at most 128"):
        request(labelled_socket.path, "label", {"job": "slurm:1", "labels": {"model": ["a"]}})
    with pytest.raises(NodectlError, match="labels of slurm:1: model must be a string"):
        request(labelled_socket.path, "label", {"job": "slurm:1", "labels": {"model": 3}})
    assert labelled_socket.registry.snapshot() == {}



# -- kept across restarts (the state directory)

REGISTRABLE_LABELS = st.fixed_dictionaries({}, optional={
    "category": st.sampled_from(["CV", "NLP", "Speech"]),
    "model": st.text(min_size=1, max_size=40),
    "batch_size": st.integers(1, 1 << 20),
    "requested_cores": st.integers(1, 1024),
    "pipelined": st.booleans(),
    "heavy_preprocessing": st.booleans(),
})


@given(registrations=st.dictionaries(st.text(min_size=1, max_size=30), REGISTRABLE_LABELS, max_size=8),
       forgotten=st.sets(st.integers(0, 7)))
def test_registered_labels_read_back_after_a_restart_are_those_in_force(tmp_path_factory, registrations,
                                                                         forgotten):
    state = SecureDir(str(tmp_path_factory.mktemp("state")), mode=0o700)
    before = RegisteredLabels(state=state)
    for job, labels in registrations.items():
        before.set(job, labels)
    for i, job in enumerate(list(registrations)):
        if i in forgotten:
            assert before.forget(job)
    after = RegisteredLabels(state=state)  # noded started again
    assert after.snapshot() == before.snapshot() and after.notes == []


def test_a_registration_that_cannot_be_kept_changes_nothing_and_says_why(tmpfs):
    mnt = tmpfs()
    state = SecureDir(str(mnt), mode=0o700)
    registry = RegisteredLabels(state=state)
    registry.set("slurm:1", {"model": "BiDAF", "batch_size": 32})
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    with pytest.raises(StateWriteError, match="registered_labels.json"):
        registry.set("slurm:2", {"model": "VGG16"})
    with pytest.raises(StateWriteError):
        registry.forget("slurm:1")
    assert set(registry.snapshot()) == {"slurm:1"}  # memory says what the file says
    assert RegisteredLabels(state=state).snapshot() == registry.snapshot()


@pytest.mark.parametrize("content", [b"[1, 2]", b"{\"slurm:1\": {\"exempt\": true}}", b"{\"slurm:1\": 7}",
                                     b"{\"slurm:1\": {\"batch_size\": -1}}", b"{not json"])
def test_a_registered_labels_file_that_cannot_be_trusted_is_moved_aside_and_noded_starts(tmp_path, content):
    # exempt among them: a file someone wrote must not exempt a job the API would refuse to
    state = SecureDir(str(tmp_path / "state"), mode=0o700)
    state.write_bytes("registered_labels.json", content)
    registry = RegisteredLabels(state=state)
    assert registry.snapshot() == {} and len(registry.notes) == 1
    assert "registered_labels.json" in registry.notes[0]
    assert [n for n in os.listdir(tmp_path / "state") if n.startswith("registered_labels.json.corrupt-")]


def test_forget_releases_the_reservation_even_when_the_labels_cannot_be_written(tmpfs):
    from noded.admin.commands import AdminCommands
    from noded.loop.control import ControlState

    mnt = tmpfs()
    registry = RegisteredLabels(state=SecureDir(str(mnt), mode=0o700))
    registry.set("slurm:3", {"model": "BiDAF", "batch_size": 32})
    released = []
    colocation = SimpleNamespace(release=lambda job: released.append(job) or True)
    commands = AdminCommands(ControlState(None), lambda: None, colocation, registered_labels=registry)
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    with pytest.raises(StateWriteError):
        commands.forget("slurm:3", uid=0)
    assert released == ["slurm:3"]  # the GPU share is free for the next job
    assert set(registry.snapshot()) == {"slurm:3"}  # and the labels are as the file says


def test_labels_of_a_job_gone_for_an_hour_are_forgotten_and_kept_while_it_runs(tmp_path):
    # a job whose Epilog never reached noded (noded down then) must not hold a place under
    # the cap for good; a job whose cgroup is there keeps its labels however long it runs
    from noded.jobs import CgroupSource
    from noded.jobs.discovery import ABSENT_FORGET_S

    root = tmp_path / "cg"
    (root / "running").mkdir(parents=True)
    (root / "running" / "cgroup.procs").write_text("")
    now = [0.0]
    state = SecureDir(str(tmp_path / "state"), mode=0o700)
    registry = RegisteredLabels(state=state)
    for job in ("cgroup:running", "cgroup:ended"):
        registry.set(job, {"model": "BiDAF", "batch_size": 32})
    discovery = JobDiscovery([CgroupSource.create("cgroup", str(root), ["*"])], registered_labels=registry,
                             clock=lambda: now[0])
    discovery.discover()
    now[0] = ABSENT_FORGET_S - 1
    discovery.discover()
    assert set(registry.snapshot()) == {"cgroup:running", "cgroup:ended"}  # not yet
    now[0] = ABSENT_FORGET_S
    discovery.discover()
    assert set(registry.snapshot()) == {"cgroup:running"}
    assert set(RegisteredLabels(state=state).snapshot()) == {"cgroup:running"}  # kept so
    now[0] = 10 * ABSENT_FORGET_S
    discovery.discover()
    assert set(registry.snapshot()) == {"cgroup:running"}  # an empty job directory is still the job's
