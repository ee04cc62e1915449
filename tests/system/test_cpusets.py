"""The one owner of every job's CPUs (issue #13 item 5): any wanted set, not only a halving,
on real cgroup v1 cpusets and real affinities; originals recorded before the first write and
restored (on release, and after a SIGKILL at the next start); only differences written, in an
order the kernel accepts; someone else's change respected; nothing changed without a record."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.waiting import read_until
from noded.actuators.cpurecords import WRITTEN_FILE
from noded.actuators.cpusets import CpuSetOwner
from noded.util.cputree import cpuset_steps
from noded.util.cputree import derived
from noded.jobs.model import Job
from noded.stores.originals import OriginalValues
from resctrl.cpulist import parse_cpu_list
from support.cpus import observe
from support.paths import REPO_ROOT

REPO = Path(REPO_ROOT)
needs_two_cpus = pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts a tmpfs")


def cpus(path) -> set[int]:
    return set(parse_cpu_list(open(f"{path}/cpuset.cpus").read()))


def write(path, name, value):
    with open(os.path.join(path, name), "w") as f:
        f.write(str(value))


# -- pure: what a child gets, and the order of writes


def test_a_child_keeps_what_its_original_has_of_its_parents_set_and_whatever_was_lent():
    assert derived(frozenset({0, 1}), frozenset({0, 1}), frozenset({1})) == {1}  # the same original: follows
    assert derived(frozenset({0}), frozenset({0, 1}), frozenset({0, 1, 2, 3})) == {0, 2, 3}  # lent CPUs reach it
    assert derived(frozenset({0}), frozenset({0, 1}), frozenset({1})) == {1}  # nothing of its own left: all


def test_shrinking_writes_children_first_growing_parents_first_and_a_swap_goes_through_the_union():
    a, b, ab = frozenset({0}), frozenset({1}), frozenset({0, 1})
    assert cpuset_steps([(ab, a, None), (ab, a, 0)]) == [(1, a), (0, a)]
    assert cpuset_steps([(a, ab, None), (a, ab, 0)]) == [(0, ab), (1, ab)]
    assert cpuset_steps([(a, b, None), (a, b, 0)]) == [(0, ab), (1, ab), (1, b), (0, b)]
    assert cpuset_steps([(ab, ab, None), (a, a, 0)]) == []  # nothing differs: nothing written


def tree_states():
    """A cpuset tree (parents first) with a now and a target per cgroup, each inside its parent's."""
    cpu_sets = st.frozensets(st.integers(0, 5), min_size=1)

    @st.composite
    def build(draw):
        n = draw(st.integers(1, 5))
        parents, nows, targets = [None], [draw(cpu_sets)], [draw(cpu_sets)]
        for i in range(1, n):
            p = draw(st.integers(0, i - 1))
            parents.append(p)
            nows.append(draw(st.frozensets(st.sampled_from(sorted(nows[p])), min_size=1)))
            targets.append(draw(st.frozensets(st.sampled_from(sorted(targets[p])), min_size=1)))
        return list(zip(nows, targets, parents))

    return build()


@settings(max_examples=300, deadline=None)
@given(tree=tree_states())
def test_every_write_keeps_each_child_inside_its_parent_and_ends_at_the_targets(tree):
    state = [now for now, _t, _p in tree]
    steps = cpuset_steps(tree)
    for i, value in steps:
        assert value, "a cpuset is never emptied"
        parent = tree[i][2]
        assert parent is None or value <= state[parent], (i, value, state)
        assert all(state[c] <= value for c, (_n, _t, p) in enumerate(tree) if p == i), (i, value, state)
        state[i] = value
    assert state == [t for _n, t, _p in tree]
    assert len(steps) <= 3 * len(tree) and all(tree[i][0] != tree[i][1] for i in {i for i, _ in steps})


# -- real cpusets


