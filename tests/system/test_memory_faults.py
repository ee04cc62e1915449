"""Right-sizing's memory (soft limits) and operators' kept pins and stops, tried as a hostile
local user and a careless operator would (issue #13): state files corrupt or hostile, records
naming what is no cgroup, writes failing in a row, someone writing between noded's reads and
writes, a SIGKILL at every step, cgroups removed or left by the job's processes, labels at
their bounds, thousands of controls."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from noded.actuators.memsoft import QUANTUM, WRITTEN_FILE, MemorySoftLimits, parse_written
from noded.jobs.model import JobMeta
from noded.rightsize.memsplit import CacheJob, cache_curve, split_memory
from noded.samplers.sample import GPU, JobSample
from noded.samplers.cpus import CpuPlacement
from noded.stores.securedir import SecureDir
from noded.stores.originals import OriginalValues, StateWriteError, parse_originals
from support.forking import ForkedRuns

from support.memory import observe

REPO = Path(__file__).resolve().parents[2]
V1_MEMORY = "/sys/fs/cgroup/memory"
V1_CPUSET = "/sys/fs/cgroup/cpuset"
UNLIMITED_V1 = "9223372036854771712"
SOFT = "memory.soft_limit_in_bytes"


def _write(path, text):
    with open(path, "w") as f:
        f.write(str(text))


def _read(path):
    with open(path) as f:
        return f.read().strip()


def _records(state) -> tuple[dict, dict]:
    """(memory records of originals.json, memory_written.json) as a fresh start loads them."""
    owner = MemorySoftLimits(OriginalValues(str(state)))
    return {k: v for k, v in owner.originals.items() if k.startswith("memory:")}, dict(owner._written)


@pytest.fixture
def v1_job(tmp_path):
    """A job as Slurm makes one on v1: the same path in the cpuset and memory hierarchies, a
    process in both; ``move_out`` puts it in a sibling memory cgroup."""
    if not os.access(V1_MEMORY, os.W_OK) or not os.access(V1_CPUSET, os.W_OK):
        pytest.skip("no writable v1 memory and cpuset hierarchies")
    top = f"noded-memfault-{uuid.uuid4().hex[:8]}"
    cs, mem, other = f"{V1_CPUSET}/{top}/job_1", f"{V1_MEMORY}/{top}/job_1", f"{V1_MEMORY}/{top}/other"
    for d in (cs, mem, other):
        os.makedirs(d)
    for d in (f"{V1_CPUSET}/{top}", cs):
        for f in ("cpuset.cpus", "cpuset.mems"):
            _write(f"{d}/{f}", _read(f"{V1_CPUSET}/{f}"))
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        _write(f"{cs}/cgroup.procs", proc.pid)
        _write(f"{mem}/cgroup.procs", proc.pid)
        js = JobSample("slurm:1", "slurm", frozenset([proc.pid]), JobMeta(), GPU, (), None, None, "none",
                       cgroup=cs, cpus=CpuPlacement(((cs, frozenset(os.sched_getaffinity(0))),)))
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        yield SimpleNamespace(js=js, mem=mem, cs=cs, other=other, state=state, pid=proc.pid,
                              move_out=lambda: _write(f"{other}/cgroup.procs", proc.pid))
    finally:
        proc.kill()
        proc.wait()
        for d in (cs, mem, other, f"{V1_CPUSET}/{top}", f"{V1_MEMORY}/{top}"):
            if os.path.isdir(d):
                os.rmdir(d)


def _owner(state, **kw):
    return MemorySoftLimits(OriginalValues(str(state)), **kw)


def _tick(owner, js, want):
    """One tick of the daemon's part: observe, then wish ``want`` bytes (None: no wish)."""
    cgroups, unplaced = observe(owner, {js.id: js})
    return owner.apply({} if want is None else {js.id: want}, cgroups, unplaced)


