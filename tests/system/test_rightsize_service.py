"""The daemon's right-sizing service (issue #13): sizings begun, fed and ended per tick from
Samples, the plan made from them, operator controls, the history remembered. The node here
is a table: each job's CPUs are what the test says the kernel shows (nothing is written),
and a GPU job's utilisation follows a curve of its cores."""

from __future__ import annotations

import os
import subprocess
from types import MappingProxyType

import pytest

from noded.config import RightsizeConfig
from noded.jobs.model import JobMeta
from noded.rightsize import allocator as alloc
from noded.rightsize import cpuplan
from noded.rightsize.history import SizingHistory
from noded.rightsize.service import (LIMITED, PINNED, PROBING, SIZED, STOPPED, NotSized, RightSizing, job_owner)
from noded.rightsize.signal import GPU_UTILISATION, ITERATION_TIME
from noded.samplers.sample import CPU, GPU, JobSample, Sample
from noded.samplers.cpus import CpuPlacement
from noded.samplers.nvml import GpuSample
from noded.stores.securedir import SecureDir

CONFIG = RightsizeConfig(sources=("registered",), lend_to=("registered",), warmup_s=0.0, max_window_s=60.0)
ME = os.getpid()
#: a curve with its best at 6 cores: utilisation rises 10 % a core to 6, then falls 1 % a core
CURVE = {c: (10.0 * c if c <= 6 else 60.0 - (c - 6)) for c in range(1, 17)}


class Node:
    """The kernel's state as a test keeps it: each job's CPUs, GPU jobs' utilisation by curve."""

    def __init__(self, cpus=16, gpus=4):
        self.cpus = cpus
        self.gpus = tuple(GpuSample(i, f"GPU-{i}", "H100", None, None, None, None, None) for i in range(gpus))
        self.jobs: dict[str, dict] = {}
        self.t = 0.0

    def start(self, job, kind=GPU, source="registered", cpus=None, meta=None, curve=CURVE, gpus=1):
        self.jobs[job] = {"kind": kind, "source": source, "cpus": frozenset(cpus if cpus is not None else
                                                                            range(self.cpus)),
                          "meta": meta or JobMeta(model="BiDAF", batch_size=32, category="NLP"), "curve": curve,
                          "gpus": tuple(f"GPU-{i}" for i in range(gpus)) if kind == GPU else ()}

    def sample(self, quiet=None) -> Sample:
        jobs = {}
        for job, j in self.jobs.items():
            util = j["curve"][len(j["cpus"])] if j["kind"] == GPU else None
            jobs[job] = JobSample(job, j["source"], frozenset({ME}), j["meta"], j["kind"], j["gpus"], util, None,
                                  "none", None, None, CpuPlacement(affinities=((ME, "1", j["cpus"]),)))
        return Sample(self.t, MappingProxyType(jobs), self.gpus, True, None, (), MappingProxyType({}), (), ())


class Loop:
    """The daemon's part, in small: tick the service, plan, and 'write' the plan's CPUs."""

    def __init__(self, node: Node, service: RightSizing, levels=None):
        self.node, self.rs = node, service
        self.originals = {j: frozenset(v["cpus"]) for j, v in node.jobs.items()}
        self.levels = levels or {}
        self.plan = None
        self.follow = True  # False: the kernel keeps what it had (a write that never lands)

    def tick(self):
        node = self.node
        for j, v in node.jobs.items():
            self.originals.setdefault(j, frozenset(v["cpus"]))
        sample = node.sample()
        have = {j: len(v["cpus"]) for j, v in node.jobs.items()}
        out = self.rs.tick(sample, have, self.originals, node.t, node.cpus, 4)
        self.plan = self.rs.plan(sample, self.originals, self.levels, CONFIG.lend_to, node.t)
        if self.follow and self.plan is not None:
            for job, jc in self.plan.jobs.items():
                node.jobs[job]["cpus"] = frozenset(jc.cpus)
        node.t += 1.0
        return out

    def until(self, predicate, limit=400):
        for _ in range(limit):
            out = self.tick()
            if predicate(out):
                return out
        raise AssertionError(f"not reached in {limit} ticks: {self.rs.view().jobs}")


@pytest.fixture
def history(tmp_path):
    return SizingHistory(SecureDir(str(tmp_path / "state")))


def sized(job):
    return lambda out: isinstance(out.get(job), alloc.Sized)


def one_gpu_job(history):
    """A node with one GPU job "g" on 16 CPUs, right-sized by CONFIG: (node, service, loop)."""
    node = Node()
    node.start("g", cpus=range(16))
    rs = RightSizing(CONFIG, history, clock=lambda: node.t)
    return node, rs, Loop(node, rs)


