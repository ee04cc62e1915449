"""Throttling by halving a CPU job's cores, where the host has no MBA (CODA Sec. V-D).

Level L leaves the first ``max(1, n >> L)`` of the job's original n CPUs. A job
with its own cpuset cgroup (the v1 cpuset hierarchy, or v2 with the cpuset
controller) gets its ``cpuset.cpus`` rewritten, children before the parent when
shrinking (a child must stay inside its parent) and after it when growing; any
other job gets the affinity of every thread of every process (new threads and
children inherit it).

Record before you touch: the original value of every cpuset or affinity is
written durably to ``originals.json`` before the first write to it; when that
record cannot be written, nothing is changed. The level in force is read from the
Sample (what the kernel reports now) against those originals: a value someone
else changed since (a resize by the scheduler, an operator) is theirs: noded forgets
its record rather than fight it.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

from resctrl.cpulist import format_cpu_list, parse_cpu_list

from ..procstat import STARTTIME, stat_fields
from ..sample import CPU, JobSample, Sample
from ..samplers.cpus import CpuPlacement
from ..state import OriginalValues, StateWriteError
from .plan import UNKNOWN, LevelThrottle

log = logging.getLogger(__name__)


def kept_cpus(original: list[int], level: int) -> list[int]:
    """The CPUs a job keeps at a level: halved per level, never below one."""
    cpus = sorted(original)
    return cpus[: max(1, len(cpus) >> level)]


def max_level(ncpus: int) -> int:
    return max(0, ncpus.bit_length() - 1)  # halvings until one CPU is left


def consistent_levels(original: list[int], now: frozenset[int]) -> list[int]:
    """The levels whose CPUs are exactly ``now`` (several where halving stops at one CPU)."""
    return [lvl for lvl in range(max_level(len(original)) + 1) if set(kept_cpus(original, lvl)) == now]


def cpuset_key(path: str) -> str:
    return f"cpuset:{path}"


def affinity_key(pid: int, starttime: str) -> str:
    # The start time tells a reused pid from the process we recorded.
    return f"affinity:{pid}:{starttime}"


class CoreHalving(LevelThrottle):
    kind = "cores"

    def __init__(self, originals: OriginalValues, *, proc: str = "/proc", dry_run: bool = False):
        super().__init__(dry_run=dry_run)
        self.originals = originals
        self.proc = proc

    @staticmethod
    def level_share(level: int) -> float:
        return 0.5 ** level  # cores halved per level; bandwidth roughly follows

    # -- what a job's CPUs were and are (no I/O: the Sample and our own record)
    def _recorded(self, key: str) -> list[int] | None:
        value = self.originals.get(key)
        if value is None:
            return None
        return sorted(parse_cpu_list(value)) if isinstance(value, str) else sorted(value)

    def original_cpus(self, js: JobSample) -> list[int]:
        """The job's CPUs before noded touched them: recorded, else as they are now."""
        p = js.cpus
        if p is None:
            return []
        if p.cpusets:
            top, now = p.cpusets[0]
            return self._recorded(cpuset_key(top)) or sorted(now)
        for pid, start, _now in p.affinities:
            recorded = self._recorded(affinity_key(pid, start))
            if recorded:
                return recorded
        return sorted(p.affinities[0][2]) if p.affinities else []

    def max_levels(self, sample: Sample) -> dict[str, int]:
        return {j: max_level(len(self.original_cpus(js))) for j, js in sample.jobs.items()
                if js.kind == CPU and js.cpus is not None}

    def _candidates(self, js: JobSample) -> list[int] | None:
        """Levels consistent with what the kernel shows; [] when it matches none of ours."""
        p = js.cpus
        assert p is not None
        if p.cpusets:
            top, now = p.cpusets[0]
            return consistent_levels(self.original_cpus(js), now)
        job_original = self.original_cpus(js)
        levels: set[int] | None = None
        for pid, start, now in p.affinities:
            recorded = self._recorded(affinity_key(pid, start))
            fits = set(consistent_levels(recorded, now)) if recorded else \
                {0} | set(consistent_levels(job_original, now))  # its own affinity, or one it inherited from us
            levels = fits if levels is None else levels & fits
        return sorted(levels) if levels is not None else [0]

    def levels_in_force(self, sample: Sample) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for job, js in sample.jobs.items():
            if js.cpus is None or (not js.cpus.cpusets and not js.cpus.affinities):
                out[job] = UNKNOWN
                continue
            levels = self._candidates(js)
            out[job] = levels[0] if levels else 0  # [] only until _before forgets a stale record
        return out

    def _job_keys(self, p: CpuPlacement) -> list[str]:
        return [cpuset_key(d) for d, _ in p.cpusets] + [affinity_key(pid, s) for pid, s, _ in p.affinities]

    def _before(self, wanted: Mapping[str, int], sample: Sample) -> None:
        """Forget records that no longer describe the kernel's state (values someone else
        changed: theirs now; originals already back in place), and record the original of
        every new process that inherited a throttled affinity, so a crash cannot strand it."""
        if self.dry_run:
            return
        self._forget_gone()
        for job, js in sample.jobs.items():
            if js.cpus is None:
                continue
            self._record_inherited(job, js)
            keys = [k for k in self._job_keys(js.cpus) if self.originals.get(k) is not None]
            if not keys:
                continue
            levels = self._candidates(js)
            if levels == [] or (levels == [0] and not wanted.get(job)):
                if levels == []:
                    log.warning("job=%s its CPUs were changed by someone else since noded recorded them; "
                                "forgetting noded's record, leaving them as they are", job)
                try:
                    for key in keys:
                        self.originals.forget(key)
                except StateWriteError as e:
                    log.warning("job=%s forgetting stale originals failed: %s", job, e)

    def _forget_gone(self) -> None:
        """Records of cgroups removed and processes exited: nothing is left to restore."""
        for key, _value in self.originals.items():
            kind, _, where = key.partition(":")
            if kind == "cpuset":
                gone = not os.path.isdir(where)
            elif kind != "affinity":
                continue  # not a core halving record (a GPU's compute mode)
            else:
                pid_text, _, start = where.partition(":")
                fields = stat_fields(self.proc, int(pid_text))
                gone = fields is None or fields[STARTTIME].decode() != start
            if gone:
                try:
                    self.originals.forget(key)
                except StateWriteError as e:
                    log.warning("forgetting the original of %s (gone) failed: %s", where, e)
                    return

    def _record_inherited(self, job: str, js: JobSample) -> None:
        p = js.cpus
        if p is None or p.cpusets or not any(self.originals.get(affinity_key(pid, s)) is not None
                                             for pid, s, _ in p.affinities):
            return
        job_original = self.original_cpus(js)
        levels = self._candidates(js)
        level = levels[0] if levels else 0
        for pid, start, now in p.affinities:
            key = affinity_key(pid, start)
            if level > 0 and self.originals.get(key) is None and set(kept_cpus(job_original, level)) == now:
                try:
                    self.originals.record(key, job_original)
                except StateWriteError as e:
                    log.warning("job=%s pid=%d inherited a throttled affinity; recording its original failed: %s",
                                job, pid, e)

    # -- writes
    def _set_level(self, job: str, level: int, in_force: int, sample: Sample, writes: list[str]) -> None:
        js = sample.jobs[job]
        p = js.cpus
        assert p is not None
        original = self.original_cpus(js)
        if not original:
            raise OSError(f"no CPUs known for job {js.id}")
        if p.cpusets:
            self._set_cpusets(p, kept_cpus(original, level), level, writes)
        else:
            self._set_affinities(p, original, in_force, level, writes)

    def _record(self, key: str, value) -> None:
        if not self.dry_run:
            self.originals.record(key, value)  # durable before the first write, or raises

    def _set_cpusets(self, p: CpuPlacement, cpus: list[int], level: int, writes: list[str]) -> None:
        for d, now in p.cpusets:
            self._record(cpuset_key(d), format_cpu_list(sorted(now)))
        wanted = set(cpus)
        top_now = p.cpusets[0][1]
        growing = not wanted <= top_now
        order = list(p.cpusets) if growing else list(reversed(p.cpusets))  # parents first when growing
        for d, now in order:
            original = set(self._recorded(cpuset_key(d)) or now)
            target = (original & wanted) or wanted
            text = format_cpu_list(sorted(target))
            writes.append(f"{d}/cpuset.cpus <- {text}")
            if not self.dry_run:
                with open(os.path.join(d, "cpuset.cpus"), "w") as f:
                    f.write(text)
        if level == 0 and not self.dry_run:
            for d, _ in p.cpusets:
                self.originals.forget(cpuset_key(d))

    def _set_affinities(self, p: CpuPlacement, job_original: list[int], in_force: int, level: int,
                        writes: list[str]) -> None:
        for pid, start, now in p.affinities:
            key = affinity_key(pid, start)
            original = self._recorded(key)
            if original is None:
                # A process with no record either kept its own affinity, or inherited the
                # one noded gave its parent: then its original is the job's.
                inherited = in_force > 0 and set(kept_cpus(job_original, in_force)) == now
                original = job_original if inherited else sorted(now)
                self._record(key, original)
            cpus = kept_cpus(original, level)
            try:
                tids = [int(t) for t in os.listdir(f"{self.proc}/{pid}/task")]
            except FileNotFoundError:
                continue  # exited: its record goes when the process is seen gone
            writes.append(f"sched_setaffinity({pid} and its {len(tids)} threads, {format_cpu_list(cpus)})")
            if self.dry_run:
                continue
            for tid in tids:
                try:
                    os.sched_setaffinity(tid, cpus)
                except ProcessLookupError:
                    pass
            if level == 0:
                self.originals.forget(key)

    # -- stop, and the start after a crash
    def release_all(self) -> list[str]:
        """Put back every recorded original; returns what could not be restored."""
        return [key for key, ok in self._restore().items() if not ok]

    def restore_all(self) -> list[str]:
        """Put back every recorded original (at start: a crash left them changed)."""
        return [key for key, ok in self._restore().items() if ok]

    def _restore(self) -> dict[str, bool]:
        done: dict[str, bool] = {}
        if self.dry_run:
            return done
        # Parents before children: a child's CPUs must fit in its parent's.
        for key, value in sorted(self.originals.items(), key=lambda kv: (len(kv[0]), kv[0])):
            kind, _, where = key.partition(":")
            if kind not in ("cpuset", "affinity"):
                continue  # not a core halving record (a GPU's compute mode)
            try:
                if kind == "cpuset":
                    if os.path.isdir(where):
                        with open(os.path.join(where, "cpuset.cpus"), "w") as f:
                            f.write(value)
                        log.warning("restored %s/cpuset.cpus <- %s", where, value)
                elif kind == "affinity":
                    pid_text, _, start = where.partition(":")
                    pid = int(pid_text)
                    fields = stat_fields(self.proc, pid)
                    if fields is not None and fields[STARTTIME].decode() == start:
                        for tid in os.listdir(f"{self.proc}/{pid}/task"):
                            try:
                                os.sched_setaffinity(int(tid), value)
                            except ProcessLookupError:
                                pass
                        log.warning("restored sched_setaffinity(%d, %s)", pid, format_cpu_list(sorted(value)))
            except OSError as e:
                log.warning("restoring %s failed: %s", key, e)
                done[key] = False
                continue
            try:
                self.originals.forget(key)
            except StateWriteError as e:
                log.warning("restored %s but could not forget its record: %s", key, e)
            done[key] = True
        return done