@pytest.fixture
def fake_v2(tmp_path, tmpfs):
    """A cgroup v2 layout on a tmpfs the mounts file given to noded lists as cgroup2 (this host's
    memory controller is on v1): jobs' directories with memory.high and memory.stat."""
    root = tmpfs(size="1m", name="cg")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {root} cgroup2 rw 0 0\n")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)

    def job(name="job_9", cgroup=None):
        d = root / name
        d.mkdir()
        (d / "memory.high").write_text("max\n")
        (d / "memory.stat").write_text(f"anon {1 << 30}\nfile {1 << 30}\n")
        return JobSample(f"slurm:{name}", "slurm", frozenset(), JobMeta(), GPU, (), None, None, "none",
                         cgroup=str(cgroup or d))

    return SimpleNamespace(root=root, mounts=mounts, state=state, job=job,
                           owner=lambda: _owner(state, mounts=str(mounts)))


# -- the lists of what noded wrote


def test_a_corrupt_written_list_does_not_leave_noded_limits_behind_and_leaves_others(v1_job):
    owner = _owner(v1_job.state)
    _tick(owner, v1_job.js, 2 * QUANTUM)
    assert _read(f"{v1_job.mem}/{SOFT}") == str(2 * QUANTUM)
    (v1_job.state / WRITTEN_FILE).write_text("{not json")
    fresh = _owner(v1_job.state)
    assert any("moved aside" in n for n in fresh.notes) and any("taken as noded's" in n for n in fresh.notes)
    assert fresh.restore_all() == [f"memory:{v1_job.mem}"]
    assert _read(f"{v1_job.mem}/{SOFT}") == UNLIMITED_V1
    assert _records(v1_job.state) == ({}, {})
    # an operator's value (not of the shape noded writes) is theirs even with the list lost
    _tick(_owner(v1_job.state), v1_job.js, 2 * QUANTUM)
    _write(f"{v1_job.mem}/{SOFT}", 3 * QUANTUM + 4096)
    (v1_job.state / WRITTEN_FILE).write_text("[]")
    assert _owner(v1_job.state).restore_all() == []
    assert _read(f"{v1_job.mem}/{SOFT}") == str(3 * QUANTUM + 4096) and _records(v1_job.state) == ({}, {})


def test_a_run_of_failed_writes_never_pushes_the_value_in_force_out_of_the_list(fake_v2):
    js = fake_v2.job()
    owner = fake_v2.owner()
    _tick(owner, js, 2 * QUANTUM)
    high = Path(js.cgroup) / "memory.high"
    assert high.read_text() == str(2 * QUANTUM)
    subprocess.run(["mount", "-o", "remount,ro", str(fake_v2.root)], check=True)
    try:
        for n in range(3, 10):  # the process memory grows: each tick wishes more, each write fails
            result = _tick(owner, js, n * QUANTUM)
            assert [bool(c.error) for c in result.changes] == [True]
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(fake_v2.root)], check=True)
    assert high.read_text() == str(2 * QUANTUM)
    assert owner.release_all() == [] and high.read_text() == "max"  # still noded's: put back
    assert _records(fake_v2.state) == ({}, {})


def test_values_listed_for_a_record_long_gone_are_not_taken_as_noded(v1_job):
    key = f"memory:{v1_job.mem}"
    (v1_job.state / WRITTEN_FILE).write_text(json.dumps({key: [str(5 * QUANTUM)]}))  # a crash between forgets
    owner = _owner(v1_job.state)
    _tick(owner, v1_job.js, 2 * QUANTUM)
    assert _records(v1_job.state)[1] == {key: [str(2 * QUANTUM)]}
    _write(f"{v1_job.mem}/{SOFT}", 5 * QUANTUM)  # the operator's, the same as the stale value
    assert _tick(owner, v1_job.js, 3 * QUANTUM).changes == ()
    assert _read(f"{v1_job.mem}/{SOFT}") == str(5 * QUANTUM) and _records(v1_job.state) == ({}, {})


@pytest.mark.parametrize("originals, written", [
    ({"memory:/sys/fs/cgroup/memory/a/../../../../etc": {"job": "j", "original": "0", "version": 1}}, None),
    ({"memory:/x": {"job": "j", "original": "hello", "version": 2}}, None),
    ({"memory:/x": {"job": "j", "original": "max", "version": 1}}, None),  # v1 shows bytes only
    ({"memory:/x": {"job": "j", "original": "1", "version": True}}, None),
    (None, {"memory:/x": ["max"]}),
    (None, {"memory:/x": [str(QUANTUM + 1)]}),
    (None, {"memory:/x": ["0"]}),
    (None, {"memory:/x/": [str(QUANTUM)]}),
    (None, {"memory:/x": [str(QUANTUM)] * 5}),
])
def test_a_hostile_memory_record_is_moved_aside_at_start(tmp_path, originals, written):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    if originals is not None:
        with pytest.raises(ValueError):
            parse_originals(originals)
        (state / "originals.json").write_text(json.dumps(originals))
    if written is not None:
        with pytest.raises(ValueError):
            parse_written(written)
        (state / WRITTEN_FILE).write_text(json.dumps(written))
    owner = _owner(state)
    assert any("moved aside" in n for n in owner.notes + owner.originals.notes)
    assert owner.restore_all() == []


