"""Which job is capped at what (issue #27, item 2): the reserve's arithmetic, where a cap
comes from, and the config keys that ask for them."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from noded.capping.plan import MIN_RESERVE_CAP_BPS, OVERRIDE, RESERVE, SOURCE, plan_caps, reserve_share
from noded.config import ConfigError, parse_config
from noded.jobs.model import JobMeta
from noded.samplers.sample import CPU, GPU, UNKNOWN, JobSample

GB = 1e9


def job(name, kind=CPU, gbps=None, source="slurm", exempt=False):
    return JobSample(name, source, frozenset(), JobMeta(exempt=exempt), kind, (), None,
                     None if gbps is None else gbps * GB, "own")


def test_light_jobs_keep_what_they_use_and_the_heavy_ones_share_the_rest_equally():
    assert reserve_share({"a": 2 * GB, "b": 30 * GB, "c": 30 * GB}, 20 * GB) == pytest.approx(9 * GB)
    assert reserve_share({"a": 2 * GB, "b": 3 * GB}, 20 * GB) is None  # all fit: no cap
    assert reserve_share({"a": 2 * GB, "b": None}, 20 * GB) == pytest.approx(18 * GB)  # None: wants without bound
    assert reserve_share({"a": 5 * GB, "b": 5 * GB}, -3 * GB) == 0.0  # nothing left


@given(st.dictionaries(st.text(max_size=3), st.one_of(st.none(), st.floats(0, 1e11)), min_size=1, max_size=8),
       st.floats(0, 1e11))
def test_the_water_level_shares_exactly_the_budget(demands, budget):
    level = reserve_share(demands, budget)
    if level is None:
        assert None not in demands.values() and sum(demands.values()) <= budget
    else:
        assert sum(level if d is None else min(d, level) for d in demands.values()) == pytest.approx(budget, rel=1e-9,
                                                                                                     abs=1)


def test_the_reserve_holds_cpu_jobs_to_what_leaves_it_free():
    jobs = {"gpu": job("gpu", GPU, 8), "hog": job("hog", gbps=40), "light": job("light", gbps=2),
            "exempt": job("exempt", gbps=5, exempt=True)}
    caps = plan_caps(jobs, {}, frozenset(), {}, 20 * GB, 60 * GB, {})
    # 60 peak - 20 reserve - 8 GPU - 5 exempt = 27 for the two: light keeps 2, hog gets 25
    assert set(caps) == {"hog", "light"} and caps["hog"].source == RESERVE
    assert caps["hog"].bps == pytest.approx(25 * GB) and caps["light"].bps == pytest.approx(25 * GB)
    assert "20 GB/s kept for GPU jobs" in caps["hog"].why
    assert plan_caps({k: v for k, v in jobs.items() if k != "gpu"}, {}, frozenset(), {}, 20 * GB, 60 * GB, {}) == {}
    # held at its cap, the hog's 25 GB/s says nothing of what it wants: the cap stays
    held = {**jobs, "hog": job("hog", gbps=24.9)}
    assert plan_caps(held, {}, frozenset(), {}, 20 * GB, 60 * GB, {"hog": 25 * GB, "light": 25 * GB})["hog"].bps \
        == pytest.approx(25 * GB)


def test_an_override_wins_a_source_default_applies_and_the_lower_cap_holds():
    jobs = {"gpu": job("gpu", GPU, 10), "a": job("a", gbps=30), "b": job("b", gbps=30, source="systemd"),
            "c": job("c", gbps=30), "lvl": job("lvl", gbps=3)}
    caps = plan_caps(jobs, {"a": 6 * GB}, frozenset({"lvl"}), {"systemd": 4 * GB}, None, 60 * GB, {})
    assert (caps["a"].bps, caps["a"].source) == (6 * GB, OVERRIDE) and (caps["b"].bps, caps["b"].source) == \
        (4 * GB, SOURCE) and "c" not in caps and "lvl" not in caps
    # with a reserve: 60 - 20 - 10 GPU - 6 override - 3 held at a level = 21 for b and c; b's default is lower
    caps = plan_caps(jobs, {"a": 6 * GB}, frozenset({"lvl"}), {"systemd": 4 * GB}, 20 * GB, 60 * GB, {})
    assert caps["b"].source == SOURCE and caps["c"].source == RESERVE and caps["c"].bps == pytest.approx(17 * GB)
    # nothing left: a floor, not a stop
    caps = plan_caps(jobs, {}, frozenset(), {}, 59 * GB, 60 * GB, {})
    assert caps["c"].bps == MIN_RESERVE_CAP_BPS


def test_the_caps_config_keys_are_read_and_checked():
    c = parse_config("jobs:\n  sources:\n    - {kind: slurm, cap_gbps: 6}\ncontention:\n  gpu_reserve_gbps: 20\n")
    assert c.jobs.sources[0].cap_gbps == 6 and c.contention.gpu_reserve_gbps == 20


@pytest.mark.parametrize("text,key,said", [
    ("contention:\n  gpu_reserve_gbps: 0\n", "contention.gpu_reserve_gbps", "GB/s"),
    ("contention:\n  gpu_reserve_gbps: 20\n  method: cores\n", "contention.gpu_reserve_gbps", "held with MBA"),
    ("jobs:\n  sources:\n    - {kind: slurm, cap_gbps: -1}\n", "jobs.sources[0].cap_gbps", "GB/s"),
    ("jobs:\n  sources:\n    - {kind: slurm, cap_gbps: 6}\n    - {kind: slurm, root: /x, cap_gbps: 7}\n",
     "jobs.sources[1].cap_gbps", "another slurm source caps at 6 GB/s"),
])
def test_a_bad_cap_key_is_refused_naming_it(text, key, said):
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert any(p.key == key and said in p.reason for p in e.value.problems), str(e.value)


def test_explain_says_how_many_threads_a_cap_steers_on_and_the_cores_it_is_held_on():
    from noded.admin.commands import _cap_why
    from noded.capping.service import CapState

    held = CapState(2e9, "override", "an operator's cap", "noded", 2.4e9, "10", unreachable=True,
                    cpus="2 of 8 CPUs", busy_threads=3)
    text = _cap_why(held)
    assert "3 busy threads" in text and "held on fewer cores (2 of 8 CPUs)" in text
    waiting = CapState(2e9, "override", "an operator's cap", "noded", 2.4e9, "10", unreachable=True, busy_threads=1)
    assert "1 busy thread," not in _cap_why(waiting) and "1 busy thread;" in _cap_why(waiting)
    assert "fewer cores come next" in _cap_why(waiting)


def test_where_only_caps_change_cpus_the_capped_jobs_and_the_recorded_ones_are_read():
    from noded.capping.plan import Cap
    from noded.capping.service import CapService
    from noded.jobs.model import Job

    jobs = {"a": Job("a", "cgroup", frozenset({10}), "/cg/a"), "b": Job("b", "cgroup", frozenset({20}), "/cg/b"),
            "ab": Job("ab", "cgroup", frozenset({30}), "/cg/ab"), "p": Job("p", "pid", frozenset({40, 41})),
            "q": Job("q", "pid", frozenset({50})), "idle": Job("idle", "cgroup", frozenset({60}), "/cg/idle")}
    caps = CapService(lambda: None, lambda j: j)
    caps.caps = {"a": Cap(1 * GB, OVERRIDE, "test"), "gone": Cap(1 * GB, OVERRIDE, "test")}
    assert caps.placements_wanted(jobs, []) == {"a"}  # a capped job no longer there is not
    records = ["cpuset:/cg/b/step_0/task", "affinity:41:12345", "affinity_job:q", "gpu:0:compute_mode",
               "cpuset:/elsewhere", "affinity:notapid:1", "affinity_job:gone"]
    # a record below a job's cgroup is its ("/cg/ab" is not below "/cg/a"); a process's by pid
    assert caps.placements_wanted(jobs, records) == {"a", "b", "p", "q"}


def _tick(t, hog_kind, gpu_kind=GPU):
    """A sample of two domains: a GPU job and a CPU hog (their kinds as NVML told them, or
    UNKNOWN where it did not answer), the hog at 12 GB/s."""
    from noded.samplers.sample import Sample

    jobs = {"bert": job("bert", gpu_kind, 1), "hog": job("hog", hog_kind, 12)}
    return Sample(t, jobs, (), hog_kind != UNKNOWN, None if hog_kind != UNKNOWN else "NVML has not answered",
                  (0, 1), {0: 7 * GB, 1: 6 * GB}, (), ())


def test_a_cap_holds_while_nvml_cannot_tell_the_jobs_kinds_then_goes_as_a_level_does():
    """One tick of NVML late (its deadline missed on a loaded host) made every job's kind
    unknown: the reserve's cap of the hog was released and made again a tick later, the
    hog uncapped in between (tests/system/test_caps.py's reserve test, once in a fresh
    clone's run), and an operator's cap was released alike. Now a cap in force holds
    while kinds are unknown (an operator's as long as it stands, any other for
    contention.missing_release_s) and nothing is newly capped blind."""
    from noded.capping.plan import Cap
    from noded.capping.service import CapService
    from noded.loop.overrides import Override

    caps = CapService(lambda: None, lambda j: j)
    plan = caps.plan(_tick(0.0, CPU), {}, {}, 9 * GB, 8 * GB, blind_hold_s=30)
    assert set(plan) == {"hog"} and plan["hog"].source == RESERVE
    caps.caps = dict(plan)
    for t in (1.0, 10.0, 30.9):  # blind: held as it was, for up to 30 s of it
        assert caps.plan(_tick(t, UNKNOWN, UNKNOWN), {}, {}, 9 * GB, 8 * GB, blind_hold_s=30) == plan
    caps.before_apply(plan)
    ended = caps.plan(_tick(31.0, UNKNOWN, UNKNOWN), {}, {}, 9 * GB, 8 * GB, blind_hold_s=30)
    assert ended == {} and "noded holds no throttle blind" in caps._end_why["hog"]
    # sight again, then blind again: the time is counted afresh
    assert caps.plan(_tick(32.0, CPU), {}, {}, 9 * GB, 8 * GB, blind_hold_s=30) == plan
    assert caps.plan(_tick(33.0, UNKNOWN, UNKNOWN), {}, {}, 9 * GB, 8 * GB, blind_hold_s=30) == plan
    # paused: a held reserve cap goes; a job never capped is not capped blind
    assert caps.plan(_tick(34.0, UNKNOWN, UNKNOWN), {}, {}, 9 * GB, 8 * GB, automatic=False) == {}
    caps.caps = {}
    assert caps.plan(_tick(35.0, UNKNOWN, UNKNOWN), {}, {}, 9 * GB, 8 * GB) == {}
    # an operator's cap holds as long as the operator's cap stands, at its current value
    operator = {"hog": Override("hog", 0, 0, "", 0.0, None, 6 * GB)}
    caps.caps = {"hog": Cap(6 * GB, OVERRIDE, "an operator's cap (nodectl cap)")}
    for t in (36.0, 500.0):
        held = caps.plan(_tick(t, UNKNOWN, UNKNOWN), operator, {}, 9 * GB, 8 * GB, automatic=t < 100)
        assert held == {"hog": caps.caps["hog"]}
    assert caps.plan(_tick(501.0, UNKNOWN, UNKNOWN), {}, {}, 9 * GB, 8 * GB) == {}
    assert caps._end_why["hog"] == "the operator's cap was released"
