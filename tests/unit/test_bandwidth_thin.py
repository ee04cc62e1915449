"""A quiet node read thin (noded.samplers.bandwidth, issue #25's CPU goal): the node's rate
every tick from the control groups' totals, each job's counters every few ticks, a job's
rate its mean since its last read; any tick that is not quiet, or whose groups changed,
reads every counter. Counters here are a model the test drives (bytes per path), read
through the sampler's own reader interface, so every rate it gives can be checked exactly."""

import json
import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from noded.samplers.bandwidth import BandwidthSampler, QuietRead
from resctrl.mbm import MBM_TOTAL, CounterReading

GB = 1e9
QUIET = QuietRead(below_bps=50 * GB, every=5)


class Node:
    """Jobs each in their monitoring group under the root; the root's total holds every
    group's bytes and its own (as the kernel sums a control group's RMIDs)."""

    def __init__(self, root: str, jobs: int):
        self.root = root
        self.now = 0.0
        self.rates = {f"j{i}": 1 * GB for i in range(jobs)}  # bytes/s per job
        self.own_rate = 0.5 * GB  # tasks in the root's own RMID
        self.bytes = {j: 0.0 for j in self.rates}
        self.own = 0.0
        self.reads: list[str] = []  # paths read this tick
        self.groups = {j: SimpleNamespace(path=f"{root}/mon_groups/{j}", parent=SimpleNamespace(path=root))
                       for j in self.rates}
        self.rc = SimpleNamespace(root=root, list_ctrl_groups=lambda: [])

    def advance(self, dt: float) -> None:
        self.now += dt
        for j, r in self.rates.items():
            self.bytes[j] += r * dt
        self.own += self.own_rate * dt

    # the sampler's reader
    def read(self, path, domains):
        self.reads.append(path)
        if path == self.root:
            value = self.own + sum(self.bytes.values())
        else:
            value = self.bytes[path.rsplit("/", 1)[1]]
        return {d: {MBM_TOTAL: CounterReading(int(value))} for d in domains}

    def close(self):
        pass

    def tick(self, sampler, quiet=QUIET, removed=()):
        self.reads = []
        s = sampler.sample(self.rc, 1, dict(self.groups), quiet, removed)
        return s, [p.rsplit("/", 1)[1] for p in self.reads if p != self.root]

    def remove(self, job: str, read_first: bool = True) -> tuple:
        """The job's group removed, as noded's monitoring sync removes it: its counters read
        just before the rmdir (what the sync hands the sampler), then the kernel drops its
        count from its control group's total. ``read_first`` False: removed by someone else."""
        group = self.groups.pop(job)
        last = ((group.path, group.parent.path, {0: {MBM_TOTAL: CounterReading(int(self.bytes[job]))}}),)
        del self.bytes[job], self.rates[job]
        return last if read_first else ()


@pytest.fixture
def node(tmp_path):
    (tmp_path / "mon_data" / "mon_L3_00").mkdir(parents=True)
    return Node(str(tmp_path), 20)


def sampler_of(node):
    return BandwidthSampler(SimpleNamespace(created_at=lambda job: None), node, clock=lambda: node.now)


def warm(node, sampler, ticks=3):
    """``ticks`` ticks a second apart, the last just now: the first reads give no rate, so
    the second reads every job again; thin from the third."""
    out = [node.tick(sampler)]
    for _ in range(ticks - 1):
        node.advance(1.0)
        out.append(node.tick(sampler))
    return out


def test_a_quiet_node_reads_each_job_every_fifth_tick_and_the_node_every_tick(node):
    sampler = sampler_of(node)
    (_, first), (s, second) = warm(node, sampler, 2)
    assert sorted(first) == sorted(second) == sorted(node.rates) and s.jobs_current
    node.advance(1.0)
    last_read = {j: 1 for j in node.rates}
    for tick in range(2, 22):
        s, read = node.tick(sampler)
        assert len(read) == 4, read  # 20 jobs / 5
        for j in read:
            last_read[j] = tick
        assert all(tick - t < 5 for t in last_read.values()), last_read
        assert s.node_bps[0] == pytest.approx(20.5 * GB) and not s.jobs_current
        assert all(r[0] == pytest.approx(1 * GB) for r in s.job_bps.values())
        node.advance(1.0)


