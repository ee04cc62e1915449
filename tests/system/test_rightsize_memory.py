"""Right-sizing's memory (issue #13, item 6): the exact split of the GPU jobs' cache memory
from their declared cache curves, carried out only as soft limits (memory.high on v2, the v1
soft limit), recorded before the first write, put back when no longer wished for, at stop
and after a crash, and left alone once someone else changes them."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import textwrap
from types import MappingProxyType, SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noded.actuators.memsoft import MemorySoftLimits
from noded.samplers.memcgroups import MemoryCgroupError, find_memory_cgroup, parse_memory_stat
from noded.jobs.model import JobMeta
from noded.rightsize.memsplit import QUANTUM, CacheJob, cache_curve, soft_limit_bytes, split_memory
from noded.samplers.sample import GPU, JobSample, Sample
from noded.samplers.cpus import CpuPlacement
from noded.stores.originals import OriginalValues, parse_originals
from support.memory import observe
from support.paths import REPO_ROOT

V1_MEMORY = "/sys/fs/cgroup/memory"
V1_CPUSET = "/sys/fs/cgroup/cpuset"
UNLIMITED_V1 = "9223372036854771712"

IMAGE = cache_curve(480.0, 0.45)  # Synergy's ResNet18: about 2x from little cache to all of it
SPEECH = cache_curve(70.0, 0.6)


# -- the split (pure)


def test_an_image_job_gets_cache_and_a_job_without_a_curve_gets_none():
    s = split_memory([CacheJob("img", 1, IMAGE), CacheJob("nlp", 1, None)], node_gpus=2, units=16, cache_gb=480.0)
    assert set(s.units) == {"img"}  # the language model declares no cache: it is neither given nor limited
    assert s.units["img"] > s.proportional["img"]  # it takes what the flat job does not need
    assert s.unit_bytes == 30 << 30


def test_nothing_to_split_without_a_declared_curve():
    s = split_memory([CacheJob("nlp", 1, None)], node_gpus=1, units=8, cache_gb=64.0)
    assert dict(s.units) == {} and "declares a cache curve" in s.reason


def _progress(curve, m, unit_gb):
    return curve.share(m * unit_gb)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1.0, 500.0), st.floats(0.05, 1.0), st.integers(1, 2)), min_size=1, max_size=3),
       st.integers(1, 6), st.floats(1.0, 600.0))
def test_the_split_is_the_best_of_every_allocation_and_keeps_every_floor(params, units, cache_gb):
    jobs = [CacheJob(f"j{i}", g, cache_curve(d, u)) for i, (d, u, g) in enumerate(params)]
    node_gpus = sum(g for _, _, g in params)
    s = split_memory(jobs, node_gpus, units, cache_gb)
    unit_gb = cache_gb / units
    assert sum(s.units.values()) <= units
    floors = {j.job: _progress(j.curve, s.proportional[j.job], unit_gb) for j in jobs}
    for j in jobs:
        assert _progress(j.curve, s.units[j.job], unit_gb) >= floors[j.job] - 1e-12
    best = max(sum(_progress(j.curve, m, unit_gb) / floors[j.job] for j, m in zip(jobs, combo))
               for combo in itertools.product(range(units + 1), repeat=len(jobs)) if sum(combo) <= units
               if all(_progress(j.curve, m, unit_gb) >= floors[j.job] for j, m in zip(jobs, combo)))
    got = sum(_progress(j.curve, s.units[j.job], unit_gb) / floors[j.job] for j in jobs)
    assert got == pytest.approx(best, rel=1e-9)


@given(st.integers(0, 1 << 40), st.integers(0, 64), st.integers(0, 1 << 32), st.integers(0, 1 << 32))
def test_a_soft_limit_covers_process_memory_cache_and_headroom_in_whole_quanta(anon, units, unit_bytes, headroom):
    limit = soft_limit_bytes(anon, units, unit_bytes, headroom)
    assert limit % QUANTUM == 0 and limit >= anon + units * unit_bytes + headroom
    assert limit - QUANTUM < max(QUANTUM, anon + units * unit_bytes + headroom)


# -- labels and records


@pytest.mark.parametrize("labels, message", [
    ({"dataset_gb": 100.0}, "go together"),
    ({"dataset_gb": float("inf"), "uncached_share": 0.5}, "dataset_gb must be a number"),
    ({"dataset_gb": True, "uncached_share": 0.5}, "dataset_gb must be a number"),
    ({"dataset_gb": 100, "uncached_share": 0.0}, "uncached_share must be a number at least 0.01"),
    ({"dataset_gb": 100, "uncached_share": 0.005}, "uncached_share must be a number at least 0.01"),
    ({"dataset_gb": 100, "uncached_share": 1.5}, "uncached_share must be a number at least 0.01"),
])
def test_a_cache_curve_label_that_is_not_one_is_refused_naming_the_job(labels, message):
    with pytest.raises(ValueError, match=message) as e:
        JobMeta.from_mapping(labels, "labels.yaml: slurm:7")
    assert "slurm:7" in str(e.value)


def test_a_memory_record_that_is_not_one_is_refused():
    good = {"memory:/sys/fs/cgroup/memory/a": {"job": "slurm:1", "original": "max", "version": 2}}
    assert parse_originals(good) == good
    for bad in ({"memory:/x": {"job": "a", "original": "1" * 40, "version": 1}},
                {"memory:/x": {"job": "a", "original": "max", "version": 3}},
                {"memory:relative": {"job": "a", "original": "max", "version": 2}}):
        with pytest.raises(ValueError):
            parse_originals(bad)


def test_memory_stat_is_read_by_version_and_a_missing_field_is_named():
    assert parse_memory_stat("anon 10\nfile 20\nkernel 5\n", 2) == (10, 20)
    assert parse_memory_stat("cache 1\nrss 2\ntotal_cache 30\ntotal_rss 40\n", 1) == (40, 30)
    with pytest.raises(ValueError, match="'anon'"):
        parse_memory_stat("file 20\n", 2)


# -- a real v1 memory cgroup


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _read(path):
    with open(path) as f:
        return f.read().strip()


@pytest.fixture
def v1_job(tmp_path):
    """A job as Slurm makes one on v1: the same path in the cpuset and memory hierarchies,
    a process in both."""
    if not os.path.isdir(V1_MEMORY) or not os.path.isdir(V1_CPUSET):
        pytest.skip("no v1 memory and cpuset hierarchies")
    top = f"noded-memtest-{os.getpid()}"
    cs, mem = f"{V1_CPUSET}/{top}/job_1", f"{V1_MEMORY}/{top}/job_1"
    os.makedirs(cs)
    os.makedirs(mem)
    for d in (f"{V1_CPUSET}/{top}", cs):
        for f in ("cpuset.cpus", "cpuset.mems"):
            _write(f"{d}/{f}", _read(f"{V1_CPUSET}/{f}"))
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        _write(f"{cs}/cgroup.procs", str(proc.pid))
        _write(f"{mem}/cgroup.procs", str(proc.pid))
        js = JobSample("slurm:1", "slurm", frozenset([proc.pid]), JobMeta(), GPU, (), None, None, "none",
                       cgroup=cs, cpus=CpuPlacement(((cs, frozenset(os.sched_getaffinity(0))),)))
        yield SimpleNamespace(js=js, mem=mem, cs=cs, state=tmp_path / "state", pid=proc.pid)
    finally:
        proc.kill()
        proc.wait()
        for d in (cs, mem, f"{V1_CPUSET}/{top}", f"{V1_MEMORY}/{top}"):
            if os.path.isdir(d):
                os.rmdir(d)


def _owner(state):
    os.makedirs(state, mode=0o700, exist_ok=True)
    return MemorySoftLimits(OriginalValues(str(state)))


def test_a_soft_limit_is_recorded_then_written_and_put_back_when_no_longer_wished(v1_job):
    owner = _owner(v1_job.state)
    hard = _read(f"{v1_job.mem}/memory.limit_in_bytes")
    cgroups, unplaced = observe(owner, {"slurm:1": v1_job.js})
    assert unplaced == {} and cgroups["slurm:1"].path == v1_job.mem and cgroups["slurm:1"].version == 1
    result = owner.apply({"slurm:1": 2 * QUANTUM}, cgroups)
    assert [(c.limit_from, c.limit, c.error) for c in result.changes] == [(UNLIMITED_V1, str(2 * QUANTUM), None)]
    assert _read(f"{v1_job.mem}/memory.soft_limit_in_bytes") == str(2 * QUANTUM)
    assert _read(f"{v1_job.mem}/memory.limit_in_bytes") == hard  # never a hard limit
    assert OriginalValues(str(v1_job.state)).get(f"memory:{v1_job.mem}")["original"] == UNLIMITED_V1
    again = owner.apply({"slurm:1": 2 * QUANTUM}, observe(owner, {"slurm:1": v1_job.js})[0])
    assert again.changes == () and again.limits == {"slurm:1": str(2 * QUANTUM)}  # only differences are written
    gone = owner.apply({}, observe(owner, {"slurm:1": v1_job.js})[0])
    assert [c.limit for c in gone.changes] == [UNLIMITED_V1]
    assert _read(f"{v1_job.mem}/memory.soft_limit_in_bytes") == UNLIMITED_V1
    assert OriginalValues(str(v1_job.state)).items() == []


def test_a_limit_someone_else_set_is_theirs(v1_job):
    owner = _owner(v1_job.state)
    owner.apply({"slurm:1": 2 * QUANTUM}, observe(owner, {"slurm:1": v1_job.js})[0])
    _write(f"{v1_job.mem}/memory.soft_limit_in_bytes", str(5 * QUANTUM))  # the operator's
    result = owner.apply({"slurm:1": 3 * QUANTUM}, observe(owner, {"slurm:1": v1_job.js})[0])
    assert result.changes == () and _read(f"{v1_job.mem}/memory.soft_limit_in_bytes") == str(5 * QUANTUM)
    assert owner.release_all() == [] and _read(f"{v1_job.mem}/memory.soft_limit_in_bytes") == str(5 * QUANTUM)
    assert OriginalValues(str(v1_job.state)).items() == []


def test_nothing_is_written_when_the_original_cannot_be_recorded(v1_job, tmpfs):
    state = tmpfs(name="state")
    owner = MemorySoftLimits(OriginalValues(str(state)))
    subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
    result = owner.apply({"slurm:1": 2 * QUANTUM}, observe(owner, {"slurm:1": v1_job.js})[0])
    assert [c.error.startswith("original not recorded") for c in result.changes] == [True]
    assert _read(f"{v1_job.mem}/memory.soft_limit_in_bytes") == UNLIMITED_V1


def test_after_sigkill_the_next_start_puts_the_original_back(v1_job):
    os.makedirs(v1_job.state, mode=0o700)
    script = textwrap.dedent(f"""
        import os, signal
        from noded.actuators.memsoft import MemorySoftLimits
        from noded.jobs.model import JobMeta
        from noded.samplers.memcgroups import MemoryCgroupSampler
        from noded.samplers.sample import JobSample
        from noded.stores.originals import OriginalValues
        js = JobSample("slurm:1", "slurm", frozenset([{v1_job.pid}]), JobMeta(), "gpu", (), None, None, "none",
                       cgroup={v1_job.cs!r})
        owner = MemorySoftLimits(OriginalValues({str(v1_job.state)!r}))
        owner.apply({{"slurm:1": {3 * QUANTUM}}}, MemoryCgroupSampler().sample({{"slurm:1": js}}).cgroups)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT)
    assert done.returncode == -signal.SIGKILL
    assert _read(f"{v1_job.mem}/memory.soft_limit_in_bytes") == str(3 * QUANTUM)
    from noded.commands.wiring import build_daemon
    from noded.config import Config

    built = build_daemon(Config(state_dir=str(v1_job.state), runtime_dir=str(v1_job.state / "run"), nvml=False))
    try:
        assert _read(f"{v1_job.mem}/memory.soft_limit_in_bytes") == UNLIMITED_V1
        assert any("restored" in n and v1_job.mem in n for n in built.notes)
        assert built.daemon.parts.memory is None  # memory is not sized in this config: restored, nothing more
    finally:
        built.daemon.shutdown()


