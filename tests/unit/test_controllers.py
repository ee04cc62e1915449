"""Controllers as files (issue #25, item 1): a tick is sample -> each controller proposes ->
one plan per knob -> apply -> result, and a new controller (a bandwidth cap, network
shaping) is a file of its package registered in the wiring, not a branch in the tick.

Here a toy controller, registered through Parts and nothing else, proposes on a knob, and
the knob's planner and its one writer apply it; the tick, the planners and the writers are
the product's, unchanged. Before, Parts had no controllers to register (a new controller was
a branch of ``Daemon._decide``/``_act``)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from noded.actuators.plan import CAPPED, Applied, ApplyResult
from noded.config import Config
from noded.capping.service import CapState
from noded.knobs.controller import ControllerCycle, Found, Proposals, Proposer, in_reading_order
from noded.loop.daemon import Daemon
from noded.loop.parts import Parts
from noded.loop.planners import plan_knobs

from test_tick_snapshot import JOB, OneCpuJob


class RecordingThrottle:
    """A throttle (loop.parts.Throttle) that records each plan of levels it is handed and
    takes it whole: the knob's one writer, as the tick drives it."""

    kind = "mba"

    def __init__(self):
        self.handed: list[dict[str, int]] = []
        self.in_force: dict[str, int] = {}

    def max_levels(self, sample):
        return {j: 4 for j in sample.jobs}

    def levels_in_force(self, sample):
        return {j: self.in_force.get(j, 0) for j in sample.jobs}

    def level_share(self, level):
        return 0.5 ** level

    def apply(self, levels, sample):
        self.handed.append(dict(levels))
        applied = tuple(Applied(j, lvl, 1, None, self.in_force.get(j, 0)) for j, lvl in sorted(levels.items())
                        if self.in_force.get(j, 0) != lvl)
        self.in_force = {j: lvl for j, lvl in levels.items() if lvl}
        return ApplyResult(applied, MappingProxyType(dict(self.in_force)))

    def release_all(self):
        return []

    def use_peak(self, peak):
        pass


class HoldAtTwo(Proposer):
    """A toy controller, one file's worth: every CPU job at level 2, and told after the writes."""

    name = "hold-at-two"

    def __init__(self):
        self.told: list[object] = []

    def propose(self, reading, proposed):
        return Proposals(levels={j: 2 for j, js in reading.sample.jobs.items() if js.kind == "cpu"})

    def after_apply(self, reading, plans, outcome):
        self.told.append(outcome.levels)


def test_a_controller_registered_through_parts_proposes_and_its_knobs_writer_applies_it():
    throttle, toy = RecordingThrottle(), HoldAtTwo()
    daemon = Daemon(Config(), Parts(OneCpuJob(), throttle=throttle, controllers=(toy,)))
    result = daemon.tick()
    assert throttle.handed == [{JOB: 2}]  # contention asked nothing (no GPU job starved): the toy's plan
    assert result.levels == {JOB: 2} and [(a.job, a.level) for a in result.applied] == [(JOB, 2)]
    assert len(toy.told) == 1 and toy.told[0].levels == {JOB: 2}  # told what was written
    assert [c.name for c in daemon.controllers] == ["contention", "hold-at-two"]


def test_without_it_the_same_tick_writes_nothing():
    throttle = RecordingThrottle()
    result = Daemon(Config(), Parts(OneCpuJob(), throttle=throttle)).tick()
    assert throttle.handed == [{}] and result.levels == {} and result.applied == ()


def test_one_plan_per_knob_a_cap_over_a_level_and_the_later_controller_over_the_earlier():
    plans = plan_knobs((Proposals(capped={"b": "cap of b"}), Proposals(levels={"a": 1, "b": 3, "c": 2}),
                        Proposals(levels={"c": 1})))
    assert dict(plans.places) == {"a": 1, "b": CAPPED, "c": 1} and dict(plans.capped) == {"b": "cap of b"}
    assert plans.cpus is None and plans.memory is None and plans.fewer_cores == ()


def test_controllers_hold_no_actuator_the_loop_hands_each_knob_to_its_one_writer():
    """The types say who writes: a controller gets a Reading and returns Proposals (frozen);
    only the loop's appliers are given the throttle, the owner of CPUs, the soft limits."""
    import dataclasses

    daemon = Daemon(Config(), Parts(OneCpuJob(), throttle=RecordingThrottle()))
    proposals = Proposals(levels={JOB: 1})
    try:
        proposals.levels = {}  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a controller's proposals could be changed after it made them")
    assert daemon.appliers.throttle is daemon.parts.throttle
    assert all(not hasattr(c, "throttle") and not hasattr(c, "apply") for c in daemon.controllers)


class CapsAfterTheWrites(Proposer):
    """A toy controller that finds, once the writes are done, the caps the tick's result
    shows (as the caps' controller finds where each capped job is held)."""

    name = "caps-seen"

    def __init__(self):
        self.ticks = 0

    def propose(self, reading, proposed):
        return Proposals()

    def after_apply(self, reading, plans, outcome):
        self.ticks += 1
        return Found(caps=MappingProxyType({JOB: CapState(float(self.ticks), "override", "toy", None, None, None)}))


class JobsUnknownAfterTheFirst(OneCpuJob):
    def sample(self, quiet=None):
        first = super().sample()
        return first if self.t == 1.0 else replace(first, jobs_known=False)


