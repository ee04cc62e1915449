"""Core halving on real cpusets (cgroup v1 here) and real affinities: planned from
what the kernel shows now, the original values recorded before the first write and
restored after a crash; a value someone else changed is theirs."""

import os

import pytest

from noded.actuators.cores import CoreHalving
from noded.jobs.model import Job
from noded.stores.originals import OriginalValues
from noded.util.halving import kept_cpus
from noded.util.halving import max_level
from resctrl.cpulist import format_cpu_list, parse_cpu_list
from support.cpus import ForkOnRequest, observe

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to halve")


def test_levels_halve_and_never_go_below_one_core():
    assert [kept_cpus(list(range(8)), lvl) for lvl in range(5)] == [
        list(range(8)), [0, 1, 2, 3], [0, 1], [0], [0]]
    assert [max_level(n) for n in (1, 2, 3, 8, 12)] == [0, 1, 1, 3, 3]


@needs_two_cpus
def test_affinity_halving_restores_after_a_crash(tmp_path, sleeper):
    p = sleeper()
    before = os.sched_getaffinity(p.pid)
    job = Job("j", "registered", frozenset({p.pid}))
    cores = CoreHalving(OriginalValues(str(tmp_path)))
    assert cores.max_levels(observe(job)) == {"j": max_level(len(before))}
    assert cores.levels_in_force(observe(job)) == {"j": 0}
    result = cores.apply({"j": 1}, observe(job))
    assert [a.error for a in result.applied] == [None] and result.levels == {"j": 1}
    assert len(os.sched_getaffinity(p.pid)) == len(before) // 2
    assert cores.levels_in_force(observe(job)) == {"j": 1}  # read back from the kernel
    assert cores.apply({"j": 1}, observe(job)).applied == ()  # nothing to do: nothing written
    # The daemon dies here. A new one starts with the same state directory:
    assert sorted(k.split(":")[0] for k, _ in OriginalValues(str(tmp_path)).items()) == ["affinity", "affinity_job"]
    restored = CoreHalving(OriginalValues(str(tmp_path))).restore_all()
    assert os.sched_getaffinity(p.pid) == before and len(restored) == 2  # the process, and its job as a whole
    assert OriginalValues(str(tmp_path)).items() == []


@needs_two_cpus
def test_a_v1_cpuset_tree_shrinks_children_first_and_grows_back(tmp_path, v1_cpuset, sleeper):
    base, mkcg = v1_cpuset
    job_dir = mkcg("slurm/uid_0/job_5")
    step = mkcg("slurm/uid_0/job_5/step_0")
    p = sleeper()
    with open(f"{step}/cgroup.procs", "w") as f:
        f.write(str(p.pid))
    original = parse_cpu_list(open(f"{job_dir}/cpuset.cpus").read())
    job = Job("slurm:5", "slurm", frozenset({p.pid}), job_dir)
    cores = CoreHalving(OriginalValues(str(tmp_path)))
    (a,) = cores.apply({"slurm:5": 1}, observe(job)).applied
    assert a.error is None, a
    half = format_cpu_list(sorted(original)[: len(original) // 2])
    assert open(f"{job_dir}/cpuset.cpus").read().strip() == half
    assert open(f"{step}/cpuset.cpus").read().strip() == half  # written before its parent
    assert a.writes[0].startswith(step) and a.writes[1].startswith(job_dir)
    assert len(os.sched_getaffinity(p.pid)) == len(original) // 2
    (a,) = cores.apply({}, observe(job)).applied
    assert a.error is None and a.writes[0].startswith(job_dir)  # the parent grows first
    assert parse_cpu_list(open(f"{job_dir}/cpuset.cpus").read()) == original
    assert parse_cpu_list(open(f"{step}/cpuset.cpus").read()) == original
    assert OriginalValues(str(tmp_path)).items() == []


@needs_two_cpus
def test_a_cpuset_someone_else_changed_is_theirs(tmp_path, v1_cpuset, sleeper):
    base, mkcg = v1_cpuset
    job_dir = mkcg("job_6")
    p = sleeper()
    with open(f"{job_dir}/cgroup.procs", "w") as f:
        f.write(str(p.pid))
    original = sorted(parse_cpu_list(open(f"{job_dir}/cpuset.cpus").read()))
    job = Job("cgroup:job_6", "cgroup", frozenset({p.pid}), job_dir)
    originals = OriginalValues(str(tmp_path))
    cores = CoreHalving(originals)
    cores.apply({job.id: 1}, observe(job))
    # The scheduler resizes the job meanwhile (here: to its last CPU only).
    with open(f"{job_dir}/cpuset.cpus", "w") as f:
        f.write(str(original[-1]))
    cores.apply({job.id: 1}, observe(job))  # still wanted at level 1
    # noded forgets its record and halves what the job has now, never writing back its old original
    # (one CPU halved is that CPU: nothing differs, so nothing is recorded or written).
    assert originals.get(f"cpuset:{job_dir}") is None
    assert open(f"{job_dir}/cpuset.cpus").read().strip() == str(original[-1])
    cores.apply({}, observe(job))
    assert open(f"{job_dir}/cpuset.cpus").read().strip() == str(original[-1])
    assert originals.items() == []


@needs_two_cpus
def test_a_child_that_inherited_a_throttled_affinity_gets_the_jobs_original_back(tmp_path):
    tree = ForkOnRequest()
    parent = tree.parent
    try:
        before = os.sched_getaffinity(parent.pid)
        originals = OriginalValues(str(tmp_path))
        cores = CoreHalving(originals)
        job = Job("pid:1", "registered", frozenset({parent.pid}))
        cores.apply({job.id: 1}, observe(job))
        throttled = os.sched_getaffinity(parent.pid)
        assert len(throttled) == len(before) // 2
        child = tree.fork()
        assert os.sched_getaffinity(child) == throttled  # inherited
        job = Job("pid:1", "registered", frozenset({parent.pid, child}))
        assert cores.levels_in_force(observe(job)) == {job.id: 1}
        cores.apply({job.id: 1}, observe(job))  # nothing to change, but the child's original is recorded now
        assert any(k.startswith(f"affinity:{child}:") for k, _ in originals.items())
        # A crash here, then a start: both come back to the job's original CPUs.
        CoreHalving(OriginalValues(str(tmp_path))).restore_all()
        assert os.sched_getaffinity(parent.pid) == before and os.sched_getaffinity(child) == before
    finally:
        tree.close()


def test_a_broken_state_file_is_moved_aside_and_noded_starts(tmp_path):
    (tmp_path / "originals.json").write_text("[1, 2]")
    values = OriginalValues(str(tmp_path))
    assert values.items() == [] and values.notes and "moved aside" in values.notes[0]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("originals.json.corrupt-")]


def test_a_level_that_needs_no_write_is_no_change_and_no_journal_line(tmp_path, sleeper, caplog):
    # One CPU cannot be halved: a level asked of a one-CPU job (an override set when it had
    # more) writes nothing, so it is no change: nothing applied, nothing logged, every tick.
    p = sleeper()
    os.sched_setaffinity(p.pid, {min(os.sched_getaffinity(p.pid))})
    job = Job("j", "registered", frozenset({p.pid}))
    cores = CoreHalving(OriginalValues(str(tmp_path)))
    for _ in range(3):
        with caplog.at_level("INFO", logger="noded.changes"):
            result = cores.apply({"j": 1}, observe(job))
        assert result.applied == () and result.failed == ()
    assert not [r for r in caplog.records if r.name == "noded.changes"]
    assert OriginalValues(str(tmp_path)).items() == []  # nothing touched, nothing recorded
