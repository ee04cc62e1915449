"""The one owner of every job's CPUs, tried as faults and a hostile job owner would
(issue #13 item 5): a SIGKILL before any write of a multi-step change, state files
corrupt or missing, the state dir failing between two records, a job owner racing
noded's writes, pids reused, the kernel refusing a write."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from noded.actuators.cpurecords import WRITTEN_FILE
from noded.actuators.cpusets import CpuSetOwner
from noded.jobs.model import Job
from noded.stores.originals import OriginalValues
from resctrl.cpulist import parse_cpu_list
from support.cpus import observe
from support.forking import ForkedRuns

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")


def cpus(path) -> set[int]:
    return set(parse_cpu_list(open(f"{path}/cpuset.cpus").read()))


def write(path, name, value):
    with open(os.path.join(path, name), "w") as f:
        f.write(str(value))


def records(state) -> tuple[dict, dict]:
    """(originals.json, cpus_written.json) as a fresh start would load them."""
    owner = CpuSetOwner(OriginalValues(str(state)))
    return dict(owner.originals.items()), {k: owner.written.get(k) for k in owner.written.keys()}


# -- SIGKILL before every write of a change

# The owner applies each wish in turn, in a process that at its k-th step (opening a
# cpuset.cpus or a state file's temp for writing, renaming the temp over the state file,
# listing a process's threads to set their affinity) kills itself (SIGKILL), or plays the
# job's owner writing a cpuset there and then goes on. An audit hook counts the steps: what
# the owner runs is unchanged. Each run is a process forked from one that imported noded
# once per module (support.forking): a fresh interpreter for each of a test's 40-odd kill
# points was most of these tests' time.
KILLED_AT = """
import os, sys, json, subprocess
from types import MappingProxyType
from noded.actuators.cpusets import CpuSetOwner
from noded.jobs.model import Job, JobMeta
from noded.samplers.sample import JobSample, Sample
from noded.samplers.cpus import CpuPlacementSampler
from noded.stores.originals import OriginalValues


def run(state, job_id, cgroup, pids, wishes, at, action):
    count = 0

    def hook(event, args):
        nonlocal count
        if event == "open":
            path, _mode, flags = args
            if not isinstance(path, str) or not flags & (os.O_WRONLY | os.O_RDWR):
                return
            if not (path.endswith("/cpuset.cpus") or path.endswith(".tmp")):
                return
        elif event == "os.listdir":
            if not str(args[0]).endswith("/task"):
                return
        elif event != "os.rename":
            return
        count += 1
        if count == int(at) and action == "kill":
            os.kill(os.getpid(), 9)
        elif count == int(at) and action == "remount-ro":
            subprocess.run(["mount", "-o", "remount,ro", state], check=True)
        elif count == int(at):
            where, value = action.split("=")
            try:
                with open(where, "w") as f:
                    f.write(value)
            except OSError:
                pass  # the kernel refused the owner's write (outside its parent's CPUs)

    job = Job(job_id, "slurm", frozenset(int(p) for p in pids.split(",")), cgroup if cgroup != "-" else None)
    owner = CpuSetOwner(OriginalValues(state))
    sys.addaudithook(hook)
    for wish in json.loads(wishes):
        placement = CpuPlacementSampler().sample({job.id: job})[job.id]
        js = JobSample(job.id, job.source, job.pids, JobMeta(), "cpu", (), None, 1e9, "own", job.cgroup, None,
                       placement)
        sample = Sample(0.0, MappingProxyType({job.id: js}), (), False, None, (), MappingProxyType({}), (), ())
        result = owner.apply({job.id: wish} if wish is not None else {}, sample)
        assert action != "kill" and count >= int(at) or not result.failed, result.failed
    return count

"""


_kill_points = ForkedRuns(KILLED_AT, str(REPO))


@pytest.fixture(autouse=True, scope="module")
def _kill_points_closed():
    yield
    _kill_points.close()


def run_killed_at(state, job: Job, wishes: list, k: int, action: str = "kill") -> bool:
    """Run the wishes, killed (or ``action``: "PATH=VALUE", that written) at the k-th step;
    True if it was killed, or the write done (False: it finished before the k-th step)."""
    code, said = _kill_points.run(str(state), job.id, job.cgroup or "-", ",".join(str(p) for p in sorted(job.pids)),
                                  json.dumps(wishes), str(k), action)
    if code == -signal.SIGKILL:
        return True
    assert code == 0, said
    return action != "kill" and said >= k


def every_kill_point(state, job: Job, wishes: list, reset, check):
    """For every k: from the originals (``reset``), run the wishes killed at step k, then a
    fresh owner's restore_all; ``check`` then sees the kernel back and no record left."""
    k = 0
    while True:
        k += 1
        assert k < 200, "the owner never finished"
        reset()
        killed = run_killed_at(state, job, wishes, k)
        CpuSetOwner(OriginalValues(str(state))).restore_all()
        check(k)
        assert records(state) == ({}, {}), (k, records(state))
        if not killed:
            return k


