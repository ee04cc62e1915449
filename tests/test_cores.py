"""Core halving on real cpusets (cgroup v1 here) and real affinities, with the
original values recorded before the first write and restored after a crash."""

import os
import subprocess
from types import MappingProxyType

import pytest

from noded.actuators.cores import CoreHalving, kept_cpus, max_level
from noded.jobs.model import JobMeta
from noded.sample import JobSample, Sample
from noded.state import OriginalValues
from resctrl.cpulist import format_cpu_list, parse_cpu_list


def sample_of(*jobs):
    return Sample(0.0, MappingProxyType({j.id: j for j in jobs}), (), False, None, (), MappingProxyType({}), (), ())


def cpu_job(jid, pids, cgroup=None):
    return JobSample(jid, "registered", frozenset(pids), JobMeta(), "cpu", (), None, 1e9, "own", cgroup)


def test_levels_halve_and_never_go_below_one_core():
    assert [kept_cpus(list(range(8)), lvl) for lvl in range(5)] == [
        list(range(8)), [0, 1, 2, 3], [0, 1], [0], [0]]
    assert [max_level(n) for n in (1, 2, 3, 8, 12)] == [0, 1, 1, 3, 3]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to halve")
def test_affinity_halving_restores_after_a_crash(tmp_path, sleeper):
    p = sleeper()
    before = os.sched_getaffinity(p.pid)
    job = cpu_job("j", [p.pid])
    cores = CoreHalving(OriginalValues(str(tmp_path)))
    assert cores.max_levels(sample_of(job)) == {"j": max_level(len(before))}
    (applied,) = cores.apply({"j": 1}, sample_of(job))
    assert applied.error is None and len(os.sched_getaffinity(p.pid)) == len(before) // 2
    # The daemon dies here. A new one starts with the same state directory:
    restored = CoreHalving(OriginalValues(str(tmp_path))).restore_all()
    assert os.sched_getaffinity(p.pid) == before and len(restored) == 1
    assert OriginalValues(str(tmp_path)).items() == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to halve")
def test_a_v1_cpuset_tree_shrinks_children_first_and_grows_back(tmp_path, v1_cpuset, sleeper):
    base, mkcg = v1_cpuset
    job_dir = mkcg("slurm/uid_0/job_5")
    step = mkcg("slurm/uid_0/job_5/step_0")
    p = sleeper()
    with open(f"{step}/cgroup.procs", "w") as f:
        f.write(str(p.pid))
    original = parse_cpu_list(open(f"{job_dir}/cpuset.cpus").read())
    job = cpu_job("slurm:5", [p.pid], job_dir)
    cores = CoreHalving(OriginalValues(str(tmp_path)))
    (a,) = cores.apply({"slurm:5": 1}, sample_of(job))
    assert a.error is None, a
    half = format_cpu_list(sorted(original)[: len(original) // 2])
    assert open(f"{job_dir}/cpuset.cpus").read().strip() == half
    assert open(f"{step}/cpuset.cpus").read().strip() == half  # written before its parent
    assert len(os.sched_getaffinity(p.pid)) == len(original) // 2
    (a,) = cores.apply({}, sample_of(job))
    assert a.error is None
    assert parse_cpu_list(open(f"{job_dir}/cpuset.cpus").read()) == original
    assert parse_cpu_list(open(f"{step}/cpuset.cpus").read()) == original
    assert OriginalValues(str(tmp_path)).items() == []


def test_a_broken_state_file_is_moved_aside_loudly_not_a_silent_reset(tmp_path):
    (tmp_path / "originals.json").write_text("[1, 2]")
    originals = OriginalValues(str(tmp_path))  # issue #11: noded starts (tests/faults/test_state_dir.py)
    assert originals.items() == [] and "expected a JSON object" in originals.notes[0]
    assert [n for n in os.listdir(tmp_path) if n.startswith("originals.json.corrupt-")]
