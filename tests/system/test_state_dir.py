"""The state and runtime directories cannot be turned against noded (issue #11, items 3 and 4).

Real mounts (a read-only tmpfs, a full one), real symlinks planted where noded writes,
real ownership (uid 65534) and modes: a write that fails changes nothing, memory
included; no link is followed; a directory another user could change is refused with
the reason; a corrupt file is moved aside and noded starts.
"""

import errno
import json
import os
import stat
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from noded.loop.overrides import Override, OverrideStore
from noded.stores.calibration import Calibration, CalibrationError, read_calibration, write_calibration
from noded.stores.lockfile import InstanceLock, LockFileRefused
from noded.stores.securedir import MAX_FILE_BYTES, SecureDir, StateWriteError, UnsafeDirectory
from noded.stores.originals import OriginalValues, read_json_object, write_json_atomically

NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts, chown to another user")


def clock():
    return 1_700_000_000.0


def remount_read_only(where):
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)


def fill(where):
    """Fill a filesystem to ENOSPC; returns the filler file."""
    filler = where / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return filler


# -- a write that fails changes nothing, memory included


@ROOT_ONLY
def test_a_read_only_state_dir_records_nothing_and_says_why(tmpfs):
    mnt = tmpfs()
    state = str(mnt / "state")
    originals = OriginalValues(state)
    originals.record("cpuset:/sys/fs/cgroup/cpuset/a", "0-3")
    store = OverrideStore(state, clock)
    store.set(Override("kept", 2, 0, "r", clock(), None))
    remount_read_only(mnt)

    with pytest.raises(StateWriteError, match="Read-only file system") as e:
        originals.record("cpuset:/sys/fs/cgroup/cpuset/b", "0-7")
    assert e.value.path == f"{state}/originals.json"
    assert originals.get("cpuset:/sys/fs/cgroup/cpuset/b") is None  # not believed recorded
    assert originals.items() == [("cpuset:/sys/fs/cgroup/cpuset/a", "0-3")]
    with pytest.raises(StateWriteError):
        originals.forget("cpuset:/sys/fs/cgroup/cpuset/a")
    assert originals.get("cpuset:/sys/fs/cgroup/cpuset/a") == "0-3"  # still to be restored
    assert "Read-only file system" in originals.probe()

    with pytest.raises(StateWriteError, match="Read-only file system"):
        store.set(Override("new", 1, 0, "r", clock(), None))
    assert set(store.active()) == {"kept"}  # an override not saved is not in force
    # Lifting an override only releases a job: in force at once, said not saved, and the
    # file brought in line by the first save that works.
    cleared, unsaved = store.clear("kept", 0)
    assert cleared and "Read-only file system" in unsaved
    assert set(store.active()) == set()
    assert set(OverrideStore(state, clock).active()) == {"kept"}  # a restart now would bring it back
    subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
    assert set(store.active()) == set() and set(OverrideStore(state, clock).active()) == set()


@ROOT_ONLY
def test_a_full_state_dir_records_nothing_leaves_no_temp_and_recovers(tmpfs):
    mnt = tmpfs("64k")
    state = mnt / "state"
    originals = OriginalValues(str(state))
    assert originals.probe() is None
    filler = fill(mnt)
    big = ",".join(str(c) for c in range(0, 4000, 2))  # more than the last free page

    with pytest.raises(StateWriteError, match="No space left on device"):
        originals.record("cpuset:/sys/fs/cgroup/cpuset/a", big)
    assert originals.items() == []
    assert sorted(os.listdir(state)) == []  # the temp file went with the failure
    assert "No space left on device" in originals.probe()

    filler.unlink()
    assert originals.probe() is None
    originals.record("cpuset:/sys/fs/cgroup/cpuset/a", big)
    assert OriginalValues(str(state)).items() == [("cpuset:/sys/fs/cgroup/cpuset/a", big)]