@pytest.fixture
def tree_job(v1_cpuset, sleeper):
    """A job in a real v1 cpuset on CPUs 0-1: a step on 0-1 holding its task, and a step of
    its own on CPU 0 holding another."""
    base, mkcg = v1_cpuset
    job_dir, wide, narrow = mkcg("job_9"), mkcg("job_9/step_0"), mkcg("job_9/step_1")
    p, q = sleeper(), sleeper()

    def reset():
        write(job_dir, "cpuset.cpus", "0-1")
        write(wide, "cpuset.cpus", "0-1")
        write(narrow, "cpuset.cpus", "0")

    reset()
    write(wide, "cgroup.procs", p.pid)
    write(narrow, "cgroup.procs", q.pid)
    return Job("slurm:9", "slurm", frozenset({p.pid, q.pid}), job_dir), job_dir, wide, narrow, reset, mkcg


@pytest.mark.parametrize("wishes", [[[0], [1]], [[1], [0], None], [[0], None]],
                         ids=["shrink-then-swap", "swap-with-children-then-release", "shrink-then-grow"])
def test_a_sigkill_before_any_write_of_a_change_is_put_right_at_the_next_start(tmp_path, tree_job, wishes):
    job, job_dir, wide, narrow, reset, _ = tree_job

    def check(k):
        assert (cpus(job_dir), cpus(wide), cpus(narrow)) == ({0, 1}, {0, 1}, {0}), k

    steps = every_kill_point(tmp_path / "state", job, wishes, reset, check)
    assert steps > 6  # every write, and every record, was a kill point


def test_a_sigkill_before_any_affinity_write_is_put_right_at_the_next_start(tmp_path, sleeper):
    p, q = sleeper(), sleeper()
    job = Job("pid:5", "registered", frozenset({p.pid, q.pid}))

    def reset():
        os.sched_setaffinity(p.pid, {0, 1})
        os.sched_setaffinity(q.pid, {0})  # a process of the job on a CPU of its own

    def check(k):
        assert (os.sched_getaffinity(p.pid), os.sched_getaffinity(q.pid)) == ({0, 1}, {0}), k

    every_kill_point(tmp_path / "state", job, [[1], [0], None], reset, check)


# -- a job owner's own change inside the job (a delegated subtree)


@pytest.mark.parametrize("crash", [False, True], ids=["released", "sigkill-then-restart"])
def test_a_child_changed_by_its_owner_does_not_let_the_job_keep_what_noded_lent_it(tmp_path, v1_cpuset, sleeper,
                                                                                    crash):
    """Found: any value noded did not write, even in a step cgroup its owner may write (a
    delegated subtree), made noded forget the whole job: it kept the lent CPU for good, and
    noded took it for the job's own from then on."""
    base, mkcg = v1_cpuset
    job_dir, step = mkcg("job_3"), mkcg("job_3/step_0")
    write(step, "cpuset.cpus", "0")
    write(job_dir, "cpuset.cpus", "0")
    p = sleeper()
    write(step, "cgroup.procs", p.pid)
    job = Job("slurm:3", "slurm", frozenset({p.pid}), job_dir)
    owner = CpuSetOwner(OriginalValues(str(tmp_path)))
    (change,) = owner.apply({job.id: [0, 1]}, observe(job)).applied  # CPU 1 lent to the job
    assert change.error is None and cpus(job_dir) == cpus(step) == {0, 1}
    write(step, "cpuset.cpus", "1")  # the owner moves its step onto the lent CPU
    owner.apply({job.id: [0, 1]}, observe(job))  # the next tick: the step's value is its owner's
    assert cpus(step) == {1} and owner.original_cpus(observe(job).jobs[job.id]) == [0]
    if crash:
        CpuSetOwner(OriginalValues(str(tmp_path))).restore_all()  # SIGKILL, then the next start
    else:
        owner.apply({}, observe(job))  # the loan ends
    assert cpus(job_dir) == {0} and cpus(step) == {0}, (cpus(job_dir), cpus(step))
    assert records(tmp_path) == ({}, {})