def test_a_jobs_rate_on_a_thin_tick_is_its_mean_since_its_last_read(node):
    sampler = sampler_of(node)
    warm(node, sampler)
    # every job at 3 GB/s from now: each job's first read after the change gives its mean
    # since its read before, which began before the change; its next read gives 3 GB/s
    for j in node.rates:
        node.rates[j] = 3 * GB
    seen: dict[str, float] = {}
    for _ in range(10):
        node.advance(1.0)
        s, read = node.tick(sampler)
        for j in read:
            seen[j] = s.job_bps[j][0]
        assert s.node_bps[0] == pytest.approx(60.5 * GB)  # the node's own rate follows at once
    assert seen.keys() == node.rates.keys()
    assert all(v == pytest.approx(3 * GB) for v in seen.values()), seen


def test_the_node_past_the_quiet_bound_reads_every_job_at_once_and_says_the_rates_are_not_one_ticks(node):
    sampler = sampler_of(node)
    warm(node, sampler, 4)
    node.rates["j7"] = 60 * GB  # a hog rises: the node passes the bound on this tick
    node.advance(1.0)
    s, read = node.tick(sampler)
    assert sorted(read) == sorted(node.rates)  # every job read on the tick it was seen
    assert not s.jobs_current  # j7's window reaches back to its last read
    assert s.node_bps[0] == pytest.approx(20.5 * GB + 59 * GB)  # the last second's, from the totals
    node.advance(1.0)
    s, read = node.tick(sampler)
    assert sorted(read) == sorted(node.rates) and s.jobs_current
    assert s.job_bps["j7"][0] == pytest.approx(60 * GB)


def test_a_group_made_or_removed_reads_every_job_that_tick(node):
    sampler = sampler_of(node)
    warm(node, sampler, 4)
    node.advance(1.0)
    del node.groups["j3"]  # its group removed: the root's total drops by its count
    node.own += node.bytes.pop("j3")
    node.own_rate += node.rates.pop("j3")
    s, read = node.tick(sampler)
    assert sorted(read) == sorted(node.rates)
    assert s.node_bps[0] is not None and s.node_bps[0] == pytest.approx(20.5 * GB, rel=0.02)


def test_without_the_quiet_word_every_job_is_read_every_tick(node):
    sampler = sampler_of(node)
    for _ in range(4):
        s, read = node.tick(sampler, quiet=None)
        node.advance(1.0)
        assert sorted(read) == sorted(node.rates) and s.jobs_current


@given(every=st.integers(1, 8), jobs=st.integers(0, 30),
       steps=st.lists(st.tuples(st.integers(0, 29), st.floats(0, 40)), min_size=1, max_size=30))
def test_property_rates_are_exact_means_and_no_job_waits_longer_than_its_turn(tmp_path_factory, every, jobs, steps):
    root = tmp_path_factory.mktemp("resctrl")
    (root / "mon_data" / "mon_L3_00").mkdir(parents=True)
    node = Node(str(root), jobs)
    sampler = sampler_of(node)
    quiet = QuietRead(below_bps=50 * GB, every=every)
    history: dict[str, list[tuple[float, float]]] = {j: [] for j in node.rates}  # (time, bytes) at each read
    last_read: dict[str, int] = {}
    for tick, (who, gbps) in enumerate(steps):
        node.advance(1.0)
        if jobs:
            node.rates[f"j{who % jobs}"] = gbps * GB
        before = dict(node.bytes)
        s, read = node.tick(sampler, quiet)
        true_node = sum(node.rates.values()) + node.own_rate
        for j in read:
            if history[j]:
                t0, b0 = history[j][-1]
                assert s.job_bps[j][0] == pytest.approx((before[j] - b0) / (node.now - t0), rel=1e-6, abs=2)
            history[j].append((node.now, before[j]))
            last_read[j] = tick
        if tick >= 1:
            # the node's rate is the last second's, thin or not
            assert s.node_bps[0] == pytest.approx(true_node_prev_mean(node, prev_total, prev_now), rel=1e-6, abs=2)
        if tick >= 1 and s.jobs_current:
            assert sorted(read) == sorted(node.rates)
        assert all(tick - t < max(every, 1) for t in last_read.values()) or not jobs
        prev_total, prev_now = node.own + sum(node.bytes.values()), node.now
        assert true_node >= 0