def test_a_gpu_job_is_probed_through_the_plan_and_sized_at_its_curves_best_then_remembered(history):
    node, rs, loop = one_gpu_job(history)
    out = loop.until(sized("g"))
    answer = out["g"]
    assert answer.cores == 6 and answer.reason == alloc.SEARCHED
    assert node.jobs["g"]["cpus"] == frozenset(range(10, 16))  # the top of the GPU array
    v = rs.view(plan=loop.plan).jobs["g"]
    assert (v.state, v.optimal, v.signal, v.owner, v.remembered) == (SIZED, 6, GPU_UTILISATION, str(os.getuid()),
                                                                     True)
    assert {c for c, _ in v.points} >= {5, 6, 7}
    remembered = history.view().exact(str(os.getuid()), "BiDAF", 32)
    assert remembered is not None and remembered.cores == 6
    # a second job of the same owner, model and batch size starts its bisection at the answer,
    # and the answer is measured against the top before it holds
    del node.jobs["g"]
    node.start("g2", cpus=range(16))
    loop.tick()
    assert rs.view().jobs["g2"].start_source == alloc.FROM_HISTORY
    out = loop.until(sized("g2"))
    assert out["g2"].cores == 6 and out["g2"].reason == alloc.SEARCHED
    # BiDAF falls past its optimum: the top is slower than the answer by the margin, so the
    # core below it is measured too (it is the peak)
    assert {c for c, _ in out["g2"].curve_points} == {16, 6, 5} and out["g2"].steps == 3


def test_a_probe_is_measured_only_while_the_job_holds_its_cores(history):
    node, rs, loop = one_gpu_job(history)
    loop.follow = False  # the plan's CPUs never reach the kernel
    for _ in range(200):
        loop.tick()
    v = rs.view().jobs["g"]
    # the top is its whole cpuset, which it holds: measured; the next probe never is
    assert v.state == PROBING and v.points == ((16, 50.0),) and v.window_samples == 0 and v.target < 16
    loop.follow = True
    loop.until(sized("g"))


def test_iteration_reports_replace_utilisation_before_anything_is_measured(history):
    node, rs, loop = one_gpu_job(history)
    loop.tick()
    assert rs.report("g", 0.5)["sized"] and not rs.report("other", 0.5)["sized"]
    loop.tick()
    assert rs.view().jobs["g"].signal == ITERATION_TIME
    with pytest.raises(ValueError, match="iteration time must be > 0"):
        rs.report("g", -1.0)
    with pytest.raises(ValueError):
        rs.report("g", float("nan"))

    def feed_reports(out):
        cores = len(node.jobs["g"]["cpus"])
        for _ in range(3):
            rs.report("g", 1.0 / CURVE[cores])
        return isinstance(out.get("g"), alloc.Sized)

    out = loop.until(feed_reports)
    assert out["g"].cores == 6


def test_operator_pin_stop_and_reprobe(history):
    node, rs, loop = one_gpu_job(history)
    loop.tick()
    got = rs.pin("g", 3, 0, "hold it at 3")
    assert got["state"] == PINNED and got["cores"] == 3
    loop.tick()
    loop.tick()
    assert len(node.jobs["g"]["cpus"]) == 3
    v = rs.view().jobs["g"]
    assert v.state == PINNED and v.control.kind == "pin" and v.control.reason == "hold it at 3" and not v.remembered
    with pytest.raises(ValueError, match="outside 1..16"):
        rs.pin("g", 17, 0, "")
    got = rs.reprobe("g", 0, "again")
    assert got["state"] == PROBING and got["cores"] == 16  # from the top again
    loop.tick()
    got = rs.stop("g", 0, "enough")
    assert got["state"] == STOPPED and rs.view().jobs["g"].state == STOPPED
    rs.pin("g", 2, 0, "hold it at 2")
    got = rs.stop("g", 1, "stop it")  # a pin is not a probe: nothing to stop, and the pin's record stays
    assert got["control"] is None and "--reprobe` undoes a pin" in got["note"]
    v = rs.view().jobs["g"]
    assert v.state == PINNED and v.target == 2 and v.control.kind == "pin" and v.control.uid == 0
    with pytest.raises(NotSized, match="not being sized"):
        rs.pin("nope", 2, 0, "")
    assert history.view().exact(str(os.getuid()), "BiDAF", 32) is None  # a pin or a stop is not an answer