def test_a_job_whose_processes_are_not_in_the_memory_cgroup_is_not_limited(v1_job):
    _write(f"{V1_MEMORY}/cgroup.procs", str(v1_job.pid))  # moved out of its memory cgroup
    with pytest.raises(MemoryCgroupError, match="none of the job's processes"):
        find_memory_cgroup(v1_job.js)
    no_cgroup = JobSample("pid:1", "registered", frozenset([1]), JobMeta(), GPU, (), None, None, "none")
    with pytest.raises(MemoryCgroupError, match="no cgroup of its own"):
        find_memory_cgroup(no_cgroup)


# -- cgroup v2 (a directory layout: this host's memory controller is on v1)


def test_on_v2_memory_high_is_written_and_max_put_back(tmp_path):
    job = tmp_path / "cg" / "system.slice" / "slurmstepd.scope" / "job_9"
    job.mkdir(parents=True)
    (job / "memory.high").write_text("max\n")
    (job / "memory.max").write_text("max\n")
    (job / "memory.stat").write_text(f"anon {3 << 30}\nfile {1 << 30}\n")
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text(f"0::{job}/step_0\n")
    (proc / "self").mkdir()  # noded's own: the hierarchies the kernel has (a v2-only host)
    (proc / "self" / "cgroup").write_text("0::/system.slice/noded.service\n")
    js = JobSample("slurm:9", "slurm", frozenset([4242]), JobMeta(), GPU, (), None, None, "none", cgroup=str(job))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    mounts = tmp_path / "mounts"  # the fake tree stands for a cgroup2 mount: noded opens cgroup files only
    mounts.write_text(f"cgroup2 {tmp_path / 'cg'} cgroup2 rw 0 0\n")
    owner = MemorySoftLimits(OriginalValues(str(state)), proc=str(proc), mounts=str(mounts))
    cgroups, _ = observe(owner, {"slurm:9": js})
    cg = cgroups["slurm:9"]
    assert (cg.version, cg.anon_bytes, cg.file_bytes, cg.limit) == (2, 3 << 30, 1 << 30, "max")
    want = soft_limit_bytes(cg.anon_bytes, 2, 1 << 30, 1 << 30)
    owner.apply({"slurm:9": want}, cgroups)
    assert (job / "memory.high").read_text() == str(want) and (job / "memory.max").read_text() == "max\n"
    assert owner.release_all() == []
    assert (job / "memory.high").read_text() == "max"


