"""noded under a real one-host Slurm (Debian's slurm-wlm): jobs submitted with sbatch are
found in Slurm's cgroups, labelled from their --comment by the shipped Prolog, throttled
(core halving: the emulator here has no MBA) when a CPU job starves a GPU job, admitted or
refused onto a shared GPU, and forgotten by the Epilog.

One Slurm, simulated node and noded for the module (starting them takes seconds); each
test cancels its jobs and waits for the Epilog before it ends."""

import os
import subprocess

import pytest

import slurm_cluster
from slurm_cluster import CPUSET
from slurm_node import SlurmNode, job_output, parse_exports, wait_for

from support.host import noded_lock_holder

pytestmark = [pytest.mark.slurm, pytest.mark.fuse,
              pytest.mark.skipif(slurm_cluster.missing() is not None,
                                 reason=f"no one-host Slurm here: {slurm_cluster.missing()}")]

SLEEPER = "#!/bin/sh\nexec sleep 600\n"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    held = noded_lock_holder(CPUSET)  # noded here watches Slurm's whole hierarchy: no other noded on it
    if held is not None:
        pytest.skip(f"needs the host-wide noded lock: {held}")
    with SlurmNode(str(tmp_path_factory.mktemp("slurm-node"))) as n:
        yield n
        cluster = n.slurm
    assert cluster.cgroup_roots() == [], "Slurm's cgroups left behind"


def ended(node, *job_ids, timeout=60):
    """Cancels the jobs and waits until Slurm has run their Epilog and removed their cgroups."""
    node.slurm.scancel(*job_ids)
    for j in job_ids:
        wait_for(lambda: node.slurm.state(j) in ("CANCELLED", "COMPLETED", ""), timeout, what=f"job {j} ended")
        wait_for(lambda: not node.slurm.job_cgroups(j), timeout, what=f"job {j}'s cgroups gone")
        wait_for(lambda: f"slurm:{j}" not in node.ask("status")["registered_labels"], timeout, what=f"job {j}'s Epilog")


def left_in(directory: str) -> list[str]:
    """What a hook left in ``directory`` (which a hook makes only when it first writes)."""
    return os.listdir(directory) if os.path.isdir(directory) else []


def test_hog_found_in_slurms_cgroup_is_throttled_while_the_labelled_gpu_job_slows(node):
    gpu = node.slurm.sbatch("-c", "1", "--comment", "noded: model=BiDAF batch_size=32 category=NLP",
                            "-o", "/dev/null", script=SLEEPER)
    node.adopt("gpu", gpu, model="BiDAF", gpu=0)
    job = f"slurm:{gpu}"
    # Found in Slurm's cgroup, on the GPU, with the labels of its comment (the Prolog's).
    wait_for(lambda: (node.noded_job(job) or {}).get("kind") == "gpu", 30, what=f"{job} a GPU job to noded")
    explained = wait_for(lambda: (e := node.ask("explain", job=job))["baseline"] is not None and e,
                         30, what=f"{job}'s uncontended baseline")
    assert explained["labels"] == {"model": "BiDAF", "batch_size": 32, "category": "NLP"}

    hog = node.slurm.sbatch("-c", "2", "-o", "/dev/null", script=SLEEPER)
    node.adopt("hog", hog, cpu_gbps=16.0)
    assert node.job_cpuset(hog) == "0-1"
    held = wait_for(lambda: (j := node.noded_job(f"slurm:{hog}")) and j["level"] >= 1 and j,
                    60, what=f"slurm:{hog} throttled")
    assert held["kind"] == "cpu"
    # The throttle is real: Slurm's own cgroup for the job holds one CPU of its two.
    wait_for(lambda: node.job_cpuset(hog) in ("0", "1"), 10, what=f"job {hog}'s cpuset halved")
    originals = os.path.join(node.dir, "state", "originals.json")
    assert f"/job_{hog}" in open(originals).read()  # recorded, to be put back
    # for the GPU job: it slowed below its baseline
    why = node.ask("explain", job=f"slurm:{hog}")
    assert any(d["action"] == "throttle" and d["cause"] == "contention" and f"GPU job {job} at" in d["reason"]
               for d in why["decisions"]), why["decisions"]
    node.release("hog")
    node.release("gpu")
    ended(node, hog, gpu)
    wait_for(lambda: not {f"slurm:{hog}", job} & {j["job"] for j in node.ask("jobs")}, 10, what="both gone from noded")
    # noded forgets the cpuset it recorded once Slurm has removed the job's cgroup
    wait_for(lambda: f"/job_{hog}" not in open(originals).read(), 10, what=f"job {hog}'s recorded cpusets dropped")