def true_node_prev_mean(node, prev_total, prev_now):
    return (node.own + sum(node.bytes.values()) - prev_total) / (node.now - prev_now)


# --- Review (helper V): the sampler's thin reads driven into the contention policy, the way
# the Daemon does (noded.loop.daemon._quiet_read: the quiet word only while nothing is
# throttled and no per-job cap is configured; its bound half the threshold of the peak).

from types import MappingProxyType  # noqa: E402

from noded.capping.service import CapService  # noqa: E402
from noded.config import Config, ContentionConfig, ResctrlConfig  # noqa: E402
from noded.loop.daemon import Daemon  # noqa: E402
from noded.jobs.model import JobMeta  # noqa: E402
from noded.policy.contention import PolicyState, decide  # noqa: E402
from noded.samplers.sample import CPU, GPU, JobSample, Sample  # noqa: E402

PEAK = 100 * GB  # per domain: half of a 0.8 threshold is 40 GB/s, twice the quiet node's 20.5
POLICY = ContentionConfig(threshold=0.8, release_threshold=0.6, hold_s=10, settle_s=2, gpu_drop_margin=0.1)


def quiet_word(config, state, every):
    """What the Daemon gives the sampler (its own _quiet_read, over a last tick that left
    what the policy's state holds throttled, nothing capped or overridden)."""
    cfg = Config(peak_gbps_per_domain=PEAK / GB, contention=config, resctrl=ResctrlConfig(quiet_read_every=every))
    last = SimpleNamespace(levels={j: t.level for j, t in state.throttles.items()}, caps={},
                           control=SimpleNamespace(overrides={}))
    return Daemon._quiet_read(SimpleNamespace(config=cfg, last=last, state=state))


def policy_sample(bs, t, gpu_util):
    """The Sample the policy sees of one BandwidthSample: every model job a CPU job, and a
    GPU job "nlp" (no group of its own: its traffic is the root's own) at ``gpu_util``."""
    def job(jid, kind, util, bw):
        return JobSample(jid, "registered", frozenset(), JobMeta(), kind, ("GPU-0",) if kind == GPU else (),
                         util, bw, "own")
    jobs = {j: job(j, CPU, None, None if None in r.values() else sum(r.values())) for j, r in bs.job_bps.items()}
    jobs["nlp"] = job("nlp", GPU, gpu_util, None)
    return Sample(t, MappingProxyType(jobs), (), True, None, bs.domains, MappingProxyType(dict(bs.node_bps)),
                  bs.missing, (), job_bandwidth_current=bs.jobs_current)


def drive(node, sampler, state, config, every, gpu_util):
    """One tick as the Daemon runs it: sample (thin where the quiet word allows), decide."""
    node.reads = []
    bs = sampler.sample(node.rc, 1, dict(node.groups), quiet_word(config, state, every))
    read = [p.rsplit("/", 1)[1] for p in node.reads if p != node.root]
    s = policy_sample(bs, node.now, gpu_util)
    d, state = decide(s, state, config, PEAK, {j: 5 for j in s.jobs}, node.now)
    return bs, read, d, state


@pytest.mark.parametrize("every", [1, 5])
@pytest.mark.parametrize("period", [2, 4])
def test_a_hog_that_bursts_every_few_ticks_is_throttled_as_when_every_job_is_read_every_tick(node, every, period):
    sampler, state = sampler_of(node), PolicyState()
    for i in range(3):  # quiet: nlp's baseline learned at 80 %
        node.advance(1.0 * bool(i))
        _, _, _, state = drive(node, sampler, state, POLICY, every, 80)
    throttled = []
    for tick in range(20):
        burst = tick % period == 0
        node.rates["j7"] = 70 * GB if burst else 1 * GB  # 89.5 GB/s, 0.9 of the peak, on a burst
        node.advance(1.0)
        bs, _, d, state = drive(node, sampler, state, POLICY, every, 40 if burst else 80)
        if burst:
            assert d.node_share == pytest.approx(0.895) and d.slowed == ("nlp",)
        throttled += [a for a in d.actions if a.job == "j7" and a.to_level > a.from_level]
    assert throttled, "j7 pushed the node to 0.9 of its peak and slowed nlp, and was never throttled"