@pytest.fixture
def cgroup_job(v1_cpuset, sleeper):
    """A job in a real v1 cpuset on CPUs 0-1, its task in a step below it."""
    base, mkcg = v1_cpuset
    job_dir = mkcg("job_7")
    write(job_dir, "cpuset.cpus", "0-1")
    step = mkcg("job_7/step_0")
    write(step, "cpuset.cpus", "0-1")
    p = sleeper()
    write(step, "cgroup.procs", p.pid)
    return Job("slurm:7", "slurm", frozenset({p.pid}), job_dir), job_dir, step, p, mkcg


@needs_two_cpus
def test_any_set_is_applied_recorded_and_put_back_when_the_wish_is_the_original(tmp_path, cgroup_job):
    job, job_dir, step, p, _ = cgroup_job
    originals = OriginalValues(str(tmp_path))
    owner = CpuSetOwner(originals)
    result = owner.apply({job.id: [1]}, observe(job))  # CPU 1 only: no halving leaves that
    (change,) = result.applied
    assert change.error is None and change.cpus == (1,) and result.cpus == {job.id: (1,)}
    assert [w.split("/")[-2] for w in change.writes] == ["step_0", "job_7"]  # shrinking: the child first
    assert cpus(job_dir) == cpus(step) == {1} and os.sched_getaffinity(p.pid) == {1}
    assert dict(originals.items()) == {f"cpuset:{job_dir}": "0-1", f"cpuset:{step}": "0-1"}
    assert owner.apply({job.id: [1]}, observe(job)).applied == ()  # nothing differs: nothing written
    (change,) = owner.apply({job.id: [0, 1]}, observe(job)).applied  # the original: put back
    assert change.error is None and change.cpus is None
    assert [w.split("/")[-2] for w in change.writes] == ["job_7", "step_0"]  # growing: the parent first
    assert cpus(job_dir) == cpus(step) == {0, 1} and os.sched_getaffinity(p.pid) == {0, 1}
    assert originals.items() == [] and CpuSetOwner(OriginalValues(str(tmp_path))).written.keys() == []
    assert (tmp_path / WRITTEN_FILE).exists()  # what noded was about to write, recorded before it wrote


@needs_two_cpus
def test_cpus_swapped_with_children_grow_to_the_union_then_shrink(tmp_path, cgroup_job):
    job, job_dir, step, p, mkcg = cgroup_job
    narrow = mkcg("job_7/step_1")
    write(narrow, "cpuset.cpus", "0")  # a step of its own on CPU 0
    owner = CpuSetOwner(OriginalValues(str(tmp_path)))
    (change,) = owner.apply({job.id: [0]}, observe(job)).applied
    assert change.error is None and cpus(job_dir) == cpus(step) == cpus(narrow) == {0}
    (change,) = owner.apply({job.id: [1]}, observe(job)).applied  # {0} -> {1}: neither grows nor shrinks
    assert change.error is None, change
    assert cpus(job_dir) == cpus(step) == {1}
    assert cpus(narrow) == {1}  # nothing of its own original left: the job's
    assert change.writes[0] == f"{job_dir}/cpuset.cpus <- 0-1" and change.writes[-1] == f"{job_dir}/cpuset.cpus <- 1"
    assert os.sched_getaffinity(p.pid) == {1}
    owner.apply({}, observe(job))  # no wish: every original back
    assert cpus(job_dir) == cpus(step) == {0, 1} and cpus(narrow) == {0}
    assert owner.originals.items() == []


@needs_two_cpus
def test_a_step_made_while_the_job_is_changed_gets_the_jobs_original_back_after_a_crash(tmp_path, cgroup_job):
    job, job_dir, step, p, mkcg = cgroup_job
    owner = CpuSetOwner(OriginalValues(str(tmp_path)))
    owner.apply({job.id: [1]}, observe(job))
    late = mkcg("job_7/step_1")  # srun copies the job's CPUs now: {1}
    assert cpus(late) == {1}
    owner.apply({job.id: [1]}, observe(job))  # nothing to change; the new step's original recorded
    assert OriginalValues(str(tmp_path)).get(f"cpuset:{late}") == "0-1"
    # SIGKILL here; the next start:
    restored = CpuSetOwner(OriginalValues(str(tmp_path))).restore_all()
    assert len(restored) == 3 and cpus(job_dir) == cpus(step) == cpus(late) == {0, 1}