# -- nothing but cgroup files, never blocking

RESTORE = """
import sys
from noded.actuators.memsoft import MemorySoftLimits
from noded.stores.originals import OriginalValues
owner = MemorySoftLimits(OriginalValues(sys.argv[1]), mounts=sys.argv[2])
print(owner.release_all())
"""


@pytest.mark.parametrize("plant", ["regular", "fifo", "link", "dir-link", "not-a-dir"])
def test_a_record_naming_no_cgroup_file_is_never_written_through_nor_hangs(fake_v2, tmp_path, plant):
    """A record (a careless operator's, another host's) for a directory outside every cgroup
    filesystem, holding a value noded wrote: restore writes nothing there and drops it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = tmp_path / "victim"
    victim.write_text(str(2 * QUANTUM))
    target = outside
    if plant == "regular":
        (outside / "memory.high").write_text(str(2 * QUANTUM))
    elif plant == "fifo":
        os.mkfifo(outside / "memory.high")
    elif plant == "link":
        (outside / "memory.high").symlink_to(victim)
    elif plant == "dir-link":  # the record's directory is a link to one outside every cgroup filesystem
        (outside / "memory.high").write_text(str(2 * QUANTUM))
        target = tmp_path / "via"
        target.symlink_to(outside)
        victim = outside / "memory.high"
    else:
        target = victim
    key = f"memory:{target}"
    (fake_v2.state / "originals.json").write_text(json.dumps({key: {"job": "j", "original": "max", "version": 2}}))
    (fake_v2.state / WRITTEN_FILE).write_text(json.dumps({key: [str(2 * QUANTUM)]}))
    done = subprocess.run([sys.executable, "-c", RESTORE, str(fake_v2.state), str(fake_v2.mounts)], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == str(2 * QUANTUM)
    if plant == "regular":
        assert (outside / "memory.high").read_text() == str(2 * QUANTUM)
    assert key in done.stdout  # said: not put back
    assert _records(fake_v2.state) == ({}, {})  # noded cannot have written there: nothing to keep


@pytest.mark.parametrize("plant", ["link", "fifo", "dir-link"])
def test_a_job_whose_limit_file_is_not_a_cgroup_file_is_not_limited(fake_v2, tmp_path, plant):
    js = fake_v2.job()
    high = Path(js.cgroup) / "memory.high"
    victim = tmp_path / "victim"
    victim.write_text("max\n")
    if plant == "link":
        high.unlink()
        high.symlink_to(victim)
    elif plant == "fifo":
        high.unlink()
        os.mkfifo(high)
    else:
        (tmp_path / "fake").mkdir()
        for f in ("memory.high", "memory.stat"):
            (tmp_path / "fake" / f).write_text((Path(js.cgroup) / f).read_text())
        js = fake_v2.job("job_10", cgroup=tmp_path / "via")
        (tmp_path / "via").symlink_to(tmp_path / "fake")
        victim = tmp_path / "fake" / "memory.high"
    owner = fake_v2.owner()
    cgroups, unplaced = observe(owner, {js.id: js})
    assert cgroups == {} and js.id in unplaced
    assert owner.apply({js.id: 2 * QUANTUM}, cgroups, unplaced).changes == ()
    assert victim.read_text() == "max\n" and _records(fake_v2.state) == ({}, {})


# -- the kernel and other writers between noded's steps


def test_a_value_someone_writes_between_observe_and_apply_is_theirs(v1_job):
    owner = _owner(v1_job.state)
    for first in (True, False):
        cgroups, unplaced = observe(owner, {v1_job.js.id: v1_job.js})
        _write(f"{v1_job.mem}/{SOFT}", 7 * QUANTUM + 4096)  # the operator, between noded's read and write
        result = owner.apply({v1_job.js.id: (2 if first else 3) * QUANTUM}, cgroups, unplaced)
        assert result.changes == () and _read(f"{v1_job.mem}/{SOFT}") == str(7 * QUANTUM + 4096)
        assert _records(v1_job.state) == ({}, {})
        if first:  # again with a record of noded's in force
            _write(f"{v1_job.mem}/{SOFT}", UNLIMITED_V1)
            _tick(owner, v1_job.js, 2 * QUANTUM)
            assert _read(f"{v1_job.mem}/{SOFT}") == str(2 * QUANTUM)


def test_a_cgroup_removed_between_observe_and_apply_takes_its_records_with_it(v1_job):
    owner = _owner(v1_job.state)
    cgroups, unplaced = observe(owner, {v1_job.js.id: v1_job.js})
    v1_job.move_out()
    os.rmdir(v1_job.mem)
    result = owner.apply({v1_job.js.id: 2 * QUANTUM}, cgroups, unplaced)
    assert [bool(c.error) for c in result.changes] == [True]  # said, not believed done
    assert result.limits[v1_job.js.id] == UNLIMITED_V1
    assert _tick(owner, v1_job.js, None).changes == ()
    assert _records(v1_job.state) == ({}, {})


def test_a_job_whose_processes_leave_its_memory_cgroup_is_held_then_put_back_at_its_end(v1_job):
    owner = _owner(v1_job.state)
    _tick(owner, v1_job.js, 2 * QUANTUM)
    v1_job.move_out()
    result = _tick(owner, v1_job.js, 3 * QUANTUM)
    assert v1_job.js.id in result.unplaced and result.changes == ()  # an error is not "no limit"
    assert _read(f"{v1_job.mem}/{SOFT}") == str(2 * QUANTUM)
    assert owner.apply({}, {}, {}).changes[0].limit == UNLIMITED_V1  # the job ended
    assert _read(f"{v1_job.mem}/{SOFT}") == UNLIMITED_V1 and _records(v1_job.state) == ({}, {})


def test_a_wish_noded_would_not_write_is_refused_before_anything_is_recorded(v1_job):
    owner = _owner(v1_job.state)
    for bad in (QUANTUM + 1, 0, -QUANTUM):
        result = _tick(owner, v1_job.js, bad)
        assert [bool(c.error) for c in result.changes] == [True]
    assert _read(f"{v1_job.mem}/{SOFT}") == UNLIMITED_V1 and _records(v1_job.state) == ({}, {})


# -- SIGKILL at every step

# Each run a process forked from one that imported noded once (support.forking), killed
# (SIGKILL) by an audit hook at its k-th step: a limit's or a state file's temp opened for
# writing, the temp renamed over the state file.
KILLED_AT = """
import os, sys, json
from noded.actuators.memsoft import MemorySoftLimits
from noded.samplers.memcgroups import MemoryCgroupSampler
from noded.jobs.model import JobMeta
from noded.samplers.sample import JobSample
from noded.stores.originals import OriginalValues