def test_a_write_is_atomic_and_private(tmp_path):
    d = SecureDir(str(tmp_path / "state"))
    d.write_json("x.json", {"a": 1})
    d.write_json("x.json", {"a": 2})
    assert json.loads((tmp_path / "state" / "x.json").read_text()) == {"a": 2}
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "x.json").st_mode) == 0o600
    assert sorted(os.listdir(tmp_path / "state")) == ["x.json"]


# -- links planted where noded writes are never followed


def test_a_link_planted_as_the_temp_file_is_removed_not_followed(tmp_path, secret):
    state = tmp_path / "state"
    originals = OriginalValues(str(state))
    os.symlink(secret, state / "originals.json.tmp")
    originals.record("cpuset:/sys/fs/cgroup/cpuset/a", "0-3")
    assert secret.read_text() == "root's own data\n" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert not os.path.islink(state / "originals.json")
    assert OriginalValues(str(state)).items() == [("cpuset:/sys/fs/cgroup/cpuset/a", "0-3")]


def test_a_directory_planted_as_the_temp_file_fails_the_write_and_names_it(tmp_path):
    state = tmp_path / "state"
    originals = OriginalValues(str(state))
    (state / "originals.json.tmp").mkdir()
    with pytest.raises(StateWriteError, match="originals.json.tmp") as e:
        originals.record("cpuset:/x", "0")
    assert e.value.path == f"{state}/originals.json" and originals.items() == []


def test_a_link_planted_as_the_state_file_is_moved_aside_not_followed(tmp_path, secret):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (tmp_path / "elsewhere.json").write_text('{"cpuset:/sys/fs/cgroup/cpuset/x": "0"}')
    os.symlink(tmp_path / "elsewhere.json", state / "originals.json")
    os.symlink(secret, state / "overrides.json")
    originals = OriginalValues(str(state))
    store = OverrideStore(str(state), clock)
    assert originals.items() == [] and store.active() == {}  # a link is not trusted, whatever it points at
    assert f"{state}/originals.json is corrupt: a symbolic link" in originals.notes[0]
    assert f"{state}/overrides.json is corrupt: a symbolic link (to '{secret}')" in store.notes[0]
    originals.record("cpuset:/sys/fs/cgroup/cpuset/a", "0-3")
    store.set(Override("j", 1, 0, "", clock(), None))
    assert secret.read_text() == "root's own data\n"
    assert not os.path.islink(state / "overrides.json") and not os.path.islink(state / "originals.json")


def test_a_link_planted_as_the_pid_file_is_refused_and_named(tmp_path, secret):
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(secret, run / "noded.pid")
    with pytest.raises(LockFileRefused, match=f"lock file {run}/noded.pid is a symbolic link"):
        InstanceLock(str(run)).acquire()
    assert secret.read_text() == "root's own data\n"


def test_the_pid_file_holds_the_pid_and_goes_at_release(tmp_path):
    with InstanceLock(str(tmp_path / "run")) as lock:
        assert (tmp_path / "run" / "noded.pid").read_text() == f"{os.getpid()}\n"
        assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o755  # created as asked
        assert lock.path == f"{tmp_path}/run/noded.pid"
    assert not (tmp_path / "run" / "noded.pid").exists()


# -- a directory another user could change is refused, with the reason


@ROOT_ONLY
def test_a_state_dir_owned_by_another_user_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)
    with pytest.raises(UnsafeDirectory, match=f"state directory {state}: refused: {state} is owned by uid 65534, "
                                              f"not by noded's uid 0"):
        OriginalValues(str(state))
    with pytest.raises(UnsafeDirectory, match="owned by uid 65534"):
        OverrideStore(str(state), clock)
    with pytest.raises(UnsafeDirectory, match="owned by uid 65534"):
        InstanceLock(str(state)).acquire()
    with pytest.raises(CalibrationError, match="owned by uid 65534"):
        read_calibration(str(state))
    assert os.listdir(state) == []


@pytest.mark.parametrize("mode, who", [(0o770, "group"), (0o707, "others"), (0o777, "group and others"),
                                       (0o1777, "group and others")])
def test_a_state_dir_others_may_write_is_refused(tmp_path, mode, who):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    with pytest.raises(UnsafeDirectory, match=f"{state} is writable by {who} \\(mode {mode:04o}\\)"):
        OriginalValues(str(state))