def test_a_child_changed_by_its_owner_while_noded_was_down_is_fitted_into_the_jobs_cpus(tmp_path, v1_cpuset,
                                                                                         sleeper):
    base, mkcg = v1_cpuset
    job_dir, step = mkcg("job_3"), mkcg("job_3/step_0")
    write(step, "cpuset.cpus", "0")
    write(job_dir, "cpuset.cpus", "0")
    job = Job("slurm:3", "slurm", frozenset(), job_dir)
    CpuSetOwner(OriginalValues(str(tmp_path))).apply({job.id: [0, 1]}, observe(job))
    write(step, "cpuset.cpus", "1")  # SIGKILL; the owner moves its step onto the lent CPU
    CpuSetOwner(OriginalValues(str(tmp_path))).restore_all()
    assert cpus(job_dir) == {0} and cpus(step) == {0} and records(tmp_path) == ({}, {})


@pytest.mark.parametrize("child", ["step_0", "step_1"])
def test_an_owner_racing_a_swap_at_any_step_keeps_neither_the_union_nor_the_old_cpus(tmp_path, tree_job, child):
    """The owner writes CPU 0 into a step of its job at each step of noded's swap to CPU 1:
    the next tick still leaves the job only CPU 1 (its own value clipped to it), and the
    release, or the next start after a crash, the job's own CPUs."""
    job, job_dir, wide, narrow, reset, _ = tree_job
    state = tmp_path / "state"
    k = 0
    while True:
        k += 1
        reset()
        raced = run_killed_at(state, job, [[0], [1]], k, f"{job_dir}/{child}/cpuset.cpus=0")
        owner = CpuSetOwner(OriginalValues(str(state)))
        owner.apply({job.id: [1]}, observe(job))  # the next tick
        assert cpus(job_dir) == cpus(wide) == cpus(narrow) == {1}, k
        if k % 2:
            owner.apply({}, observe(job))  # the wish goes
        else:
            CpuSetOwner(OriginalValues(str(state))).restore_all()  # SIGKILL, then the next start
        assert cpus(job_dir) == cpus(wide) == {0, 1} and cpus(narrow) == {0}, k
        assert records(state) == ({}, {}), (k, records(state))
        if not raced:
            break


@pytest.mark.parametrize("crash", [False, True], ids=["released", "sigkill-then-restart"])
def test_an_owner_racing_a_loan_at_any_step_gives_the_lent_cpu_back(tmp_path, v1_cpuset, sleeper, crash):
    """CPU 1 lent to a job on CPU 0; at each step of noded's writes its owner moves its step
    onto CPU 1: when the loan ends (or at the next start after a crash) the job is on CPU 0."""
    base, mkcg = v1_cpuset
    job_dir, step = mkcg("job_4"), mkcg("job_4/step_0")
    p = sleeper()
    write(step, "cgroup.procs", p.pid)
    job = Job("slurm:4", "slurm", frozenset({p.pid}), job_dir)
    state = tmp_path / "state"
    k = 0
    while True:
        k += 1
        write(step, "cpuset.cpus", "0")
        write(job_dir, "cpuset.cpus", "0")
        raced = run_killed_at(state, job, [[0, 1]], k, f"{step}/cpuset.cpus=1")
        owner = CpuSetOwner(OriginalValues(str(state)))
        owner.apply({job.id: [0, 1]}, observe(job))  # the next tick
        assert cpus(job_dir) == {0, 1}, k
        if crash:
            CpuSetOwner(OriginalValues(str(state))).restore_all()
        else:
            owner.apply({}, observe(job))
        assert cpus(job_dir) == cpus(step) == {0}, k
        assert records(state) == ({}, {}), (k, records(state))
        if not raced:
            break


# -- the state files: corrupt, missing, a link, huge


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "missing", "link", "huge"])
def test_cpus_written_damaged_after_a_crash_is_said_and_nothing_is_changed_blindly(tmp_path, tree_job, damage,
                                                                                     secret):
    """Without what noded wrote, a value no halving leaves cannot be told from someone
    else's: it is left as it is (in doubt, change nothing), the damage said at start, a link
    never followed. (Left for a decision: the job stays on CPU 1; see the report.)"""
    job, job_dir, wide, narrow, reset, _ = tree_job
    state = tmp_path / "state"
    run_killed_at(state, job, [[1]], 10**6)  # CPU 1 only (no halving leaves that); then SIGKILL
    assert cpus(job_dir) == {1}
    path = state / WRITTEN_FILE
    if damage == "corrupt":
        path.write_text('{"cpuset:/x": "not a list"}')
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:20])
    elif damage == "missing":
        path.unlink()
    elif damage == "link":
        path.unlink()
        path.symlink_to(secret)
    else:
        path.write_bytes(b"[" * (20 * 1024 * 1024))
    owner = CpuSetOwner(OriginalValues(str(state)))
    assert (owner.notes == []) == (damage == "missing") and all("is corrupt" in n for n in owner.notes)
    owner.restore_all()
    assert (cpus(job_dir), cpus(wide), cpus(narrow)) == ({1}, {1}, {1})
    assert records(state) == ({}, {}) and secret.read_text() == "root's own data\n"