@needs_two_cpus
def test_a_value_someone_else_changed_is_theirs(tmp_path, cgroup_job):
    job, job_dir, step, p, _ = cgroup_job
    originals = OriginalValues(str(tmp_path))
    owner = CpuSetOwner(originals)
    owner.apply({job.id: [1]}, observe(job))
    write(job_dir, "cpuset.cpus", "0-1")  # the scheduler grows the job back, and moves the step to CPU 0
    write(step, "cpuset.cpus", "0")
    owner.apply({}, observe(job))  # noded's wish gone: but the step's value is not noded's
    assert originals.items() == [] and cpus(job_dir) == {0, 1} and cpus(step) == {0}


@needs_two_cpus
def test_a_value_someone_else_set_while_noded_was_down_is_not_overwritten(tmp_path, cgroup_job):
    job, job_dir, step, p, _ = cgroup_job
    CpuSetOwner(OriginalValues(str(tmp_path))).apply({job.id: [1]}, observe(job))
    # SIGKILL; meanwhile the scheduler moves the whole job to CPU 0 (growing the parent first).
    write(job_dir, "cpuset.cpus", "0-1")
    write(step, "cpuset.cpus", "0")
    write(job_dir, "cpuset.cpus", "0")
    again = OriginalValues(str(tmp_path))
    CpuSetOwner(again).restore_all()
    assert cpus(job_dir) == cpus(step) == {0} and again.items() == []


CRASHING = """
import sys, time
from types import MappingProxyType
from noded.actuators.cpusets import CpuSetOwner
from noded.jobs.model import Job, JobMeta
from noded.samplers.sample import JobSample, Sample
from noded.samplers.cpus import CpuPlacementSampler
from noded.stores.originals import OriginalValues

state, job_id, cgroup, pid, wanted = sys.argv[1:]
job = Job(job_id, "slurm", frozenset({int(pid)}), cgroup if cgroup != "-" else None)
placement = CpuPlacementSampler().sample({job.id: job})[job.id]
js = JobSample(job.id, job.source, job.pids, JobMeta(), "cpu", (), None, 1e9, "own", job.cgroup, None, placement)
sample = Sample(0.0, MappingProxyType({job.id: js}), (), False, None, (), MappingProxyType({}), (), ())
result = CpuSetOwner(OriginalValues(state)).apply({job.id: [int(c) for c in wanted.split(",")]}, sample)
assert not result.failed, result.failed
print("applied", flush=True)
time.sleep(300)
"""


