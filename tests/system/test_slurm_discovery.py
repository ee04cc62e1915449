"""Slurm's job cgroups as noded's ``slurm`` source finds them: cgroup v2 (a directory
layout: no v2 Slurm runs here) and the v1 root a Debian-built Slurm names ``slurm_<node>``
(the real cpuset hierarchy). The real one-host Slurm is in tests/slurm/."""

import os

from noded.jobs import CgroupSource, JobDiscovery


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_v2_slurmstepd_scope_each_job_with_every_step(tmp_path, sleeper):
    """Slurm on cgroup v2 (cgroup/v2 plugin): slurmstepd's own processes in the scope's
    ``system`` child, each job a ``job_N`` with its steps (extern, batch, numbered ones
    with user/task_N below): a job is all of its steps' processes, slurmstepd is no job."""
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    scope = root / "system.slice/slurmstepd.scope"
    stepd, extern, batch, task0, task1, other = (sleeper() for _ in range(6))
    write(scope / "system/cgroup.procs", f"{stepd.pid}\n")
    write(scope / "job_7/step_extern/user/task_special/cgroup.procs", f"{extern.pid}\n")
    write(scope / "job_7/step_batch/user/task_0/cgroup.procs", f"{batch.pid}\n")
    write(scope / "job_7/step_0/user/task_0/cgroup.procs", f"{task0.pid}\n")
    write(scope / "job_7/step_0/user/task_1/cgroup.procs", f"{task1.pid}\n")
    write(scope / "job_8/step_0/user/task_0/cgroup.procs", f"{other.pid}\n")
    write(scope / "job_9/step_extern/cgroup.procs", "")  # ended: its cgroups not yet removed
    src = CgroupSource.create("slurm", str(root))
    assert src.version == 2 and src.hierarchy == ""
    jobs = JobDiscovery([src]).discover()
    assert set(jobs) == {"slurm:7", "slurm:8"}
    assert jobs["slurm:7"].pids == {extern.pid, batch.pid, task0.pid, task1.pid}
    assert jobs["slurm:8"].pids == {other.pid}
    assert jobs["slurm:7"].cgroup == str(scope / "job_7")
    # A process's own cgroup path (as /proc/PID/cgroup's "0::" line gives it, relative to the
    # mount: here the tree's root lies below /) places it in its job.
    at = "/" + os.path.relpath(root, src.mount)
    assert src.match(f"{at}/system.slice/slurmstepd.scope/job_7/step_0/user/task_1") == \
        "system.slice/slurmstepd.scope/job_7"
    assert src.match(f"{at}/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0") == \
        "system.slice/slurmstepd.scope/job_7"
    assert src.match(f"{at}/system.slice/slurmstepd.scope/system") is None
    assert src.match(f"{at}/system.slice/slurmd.service") is None


def test_v1_root_named_after_the_node(v1_cpuset, sleeper):
    """Slurm built for several slurmd per host (Debian's slurm-wlm is) puts its jobs under
    ``slurm_<NodeName>/uid_U/job_N`` on v1: the default patterns find it as ``slurm/``."""
    base, mkcg = v1_cpuset
    step = mkcg("slurm_node7/uid_1000/job_31/step_batch")
    plain = mkcg("slurm/uid_0/job_32")
    a, b = sleeper(), sleeper()
    write(f"{step}/cgroup.procs", str(a.pid))
    write(f"{plain}/cgroup.procs", str(b.pid))
    src = CgroupSource.create("slurm", base)
    jobs = JobDiscovery([src]).discover()
    assert {j: job.pids for j, job in jobs.items()} == {"slurm:31": {a.pid}, "slurm:32": {b.pid}}
    with open(f"/proc/{a.pid}/cgroup") as f:
        path = next(line for line in f.read().splitlines() if ":cpuset:" in line).split(":", 2)[2]
    assert src.match(path) == "slurm_node7/uid_1000/job_31"


def test_only_slurms_own_job_names_are_jobs(tmp_path):
    """Slurm names a job's cgroup job_<number>: anything else the pattern job_* matches (an
    empty number, a Unicode digit, control characters) is no job, rather than an id made
    of its bytes ("slurm:" alone, or a line break for noded's logs)."""
    root = tmp_path / "cgroup"
    parent = root / "slurm" / "uid_0"
    for name in ("job_", "job_4x", "job_\n7", "job_\u0663", "job_-1", "job_42"):
        (parent / name).mkdir(parents=True)
    os.mkdir(os.path.join(os.fsencode(parent), b"job_\xff"))
    src = CgroupSource.create("slurm", str(root), version=1)
    assert src.scan() == {"slurm:42": str(parent / "job_42")}
    below_mount = os.path.relpath(src.root, src.mount)
    assert src.job_id(src.match(f"/{below_mount}/slurm/uid_0/job_\n7/step_0")) is None
