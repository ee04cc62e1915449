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

from ..jobs.cgroups import read_procs
from ..jobs.discovery import descendants, read_ppids
from ..journal import log_change
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


def affinity_job_key(job: str) -> str:
    return f"affinity_job:{job}"


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
        self._forget_gone(sample)
        for job, js in sample.jobs.items():
            if js.cpus is None:
                continue
            self._record_inherited(job, js)
            keys = [k for k in self._job_keys(js.cpus) + [affinity_job_key(job)] if self.originals.get(k) is not None]
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
                    self._housekeeping_failure("record")

    def _forget_gone(self, sample: Sample) -> None:
        """Records of cgroups removed, processes exited and jobs ended: nothing is left to restore."""
        for key, _value in self.originals.items():
            kind, _, where = key.partition(":")
            if kind == "cpuset":
                gone = not os.path.isdir(where)
            elif kind == "affinity_job":
                gone = where not in sample.jobs
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
                    self._housekeeping_failure("record")
                    return

    def _record_inherited(self, job: str, js: JobSample) -> None:
        """While a job is halved, what appears in it since (a new Slurm step's cgroup, a
        forked process) holds what it inherited from noded's write: its original is the
        job's. Recorded at once, so neither a release nor a crash leaves it halved."""
        p = js.cpus
        if p is None or not any(self.originals.get(k) is not None for k in self._job_keys(p)):
            return  # never touched by noded
        levels = self._candidates(js)
        if not levels or levels[0] == 0:
            return
        job_original = self.original_cpus(js)
        inherited = set(kept_cpus(job_original, levels[0]))
        new = ([(cpuset_key(d), format_cpu_list(job_original if now == inherited else sorted(now)))
                for d, now in p.cpusets[1:]] if p.cpusets else
               [(affinity_key(pid, s), job_original) for pid, s, now in p.affinities if now == inherited])
        for key, original in new:
            if self.originals.get(key) is None:
                try:
                    self.originals.record(key, original)
                except StateWriteError as e:
                    log.warning("job=%s %s appeared while halved; recording its original failed: %s", job, key, e)
                    self._housekeeping_failure("record")

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
            self._set_affinities(job, js, original, in_force, level, writes)

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
            text = format_cpu_list(sorted((original & wanted) or wanted))
            writes.append(f"{d}/cpuset.cpus <- {text}")
            if not self.dry_run:
                write_cpuset(d, text)
        if level == 0 and not self.dry_run:
            for d, _ in p.cpusets:
                self.originals.forget(cpuset_key(d))

    def _set_affinities(self, job: str, js: JobSample, job_original: list[int], in_force: int, level: int,
                        writes: list[str]) -> None:
        p = js.cpus
        assert p is not None
        if level:
            # The job as a whole, so whatever it forks while noded is down is put back too.
            root = min(p.affinities, key=lambda a: (int(a[1]), a[0]))
            self._record(affinity_job_key(job), {"original": job_original, "cgroup": js.cgroup,
                                                 "root": [root[0], root[1]]})
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
            writes.append(f"sched_setaffinity({pid} and its threads, {format_cpu_list(cpus)})")
            if self.dry_run:
                continue
            set_affinity(self.proc, pid, cpus)
            if level == 0:
                self.originals.forget(key)
        if level == 0 and not self.dry_run:
            self.originals.forget(affinity_job_key(job))

    # -- stop, and the start after a crash
    def release_all(self) -> list[str]:
        """Put back every recorded original; returns what could not be restored."""
        return [key for key, ok in self._restore().items() if not ok]

    def restore_all(self) -> list[str]:
        """Put back every recorded original (at start: a crash left them changed)."""
        return [key for key, ok in self._restore().items() if ok]

    def _restore(self) -> dict[str, bool]:
        """Every record put back, but only where the value is still one noded set: a value
        someone else changed meanwhile (a scheduler's resize) is theirs, and left as it is."""
        done: dict[str, bool] = {}
        if self.dry_run:
            return done
        records = dict(self.originals.items())
        # Parents before children: a child's CPUs must fit in its parent's.
        for key, value in sorted(records.items(), key=lambda kv: (len(kv[0]), kv[0])):
            kind, _, where = key.partition(":")
            if kind not in ("cpuset", "affinity", "affinity_job"):
                continue  # not a core halving record (a GPU's compute mode)
            try:
                if kind == "cpuset":
                    self._restore_cpuset(where, value, records)
                elif kind == "affinity":
                    pid_text, _, start = where.partition(":")
                    if self._alive(int(pid_text), start):
                        self._restore_affinity(int(pid_text), sorted(value))
                else:
                    for pid in self._job_pids(value):
                        self._restore_affinity(pid, sorted(value["original"]), inherited_only=True)
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

    def _alive(self, pid: int, start: str) -> bool:
        fields = stat_fields(self.proc, pid)
        return fields is not None and fields[STARTTIME].decode() == start

    def _restore_cpuset(self, path: str, value: str, records: Mapping[str, object]) -> None:
        if not os.path.isdir(path):
            return
        original = set(parse_cpu_list(value))
        try:
            now = set(parse_cpu_list(read_cpuset(path)))
        except (OSError, ValueError) as e:
            log.warning("not restoring %s: not a cpuset (%s); forgetting noded's record", path, e)
            return
        if now == original:
            return
        # The job's directory is the outermost one recorded; what noded wrote below it at
        # level L was (original & kept) or kept, kept being the job's CPUs at L.
        top = min((k.partition(":")[2] for k in records if k.startswith("cpuset:")
                   and (path == k.partition(":")[2] or path.startswith(k.partition(":")[2] + os.sep))), key=len)
        top_original = sorted(parse_cpu_list(records[cpuset_key(top)]))
        ours = [set(kept_cpus(top_original, lvl)) for lvl in range(1, max_level(len(top_original)) + 1)]
        if not any(now == ((original & kept) or kept) for kept in ours):
            log.warning("not restoring %s/cpuset.cpus: it is %s, which noded did not set (someone else changed "
                        "it); forgetting noded's record", path, format_cpu_list(sorted(now)))
            return
        write_cpuset(path, value)
        log_change("restored", None, cpuset=path, cpus=value, reason="cpuset.cpus written back")

    def _restore_affinity(self, pid: int, original: list[int], inherited_only: bool = False) -> None:
        try:
            now = os.sched_getaffinity(pid)
        except ProcessLookupError:
            return
        if now == set(original):
            return
        if not any(now == set(kept_cpus(original, lvl)) for lvl in range(1, max_level(len(original)) + 1)):
            if not inherited_only:
                log.warning("not restoring the affinity of %d: it is %s, which noded did not set; forgetting "
                            "noded's record", pid, format_cpu_list(sorted(now)))
            return
        set_affinity(self.proc, pid, original)
        log_change("restored", None, pid=pid, cpus=format_cpu_list(original), reason="sched_setaffinity back")

    def _job_pids(self, record: Mapping) -> set[int]:
        """The processes of a job halved by affinity now: its cgroup's, else its tree's."""
        cgroup, root = record.get("cgroup"), record.get("root")
        if cgroup and os.path.isdir(cgroup):
            return read_procs(cgroup)
        if root and self._alive(int(root[0]), str(root[1])):
            return descendants(int(root[0]), read_ppids(self.proc))
        return set()


def read_cpuset(path: str) -> str:
    """A cgroup's cpuset.cpus, never through a link (only records noded made name cgroups)."""
    fd = os.open(os.path.join(path, "cpuset.cpus"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def write_cpuset(path: str, text: str) -> None:
    """Write a cgroup's cpuset.cpus: never creating a file, never through a link."""
    fd = os.open(os.path.join(path, "cpuset.cpus"), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def set_affinity(proc: str, pid: int, cpus) -> None:
    """Every thread of a process (new threads and children inherit it)."""
    try:
        tids = [int(t) for t in os.listdir(f"{proc}/{pid}/task")]
    except FileNotFoundError:
        return  # exited
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            pass
