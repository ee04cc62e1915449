"""The admin commands: what each request does, on the daemon's control state.

The transport (noded.admin.server) checks who the peer is and parses the request;
it calls an ``AdminCommands`` with ``(command, args, peer)`` and sends back what it
returns, or the error it raises. Commands read and change only the ``ControlState``
and read the last ``TickResult`` (and ask the co-location and right-sizing services):
never the loop's internals.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

from noded.util.halving import max_level as max_core_level
from noded.capping.units import format_bandwidth
from noded.loop.control import ControlState
from noded.loop.daemon import TickFailure, TickResult
from noded.util.journal import log_change, words
from noded.server.stream import Peer
from noded.loop.overrides import Override, OverrideStore
from noded.admin.protocol import RequestError

log = logging.getLogger(__name__)

#: the jobs an error about an unknown job names (`nodectl jobs` lists them all)
KNOWN_SHOWN = 10


class AdminCommands:
    def __init__(self, control: ControlState, last: Callable[[], TickResult | None], colocation=None, *,
                 wall_clock: Callable[[], float] = time.time, rightsize=None, registered_labels=None,
                 tick_failures: Callable[[], tuple[TickFailure | None, int]] = lambda: (None, 0)):
        self.control = control
        # (the last tick that raised, how many have in a row now): a loop whose ticks fail
        # publishes no result, so this is the only way status can say so
        self.tick_failures = tick_failures
        self.registered_labels = registered_labels  # a jobs.RegisteredLabels: what `label` and `forget` change
        self.rightsize = rightsize  # a rightsize.service.RightSizing, where right-sizing is on
        self.last = last
        self.colocation = colocation  # a colocation.service.Colocation, where co-location is enabled
        self.wall_clock = wall_clock

    @property
    def store(self) -> OverrideStore:
        if self.control.overrides is None:
            raise RequestError("overrides are not kept on this socket")
        return self.control.overrides

    def __call__(self, command: str, args: dict[str, Any], peer: Peer) -> Any:
        return self.dispatch(command, args, peer.uid)

    def _report(self, args: dict[str, Any]) -> dict[str, Any]:
        """An iteration time for right-sizing, and for co-location where it is on too."""
        try:
            out = {"rightsize": self.rightsize.report(args["job"], args["iteration_s"])}
            if self.colocation is not None:
                last = self.last()
                out.update(self.colocation.report(args["job"], args["iteration_s"], last.sample if last else None))
        except ValueError as e:
            raise RequestError(str(e)) from None
        return out

    def _check_reporter(self, job: str, pid: int) -> None:
        last = self.last()
        if last is None or job not in last.sample.jobs or pid not in last.sample.jobs[job].pids:
            raise RequestError(f"process {pid} is not part of job {job!r}: a job reports only for itself")

    def dispatch(self, command: str, args: dict[str, Any], uid: int) -> Any:
        handler = self._handlers().get(command)
        if handler is None:  # throttle and exempt: an override of that kind
            return self._override(command, args, uid)
        return handler(args, uid)

    def _handlers(self) -> dict[str, Callable[[dict[str, Any], int], Any]]:
        """Each command but the overrides, and what answers it: ``(args, uid)`` -> the answer."""
        return {
            "status": lambda args, uid: self.status(),
            "jobs": lambda args, uid: self.jobs(),
            "explain": lambda args, uid: self.explain(args["job"]),
            "pause": self._pause,
            "resume": self._resume,
            "admit": self.admit,
            "report": self._report_iteration,
            "model_fit": self._model_fit,
            "size": self.size,
            "label": lambda args, uid: self.label(args["job"], args["labels"], uid),
            "forget": lambda args, uid: self.forget(args["job"], uid),
            "cap": self.cap,
            "release": self._release,
        }

    def _pause(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        reason = args.get("reason") or f"paused by uid {uid}"
        self.control.pause(reason)
        log_change("pause", None, uid=uid, reason=reason)
        return {"paused": reason}

    def _resume(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        self.control.resume()
        log_change("resume", None, uid=uid, reason="automatic throttling resumes")
        return {"paused": None}

    def _report_iteration(self, args: dict[str, Any], uid: int) -> Any:
        """A job's iteration time: right-sizing's (and co-location's where on too), else co-location's."""
        if self.rightsize is not None:
            return self._report(args)
        service = self._colocation_service()
        try:
            last = self.last()
            return service.report(args["job"], args["iteration_s"], last.sample if last else None)
        except ValueError as e:
            raise RequestError(str(e)) from None

    def _model_fit(self, args: dict[str, Any], uid: int) -> Any:
        service = self._colocation_service()
        try:
            log.warning("colocation model fit requested by uid %d", uid)
            return service.fit()
        except ValueError as e:
            raise RequestError(str(e)) from None

    def _colocation_service(self):
        if self.colocation is None:
            raise RequestError("co-location is not enabled on this node (colocation.enabled)")
        return self.colocation

    def _release(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        cleared, unsaved = self.store.clear(args["job"], uid)
        # the jobs that hold one still: what a release of the wrong id would have wanted
        return {"job": args["job"], "override_cleared": cleared, "not_saved": unsaved,
                "overrides": sorted(self.store.active())}

    def _override(self, command: str, args: dict[str, Any], uid: int) -> dict[str, Any]:
        """An override of kind ``command`` (throttle: at a level, or a number of cores; exempt)."""
        job = args["job"]
        last = self._known(job)
        level, max_level = 0, None
        if command == "throttle":
            max_level, what = self._level_bound(job, last)
            level = args["level"] if "level" in args else self._level_for_cores(job, args["cores"], last)
            if level > max_level:
                raise RequestError(f"level {level} is beyond this host's throttle: levels are 1 to {max_level} "
                                   f"({what})")
        now = self.wall_clock()
        ttl = args.get("ttl_s")
        override = Override(job, level, uid, args.get("reason", ""), now, now + ttl if ttl else None)
        self.store.set(override)
        # What the operator needs to hear: where the job stands now, and what follows.
        return {**self._override_json(override), "level_now": last.levels.get(job, 0), "max_level": max_level,
                "in_last_sample": job in last.sample.jobs}

    def cap(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        """Hold a CPU job at a bandwidth (an override of kind cap: the level throttle leaves
        the job alone while it holds), or release its cap. A cap replaces whatever override
        the job had (one override a job); releasing touches only a cap."""
        job = args["job"]
        if args.get("release"):
            held = self.store.active().get(job)
            if held is not None and held.kind != "cap":
                raise RequestError(f"job {job!r} holds a {held.kind} override, not a cap: `nodectl release {job}` "
                                   "lifts it")
            cleared, unsaved = self.store.clear(job, uid)
            return {"job": job, "cap_released": cleared, "not_saved": unsaved}
        last = self._known(job)
        js = last.sample.jobs.get(job)
        if js is not None and js.kind != "cpu":
            raise RequestError(f"job {job!r} is a {js.kind} job: only CPU jobs are capped (GPU jobs are what the "
                               "caps protect; a job of unknown kind may hold a GPU)")
        if last.throttle_kind != "mba":
            raise RequestError(f"this host throttles with {last.throttle_kind or 'nothing'}, not MBA: nothing here "
                               "can hold a job at a bandwidth")
        replaced = self.store.active().get(job)
        now = self.wall_clock()
        ttl = args.get("ttl_s")
        override = Override(job, 0, uid, args.get("reason", ""), now, now + ttl if ttl else None, args["bytes_per_s"])
        self.store.set(override)
        return {**self._override_json(override), "replaced": replaced.kind if replaced is not None else None,
                "bandwidth_bytes_per_s": js.bandwidth_bps if js is not None else None,
                "in_last_sample": js is not None}

    def _registry(self):
        if self.registered_labels is None:
            raise RequestError("this noded keeps no registered labels")
        return self.registered_labels

    def label(self, job: str, labels: dict[str, Any], uid: int) -> dict[str, Any]:
        """A job's labels from its job manager's hook, before or while it runs."""
        try:
            meta = self._registry().set(job, labels)
        except ValueError as e:
            raise RequestError(str(e)) from None
        log_change("labels-registered", job, uid=uid, reason=", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
        return {"job": job, "labels": {k: getattr(meta, k) for k in sorted(labels)}}

    def forget(self, job: str, uid: int) -> dict[str, Any]:
        """A job ended (a Slurm epilog): its registered labels and its admission's GPU
        reservation go now, not when noded notices the job is gone. Overrides are the
        operator's and stay (they expire or are released)."""
        # The reservation first: it is memory only, and a GPU share must not stay held for a
        # job that ended because the labels' file could not be written (that raises after it)
        reservation = self.colocation.release(job) if self.colocation is not None else False
        labels = self._registry().forget(job)
        if labels or reservation:
            log_change("job-forgotten", job, uid=uid, reason=f"labels={labels} reservation={reservation}")
        return {"job": job, "labels_forgotten": labels, "reservation_released": reservation}

    def size(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        """An operator's control of a GPU job's right-sizing: pin its cores, stop probing it,
        or search again."""
        from noded.rightsize.service import NotSized

        service = self.rightsize
        if service is None:
            raise RequestError("right-sizing is not on on this node (rightsize.sources names no job source): no "
                               "job's cores are sized")
        job, reason = args["job"], args.get("reason", "")
        try:
            if "cores" in args:
                return service.pin(job, args["cores"], uid, reason)
            if args.get("stop"):
                return service.stop(job, uid, reason)
            return service.reprobe(job, uid, reason)
        except NotSized as e:
            sized = sorted(service.view().jobs)
            listed = words(sized[:KNOWN_SHOWN]) + (f" and {len(sized) - KNOWN_SHOWN} more"
                                                   if len(sized) > KNOWN_SHOWN else "")
            raise RequestError(f"{e}; the jobs sized now are " + (listed if sized else "none")
                               + " (`nodectl explain JOB` shows a job's sizing)") from None
        except ValueError as e:
            raise RequestError(f"job {job!r}: {e}") from None

    def _known(self, job: str) -> TickResult:
        """The last tick's result, where ``job`` is known: in that tick's sample, or holding
        an override already (one that is gone from the sample may still be changed). An
        override for a job noded does not know (a typo, a job not started) is refused."""
        last = self.last()
        if last is None or last.config is None:
            raise RequestError("noded has not sampled its jobs yet: try again after its first tick")
        if job in last.sample.jobs or job in self.store.active():
            return last
        if not last.sample.jobs_known:
            raise RequestError(f"noded does not know its jobs now (discovery failed at the last tick), so not "
                               f"{job!r} either: try again later")
        raise RequestError(self._unknown_job(job, last).replace(" at noded's last tick:",
                                                                 " at noded's last tick, and no override on it:", 1))

    @staticmethod
    def _unknown_job(job: str, last: TickResult | None) -> str:
        """Why ``job`` is not one noded can answer for, with the jobs it knows (as throttle says)."""
        if last is None:
            return f"no job {job!r}: noded has not sampled its jobs yet (try again after its first tick)"
        if not last.sample.jobs_known:
            return f"no job {job!r}: noded does not know its jobs now (discovery failed at the last tick)"
        known = sorted(last.sample.jobs)
        listed = words(known[:KNOWN_SHOWN]) + (f" and {len(known) - KNOWN_SHOWN} more"
                                               if len(known) > KNOWN_SHOWN else "")
        return (f"no job {job!r} at noded's last tick: " + (f"the jobs are {listed} (nodectl jobs lists them)" if known
                else "noded sees no jobs at all (nodectl jobs lists them; `nodectl status` says what it watches)"))

    def _level_bound(self, job: str, last: TickResult) -> tuple[int, str]:
        """The highest level this host's throttle has for ``job``, and where it comes from."""
        kind = last.throttle_kind
        if kind == "mba":
            levels = last.config.contention.mba_levels
            return len(levels), ("contention.mba_levels: " + ", ".join(f"{lvl:.0%}" for lvl in levels)
                                 + " of a job's bandwidth")
        if kind == "cores":
            n = last.original_cpus.get(job)
            if not n:
                raise RequestError(f"no CPUs known for job {job!r} (not in noded's last sample): on this host a "
                                   "throttle halves a job's CPUs")
            if max_core_level(n) == 0:
                raise RequestError(f"job {job!r} has 1 CPU: halving its CPUs cannot throttle it")
            return max_core_level(n), f"{job} has {n} CPUs, halved at each level"
        raise RequestError("this host has no throttle (neither MBA nor CPU placement): no job can be held at a level")

    def admit(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        from noded.colocation.admission import TRANSIENT_REFUSALS
        from noded.colocation.profiles import JobProfile

        service = self.colocation
        if service is None:
            raise RequestError("co-location is not enabled on this node (colocation.enabled)")
        p = args.get("profile")
        profile = None if p is None else JobProfile(args["model"], args["batch_size"], float(p["c"]), float(p["m"]),
                                                    float(p["window_us"]), f"{p['source']} (sent by uid {uid})")
        last = self.last()
        d = service.admit(args["job"], last.sample if last else None, model=args["model"],
                          batch_size=args["batch_size"], profile=profile, gpu=args.get("gpu", "auto"),
                          uid=args.get("uid"))
        return {"admit": d.admit, "job": d.job, "gpu_uuid": d.gpu_uuid, "gpu_index": d.gpu_index,
                "predicted_speedup": d.predicted_speedup, "reason": d.reason, "env": d.env,
                "sources": list(d.sources), "sum_c_after": d.sum_c_after, "n_jobs_after": d.n_jobs_after,
                # a refusal's kind, and whether asking again soon may be answered otherwise (MPS
                # starting, noded's first sample): a hook decides on these, never on the reason's prose
                "refusal": d.refusal, "transient": d.refusal in TRANSIENT_REFUSALS}

    def _level_for_cores(self, job: str, cores: int, last: TickResult) -> int:
        kind = last.throttle_kind
        if kind != "cores":
            raise RequestError(f"this host throttles with {kind or 'nothing'}: use --level")
        n = last.original_cpus.get(job, 0)
        if not n:
            raise RequestError(f"no CPUs known for job {job!r} (not in noded's last sample)")
        if cores >= n:
            raise RequestError(f"job {job!r} has {n} CPU{'s' if n > 1 else ''}: cores must be from 1 to {n - 1} "
                               "to throttle it" if n > 1 else f"job {job!r} has 1 CPU: it cannot have fewer")
        # The halving level that leaves at most `cores` CPUs (halving stops at one CPU).
        return min(max(1, math.ceil(math.log2(n / cores))), max_core_level(n))

    def _override_json(self, o: Override) -> dict[str, Any]:
        return {"job": o.job, "kind": o.kind, "level": o.level, "cap_bytes_per_s": o.cap_bps,
                "set_by_uid": o.set_by_uid, "reason": o.reason,
                "expires_in_s": None if o.expires is None else max(0.0, o.expires - self.wall_clock()),
                "expires_at": o.expires}

    def _tick_failures_json(self) -> dict[str, Any]:
        """How many ticks have failed in a row now (0: they complete), and the last that
        failed, ever since start (None: none has)."""
        last, in_a_row = self.tick_failures()
        if last is None:
            return {"in_a_row": in_a_row, "last": None}
        ago = None if last.at is None else max(0.0, self.wall_clock() - last.at)
        return {"in_a_row": in_a_row, "last": {"error": last.error, "at": last.at, "seconds_ago": ago,
                                               "completed_before": last.completed}}

    def status(self) -> dict[str, Any]:
        r = self.last()
        overrides = self.store.active()
        paused = self.control.paused
        out: dict[str, Any] = {"paused": paused, "ticks": r.tick if r else 0,
                               "overrides": [self._override_json(o) for o in overrides.values()],
                               # jobs whose labels a job manager's hook registered and has not forgotten
                               "registered_labels": sorted(self.registered_labels.snapshot())
                               if self.registered_labels is not None else [],
                               "tick_failures": self._tick_failures_json()}
        if r is None or r.config is None:
            return {**out, "node": None, "gpus": [], "jobs": [], "missing": [], "watching": []}
        cfg = r.config
        out.update({"tick_s": cfg.tick_s, "throttle_method": r.throttle_kind,
                    "threshold": cfg.contention.threshold, "release_threshold": cfg.contention.release_threshold,
                    "peak_bytes_per_s_per_domain": cfg.peak_bytes_per_domain})
        s = r.sample
        out["node"] = {"share_of_peak": r.decision.node_share, "bandwidth_bytes_per_s": dict(s.node_bandwidth_bps),
                       "contention": r.decision.triggered, "note": r.decision.note}
        out["gpus"] = [{"gpu": g.index, "uuid": g.uuid, "util": g.util_gpu, "error": g.error} for g in s.gpus]
        out["jobs"] = [{"job": j.id, "kind": j.kind, "bandwidth_bytes_per_s": j.bandwidth_bps, "gpu_util": j.gpu_util,
                        "level": r.levels.get(j.id, 0), "override": j.id in overrides, "exempt": j.meta.exempt,
                        "cap_bytes_per_s": r.caps[j.id].cap_bps if j.id in r.caps else None,
                        "monitoring": j.monitoring, "pod": j.pod.as_dict() if j.pod else None}
                       for j in sorted(s.jobs.values(), key=lambda j: j.id)]
        out["missing"] = list(s.missing)
        # each input noded watches (jobs, gpus, resctrl): whether it does, and why not
        out["watching"] = [{"what": w.what, "watching": w.watching, "why": w.why} for w in r.watching]
        return out

    def jobs(self) -> list[dict[str, Any]]:
        """The jobs of the last tick, as status lists them; an error where noded does not
        know them (no tick yet, discovery failed): an empty list would read as "no jobs"."""
        last = self.last()
        if last is None or last.config is None:
            raise RequestError("noded has not sampled its jobs yet: try again after its first tick")
        if not last.sample.jobs_known:
            raise RequestError("noded does not know its jobs now (discovery failed at the last tick; nodectl status "
                               "says where): try again later")
        return self.status()["jobs"]

    def explain(self, job: str) -> dict[str, Any]:
        r = self.last()
        if r is None or job not in r.sample.jobs:
            raise RequestError(self._unknown_job(job, r))
        why = self._policy_reasons(job, r)
        sizing, borrowed, memory = _rightsizing_reasons(job, r, why)
        return self._explanation(job, r, why, sizing, borrowed, memory)

    def _policy_reasons(self, job: str, r: TickResult) -> list[str]:
        """Why the policy throttles the job or leaves it alone: its kind, labels, an
        override or a cap, a pause, the decision's note, or the values it was judged by."""
        js = r.sample.jobs[job]
        why: list[str] = []
        if js.kind == "gpu":
            why.append("a GPU job: never throttled")
            if job not in r.baselines:
                why.append("no uncontended utilisation known yet: its slowdown cannot be seen")
        if js.meta.exempt:
            why.append("marked exempt in its labels")
        o = self.store.active().get(job)
        if o is not None:
            held = f"cap {format_bandwidth(o.cap_bps)}" if o.cap_bps is not None else f"level {o.level}"
            why.append(f"operator override ({o.kind}, {held}) by uid {o.set_by_uid}: {o.reason or 'no reason'}")
        cap = r.caps.get(job)
        if cap is not None:
            why.append(_cap_why(cap))
        paused = self.control.paused
        if paused:
            why.append(f"the eliminator is paused: {paused}")
        if r.decision.note:
            why.append(r.decision.note)
        cfg = r.config.contention if r.config else None
        level = r.levels.get(job, 0)
        if js.kind == "unknown":
            why.append("kind unknown: some GPU's processes could not be read this tick, and this job was never seen "
                       "on a GPU: it may hold one, so it is not throttled (see `nodectl status` for what is missing)")
        elif js.kind != "gpu" and not level and not js.meta.exempt and o is None and not paused and cfg is not None \
                and cap is None:
            why.append(self._not_throttled(job, r))
        return why

    def _explanation(self, job: str, r: TickResult, why: list[str], sizing: dict[str, Any] | None,
                     borrowed: list[int] | None, memory: dict[str, Any] | None) -> dict[str, Any]:
        """``nodectl explain``'s answer: the job's values, the reasons, its decisions, its sizing and cap."""
        js = r.sample.jobs[job]
        d, cfg = r.decision, r.config.contention if r.config else None
        level = r.levels.get(job, 0)
        cap = r.caps.get(job)
        now = r.t
        baseline, source = r.baselines.get(job, (None, None))
        return {
            "job": job, "kind": js.kind, "level": level, "bandwidth_bytes_per_s": js.bandwidth_bps,
            # how old that rate is (None: no rate): read this tick, or carried on a quiet node's
            # thin tick from a read seconds_ago; window_s: the seconds it is a mean over
            "bandwidth_read": None if js.bandwidth_bps is None else {
                "this_tick": js.bandwidth_age_s == 0.0, "seconds_ago": round(js.bandwidth_age_s, 1),
                "window_s": None if js.bandwidth_window_s is None else round(js.bandwidth_window_s, 1)},
            "gpu_util": js.gpu_util, "baseline": baseline, "baseline_source": source,
            # what noded knows the job as (label file, or registered by its job manager's hook)
            "labels": _labels_json(js.meta),
            "node_share_of_peak": d.node_share,
            "threshold": cfg.threshold if cfg else None,
            "release_threshold": cfg.release_threshold if cfg else None,
            "slowed_gpu_jobs": list(d.slowed), "why": why,
            # a job held at a level: each release condition it does not meet, with the values
            "held": list(d.held.get(job, ())) if level else [],
            "decisions": [{"seconds_ago": round(now - t, 1), "action": a.kind, "from": a.from_level,
                           "to": a.to_level, "cause": a.cause, "reason": a.reason}
                          for t, a in self.control.history(job)],
            # right-sizing (None where it is off, or does not size this job): the curve and why the size
            "sizing": sizing, "borrowed_cpus": borrowed,
            # right-sizing's memory (None where rightsize.memory is off or the job is not sized)
            "memory": memory,
            # a bandwidth cap: its value, where it comes from, the holder's state (None: not capped)
            "cap": None if cap is None else {
                "bytes_per_s": cap.cap_bps, "source": cap.source, "why": cap.why, "mode": cap.mode,
                "measured_bytes_per_s": cap.measured_bps, "held": cap.held, "unreachable": cap.unreachable,
                "note": cap.note},
            # a Kubernetes pod's UID, QoS class, cgroup driver and containers (None: not a pod)
            "pod": js.pod.as_dict() if js.pod else None,
        }

    @staticmethod
    def _not_throttled(job: str, r: TickResult) -> str:
        """Why the policy leaves a CPU job alone, with the values."""
        d, c = r.decision, r.config.contention
        if d.node_share is None:
            return "node bandwidth unknown: nothing is throttled blind"
        if d.node_share < c.threshold:
            return f"no contention: node bandwidth {d.node_share:.0%} of peak is below the threshold {c.threshold:.0%}"
        if not d.slowed:
            return (f"node bandwidth {d.node_share:.0%} of peak is at or above the threshold {c.threshold:.0%}, but no "
                    f"GPU job is more than {c.gpu_drop_margin:.0%} below its baseline (contention.gpu_drop_margin)")
        return "contention: heavier CPU jobs are throttled first, one step every contention.settle_s " \
               f"({c.settle_s:g}s)"


def _rightsizing_reasons(job: str, r: TickResult, why: list[str]
                         ) -> tuple[dict[str, Any] | None, list[int] | None, dict[str, Any] | None]:
    """Right-sizing's part of an explanation (its reasons appended to ``why``): the job's
    sizing, the CPUs a CPU job borrows, and its memory; each None where it does not apply."""
    js = r.sample.jobs[job]
    sizing, borrowed, memory = None, None, None
    if r.rightsize is not None:
        v = r.rightsize.jobs.get(job)
        if v is not None:
            sizing = _sizing_json(v)
            why.append(sizing["why"])
        memory = _memory_json(job, r.memory) if r.memory is not None and v is not None else None
        if memory is not None:
            why.append(memory["why"])
        if js.kind != "gpu":
            borrowed = list(r.rightsize.borrowed.get(job, ()))
            if borrowed:
                why.append(f"borrows {len(borrowed)} idle CPU{'s' * (len(borrowed) > 1)} of the GPU array "
                           f"({_cpu_list(borrowed)}), given back at once when a GPU job needs them")
    return sizing, borrowed, memory


def _cap_why(c) -> str:
    """A capped job in words: the cap, its source, and what steers it now."""
    text = f"capped at {format_bandwidth(c.cap_bps)} ({c.source}: {c.why})"
    if c.shared_group is not None:  # no CLOSID of its own: what it gets instead
        return text + f"; {c.note}"
    if c.mode is None:
        return text + f"; not steered yet: {c.note or 'its holder starts next tick'}"
    text += f"; steered by {c.mode}"
    if c.measured_bps is not None:
        text += f", {format_bandwidth(c.measured_bps)} over its last period"
    if c.held is not None:
        text += f", MB value {c.held}"
    if c.busy_threads is not None:
        text += f", {c.busy_threads} busy thread{'s' * (c.busy_threads != 1)}"
    if c.steered_for:
        text += (f"; shares its CLOSID with {words(c.steered_for)} (no CLOSID of their own): its holder holds "
                 "their sum within the strictest cap among them")
    if c.cpus is not None:
        text += f"; below what MBA's lowest value lets it move: held on fewer cores ({c.cpus})"
    elif c.unreachable:
        text += "; below what MBA's lowest value lets it move: fewer cores come next"
    return text


def _labels_json(meta) -> dict[str, Any]:
    """A job's labels that say something (those left at their defaults are not shown)."""
    return meta.set_labels()


def _cpu_list(cpus) -> str:
    return ",".join(map(str, cpus))


def _memory_json(job: str, m) -> dict[str, Any]:
    """A sized job's memory, for ``explain``: its cache share, soft limit and why."""
    split, result = m.split, m.result
    units = split.units.get(job) if split is not None else None
    cg = result.cgroups.get(job) if result is not None else None
    limit = result.limits.get(job) if result is not None else None
    if split is None:
        why = f"memory: no split this tick ({m.error}); soft limits held as they are"
    elif job in split.refused:
        why = f"memory: its cache curve is refused ({split.refused[job]}): no cache share, no soft limit"
    elif units is None:
        why = ("memory: no cache curve declared (labels dataset_gb and uncached_share): no cache share, no soft "
               "limit")
    elif result is not None and job in result.unplaced:
        why = f"memory: {units} units of cache, but no soft limit: {result.unplaced[job]}"
    else:
        why = (f"memory: {units} units of cache ({units * split.unit_bytes / 2**30:.3g} GiB; its GPU-proportional "
               f"share is {split.proportional.get(job)} units), soft limit {limit} bytes on top of "
               f"{cg.anon_bytes if cg else '?'} bytes of process memory")
    return {"cache_units": units, "unit_bytes": split.unit_bytes if split is not None else None,
            "proportional_units": split.proportional.get(job) if split is not None else None,
            "soft_limit": limit, "cgroup": cg.path if cg is not None else None,
            "anon_bytes": cg.anon_bytes if cg is not None else None,
            "file_bytes": cg.file_bytes if cg is not None else None, "why": why}


def _sizing_json(v) -> dict[str, Any]:
    """A sized GPU job's sizing, for ``explain``: the curve measured and why its size."""
    from noded.rightsize.service import LIMITED, PINNED, PROBING, STOPPED

    c = v.control
    if v.state == PROBING:
        why = (f"right-sizing is probing it at {v.target} cores (phase {v.phase}, started at {v.start} from "
               f"{v.start_source}; {v.window_samples} samples in the window)")
    elif v.state == PINNED:
        why = f"pinned at {v.target} cores by uid {c.uid if c else '?'}: {(c.reason if c else '') or 'no reason'}"
    elif v.state == STOPPED:
        why = (f"probing stopped at {v.target} cores by uid {c.uid if c else '?'}: "
               f"{(c.reason if c else '') or 'no reason'}")
    else:
        best = max(v.points, key=lambda p: p[1]) if v.points else None
        why = (f"sized at {v.optimal} cores ({v.reason}"
               + (f"; best measured {best[1]:.4g} at {best[0]} cores" if best else "")
               + (f"; the node could give it at most {v.ceiling}: it may want more" if v.state == LIMITED else "")
               + ")")
    if v.plan_note:
        why += f"; plan: {v.plan_note}"
    return {"state": v.state, "phase": v.phase, "reason": v.reason, "target": v.target, "optimal": v.optimal,
            "max_cores": v.max_cores, "ceiling": v.ceiling, "start": v.start, "start_source": v.start_source,
            "signal": v.signal, "points": [[cores, value] for cores, value in v.points], "allocated": v.allocated,
            "planned": None if v.planned is None else list(v.planned), "plan_note": v.plan_note,
            "control": None if c is None else {"kind": c.kind, "uid": c.uid, "reason": c.reason, "cores": c.cores},
            "remembered": v.remembered, "model": v.model, "batch_size": v.batch_size, "owner": v.owner, "why": why}