def test_the_epilog_leaves_nothing_behind(node):
    """After a labelled job admitted onto the shared GPU: no labels, no reservation, no
    environment file, no cgroup, no monitoring group in resctrl."""
    out = os.path.join(node.dir, "admitted.out")
    j = node.slurm.sbatch("-c", "1", "--comment", "noded: model=BiDAF batch_size=32 share=mps", "-o", out,
                          script="#!/bin/sh\nenv | grep ^CUDA_\nexec sleep 600\n")
    wait_for(lambda: "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in job_output(out), 30, what=f"job {j}'s MPS environment")
    env = parse_exports(job_output(out))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100" and env["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].startswith("0=") and env["CUDA_MPS_PIPE_DIRECTORY"]
    assert os.path.exists(os.path.join(node.env_dir, f"job_{j}.env"))
    assert f"slurm:{j}" in node.ask("status")["registered_labels"]
    mon_groups = os.path.join(node.sim.emu.root, "mon_groups")
    mine = lambda: [g for g in os.listdir(mon_groups) if f"job-slurm_{j}-" in g]  # noqa: E731 (group_name's)
    wait_for(mine, 10, what=f"slurm:{j}'s monitoring group")
    # held: a second admission of the same job is refused (its reservation stands)
    assert not node.ask("admit", job=f"slurm:{j}", model="BiDAF", batch_size=32)["admit"]
    ended(node, j)
    assert left_in(node.env_dir) == left_in(node.record_dir) == []
    r = node.ask("admit", job=f"slurm:{j}", model="BiDAF", batch_size=32)  # the reservation went with the Epilog
    assert r["admit"], r
    node.ask("forget", job=f"slurm:{j}")
    wait_for(lambda: node.noded_job(f"slurm:{j}") is None, 10, what=f"slurm:{j} gone from noded")
    assert mine() == []