def test_idle_gpu_array_cores_are_lent_and_taken_back_when_a_gpu_job_arrives(history):
    node = Node()
    node.start("c:batch", kind=CPU, cpus=range(16))
    node.start("g", cpus=range(16))
    config = RightsizeConfig(sources=("registered",), lend_to=("registered",), warmup_s=0.0, reserve_per_gpu=4)
    rs = RightSizing(config, history, clock=lambda: node.t)
    loop = Loop(node, rs)
    loop.until(sized("g"))
    view = rs.view(plan=loop.plan)
    # 16 CPUs, GPU array 4 x 4 GPUs = all 16; the job has 6: the other 10 are lent to the batch job
    assert len(loop.plan.lent) == 10 and view.borrowed["c:batch"] == loop.plan.lent
    assert node.jobs["c:batch"]["cpus"] == frozenset(loop.plan.lent)
    node.start("g2", cpus=range(16), meta=JobMeta(model="ResNet-50", batch_size=64, category="CV"))
    loop.tick()
    g2 = frozenset(loop.plan.cpus_of("g2"))
    # taken back in the same plan (the batch job keeps its last CPU, beside g2's: never none)
    assert g2 and len(g2 & node.jobs["c:batch"]["cpus"]) <= 1 and len(node.jobs["c:batch"]["cpus"]) < 10
    assert cpuplan.TAKEN_BACK in loop.plan.jobs["c:batch"].reasons


def test_a_probe_the_plan_cannot_give_is_cut_to_what_it_can(history):
    node = Node(cpus=8)
    node.start("c:batch", kind=CPU, source="slurm", cpus=range(8))
    node.start("a", cpus=range(8), meta=JobMeta(model="A", category="NLP"))
    node.start("b", cpus=range(8), meta=JobMeta(model="B", category="NLP"))
    rs = RightSizing(RightsizeConfig(sources=("registered",), warmup_s=0.0), history, clock=lambda: node.t)
    loop = Loop(node, rs)
    loop.tick()
    # both start at 5 (NLP's default) on an 8-CPU node: the plan cuts one; its probe follows
    a, b = (rs.view().jobs[j] for j in ("a", "b"))
    assert a.target + b.target <= 8 and (a.ceiling or b.ceiling)
    assert len(loop.plan.cpus_of("a")) == a.target and len(loop.plan.cpus_of("b")) == b.target
    loop.until(lambda out: all(isinstance(o, alloc.Sized) for o in out.values()))
    assert {rs.view().jobs[j].state for j in ("a", "b")} <= {SIZED, LIMITED}


def test_jobs_not_of_an_enabled_source_are_left_out_and_their_cpus_not_handed_out(history):
    node = Node()
    node.start("slurm:1", source="slurm", cpus=range(8, 16))
    node.start("g", cpus=range(16))
    rs = RightSizing(CONFIG, history, clock=lambda: node.t)
    loop = Loop(node, rs)
    loop.tick()
    assert set(rs.view().jobs) == {"g"} and "slurm:1" not in loop.plan.jobs
    assert not set(loop.plan.cpus_of("g")) & set(range(8, 16))
    assert node.jobs["slurm:1"]["cpus"] == frozenset(range(8, 16))
    del node.jobs["g"]
    loop.tick()
    assert rs.view().jobs == {} and loop.plan is None  # no sized GPU job: nothing planned


def test_the_owner_is_the_uid_of_the_first_process_still_there(tmp_path):
    assert job_owner("/proc", [ME]) == str(os.getuid())
    assert job_owner("/proc", [1 << 30, ME]) == str(os.getuid())
    assert job_owner(str(tmp_path), [ME]) is None


@pytest.fixture
def tmpfs_state(tmpfs):
    """A state directory on a tmpfs of its own (remounted read-only by the test)."""
    return tmpfs(name="state")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts a tmpfs")
def test_an_answer_that_cannot_be_remembered_is_kept_and_counted(tmpfs_state):
    history = SizingHistory(SecureDir(str(tmpfs_state)))
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs_state)], check=True)
    node = Node()
    node.start("g", cpus=range(16))
    rs = RightSizing(CONFIG, history, clock=lambda: node.t)
    out = Loop(node, rs).until(sized("g"))
    assert out["g"].cores == 6 and rs.view().history_errors == 1 and not rs.view().jobs["g"].remembered
    assert history.view().exact(str(os.getuid()), "BiDAF", 32) is None


