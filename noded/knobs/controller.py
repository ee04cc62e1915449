"""A controller, the tick's reading it proposes from, and what it may propose, per knob.

A tick reads: sample -> each controller proposes (after the controllers whose proposals it
reads, its ``reads``; otherwise in the order the wiring registered them; each seeing what
those it reads proposed, nothing of the others) -> one plan per knob, merged by the knob's planner
(noded.loop.planners) -> the actuators apply each plan -> the tick's result.

No controller holds an actuator: a knob's only writer is the actuator its planner hands
the plan to. Precedence where two controllers propose on one knob (the planners say it too):

* where a CPU job's tasks go (its ``levels``' group, or its cap's own: ``capped``): a cap
  over contention's level (contention's levels carry the operators' level overrides; the
  caps carry the operators' caps, and an operator's level is never capped);
* each job's CPUs: right-sizing's plan (``cpus``), then each ``fewer_cores`` on top (a
  capped job's cores halved from whatever the plan gave it);
* memory soft limits: right-sizing's memory alone (``memory``).

Among several proposals of one kind on one job, the controller registered later wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Protocol, Sequence

from noded.config import Config
from noded.samplers.memcgroups import MemoryCgroup
from noded.samplers.sample import JobSample, Sample
from noded.stores.originals import OriginalValues
from noded.util.cputree import CpuSet

if TYPE_CHECKING:  # annotations only: the words of the controllers, actuators and loop, above this layer
    from noded.actuators.cpusets import CpuSetResult
    from noded.actuators.memsoft import MemoryResult
    from noded.actuators.plan import ApplyResult
    from noded.capping.plan import Cap
    from noded.capping.service import CapState
    from noded.colocation.view import ColocationView
    from noded.loop.overrides import Override
    from noded.policy.contention import Decision
    from noded.rightsize.memsplit import MemorySplit
    from noded.rightsize.service import RightsizeView


@dataclass(frozen=True)
class Reading:
    """What every controller sees of a tick, read once before any proposes: the Sample, the
    operators' one reading (pause, overrides by job), and what the throttle has in force."""

    sample: Sample
    config: Config
    now: float
    paused: str | None = None  # why the eliminator is paused, or None
    overrides: Mapping[str, Override] = field(default_factory=lambda: MappingProxyType({}))  # by job
    unwritable: str | None = None  # why the state directory cannot be written (nothing new may change), or None
    throttle_kind: str | None = None  # mba | cores | None (nothing can throttle here)
    in_force: Mapping[str, int | None] = field(default_factory=lambda: MappingProxyType({}))  # levels read now
    capped_in_force: frozenset[str] = frozenset()  # jobs in a cap's own group now
    max_levels: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # as far as each may go
    level_share: Callable[[int], float] = lambda level: 1.0  # the bandwidth a level leaves


class CpuView(Protocol):
    """One job's CPUs as the owner of every job's CPUs sees them."""

    @property
    def original(self) -> CpuSet: ...  # before noded touched them: recorded, else as they are now

    @property
    def now(self) -> CpuSet: ...


class CpuRecords(Protocol):
    """What a controller may read of the one owner of every job's CPUs (never write)."""

    originals: OriginalValues

    def view(self, job: str, js: JobSample) -> CpuView | None: ...


@dataclass(frozen=True)
class CpuWishes:
    """A plan of every planned job's CPUs (right-sizing's), and what it granted each CPU
    job before halving: a cores host reads the next tick's levels in force against it."""

    cpus: Mapping[str, tuple[int, ...]]
    granted: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))


class FewerCores(Protocol):
    """A change on top of the plan of CPUs: ``wishes`` from the CPUs wished so far (``base``,
    the plan's or none); ``has_records``: whether the owner holds CPUs of its to put back,
    so that with no wish left there is still something to write."""

    def wishes(self, base: Mapping[str, Iterable[int] | None],
               owner: CpuRecords) -> dict[str, Iterable[int] | None]: ...

    def has_records(self, owner: CpuRecords) -> bool: ...


@dataclass(frozen=True)
class MemoryWishes:
    """Soft limits wished (job -> bytes) on the memory cgroups read (job -> cgroup); jobs
    of the split whose cgroup was not read (job -> why) keep what they have. ``split`` and
    ``error`` are for the tick's result: the split made, or why none could be (then nothing
    is wished and nothing changes)."""

    wishes: Mapping[str, int] | None
    cgroups: Mapping[str, MemoryCgroup] = field(default_factory=lambda: MappingProxyType({}))
    unplaced: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    split: MemorySplit | None = None
    error: str | None = None


@dataclass(frozen=True)
class Found:
    """What controllers found for the tick's result, each fact from the one controller that
    finds it (None: not this one's): contention's decision and why contention lasts with
    nothing left to throttle, right-sizing's view (when they propose); the caps' and
    co-location's (after the writes: where each capped job is held now, the reservations
    left once ended jobs' are dropped)."""

    decision: Decision | None = None
    stuck: str | None = None
    rightsize: RightsizeView | None = None
    colocation: ColocationView | None = None
    caps: Mapping[str, CapState] | None = None

    def then(self, later: Found | None) -> Found:
        """These findings with ``later``'s on top (a fact it found replaces this one's)."""
        if later is None:
            return self
        return Found(**{f.name: getattr(later, f.name) if getattr(later, f.name) is not None
                        else getattr(self, f.name) for f in fields(self)})