# -- the daemon's part


def _sample(jobs):
    return Sample(1.0, MappingProxyType(jobs), (), True, None, (), MappingProxyType({}), (), ())


def memory_tick(daemon, sample):
    """Right-sizing's memory alone for one Sample, as a tick runs it: its controller proposes,
    the knob's planner plans, the knob's one writer writes; the view the tick's result shows."""
    from noded.knobs.controller import Reading
    from noded.loop.daemon import MemoryView
    from noded.loop.planners import plan_knobs

    memory = next(c for c in daemon.controllers if c.name == "memory")
    plans = plan_knobs((memory.propose(Reading(sample, daemon.config, sample.t), ()),))
    return MemoryView(plans.memory.split, daemon.appliers.apply_memory(plans, daemon.stats), plans.memory.error)


def test_the_daemon_limits_a_sized_job_with_a_cache_curve_and_shows_it(v1_job):
    from prometheus_client.core import Metric

    from noded.commands.wiring import build_daemon
    from noded.config import Config, RightsizeConfig, RightsizeMemoryConfig
    from noded.loop.metrics import NodedCollector

    config = Config(state_dir=str(v1_job.state), runtime_dir=str(v1_job.state / "run"), nvml=False,
                    rightsize=RightsizeConfig(sources=("slurm",),
                                              memory=RightsizeMemoryConfig(cache_gb=8.0, units=8, headroom_gb=0.5)))
    built = build_daemon(config)
    daemon = built.daemon
    try:
        img = JobSample(**{**v1_job.js.__dict__, "meta": JobMeta(dataset_gb=16.0, uncached_share=0.5)})
        # the sample as the daemon's telemetry makes it: the job's memory cgroup read with it
        sample = dataclasses.replace(_sample({"slurm:1": img}),
                                     memory=daemon.parts.telemetry.memory.sample({"slurm:1": img}))
        view = memory_tick(daemon, sample)
        units = view.split.units["slurm:1"]
        assert 0 < units <= 8
        limit = int(_read(f"{v1_job.mem}/memory.soft_limit_in_bytes"))
        anon = view.result.cgroups["slurm:1"].anon_bytes
        assert limit == soft_limit_bytes(anon, units, 1 << 30, 1 << 29)
        series = {s.name: s for m in NodedCollector._memory(SimpleNamespace(memory=view)) if isinstance(m, Metric)
                  for s in m.samples}
        assert series["noded_job_memory_soft_limit_bytes"].value == limit
        assert series["noded_job_memory_cache_units"].value == units
        from noded.admin.commands import _memory_json
        shown = _memory_json("slurm:1", view)
        assert shown["soft_limit"] == str(limit) and f"{units} units of cache" in shown["why"]
        # a tick whose memory sampler failed (no reading): the limit is held, not put back
        held = memory_tick(daemon, _sample({"slurm:1": img}))
        assert int(_read(f"{v1_job.mem}/memory.soft_limit_in_bytes")) == limit
        assert "could not be read this tick" in held.result.unplaced["slurm:1"]
        # the label goes: the job's curve is no longer declared, its limit is put back
        view = memory_tick(daemon, _sample({"slurm:1": v1_job.js}))
        assert dict(view.split.units) == {} and _read(f"{v1_job.mem}/memory.soft_limit_in_bytes") == UNLIMITED_V1
        memory_tick(daemon, sample)
    finally:
        daemon.shutdown()  # puts the limit back
    assert _read(f"{v1_job.mem}/memory.soft_limit_in_bytes") == UNLIMITED_V1


def test_a_memory_unit_below_the_limits_step_is_refused_by_check_config():
    from noded.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="below the 256 MiB steps"):
        parse_config("rightsize: {sources: [slurm], memory: {cache_gb: 2, units: 16}}")
    assert parse_config("rightsize: {sources: [slurm], memory: {cache_gb: 4, units: 16}}").rightsize.memory.units == 16