def test_the_tick_result_is_what_the_controllers_found_this_tick_not_what_a_part_says_afterwards():
    """One source per fact (issue #25): the result's caps are what a controller found this
    tick (before, ``_publish`` asked ``parts.caps`` itself: a controller's findings went
    nowhere, and a part off meant nothing to show whatever the controllers found)."""
    daemon = Daemon(Config(), Parts(OneCpuJob(), throttle=RecordingThrottle(), controllers=(CapsAfterTheWrites(),)))
    assert daemon.tick().caps[JOB].cap_bps == 1.0
    assert daemon.tick().caps[JOB].cap_bps == 2.0  # this tick's finding, not the first's


def test_a_tick_that_proposes_nothing_jobs_unknown_holds_what_the_controllers_found_last():
    toy = CapsAfterTheWrites()
    daemon = Daemon(Config(), Parts(JobsUnknownAfterTheFirst(), throttle=RecordingThrottle(), controllers=(toy,)))
    first = daemon.tick()
    held = daemon.tick()
    assert toy.ticks == 1 and held.caps == first.caps and held.decision.note.startswith("holding")


def test_a_later_finding_replaces_an_earlier_one_and_none_keeps_it():
    early = Found(stuck="early", caps=MappingProxyType({}))
    assert early.then(Found(stuck="late")) == Found(stuck="late", caps=MappingProxyType({}))
    assert early.then(None) is early


class Named(Proposer):
    def __init__(self, name, reads=()):
        self.name, self.reads = name, tuple(reads)

    def propose(self, reading, proposed):
        return Proposals(levels={j: len(proposed) for j in reading.sample.jobs})


def test_a_controller_proposes_after_those_it_reads_whatever_the_order_registered():
    """Each controller says whose proposals it reads (``reads``) and the order follows from
    it (before, Parts.tick_controllers ordered them by hand: registered in this order, the
    reader proposed first and saw nothing)."""
    reader, source = Named("reader", reads=("source",)), Named("source")
    daemon = Daemon(Config(), Parts(OneCpuJob(), throttle=RecordingThrottle(), controllers=(reader, source)))
    assert [c.name for c in daemon.controllers] == ["contention", "source", "reader"]
    # the built-ins: the caps before contention, contention before right-sizing's CPUs, the rest as listed
    built = [Named("caps"), Named("contention", ("caps",)), Named("rightsize", ("contention",)), Named("memory"),
             Named("colocation")]
    assert in_reading_order(built[::-1]) == (built[4], built[3], built[0], built[1], built[2])
    assert in_reading_order(built) == tuple(built)


def test_controllers_reading_each_other_in_a_circle_are_refused_naming_the_circle():
    a, b, c = Named("a", reads=("c",)), Named("b", reads=("a",)), Named("c", reads=("b", "gone"))
    try:
        Daemon(Config(), Parts(OneCpuJob(), throttle=RecordingThrottle(), controllers=(a, b, c, Named("d"))))
    except ControllerCycle as e:
        assert "a -> c -> b -> a" in str(e), e
    else:
        raise AssertionError("a circle of controllers was taken")


class Seeing(Proposer):
    """Proposes a level on every job and keeps the names of the proposals it was given."""

    def __init__(self, name, reads=()):
        self.name, self.reads, self.saw = name, tuple(reads), []

    def propose(self, reading, proposed):
        self.saw.append(tuple(sorted(j for p in proposed for j in p.levels or {})))
        return Proposals(levels={f"{self.name}-job": 1})


def test_a_controller_sees_the_proposals_of_those_it_reads_and_nothing_of_the_others():
    """What a controller proposes depends only on what it declared it reads (before, each
    saw every earlier proposal, so one registered later could read another's without
    saying so, and the order alone decided what it saw)."""
    a, b, reader = Seeing("a"), Seeing("b"), Seeing("reader", reads=("b",))
    daemon = Daemon(Config(), Parts(OneCpuJob(), throttle=RecordingThrottle(), controllers=(a, b, reader)))
    daemon.tick()
    assert reader.saw == [("b-job",)] and a.saw == [()] and b.saw == [()]


def test_two_controllers_of_one_name_are_refused_naming_it():
    """A name is what another controller's ``reads`` points at: two of one name would make
    what a reader sees depend on which registered last."""
    try:
        in_reading_order((Named("twin"), Named("other"), Named("twin")))
    except ValueError as e:
        assert "twin" in str(e), e
    else:
        raise AssertionError("two controllers named alike were taken")


class MpsThatStops:
    """An MPS supervisor as co-location reads it (its own thread keeps MPS up between ticks):
    its state, set here as the supervisor would when MPS stops."""

    state, last_error, restarts, start_failures, pipe_dir = "ok", None, 0, 0, None


def test_a_tick_with_the_jobs_unknown_shows_what_moves_between_ticks_as_it_is_now():
    """Holding the last findings (above) is for what a tick finds; MPS's state and the
    admissions move between ticks, on their own threads and on operators' requests. Before,
    a tick with the jobs unknown showed the last tick's: noded_mps_up stayed 1 with MPS down
    (NodedMpsDown could not fire while discovery failed) and admissions went uncounted."""
    from noded.colocation.admission import ColocationRule
    from noded.colocation.service import Colocation

    mps = MpsThatStops()
    colocation = Colocation(ColocationRule(), {}, mps=mps, clock=lambda: 0.0)  # type: ignore[arg-type]
    daemon = Daemon(Config(), Parts(JobsUnknownAfterTheFirst(), throttle=RecordingThrottle(), colocation=colocation))
    first = daemon.tick()
    assert first.colocation.mps_state == "ok" and first.colocation.decisions["refuse"] == 0
    mps.state = "failed"
    colocation.admit("slurm:7", None, model="m", batch_size=1)  # refused: nothing sampled (counted all the same)
    held = daemon.tick()
    assert held.decision.note.startswith("holding")
    assert held.colocation.mps_state == "failed" and held.colocation.decisions["refuse"] == 1
