"""Contention as a controller of the tick: the levels that relieve GPU jobs starved of
memory bandwidth (noded.policy.contention.decide), from the tick's reading and the caps
proposed before it (a capped job is the cap's, not contention's). The operators' level
overrides are in these levels; while paused only they hold."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import MappingProxyType
from typing import Mapping

from noded.knobs.controller import Found, Proposals, Proposer, Reading
from noded.policy.baselines import BaselineStore
from noded.policy.contention import NOTHING_LEFT_TO_THROTTLE, Decision, PolicyState, decide
from noded.samplers.sample import GPU
from noded.util.journal import log_change, word

log = logging.getLogger(__name__)


def nothing_left_to_throttle(decision: Decision) -> str | None:
    """Why contention lasts with nothing left to throttle, while it does (an alert's text)."""
    if decision.note != NOTHING_LEFT_TO_THROTTLE:
        return None
    return (f"node bandwidth {decision.node_share:.0%} of peak and GPU job"
            f"{'s' * (len(decision.slowed) > 1)} {', '.join(map(word, decision.slowed))} below baseline, but no CPU "
            "job can be throttled further (exempt, overridden, at its deepest level, or its bandwidth "
            "unknown): `nodectl explain JOB` says which")


def limits_while_unwritable(limits: Mapping[str, int], in_force: Mapping[str, int | None]) -> dict[str, int]:
    """No new original can be recorded: no level may rise above what is in force. A job
    whose level is unknown (None) or unsettled (a change left half done, -1) is at no
    level: nothing may rise there either, and no limit is below 0."""
    return {j: min(lvl, max(0, in_force.get(j) or 0)) for j, lvl in limits.items()}


class Contention(Proposer):
    """The policy: its state (throttles, baselines) is its own, carried from tick to tick;
    GPU jobs' baselines are kept across restarts in ``baselines`` where there is a store."""

    name = "contention"
    reads = ("caps",)  # a capped job is the cap's, not contention's

    def __init__(self, baselines: BaselineStore | None = None):
        self.baselines = baselines
        self.state = PolicyState()

    def propose(self, reading: Reading, proposed: tuple[Proposals, ...]) -> Proposals:
        sample, paused, unwritable = reading.sample, reading.paused, reading.unwritable
        limits = dict(reading.max_levels)
        if unwritable:
            limits = limits_while_unwritable(limits, reading.in_force)
        overrides = {j: o.level for j, o in reading.overrides.items() if o.cap_bps is None}
        if paused:
            # Paused: nothing is throttled automatically (the policy still learns its
            # baselines); only what operators set explicitly holds.
            limits = {j: lvl for j, lvl in limits.items() if j in overrides}
        capped = frozenset(j for p in proposed if p.capped for j in p.capped)
        metas = {j: js.meta for j, js in sample.jobs.items() if js.kind == GPU}
        known = self.baselines.known(metas) if self.baselines else MappingProxyType({})
        config = reading.config
        decision, self.state = decide(sample, self.state, config.contention, config.peak_bytes_per_domain,
                                      limits, reading.now, MappingProxyType(overrides), reading.level_share, known,
                                      capped, paused=bool(paused))
        stuck = nothing_left_to_throttle(decision)
        if self.baselines:
            self.baselines.update(self.state.baselines, self.state.baseline_sources, metas)
        if paused:
            decision = replace(decision, note=f"paused: {paused}")
        elif unwritable:
            decision = replace(decision, note=f"state directory not writable ({unwritable}): no new throttles"
                               + (f"; {decision.note}" if decision.note else ""))
        for a in decision.actions:  # the why, before the actuator's lines saying what it wrote
            log_change(a.kind, a.job, level_from=a.from_level, level_to=a.to_level, cause=a.cause, reason=a.reason)
        return Proposals(levels=decision.levels, found=Found(decision=decision, stuck=stuck))

    def holding(self) -> Decision:
        """The decision while the jobs are unknown: every level as it stands."""
        return Decision(MappingProxyType({j: t.level for j, t in self.state.throttles.items()}), (),
                        False, None, (), "holding: jobs unknown (discovery failed), nothing changed")