def test_a_node_once_at_the_bound_is_read_in_full_until_it_stayed_below_it_calm_s(node):
    sampler = sampler_of(node)
    quiet = QUIET._replace(calm_s=3.0)
    for i in range(4):
        node.advance(1.0 * bool(i))
        node.tick(sampler, quiet)
    node.rates["j7"] = 40 * GB  # 59.5 GB/s: at the bound (50) for one second
    node.advance(1.0)
    s, read = node.tick(sampler, quiet)
    assert len(read) == 20 and not s.jobs_current
    node.rates["j7"] = 1 * GB
    for _ in range(2):  # 1 s and 2 s after: below the bound, not yet for calm_s
        node.advance(1.0)
        s, read = node.tick(sampler, quiet)
        assert len(read) == 20 and s.jobs_current and s.node_bps[0] == pytest.approx(20.5 * GB)
    node.advance(1.0)  # 3 s after: calm
    s, read = node.tick(sampler, quiet)
    assert len(read) == 4 and not s.jobs_current


def j7_read_then_dropped(node, sampler, state, every):
    """j7 at 8 GB/s (the node at 27.5 GB/s: quiet) until 3 ticks past its read on a thin
    tick, then at 1 GB/s for a second: its mean since its last read is 6.25 GB/s."""
    node.rates["j7"] = 8 * GB
    for i in range(3):
        node.advance(1.0 * bool(i))
        _, _, _, state = drive(node, sampler, state, POLICY, every, 80)
    for _ in range(10):  # until j7's turn
        node.advance(1.0)
        _, read, _, state = drive(node, sampler, state, POLICY, every, 80)
        if "j7" in read:
            break
    assert "j7" in read
    for _ in range(3):
        node.advance(1.0)
        _, _, _, state = drive(node, sampler, state, POLICY, every, 80)
    node.rates["j7"] = 1 * GB
    node.advance(1.0)
    return state


@pytest.mark.parametrize("every", [1, 5])
def test_a_cap_set_by_a_reload_while_thin_does_not_step_down_a_job_on_a_stale_mean(node, every):
    sampler = sampler_of(node)
    state = j7_read_then_dropped(node, sampler, PolicyState(), every)
    # j7 has dropped, and an operator's reload sets a 5 GB/s per-job cap
    capped = ContentionConfig(**{**POLICY.__dict__, "cpu_job_cap_gbps": 5.0})
    bs, read, d, state = drive(node, sampler, state, capped, every, 80)
    assert "j7" in read  # read in full: the cap takes the quiet word away
    steps = [a for a in d.actions if a.job == "j7"]
    assert not steps, f"j7 at 1 GB/s over the last second stepped down: {steps[0].reason}"


@pytest.mark.parametrize("quiet", [None, QUIET])
def test_the_node_rate_on_a_tick_whose_groups_changed_after_thin_ticks_is_the_last_ticks(node, quiet):
    # Before its fix: the node's rate on such a tick summed residuals last read at the last
    # full tick (any number of ticks ago) and job means since each job's last read; it read
    # 20.5 GB/s when 50 moved. Now the removed group's last counts are added back to the
    # root's total, whose meter goes on: the last second's rate, thin before or not.
    sampler = sampler_of(node)
    for i in range(30):  # read thin: 28 thin ticks, the root's residual last read 29 s ago
        node.advance(1.0 * bool(i))
        node.tick(sampler, quiet)
    node.own_rate = 30 * GB  # tasks in the root's own RMID rise (still under the bound: 49.5 < 50)
    node.advance(1.0)
    last = node.remove("j3")  # its job ended: on the kernel the root's total drops by its count
    s, read = node.tick(sampler, quiet, last)
    assert sorted(read) == sorted(node.rates)
    assert s.node_bps[0] == pytest.approx(20 * GB + 30 * GB, rel=1e-6)  # j3 ran the whole second
    # and on: a job made, another removed, the node's rate the last second's each tick
    node.advance(1.0)
    node.rates["n1"], node.bytes["n1"] = 2 * GB, 0.0  # made as the tick reads: nothing counted yet
    node.groups["n1"] = SimpleNamespace(path=f"{node.root}/mon_groups/n1", parent=SimpleNamespace(path=node.root))
    s, _ = node.tick(sampler, quiet)
    assert s.node_bps[0] == pytest.approx(19 * GB + 30 * GB, rel=1e-6)
    node.advance(1.0)
    s, _ = node.tick(sampler, quiet, node.remove("j5"))
    assert s.node_bps[0] == pytest.approx(19 * GB + 2 * GB + 30 * GB, rel=1e-6)