def test_originals_lost_but_cpus_written_left_changes_nothing_and_is_pruned(tmp_path, tree_job):
    """A crash between the two records (cpus_written.json first, then originals.json):
    nothing was written to the kernel, and what noded was about to write is forgotten."""
    job, job_dir, wide, narrow, reset, _ = tree_job
    state = tmp_path / "state"
    assert run_killed_at(state, job, [[1]], 3)  # killed creating originals.json's temp
    assert (cpus(job_dir), cpus(wide), cpus(narrow)) == ({0, 1}, {0, 1}, {0})
    assert records(state)[0] == {} and records(state)[1]
    CpuSetOwner(OriginalValues(str(state))).restore_all()
    assert records(state) == ({}, {}) and (cpus(job_dir), cpus(wide), cpus(narrow)) == ({0, 1}, {0, 1}, {0})


# -- the kernel refusing a write


def test_a_write_the_kernel_refuses_is_reported_with_its_error_and_file(tmp_path, cgroup_job_2, caplog):
    """A step made on CPU 0 between noded's reading and its writes: shrinking the job to
    CPU 1 is refused (EBUSY, a child outside it); the journal line says which write and why."""
    job, job_dir, step, mkcg = cgroup_job_2
    owner = CpuSetOwner(OriginalValues(str(tmp_path)))
    sample = observe(job)
    late = mkcg("job_8/step_1")
    write(late, "cpuset.cpus", "0")
    result = owner.apply({job.id: [1]}, sample)
    (failed,) = result.failed
    assert "Device or resource busy" in failed.error and f"{job_dir}/cpuset.cpus" in failed.error, failed
    assert failed.writes == (f"{step}/cpuset.cpus <- 1",)  # those made, not the refused one
    line = next(r.getMessage() for r in caplog.records if "apply-failed" in r.getMessage())
    assert "Device or resource busy" in line and f"{job_dir}/cpuset.cpus" in line, line
    owner.apply({job.id: [1]}, observe(job))  # the next tick: the new step recorded and fitted
    assert cpus(job_dir) == cpus(step) == cpus(late) == {1}
    owner.apply({}, observe(job))
    assert (cpus(job_dir), cpus(step), cpus(late)) == ({0, 1}, {0, 1}, {0}) and records(tmp_path) == ({}, {})


@pytest.fixture
def cgroup_job_2(v1_cpuset, sleeper):
    base, mkcg = v1_cpuset
    job_dir, step = mkcg("job_8"), mkcg("job_8/step_0")
    p = sleeper()
    write(step, "cgroup.procs", p.pid)
    return Job("slurm:8", "slurm", frozenset({p.pid}), job_dir), job_dir, step, mkcg


@pytest.fixture
def tmpfs_state(tmpfs):
    return tmpfs("1m", name="state")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: remounts a tmpfs")
def test_the_state_dir_turning_read_only_at_any_step_leaves_nothing_unrecorded_and_the_next_tick_recovers(
        tmpfs_state, tree_job):
    job, job_dir, wide, narrow, reset, _ = tree_job
    k = 0
    while True:
        k += 1
        reset()
        hit = run_killed_at(tmpfs_state, job, [[0], [1]], k, "remount-ro")
        subprocess.run(["mount", "-o", "remount,rw", str(tmpfs_state)], check=True)
        if k % 2:  # the next tick, the directory writable again
            owner = CpuSetOwner(OriginalValues(str(tmpfs_state)))
            assert not owner.apply({job.id: [1]}, observe(job)).failed
            assert cpus(job_dir) == cpus(wide) == cpus(narrow) == {1}, k
            owner.apply({}, observe(job))
        else:  # or a SIGKILL, and the next start
            CpuSetOwner(OriginalValues(str(tmpfs_state))).restore_all()
        assert (cpus(job_dir), cpus(wide), cpus(narrow)) == ({0, 1}, {0, 1}, {0}), k
        assert records(tmpfs_state) == ({}, {}), (k, records(tmpfs_state))
        if not hit:
            break


def test_a_reused_pid_never_gets_a_restore_meant_for_the_process_recorded(tmp_path, sleeper):
    p = sleeper()
    os.sched_setaffinity(p.pid, {1})  # another user's process, now holding the pid noded recorded
    originals = OriginalValues(str(tmp_path))
    key = f"affinity:{p.pid}:1"  # the recorded process started at tick 1: not this one
    owner = CpuSetOwner(originals)
    owner.written.update({key: [frozenset({1})]})
    originals.record(key, [0, 1])
    CpuSetOwner(OriginalValues(str(tmp_path))).restore_all()
    assert os.sched_getaffinity(p.pid) == {1} and records(tmp_path) == ({}, {})