def apply_then_sigkill(state, job: Job, wanted: str) -> None:
    """A process holding a CpuSetOwner applies ``wanted``, then dies by SIGKILL."""
    proc = subprocess.Popen([sys.executable, "-c", CRASHING, str(state), job.id, job.cgroup or "-",
                             str(min(job.pids)), wanted], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        read_until(proc.stdout, "applied", "the owner's apply")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


@needs_two_cpus
def test_after_a_sigkill_the_next_owner_restores_a_cpuset_tree(tmp_path, cgroup_job):
    job, job_dir, step, p, _ = cgroup_job
    apply_then_sigkill(tmp_path / "state", job, "1")
    assert cpus(job_dir) == cpus(step) == {1}
    restored = CpuSetOwner(OriginalValues(str(tmp_path / "state"))).restore_all()
    assert sorted(restored) == [f"cpuset:{job_dir}", f"cpuset:{step}"]
    assert cpus(job_dir) == cpus(step) == {0, 1} and os.sched_getaffinity(p.pid) == {0, 1}
    assert OriginalValues(str(tmp_path / "state")).items() == []


@needs_two_cpus
def test_after_a_sigkill_the_next_owner_restores_an_affinity(tmp_path, sleeper):
    p = sleeper()
    os.sched_setaffinity(p.pid, {0, 1})
    job = Job("pid:1", "registered", frozenset({p.pid}))
    apply_then_sigkill(tmp_path / "state", job, "1")
    assert os.sched_getaffinity(p.pid) == {1}
    restored = CpuSetOwner(OriginalValues(str(tmp_path / "state"))).restore_all()
    assert len(restored) == 2 and os.sched_getaffinity(p.pid) == {0, 1}  # the process, and its job as a whole


@needs_two_cpus
def test_an_affinity_set_and_swapped_and_put_back(tmp_path, sleeper):
    p = sleeper()
    os.sched_setaffinity(p.pid, {0, 1})
    job = Job("pid:1", "registered", frozenset({p.pid}))
    originals = OriginalValues(str(tmp_path))
    owner = CpuSetOwner(originals)
    owner.apply({job.id: [1]}, observe(job))
    assert os.sched_getaffinity(p.pid) == {1}
    (change,) = owner.apply({job.id: [0]}, observe(job)).applied
    assert change.error is None and os.sched_getaffinity(p.pid) == {0}
    assert originals.get(f"affinity_job:{job.id}")["original"] == [0, 1]
    owner.apply({job.id: None}, observe(job))
    assert os.sched_getaffinity(p.pid) == {0, 1} and originals.items() == []


@needs_two_cpus
def test_records_of_an_earlier_version_are_still_restored(tmp_path, cgroup_job):
    # originals.json as core halving wrote it before cpus_written.json existed: a crash at level 1.
    job, job_dir, step, p, _ = cgroup_job
    originals = OriginalValues(str(tmp_path))
    originals.record(f"cpuset:{job_dir}", "0-1")
    originals.record(f"cpuset:{step}", "0-1")
    write(step, "cpuset.cpus", "0")
    write(job_dir, "cpuset.cpus", "0")
    CpuSetOwner(OriginalValues(str(tmp_path))).restore_all()
    assert cpus(job_dir) == cpus(step) == {0, 1} and OriginalValues(str(tmp_path)).items() == []


# -- nothing changes without a record


@pytest.fixture
def read_only_state(tmpfs):
    """A state directory on a tmpfs mounted read-only."""
    return tmpfs(name="state", read_only=True)


@ROOT_ONLY
@needs_two_cpus
def test_an_original_that_cannot_be_recorded_changes_nothing(read_only_state, cgroup_job, sleeper):
    job, job_dir, step, p, _ = cgroup_job
    q = sleeper()
    os.sched_setaffinity(q.pid, {0, 1})
    by_affinity = Job("pid:2", "registered", frozenset({q.pid}))
    owner = CpuSetOwner(OriginalValues(str(read_only_state)))
    result = owner.apply({job.id: [1], by_affinity.id: [1]}, observe(job, by_affinity))
    assert sorted(c.job for c in result.failed) == [by_affinity.id, job.id]
    assert all("Read-only file system" in c.error and c.writes == () for c in result.failed), result.failed
    assert result.cpus == {}
    assert cpus(job_dir) == cpus(step) == {0, 1} and os.sched_getaffinity(q.pid) == {0, 1}
    assert owner.originals.items() == [] and os.listdir(read_only_state) == []


@needs_two_cpus
def test_core_halving_puts_right_a_change_left_half_done(tmp_path, cgroup_job):
    from noded.actuators.cores import CoreHalving
    from noded.actuators.plan import UNSETTLED

    job, job_dir, step, p, _ = cgroup_job
    cores = CoreHalving(OriginalValues(str(tmp_path)))
    (a,) = cores.apply({job.id: 1}, observe(job)).applied
    assert a.error is None and cpus(job_dir) == cpus(step) == {0}
    write(job_dir, "cpuset.cpus", "0-1")  # as if noded died between the two writes of growing back
    assert cores.levels_in_force(observe(job)) == {job.id: UNSETTLED}  # no level: both values are noded's
    (a,) = cores.apply({}, observe(job)).applied
    assert a.error is None and a.writes == (f"{step}/cpuset.cpus <- 0-1",)  # only what differs
    assert cpus(job_dir) == cpus(step) == {0, 1} and cores.originals.items() == []