def test_a_group_removed_by_someone_else_starts_the_totals_again(node):
    # unread before its rmdir, its count is gone from the total: the totals cannot go on,
    # so that tick's node rate is the residuals' sum (read every tick here: exact)
    sampler = sampler_of(node)
    for i in range(3):
        node.advance(1.0 * bool(i))
        node.tick(sampler, None)
    node.advance(1.0)
    s, _ = node.tick(sampler, None, node.remove("j3", read_first=False))
    assert s.node_bps[0] == pytest.approx(19.5 * GB, rel=0.02)
    node.advance(1.0)
    s, _ = node.tick(sampler, None)
    assert s.node_bps[0] == pytest.approx(19.5 * GB, rel=1e-6)


@given(calm=st.sampled_from([0.0, 2.0, 10.0]), every=st.integers(2, 6), jobs=st.integers(0, 12),
       steps=st.lists(st.tuples(st.sampled_from(["rate", "add", "remove", "own", "none", "none", "none"]), st.integers(0, 40),
                                st.floats(0, 30)), min_size=1, max_size=40))
def test_property_groups_made_and_removed_any_tick_the_node_and_current_rates_hold(tmp_path_factory, calm, every,
                                                                                     jobs, steps):
    # jobs arriving and leaving at any tick, rates and the root's own moving, the node crossing
    # the quiet bound (15 GB/s) both ways: no exception; the node's rate is the last second's
    # on every tick whose groups stayed as they were since the tick before; a tick that says
    # its job rates are current has each job's over the last second; no job waits past its
    # turn while the groups stay; nothing kept of a job that left
    root = tmp_path_factory.mktemp("resctrl")
    (root / "mon_data" / "mon_L3_00").mkdir(parents=True)
    node = Node(str(root), jobs)
    created: dict[str, float] = {}
    sampler = BandwidthSampler(SimpleNamespace(created_at=created.get), node, clock=lambda: node.now)
    quiet = QuietRead(below_bps=15 * GB, every=every, calm_s=calm)
    made, changed_before, before, last_read = jobs, True, set(), {}
    for tick, (op, who, gbps) in enumerate(steps):
        names, changed = sorted(node.groups), op in ("add", "remove")
        if op == "rate" and names:
            node.rates[names[who % len(names)]] = gbps * GB
        elif op == "own":
            node.own_rate = gbps * GB
        elif op == "add":
            j, made = f"n{made}", made + 1
            node.rates[j], node.bytes[j], created[j] = gbps * GB, 0.0, node.now
            node.groups[j] = SimpleNamespace(path=f"{root}/mon_groups/{j}", parent=SimpleNamespace(path=str(root)))
        elif op == "remove" and names:
            j = names[who % len(names)]
            del node.groups[j], node.bytes[j], node.rates[j]  # the root's total drops by its count
            last_read.pop(j, None)
        node.advance(1.0)
        s, read = node.tick(sampler, quiet)
        last_read.update(dict.fromkeys(read, tick))
        if tick >= 2 and not changed and not changed_before:
            assert s.node_bps[0] == pytest.approx(sum(node.rates.values()) + node.own_rate, rel=1e-6, abs=10)
        if s.jobs_current:
            for j in set(node.groups) & before:
                assert s.job_bps[j][0] == pytest.approx(node.rates[j], rel=1e-6, abs=10)
        if not changed:
            assert all(tick - t < every for t in last_read.values()), last_read
        assert s.job_bps.keys() == node.groups.keys()
        assert sampler._job_meters.keys() <= node.groups.keys() and sampler._job_read_at.keys() <= node.groups.keys()
        before, changed_before = set(node.groups), changed