@pytest.mark.parametrize("mode, refused", [(0o777, True), (0o775, True), (0o1777, False), (0o755, False)])
def test_an_ancestor_others_may_write_is_refused_unless_sticky(tmp_path, mode, refused):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    if refused:
        with pytest.raises(UnsafeDirectory, match=f"{shared} is writable by .* and not sticky"):
            OriginalValues(str(shared / "state"))
        assert not (shared / "state").exists()  # refused before anything was made
    else:
        OriginalValues(str(shared / "state")).record("cpuset:/x", "0")


@ROOT_ONLY
def test_an_ancestor_owned_by_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    (theirs / "state").mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UnsafeDirectory, match=f"{theirs} is owned by uid 65534"):
        OriginalValues(str(theirs / "state"))


@ROOT_ONLY
def test_a_link_on_the_way_is_followed_only_if_root_or_noded_made_it(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    os.symlink(real, sticky / "mine")
    OriginalValues(str(sticky / "mine")).record("cpuset:/x", "0")  # an operator's link: followed
    assert (real / "originals.json").exists()
    os.symlink(real, sticky / "planted")
    os.lchown(sticky / "planted", NOBODY, NOBODY)  # any user may make a link in a sticky directory
    with pytest.raises(UnsafeDirectory, match=f"{sticky}/planted \\(a symbolic link\\) is owned by uid 65534"):
        OriginalValues(str(sticky / "planted"))


def test_pytests_own_directories_are_accepted(tmp_path):
    """/tmp is sticky and world-writable, /tmp/pytest-of-root is root's 0700."""
    OriginalValues(str(tmp_path / "a" / "b" / "state")).record("cpuset:/x", "0")
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b" / "state").st_mode) == 0o700


def test_a_new_directory_gets_the_mode_asked_for_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        SecureDir(str(tmp_path / "run"), mode=0o755, what="runtime directory").close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o755


def test_a_path_that_is_not_a_directory_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UnsafeDirectory, match="is not a directory"):
        OriginalValues(str(tmp_path / "file"))
    with pytest.raises(Exception, match="is not a directory"):
        OriginalValues(str(tmp_path / "file" / "state"))


# -- a corrupt file is moved aside, noded starts, and says so

CORRUPT = {
    "not JSON": (b"{not json", "not valid JSON"),
    "not UTF-8": (b'{"\xff": 1}', "not valid JSON"),
    "nested too deep": (b"[" * 100_000, "not valid JSON"),
    "wrong shape": (b"[1, 2]", "expected a JSON object, found list"),
}
ORIGINALS_BAD = {
    **CORRUPT,
    "a number for a cpuset": (b'{"cpuset:/sys/fs/cgroup/cpuset/a": 5}', "not a CPU list"),
    "a huge CPU range": (b'{"cpuset:/a": "0-99999999999"}', "bad CPU range"),
    "an unknown record": (b'{"cpuset:/a": "0-3", "schemata:x": "MB:0=10"}', "unknown record 'schemata:x'"),
    "an affinity of strings": (b'{"affinity:10:20": ["0"]}', "not a list of CPU numbers"),
}
OVERRIDES_BAD = {
    **CORRUPT,
    "a missing field": (b'{"a": {"level": 2}}', "override 'a': expected the keys"),
    "a level as text": (json.dumps({"a": {"job": "a", "level": "2", "set_by_uid": 0, "reason": "", "created": 1.0,
                                          "expires": None}}).encode(), "level must be an integer"),
    "a level that is true": (json.dumps({"a": {"job": "a", "level": True, "set_by_uid": 0, "reason": "",
                                               "created": 1.0, "expires": None}}).encode(), "level must be"),
    "an expiry of NaN": (b'{"a": {"job": "a", "level": 1, "set_by_uid": 0, "reason": "", "created": 1.0,'
                         b' "expires": NaN}}', "expires must be a finite number"),
    "another job's entry": (json.dumps({"a": {"job": "b", "level": 1, "set_by_uid": 0, "reason": "",
                                              "created": 1.0, "expires": None}}).encode(), "names the job 'b'"),
    "one good, one bad": (json.dumps({
        "good": {"job": "good", "level": 1, "set_by_uid": 0, "reason": "", "created": 1.0, "expires": None},
        "bad": {"job": "bad", "level": -1, "set_by_uid": 0, "reason": "", "created": 1.0, "expires": None}},
    ).encode(), "override 'bad': level must be"),
}