def run(state, cgroup, pid, wishes, at):
    count = 0

    def hook(event, args):
        nonlocal count
        if event == "open":
            path, _mode, flags = args
            if not isinstance(path, str) or not flags & (os.O_WRONLY | os.O_RDWR):
                return
            if not (path.endswith("/memory.soft_limit_in_bytes") or path.endswith(".tmp")):
                return
        elif event != "os.rename":
            return
        count += 1
        if count == int(at):
            os.kill(os.getpid(), 9)

    js = JobSample("slurm:1", "slurm", frozenset([int(pid)]), JobMeta(), "gpu", (), None, None, "none",
                   cgroup=cgroup)
    owner = MemorySoftLimits(OriginalValues(state))
    sys.addaudithook(hook)
    for wish in json.loads(wishes):
        found = MemoryCgroupSampler().sample({js.id: js})
        result = owner.apply({js.id: wish} if wish is not None else {}, found.cgroups, found.unplaced)
        assert not result.failed, result.failed
    return count
"""


def test_a_sigkill_at_any_step_leaves_what_a_clean_start_leaves(v1_job):
    wishes = [2 * QUANTUM, 3 * QUANTUM, 2 * QUANTUM, None, 4 * QUANTUM]
    runs = ForkedRuns(KILLED_AT, str(REPO))
    try:
        k = 0
        while True:
            k += 1
            assert k < 100, "the owner never finished"
            _write(f"{v1_job.mem}/{SOFT}", UNLIMITED_V1)
            code, said = runs.run(str(v1_job.state), v1_job.cs, str(v1_job.pid), json.dumps(wishes), str(k))
            assert code in (0, -signal.SIGKILL), said
            _owner(v1_job.state).restore_all()
            assert _read(f"{v1_job.mem}/{SOFT}") == UNLIMITED_V1, k
            assert _records(v1_job.state) == ({}, {}), k
            leftovers = [n for n in os.listdir(v1_job.state) if "corrupt" in n]
            assert leftovers == [], (k, leftovers)
            if code == 0:
                assert k > 5
                return
    finally:
        runs.close()


# -- labels and the split


@pytest.mark.parametrize("share", [5e-324, 1e-300, 1e-9])
def test_one_jobs_extreme_cache_label_refuses_that_job_alone(share):
    jobs = [CacheJob("hostile", 1, cache_curve(480.0, share)), CacheJob("img", 1, cache_curve(480.0, 0.45)),
            CacheJob("img2", 1, cache_curve(480.0, 0.45))]
    s = split_memory(jobs, node_gpus=3, units=12, cache_gb=480.0)
    assert set(s.units) == {"img", "img2"} and set(s.refused) == {"hostile"}
    assert "hostile" in s.reason and s.units["img"] >= s.proportional["img"]


@pytest.mark.parametrize("dataset_gb, share", [(1e-300, 0.5), (5e-324, 1e-3), (1e6, 1.0), (1e6, 1e-3), (1.0, 1.0)])
def test_cache_labels_at_their_bounds_split_without_error(dataset_gb, share):
    s = split_memory([CacheJob("a", 1, cache_curve(dataset_gb, share)), CacheJob("b", 1, cache_curve(480.0, 0.45))],
                     node_gpus=2, units=16, cache_gb=1e6)
    assert sum(s.units.values()) <= 16 and s.refused == {}


# -- operators' controls


def test_a_control_beyond_the_limit_is_refused_as_one_that_cannot_be_kept(tmp_path):
    from noded.rightsize.controls import MAX_CONTROLS, SizeControls, StoredControl

    state = SecureDir(str(tmp_path / "state"))
    controls = SizeControls(state)
    many = {f"slurm:{i}": {"kind": "pin", "cores": 2, "uid": 0, "reason": "r" * 1024} for i in range(MAX_CONTROLS)}
    state.write_json("size_controls.json", many)
    controls = SizeControls(state)
    assert len(controls.jobs()) == MAX_CONTROLS and controls.notes == []
    with pytest.raises(StateWriteError, match="reprobe some jobs first"):
        controls.set("slurm:new", StoredControl("pin", 2, 0, ""))
    controls.set("slurm:0", StoredControl("stop", 3, 1, ""))  # one of those kept may still change
    assert SizeControls(state).get("slurm:0").kind == "stop" and "slurm:new" not in SizeControls(state).jobs()


def _sized_with_controls(tmp_path):
    """One GPU job "g" sized with its controls kept in a state directory, ticked once:
    (state, node, service, loop)."""
    from test_rightsize_service import CONFIG, Loop, Node

    from noded.rightsize.controls import SizeControls
    from noded.rightsize.history import SizingHistory
    from noded.rightsize.service import RightSizing

    state = SecureDir(str(tmp_path / "state"))
    node = Node()
    node.start("g", cpus=range(16))
    rs = RightSizing(CONFIG, SizingHistory(state), clock=lambda: node.t, controls=SizeControls(state))
    loop = Loop(node, rs)
    loop.tick()
    return state, node, rs, loop


def test_the_pin_past_the_limit_is_refused_through_the_service_and_changes_nothing(tmp_path):
    from noded.rightsize.controls import MAX_CONTROLS, SizeControls

    state, node, rs, loop = _sized_with_controls(tmp_path)
    # thousands of jobs' controls kept (jobs the next tick would find gone)
    state.write_json("size_controls.json", {f"slurm:{i}": {"kind": "stop", "cores": 1, "uid": 0, "reason": ""}
                                            for i in range(MAX_CONTROLS)})
    rs.controls = SizeControls(state)
    before = rs.view().jobs["g"]
    with pytest.raises(StateWriteError):
        rs.pin("g", 2, 0, "")
    after = rs.view().jobs["g"]
    assert (after.state, after.target, after.control) == (before.state, before.target, None)


def test_a_kept_pin_beyond_the_cpus_after_a_restart_is_cut_to_them(tmp_path):
    from test_rightsize_service import CONFIG, Loop, Node

    from noded.rightsize.controls import SizeControls
    from noded.rightsize.history import SizingHistory
    from noded.rightsize.service import PINNED, RightSizing

    state = SecureDir(str(tmp_path / "state"))
    node = Node(cpus=16)
    node.start("g", cpus=range(16))
    rs = RightSizing(CONFIG, SizingHistory(state), clock=lambda: node.t, controls=SizeControls(state))
    Loop(node, rs).tick()
    rs.pin("g", 14, 0, "big")
    node = Node(cpus=4)  # restarted on fewer CPUs (offlined, a smaller cpuset)
    node.start("g", cpus=range(4))
    rs = RightSizing(CONFIG, SizingHistory(state), clock=lambda: node.t, controls=SizeControls(state))
    loop = Loop(node, rs)
    loop.tick()
    loop.tick()
    g = rs.view().jobs["g"]
    assert (g.state, g.target) == (PINNED, 4) and loop.plan is not None
    assert len(node.jobs["g"]["cpus"]) == 4


@pytest.mark.parametrize("content", [
    b"[" * 100000 + b"]" * 100000,
    b'{"j": {"kind": "pin", "cores": ' + b"9" * 5000 + b', "uid": 0, "reason": ""}}',
    b'{"j": {"kind": "pin", "cores": 2.0, "uid": 0, "reason": ""}}',
    b'{"j": {"kind": "pin", "cores": 2, "uid": 0, "reason": "' + b"x" * 2000 + b'"}}',
    b'{"": {"kind": "pin", "cores": 2, "uid": 0, "reason": ""}}',
    b"\xff\xfe",
])
def test_a_hostile_controls_file_is_moved_aside_and_noded_starts_without_controls(tmp_path, content):
    from noded.rightsize.controls import FILE, SizeControls

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / FILE).write_bytes(content)
    controls = SizeControls(SecureDir(str(state)))
    assert controls.jobs() == set() and "moved aside" in controls.notes[0]
    assert not (state / FILE).exists()


def test_a_controls_file_that_is_a_link_or_a_fifo_is_not_followed(tmp_path):
    from noded.rightsize.controls import FILE, SizeControls

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"j": {"kind": "pin", "cores": 2, "uid": 0, "reason": ""}}')
    (state / FILE).symlink_to(elsewhere)
    assert SizeControls(SecureDir(str(state))).jobs() == set()
    assert elsewhere.exists() and stat.S_ISREG(os.lstat(elsewhere).st_mode)
    os.mkfifo(state / FILE)
    assert SizeControls(SecureDir(str(state))).jobs() == set()


def test_a_tick_without_cpu_placements_keeps_the_operators_controls(tmp_path):
    from dataclasses import replace
    from types import MappingProxyType

    from noded.rightsize.controls import SizeControls

    state, node, rs, loop = _sized_with_controls(tmp_path)
    rs.pin("g", 3, 0, "hold")
    sample = node.sample()  # the "cpus" sampler failed this tick: no job's placement is known
    blind = replace(sample, jobs=MappingProxyType({j: replace(js, cpus=None) for j, js in sample.jobs.items()}))
    rs.tick(blind, {}, loop.originals, node.t, node.cpus, 4)
    assert SizeControls(state).get("g") is not None
    v = rs.view().jobs["g"]  # the sizing is held too, pin and all
    assert (v.state, v.target, v.control.kind) == ("pinned", 3, "pin")


# -- a job's directory shut to noded (its owner's chmod; noded's unit has no CAP_DAC_OVERRIDE)

SHUT_SCRIPT = """
import json, os, sys
from noded.actuators.memsoft import MemorySoftLimits
from noded.samplers.memcgroups import MemoryCgroupSampler
from noded.stores.originals import OriginalValues
from noded.samplers.sample import GPU, JobSample
from noded.jobs.model import JobMeta
state, cgroup, shut, pid, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
os.chmod(shut, 0)  # the owner shuts noded out (CAP_FOWNER is kept here to do it)
js = JobSample("slurm:1", "slurm", frozenset([pid]), JobMeta(), GPU, (), None, None, "none", cgroup=cgroup)
owner = MemorySoftLimits(OriginalValues(state))
r = MemoryCgroupSampler().sample({js.id: js})
cgroups, unplaced = dict(r.cgroups), dict(r.unplaced)
result = owner.apply({js.id: want} if want else {}, cgroups, unplaced)
print(json.dumps({"found": {j: c.path for j, c in cgroups.items()}, "unplaced": unplaced,
                  "records": sorted(k for k, _ in OriginalValues(state).items())}))
