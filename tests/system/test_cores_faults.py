"""Core halving never leaves a job crippled (issue #11, found by trying it as a hostile
tester would): what appears in a halved job gets the job's CPUs back, a crash in any
gap is put right at the next start, and a value someone else set is never overwritten."""

import os

import pytest

from support.waiting import wait_for
from noded.actuators.cores import CoreHalving
from noded.jobs.model import Job
from noded.stores.originals import OriginalValues
from resctrl.cpulist import parse_cpu_list
from support.cpus import ForkOnRequest, observe

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to halve")


def cpus(path):
    return set(parse_cpu_list(open(f"{path}/cpuset.cpus").read()))


def write(path, name, value):
    with open(os.path.join(path, name), "w") as f:
        f.write(str(value))


@pytest.fixture
def halved_job(tmp_path, v1_cpuset, sleeper):
    """A Slurm-like job in a real v1 cpuset, halved by noded."""
    base, mkcg = v1_cpuset
    job_dir = mkcg("job_1")
    p = sleeper()
    write(job_dir, "cgroup.procs", p.pid)
    original = cpus(job_dir)
    job = Job("slurm:1", "slurm", frozenset({p.pid}), job_dir)
    cores = CoreHalving(OriginalValues(str(tmp_path / "state")))
    (a,) = cores.apply({job.id: 1}, observe(job)).applied
    assert a.error is None and len(cpus(job_dir)) == len(original) // 2

    def new_step():
        """What srun does for a new step: a child cgroup with the parent's CPUs (halved now), the task in it."""
        step = mkcg("job_1/step_0")
        write(step, "cgroup.procs", p.pid)
        return step

    return job, job_dir, original, cores, p, new_step


def test_a_step_made_while_the_job_is_halved_gets_the_jobs_cpus_back_on_release(halved_job):
    job, job_dir, original, cores, p, new_step = halved_job
    step = new_step()
    cores.apply({job.id: 1}, observe(job))  # the next tick: nothing to change, the step's original recorded
    cores.apply({}, observe(job))  # released
    assert cpus(job_dir) == original and cpus(step) == original
    assert os.sched_getaffinity(p.pid) == original


def test_a_step_made_while_halved_is_put_back_after_a_crash(halved_job, tmp_path):
    job, job_dir, original, cores, p, new_step = halved_job
    step = new_step()
    cores.apply({job.id: 1}, observe(job))
    # SIGKILL: nothing of this noded runs again. The next start:
    CoreHalving(OriginalValues(str(tmp_path / "state"))).restore_all()
    assert cpus(job_dir) == original and cpus(step) == original


def test_a_cpuset_the_scheduler_changed_while_noded_was_down_is_not_overwritten(halved_job, tmp_path):
    job, job_dir, original, cores, p, _ = halved_job
    # SIGKILL; meanwhile the scheduler resizes the job to its last CPU.
    write(job_dir, "cpuset.cpus", max(original))
    again = OriginalValues(str(tmp_path / "state"))
    CoreHalving(again).restore_all()
    assert cpus(job_dir) == {max(original)} and again.items() == []  # theirs: record forgotten, value kept


def test_a_record_never_creates_a_file_nor_follows_a_link(tmp_path, secret):
    # Records are root's own file, but a record naming any directory must not write there.
    plain = tmp_path / "not-a-cgroup"
    plain.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(secret, linked / "cpuset.cpus")
    originals = OriginalValues(str(tmp_path / "state"))
    originals.record(f"cpuset:{plain}", "0")
    originals.record(f"cpuset:{linked}", "0")
    CoreHalving(originals).restore_all()
    assert not (plain / "cpuset.cpus").exists() and secret.read_text() == "root's own data\n"


def test_a_process_forked_while_noded_was_down_gets_the_jobs_cpus_back(tmp_path):
    tree = ForkOnRequest()  # a job halved by affinity (no cpuset of its own)
    try:
        before = os.sched_getaffinity(tree.pid)
        cores = CoreHalving(OriginalValues(str(tmp_path / "state")))
        job = Job("pid:1", "registered", frozenset({tree.pid}))
        cores.apply({job.id: 1}, observe(job))
        assert len(os.sched_getaffinity(tree.pid)) == len(before) // 2
        # SIGKILL of noded; then the job forks (no noded sees it); then noded starts again.
        child = tree.fork()
        wait_for(lambda: len(os.sched_getaffinity(child)) == len(before) // 2, what="the child, halved")
        CoreHalving(OriginalValues(str(tmp_path / "state"))).restore_all()
        assert os.sched_getaffinity(tree.pid) == before and os.sched_getaffinity(child) == before
    finally:
        tree.close()