def open_originals(state):
    return OriginalValues(str(state))


def open_overrides(state):
    return OverrideStore(str(state), clock)


def assert_moved_aside(state, name, content, note, expected):
    aside = [n for n in os.listdir(state) if n.startswith(f"{name}.corrupt-")]
    assert len(aside) == 1, os.listdir(state)
    assert (state / aside[0]).read_bytes() == content  # kept for the operator, byte for byte
    assert not (state / name).exists()
    assert f"{state}/{name} is corrupt: " in note and expected in note
    assert f"moved aside to {state}/{aside[0]}" in note


@pytest.mark.parametrize("case", ORIGINALS_BAD)
def test_a_corrupt_originals_file_is_moved_aside_and_noded_starts(tmp_path, case, caplog):
    content, expected = ORIGINALS_BAD[case]
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "originals.json").write_bytes(content)
    originals = open_originals(state)
    assert originals.items() == [] and len(originals.notes) == 1
    assert_moved_aside(state, "originals.json", content, originals.notes[0], expected)
    assert any(r.levelname == "ERROR" and "originals.json is corrupt" in r.getMessage() for r in caplog.records)
    originals.record("cpuset:/x", "0")  # and it works from there
    assert open_originals(state).items() == [("cpuset:/x", "0")]


@pytest.mark.parametrize("case", OVERRIDES_BAD)
def test_a_corrupt_overrides_file_is_moved_aside_whole_and_noded_starts(tmp_path, case):
    content, expected = OVERRIDES_BAD[case]
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "overrides.json").write_bytes(content)
    store = open_overrides(state)
    assert store.active() == {} and len(store.notes) == 1  # not half-trusted
    assert_moved_aside(state, "overrides.json", content, store.notes[0], expected)


@pytest.mark.parametrize("opener, name", [(open_originals, "originals.json"), (open_overrides, "overrides.json")])
def test_a_file_too_large_is_moved_aside_unread(tmp_path, opener, name):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    with open(state / name, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: costs nothing to make
    store = opener(state)
    assert f"too large ({MAX_FILE_BYTES + 1} bytes; at most {MAX_FILE_BYTES} are read)" in store.notes[0]
    assert not (state / name).exists()


@pytest.mark.parametrize("opener, name", [(open_originals, "originals.json"), (open_overrides, "overrides.json")])
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_state_file_that_is_not_a_regular_file_is_moved_aside(tmp_path, opener, name, kind):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / name).mkdir() if kind == "directory" else os.mkfifo(state / name)
    store = opener(state)  # a FIFO must not hang the start
    assert "not a regular file" in store.notes[0] and not (state / name).exists()


def test_two_corruptions_in_one_second_keep_both_files(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    for content in (b"first", b"second"):
        (state / "originals.json").write_bytes(content)
        open_originals(state)
    kept = sorted((state / n).read_bytes() for n in os.listdir(state) if ".corrupt-" in n)
    assert kept == [b"first", b"second"]


def test_noded_run_starts_over_corrupt_state_files(tmp_path):
    from test_lifecycle import cpu_only_config

    cfg = cpu_only_config(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "originals.json").write_text("{ truncated by a disk error")
    (state / "overrides.json").write_text('{"a": {"level": 2}}')
    p = subprocess.run([sys.executable, "-m", "noded", "run", "--config", str(cfg), "--duration", "0.5"],
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    names = os.listdir(state)
    assert any(n.startswith("originals.json.corrupt-") for n in names), names
    assert any(n.startswith("overrides.json.corrupt-") for n in names), names
    assert "originals.json is corrupt: not valid JSON" in p.stderr, p.stderr
    assert "overrides.json is corrupt: not overrides (override 'a': expected the keys" in p.stderr, p.stderr


# -- any bytes at all: loaded, or moved aside; nothing else

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=20), kids,
                                                                                     max_size=4), max_leaves=12)