def test_a_comment_changed_after_the_prolog_steers_no_cleaning(node):
    """The submitter changes the running job's comment (`scontrol update JobId=N Comment=`)
    to one without "noded:": the Epilog, which cleans what the Prolog recorded and never
    reads the comment, still leaves no label, reservation, environment file or record."""
    out = os.path.join(node.dir, "changed.out")
    j = node.slurm.sbatch("-c", "1", "--comment", "noded: model=BiDAF batch_size=32 share=mps", "-o", out,
                          script="#!/bin/sh\nenv | grep ^CUDA_\nexec sleep 600\n")
    wait_for(lambda: "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in job_output(out), 30, what=f"job {j}'s MPS environment")
    assert f"slurm:{j}" in node.ask("status")["registered_labels"]
    node.scontrol_update(j, Comment="nothing for noded here")
    assert node.slurm.job(j)["Comment"].strip() == "nothing for noded here"
    ended(node, j)
    assert left_in(node.env_dir) == left_in(node.record_dir) == []
    r = node.ask("admit", job=f"slurm:{j}", model="BiDAF", batch_size=32)  # its reservation went with the Epilog
    assert r["admit"], r
    node.ask("forget", job=f"slurm:{j}")


@pytest.mark.parametrize("on_refusal", ["hold", "requeue"])
def test_a_refused_job_is_held_or_requeued_as_the_site_chose(node, on_refusal):
    node.write_hooks_conf(on_refusal)
    out = os.path.join(node.dir, f"refused-{on_refusal}.out")
    try:
        # no profile for BiDAF at batch size 7: noded refuses to predict, so to admit
        j = node.slurm.sbatch("-c", "1", "--comment", "noded: model=BiDAF batch_size=7 share=mps", "-o", out,
                              script="#!/bin/sh\necho ran\n")
        info = wait_for(lambda: (i := node.slurm.job(j)).get("Restarts", "0") != "0" and i["JobState"] == "PENDING"
                        and i, 30, what=f"job {j} put back in the queue")
        # held: priority 0 until `scontrol release` (Reason job_requeued_in_held_state, then JobHeldAdmin)
        assert (info["Priority"] == "0") == (on_refusal == "hold"), info
        assert "noded: refused: no profile for BiDAF at batch size 7" in node.slurm.job(j).get("AdminComment", "")
        assert "ran" not in job_output(out)  # it never started
        assert wait_for(lambda: not node.slurm.job_cgroups(j), 10, what=f"job {j} without cgroups")
        # nothing of it is left on this node while it waits in the queue: no labels, no record
        wait_for(lambda: f"slurm:{j}" not in node.ask("status")["registered_labels"], 10, what=f"job {j}'s labels gone")
        assert left_in(node.record_dir) == left_in(node.env_dir) == []
        node.slurm.scancel(j)
    finally:
        node.write_hooks_conf("hold")


def test_noded_down_the_job_still_runs(node, tmp_path):
    """Fail safe: the hooks cannot reach noded (another socket): the job runs, unlabelled,
    and the node is not drained."""
    conf = open(node.hooks_conf).read()
    with open(node.hooks_conf, "w") as f:
        f.write(conf.replace(node.socket, str(tmp_path / "nobody.sock")))
    try:
        out = os.path.join(node.dir, "unreachable.out")
        j = node.slurm.sbatch("-c", "1", "--comment", "noded: model=BiDAF batch_size=32 share=mps", "-o", out,
                              script="#!/bin/sh\necho ran; env | grep ^CUDA_MPS || true\n")
        wait_for(lambda: node.slurm.state(j) == "COMPLETED", 30, what=f"job {j} completed")
        assert job_output(out).strip() == "ran"
        assert node.slurm.node_state() == "idle"
    finally:
        with open(node.hooks_conf, "w") as f:
            f.write(conf)


def test_a_hooks_conf_that_is_not_shell_drains_no_node(node):
    """A careless edit of slurm-hooks.conf (an unclosed quote): each hook says so and runs
    with its defaults; the job runs, and the node is not drained (a hook that sourced the
    file ended with sh's status 2, and slurmd drained the node at the first job)."""
    conf = open(node.hooks_conf).read()
    with open(node.hooks_conf, "w") as f:
        f.write(conf + 'NODED_SOCKET="/run/noded/noded.sock\n')
    try:
        out = os.path.join(node.dir, "careless.out")
        j = node.slurm.sbatch("-c", "1", "--comment", "noded: model=BiDAF", "-o", out,
                              script="#!/bin/sh\necho ran\n")
        wait_for(lambda: node.slurm.state(j) not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"), 30,
                 what=f"job {j} ended")
        assert node.slurm.state(j) == "COMPLETED" and job_output(out).strip() == "ran"
        assert node.slurm.node_state() == "idle"
    finally:
        with open(node.hooks_conf, "w") as f:
            f.write(conf)
        if node.slurm.node_state() != "idle":  # drained: the next test needs the node
            subprocess.run(["scontrol", "update", f"NodeName={node.slurm.host}", "State=RESUME"],
                           env=node.slurm.env, capture_output=True, timeout=30)