"""


def _as_the_unit(state, cgroup, shut, pid, want=0) -> dict:
    """SHUT_SCRIPT as noded's unit runs: root without CAP_DAC_OVERRIDE nor CAP_DAC_READ_SEARCH."""
    try:
        out = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
                              sys.executable, "-c", SHUT_SCRIPT, str(state), cgroup, shut, str(pid), str(want)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    finally:
        os.chmod(shut, 0o755)
    return json.loads(out)


def test_a_held_jobs_memory_cgroup_shut_to_noded_keeps_its_record(v1_job):
    # Before: a job whose memory cgroup its owner shut was held (not read this tick), and
    # os.path.lexists answered False for EACCES on its limit file: noded took the file for
    # gone and forgot the original its own write had replaced, never to put it back.
    owner = _owner(v1_job.state)
    _tick(owner, v1_job.js, 2 * QUANTUM)
    key = f"memory:{v1_job.mem}"
    assert key in _records(v1_job.state)[0]
    got = _as_the_unit(v1_job.state, v1_job.cs, v1_job.mem, v1_job.pid, 3 * QUANTUM)
    assert "Permission denied" in got["unplaced"][v1_job.js.id] and got["records"] == [key]  # held, kept
    assert _read(f"{v1_job.mem}/{SOFT}") == str(2 * QUANTUM)
    assert _owner(v1_job.state).apply({}, {}, {}).changes[0].limit == UNLIMITED_V1  # put back at its end
    assert _read(f"{v1_job.mem}/{SOFT}") == UNLIMITED_V1 and _records(v1_job.state) == ({}, {})