@pytest.mark.parametrize("every", [1, 5])
def test_a_reserve_set_by_a_reload_while_thin_caps_no_job_on_a_stale_mean(node, every):
    sampler = sampler_of(node)
    state = j7_read_then_dropped(node, sampler, PolicyState(), every)
    # j7 has dropped; a reload keeps 77 GB/s of the 100 for GPU jobs: the 20 GB/s the CPU
    # jobs move fits in the 23 left (their stale means, 25.25, do not)
    reserve = ContentionConfig(**{**POLICY.__dict__, "gpu_reserve_gbps": 77.0})
    node.reads = []
    bs = sampler.sample(node.rc, 1, dict(node.groups), quiet_word(reserve, state, every))
    assert "j7" in [p.rsplit("/", 1)[1] for p in node.reads]  # read in full: the reserve takes the quiet word away
    caps = CapService(lambda: None, lambda job: job).plan(policy_sample(bs, node.now, 80), {}, {}, 77 * GB, PEAK)
    assert not caps, caps


class KernelNode(Node):
    """The counter model with the kernel's sum over a control group's RMIDs as it is
    (fs/resctrl/monitor.c, mon_event_count): a monitoring group whose read fails (Error,
    Unavailable) is left out of its control group's total, silently, where any read of
    the group succeeded; its own file says the word."""

    def __init__(self, root, jobs):
        super().__init__(root, jobs)
        self.failing: set[str] = set()

    def read(self, path, domains):
        job = path.rsplit("/", 1)[1]
        if path != self.root and job in self.failing:
            self.reads.append(path)
            return {d: {MBM_TOTAL: CounterReading(None, "Error")} for d in domains}
        if path == self.root:
            self.reads.append(path)
            value = self.own + sum(b for j, b in self.bytes.items() if j not in self.failing)
            return {d: {MBM_TOTAL: CounterReading(int(value))} for d in domains}
        return super().read(path, domains)


@pytest.mark.parametrize("quiet", [None, QUIET])
def test_a_job_whose_counter_fails_makes_the_node_unknown_never_a_total_without_it_nor_a_spike(tmp_path, quiet):
    (tmp_path / "mon_data" / "mon_L3_00").mkdir(parents=True)
    node = KernelNode(str(tmp_path), 20)
    sampler = sampler_of(node)
    for i in range(300):  # five minutes quiet: j3 has counted 300 GB
        node.advance(1.0 * bool(i))
        node.tick(sampler, quiet)
    node.failing.add("j3")  # its counter reads Error for 3 ticks (the hardware's error bit)
    seen = []
    for _ in range(3):
        node.advance(1.0)
        s, _ = node.tick(sampler, quiet)
        seen.append(s.node_bps[0])
    node.failing.clear()
    for _ in range(3):
        node.advance(1.0)
        s, _ = node.tick(sampler, quiet)
        seen.append(s.node_bps[0])
    # while j3's traffic is unknown the node's is; never a rate short of j3's, never its 300 GB at once
    assert all(v is None or v == pytest.approx(20.5 * GB) for v in seen), [v and v / GB for v in seen]
    assert seen[:3] == [None] * 3 and seen[-1] == pytest.approx(20.5 * GB)