state_bytes = (st.binary(max_size=200)
               | json_values.map(lambda v: json.dumps(v).encode())
               | st.dictionaries(st.sampled_from(["cpuset:/a", "cpuset:b", "affinity:1:2", "affinity:x"]),
                                 json_values, max_size=3).map(lambda v: json.dumps(v).encode()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=state_bytes, which=st.sampled_from(["originals.json", "overrides.json"]))
def test_any_bytes_as_a_state_file_are_loaded_or_moved_aside(tmp_path_factory, content, which):
    state = tmp_path_factory.mktemp("state")
    (state / which).write_bytes(content)
    store = open_originals(state) if which == "originals.json" else open_overrides(state)
    if store.notes:
        assert_moved_aside(state, which, content, store.notes[0], "")
    else:
        loaded = dict(store.items()) if which == "originals.json" else store.active()
        assert len(loaded) == len(json.loads(content))
        assert (state / which).read_bytes() == content  # a good file is left as it is


# -- the transitional path helpers and the calibration go through the same checks


def test_the_path_helpers_read_and_write_through_a_checked_directory(tmp_path, secret):
    write_json_atomically(str(tmp_path / "state" / "m.json"), {"a": 1})
    assert read_json_object(str(tmp_path / "state" / "m.json"), "a model") == {"a": 1}
    assert read_json_object(str(tmp_path / "absent" / "m.json"), "a model") == {}
    os.symlink(secret, tmp_path / "state" / "link.json")
    with pytest.raises(ValueError, match="link.json: a symbolic link"):
        read_json_object(str(tmp_path / "state" / "link.json"), "a model")
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(UnsafeDirectory):
        write_json_atomically(str(tmp_path / "open" / "m.json"), {})


def test_a_calibration_is_refused_when_it_is_a_link(tmp_path, secret):
    cal = Calibration(12.5, 1, "2026-11-22T05:00:00+00:00", "python -m bench.scenario calibrate")
    write_calibration(str(tmp_path / "state"), cal)
    assert read_calibration(str(tmp_path / "state")) == cal
    os.replace(tmp_path / "state" / "calibration.json", tmp_path / "cal.json")
    os.symlink(tmp_path / "cal.json", tmp_path / "state" / "calibration.json")
    with pytest.raises(CalibrationError, match="calibration.json: a symbolic link"):
        read_calibration(str(tmp_path / "state"))
    assert read_calibration(str(tmp_path / "no-state")) is None


@ROOT_ONLY
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to halve")
def test_an_original_that_cannot_be_forgotten_is_counted_as_a_failed_record(tmpfs, sleeper):
    from types import MappingProxyType

    from noded.actuators.cores import CoreHalving
    from noded.jobs.model import Job, JobMeta
    from noded.samplers.sample import JobSample, Sample
    from noded.samplers.cpus import CpuPlacementSampler

    def observe(*jobs):
        placements = CpuPlacementSampler().sample({j.id: j for j in jobs})
        samples = {j.id: JobSample(j.id, j.source, j.pids, JobMeta(), "cpu", (), None, 1e9, "own", j.cgroup,
                                   None, placements[j.id]) for j in jobs}
        return Sample(0.0, MappingProxyType(samples), (), False, None, (), MappingProxyType({}), (), ())

    mnt = tmpfs()
    p = sleeper()
    job = Job("j", "registered", frozenset({p.pid}))
    cores = CoreHalving(OriginalValues(str(mnt / "state")))
    assert cores.apply({"j": 1}, observe(job)).housekeeping_failed == ()
    p.kill()
    p.wait()
    remount_read_only(mnt)
    # The process is gone: its record is to be forgotten, and the state dir refuses.
    result = cores.apply({}, observe())
    assert result.housekeeping_failed == ("record",) and result.failed == ()
    assert cores.originals.items()  # kept, to be forgotten when the directory can be written