def test_a_pin_and_a_stop_hold_again_after_a_restart_and_a_reprobe_or_the_jobs_end_forgets_them(tmp_path, history):
    from noded.rightsize.controls import SizeControls

    state = SecureDir(str(tmp_path / "state"))
    node = Node()
    node.start("g", cpus=range(16))
    node.start("h", cpus=range(16))
    rs = RightSizing(CONFIG, history, clock=lambda: node.t, controls=SizeControls(state))
    loop = Loop(node, rs)
    loop.tick()
    rs.pin("g", 3, 1000, "hold it")
    rs.stop("h", 1001, "leave it")
    stopped_at = rs.view().jobs["h"].target
    # noded restarts: a new service, the same state directory; the jobs' CPUs back at their originals
    node.jobs["g"]["cpus"] = node.jobs["h"]["cpus"] = frozenset(range(16))
    rs = RightSizing(CONFIG, history, clock=lambda: node.t, controls=SizeControls(state))
    loop = Loop(node, rs)
    loop.tick()
    g, h = rs.view().jobs["g"], rs.view().jobs["h"]
    assert (g.state, g.target, g.control.kind, g.control.uid, g.control.reason) == (PINNED, 3, "pin", 1000, "hold it")
    assert (h.state, h.target, h.control.kind, h.control.uid) == (STOPPED, stopped_at, "stop", 1001)
    rs.reprobe("g", 0, "again")
    del node.jobs["h"]
    loop.tick()
    assert SizeControls(state).jobs() == set()  # neither comes back after another restart


def test_a_pin_that_cannot_be_kept_is_refused_and_changes_nothing(tmp_path, history, tmpfs):
    from noded.rightsize.controls import SizeControls
    from noded.stores.originals import StateWriteError

    where = tmpfs(name="controls")
    controls = SizeControls(SecureDir(str(where)))
    node, _, _ = one_gpu_job(history)
    rs = RightSizing(CONFIG, history, clock=lambda: node.t, controls=controls)
    loop = Loop(node, rs)
    loop.tick()
    before = rs.view().jobs["g"]
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
    with pytest.raises(StateWriteError):
        rs.pin("g", 2, 0, "")
    after = rs.view().jobs["g"]
    assert (after.state, after.target, after.control) == (before.state, before.target, None)
    subprocess.run(["mount", "-o", "remount,rw", str(where)], check=True)


def test_a_controls_file_that_is_not_one_is_moved_aside(tmp_path):
    from noded.rightsize.controls import FILE, SizeControls, parse_controls

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / FILE).write_text('{"slurm:1": {"kind": "pin", "cores": 0, "uid": 0, "reason": ""}}')
    controls = SizeControls(SecureDir(str(state)))
    assert controls.jobs() == set() and "moved aside" in controls.notes[0]
    for bad in ([], {"j": {"kind": "grow", "cores": 2, "uid": 0, "reason": ""}},
                {"j": {"kind": "pin", "cores": True, "uid": 0, "reason": ""}},
                {"j": {"kind": "pin", "cores": 2, "uid": -1, "reason": ""}}, {"j": {"kind": "pin"}}):
        with pytest.raises(ValueError):
            parse_controls(bad)


def test_a_sized_job_whose_throughput_moves_is_searched_again_from_the_top(history):
    node, rs, loop = one_gpu_job(history)
    loop.until(sized("g"))
    assert rs.view().jobs["g"].optimal == 6
    for _ in range(60):  # at rest: passive windows at the answer, no probe
        out = loop.tick()
        assert isinstance(out["g"], alloc.Sized) and rs.view().jobs["g"].window_samples >= 0
    # its input pipeline changed: now it needs 10 cores, and is 20 % slower where it was
    node.jobs["g"]["curve"] = {c: 4.8 * min(c, 10) for c in range(1, 17)}
    # the window across the change is not steady (it runs to max_window_s, 60 s), the next ones are
    probed = loop.until(lambda out: isinstance(out["g"], alloc.Probe), limit=3 * 60 + 30)
    v = rs.view().jobs["g"]
    assert probed["g"].cores == 16 and v.start_source == alloc.FROM_DRIFT and v.points == ()
    out = loop.until(sized("g"))
    assert out["g"].cores == 10
    remembered = history.view().exact(str(os.getuid()), "BiDAF", 32)
    assert remembered is not None and remembered.cores == 10  # the new answer is remembered in its turn


def test_a_sized_job_whose_labels_change_is_searched_again_from_the_top(history):
    node, rs, loop = one_gpu_job(history)
    loop.until(sized("g"))
    node.jobs["g"]["meta"] = JobMeta(model="BiDAF", batch_size=64, category="NLP")  # a new batch size
    out = loop.tick()
    v = rs.view().jobs["g"]
    assert isinstance(out["g"], alloc.Probe) and out["g"].cores == 16 and v.batch_size == 64 and v.points == ()