def test_a_new_jobs_second_read_is_on_the_next_tick_even_when_read_thin(node):
    # its first rate is over its whole life (a ramp included); carried for a thin cycle it
    # read a hog low for 5 s (test_cap_closids took c's free rate from it, under load)
    created = {}
    sampler = BandwidthSampler(SimpleNamespace(created_at=created.get), node, clock=lambda: node.now)
    warm(node, sampler, 4)
    node.advance(1.0)
    node.rates["n1"], node.bytes["n1"], created["n1"] = 8 * GB, 0.0, node.now - 1.0
    node.bytes["n1"] = 2 * GB  # its first second: a ramp, 2 GB where it now moves 8 a second
    node.groups["n1"] = SimpleNamespace(path=f"{node.root}/mon_groups/n1", parent=SimpleNamespace(path=node.root))
    s, read = node.tick(sampler)
    assert "n1" in read and s.job_bps["n1"][0] == pytest.approx(2 * GB)
    node.advance(1.0)
    s, read = node.tick(sampler)  # thin: n1 among the jobs read
    assert "n1" in read and len(read) == 5 and not s.jobs_current
    assert s.job_bps["n1"][0] == pytest.approx(8 * GB)


def test_a_carried_rate_says_how_old_it_is_and_what_it_is_a_mean_over(node):
    """On a thin tick a job's rate is its mean up to its last read, carried: the sample now
    says, for each job not read this tick, how long ago it was read, and for each job the
    span its rate is a mean over (before, nothing said a carried rate from a fresh one but
    one flag for the whole node)."""
    sampler = sampler_of(node)
    warm(node, sampler, 2)  # every job read at 0 and 1
    read_at = {j: 1.0 for j in node.rates}
    window = {j: 1.0 for j in node.rates}
    for _ in range(7):
        node.advance(1.0)
        s, read = node.tick(sampler)
        for j in read:
            window[j], read_at[j] = node.now - read_at[j], node.now
        assert not s.jobs_current and s.job_age_s == {j: node.now - read_at[j] for j in node.rates if j not in read}
        assert all(s.job_age_s[j] >= 1.0 for j in s.job_age_s)
        assert dict(s.job_window_s) == window
    assert max(window.values()) == 5.0  # each job read every fifth tick
    node.rates["j0"] = 60 * GB  # past the quiet bound: every job read at once, over its own span
    node.advance(1.0)
    s, read = node.tick(sampler)
    assert sorted(read) == sorted(node.rates) and s.job_age_s == {}
    assert dict(s.job_window_s) == {j: node.now - read_at[j] for j in node.rates}


def test_explain_says_how_old_each_jobs_rate_is(tmp_path, node):
    """nodectl explain: a carried rate says when it was read and what it is a mean over; a
    rate read this tick says so; an answer of a noded before it (no bandwidth_read) shows neither."""
    from noded.admin import answertext
    from noded.admin.commands import AdminCommands
    from noded.admin.replyshape import check_reply
    from noded.jobs.model import Job
    from noded.loop.control import ControlState
    from noded.loop.daemon import TickResult
    from noded.loop.overrides import OverrideStore
    from noded.policy.contention import Decision
    from noded.samplers.sample import build_sample

    sampler = sampler_of(node)
    warm(node, sampler, 2)
    for _ in range(3):
        node.advance(1.0)
        bs, read = node.tick(sampler)
    carried = sorted(bs.job_age_s)[0]
    sample = build_sample(node.now, {j: Job(j, "registered", frozenset()) for j in node.rates}, None, None, bs)
    assert sample.jobs[read[0]].bandwidth_age_s == 0.0 and sample.jobs[carried].bandwidth_age_s >= 1.0
    result = TickResult(1, node.now, sample, Decision(MappingProxyType({}), (), False, 0.2, (), ""), (),
                        MappingProxyType({}), "mba", MappingProxyType({}), config=Config(peak_gbps_per_domain=100))
    commands = AdminCommands(ControlState(OverrideStore(str(tmp_path / "state"), lambda: 1000.0)), lambda: result)
    for job, said in ((carried, f"(carried: read {bs.job_age_s[carried]:g}s ago, its mean over "
                                f"{bs.job_window_s[carried]:g}s;"), (read[0], "(read this tick, its mean over 3s)")):
        answer = json.loads(json.dumps(commands.explain(job)))  # as the socket carries it
        check_reply("explain", answer)
        assert said in answertext.format_explain(answertext.shown(answer)).splitlines()[0]
        del answer["bandwidth_read"]  # as a noded before it answers
        check_reply("explain", answer)
        assert "read" not in answertext.format_explain(answertext.shown(answer)).splitlines()[0]