def test_a_v1_jobs_cgroup_shut_to_noded_still_has_its_memory_cgroup(v1_job):
    # On v1 the job's memory is the memory hierarchy's (no memory.high in any cgroup): its
    # cpuset directory shut changes nothing of where its memory cgroup is
    got = _as_the_unit(v1_job.state, v1_job.cs, v1_job.cs, v1_job.pid)
    assert got["found"] == {v1_job.js.id: v1_job.mem} and got["unplaced"] == {}


UNIFIED = "/sys/fs/cgroup/unified"


def test_a_v2_jobs_cgroup_shut_to_noded_is_said_as_shut_not_taken_for_v1(sleeper, tmp_path):
    # Before: os.path.exists(JOB/memory.high) answered False for EACCES, so a v2 job whose
    # owner shut its directory was looked for in the v1 memory hierarchy and said to be
    # "none of the job's processes is in the memory cgroup /sys/fs/cgroup/memory/...".
    with open("/proc/mounts") as f:
        if not any(line.split()[1:3] == [UNIFIED, "cgroup2"] for line in f):
            pytest.skip(f"no cgroup2 mount at {UNIFIED}")
    job = f"{UNIFIED}/noded-test-{uuid.uuid4().hex[:8]}"
    os.mkdir(job)
    p = sleeper()
    try:
        _write(f"{job}/cgroup.procs", p.pid)
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        got = _as_the_unit(state, job, job, p.pid)
    finally:
        p.kill()
        p.wait()
        from support.waiting import wait_for
        wait_for(lambda: _read(f"{job}/cgroup.procs") == "", what=f"{job} to empty")
        os.rmdir(job)
    assert got["found"] == {}
    assert got["unplaced"]["slurm:1"] == f"{job}/memory.high: Permission denied", got