NO_FINDINGS = Found()


@dataclass(frozen=True)
class Proposals:
    """What one controller proposes this tick, per knob (None: nothing on that knob), and
    what it found for the tick's result."""

    levels: Mapping[str, int] | None = None  # where CPU jobs go: a level per job (0: none)
    capped: Mapping[str, Cap] | None = None  # where CPU jobs go: held at a cap
    cpus: CpuWishes | None = None  # each planned job's CPUs
    fewer_cores: FewerCores | None = None  # on top of the plan of CPUs
    memory: MemoryWishes | None = None  # memory soft limits
    found: Found = NO_FINDINGS


NOTHING = Proposals()


@dataclass(frozen=True)
class Plans:
    """One plan per knob, merged from every controller's proposals by the loop's planners:
    what the actuators write this tick."""

    places: Mapping[str, int]  # where each CPU job goes: its level, or actuators.plan.CAPPED
    capped: Mapping[str, Cap]  # the cap each job is held at (its place is CAPPED)
    cpus: CpuWishes | None  # each planned job's CPUs (None: no plan of CPUs this tick)
    fewer_cores: tuple[FewerCores, ...]  # on top of the plan's CPUs, in order
    memory: MemoryWishes | None  # memory soft limits (None: not sized)


@dataclass(frozen=True)
class Outcome:
    """What the actuators did with the plans: the levels' result, the owner of CPUs' (None:
    nothing written), the soft limits' (None: nothing written), and the capped jobs that
    are in their cap's group now."""

    levels: ApplyResult
    cpus: CpuSetResult | None = None
    memory: MemoryResult | None = None
    in_cap_group: frozenset[str] = frozenset()


class Controller(Protocol):
    """One controller: a file of its package, registered by the wiring (noded.loop.parts).
    ``propose`` is given what the controllers it reads proposed (``proposed``: those named
    in its ``reads``, in the order they proposed), never the others', and never calls one; ``before_apply`` and ``after_apply`` are told around the actuators'
    writes (a cap's holder steers its group between ticks): most do nothing there.
    ``after_apply`` returns what the controller found once the writes are done, for the
    tick's result (None: nothing beyond its proposals' ``found``); ``between_ticks`` what it
    finds on a tick that proposes nothing (the jobs unknown): what moves between ticks on
    threads and requests of its own (MPS's state, admissions, a cap holder's period), as it
    is now (None: its last findings hold). ``reads``: the names of the controllers whose
    proposals it reads: it proposes after them (``in_reading_order``)."""

    name: str
    reads: tuple[str, ...]

    def propose(self, reading: Reading, proposed: tuple[Proposals, ...]) -> Proposals: ...

    def before_apply(self, reading: Reading, plans: Plans) -> None: ...

    def after_apply(self, reading: Reading, plans: Plans, outcome: Outcome) -> Found | None: ...

    def between_ticks(self) -> Found | None: ...


class Proposer:
    """A controller that only proposes: told nothing around the writes."""

    name = "controller"
    reads: tuple[str, ...] = ()

    def before_apply(self, reading: Reading, plans: Plans) -> None:
        pass

    def after_apply(self, reading: Reading, plans: Plans, outcome: Outcome) -> Found | None:
        return None

    def between_ticks(self) -> Found | None:
        return None


class ControllerCycle(ValueError):
    """Controllers that read each other's proposals in a circle: none can propose first."""


def in_reading_order(controllers: Sequence[Controller]) -> tuple[Controller, ...]:
    """``controllers`` in the order they propose: each after those whose proposals it reads
    (a name no controller here has is nothing to wait for), otherwise in the order given
    (the later one's proposal wins on a knob both propose on). Raises ControllerCycle, or
    ValueError where two have one name (a reader names whose proposals it reads)."""
    names = [c.name for c in controllers]
    twins = sorted({n for n in names if names.count(n) > 1})
    if twins:
        raise ValueError(f"two controllers are named {', '.join(map(repr, twins))}: a controller's reads "
                         "name whose proposals it sees, so each name must be one controller's")
    waiting = list(controllers)
    done: list[Controller] = []
    while waiting:
        names = {c.name for c in waiting}
        ready = next((c for c in waiting if not names.intersection(set(c.reads) - {c.name})), None)
        if ready is None:
            raise ControllerCycle("controllers read each other's proposals in a circle, so none can propose "
                                  f"first: {' -> '.join(_circle(waiting))} (each reads the next)")
        waiting.remove(ready)
        done.append(ready)
    return tuple(done)


def _circle(waiting: Sequence[Controller]) -> list[str]:
    """One circle among ``waiting`` (each reads one of the others), by name, closed."""
    by_name = {c.name: c for c in waiting}
    path = [waiting[0].name]
    while True:
        c = by_name[path[-1]]
        nxt = next(r for r in c.reads if r in by_name and r != c.name)
        if nxt in path:
            return path[path.index(nxt):] + [nxt]
        path.append(nxt)
