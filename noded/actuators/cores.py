"""Throttling by halving a CPU job's cores, where the host has no MBA (CODA Sec. V-D).

Level L leaves the first ``max(1, n >> L)`` of the job's original n CPUs. A job
with its own cpuset cgroup (the v1 cpuset hierarchy, or v2 with the cpuset
controller) gets its ``cpuset.cpus`` rewritten, children before the parent when
shrinking (a child must stay inside its parent) and after it when growing; any
other job gets the affinity of every thread of every process (new threads and
children inherit it). Original values are recorded before the first write.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from resctrl.cpulist import format_cpu_list, parse_cpu_list

from ..procstat import STARTTIME, stat_fields
from ..sample import CPU, JobSample, Sample
from ..state import OriginalValues
from .plan import LevelThrottle

log = logging.getLogger(__name__)


def kept_cpus(original: list[int], level: int) -> list[int]:
    """The CPUs a job keeps at a level: halved per level, never below one."""
    cpus = sorted(original)
    return cpus[: max(1, len(cpus) >> level)]


def max_level(ncpus: int) -> int:
    return max(0, ncpus.bit_length() - 1)  # halvings until one CPU is left



def read_cpuset_file(path: str, name: str) -> str:
    """A cgroup's ``cpuset.cpus`` or ``cpuset.mems``, or its ``.effective`` where cgroup v2
    leaves the file empty to inherit the parent's; '' where neither says."""
    for n in (name, f"{name}.effective"):
        try:
            with open(os.path.join(path, n)) as f:
                value = f.read().strip()
        except FileNotFoundError:
            continue
        if value:
            return value
    return ""

@dataclass(frozen=True)
class _Target:
    kind: str  # cpuset | affinity
    where: str  # cgroup directory, or a pid


class CoreHalving(LevelThrottle):
    kind = "cores"

    def __init__(self, originals: OriginalValues, *, proc: str = "/proc", dry_run: bool = False):
        super().__init__(dry_run=dry_run)
        self.originals = originals
        self.proc = proc

    # -- what a job's CPUs are
    def _cpuset_dir(self, js: JobSample) -> str | None:
        if js.cgroup and os.path.exists(os.path.join(js.cgroup, "cpuset.cpus")):
            return js.cgroup
        return None

    def _read_cpuset(self, path: str) -> list[int]:
        return sorted(parse_cpu_list(read_cpuset_file(path, "cpuset.cpus")))

    def original_cpus(self, js: JobSample) -> list[int]:
        path = self._cpuset_dir(js)
        if path:
            recorded = self.originals.get(f"cpuset:{path}")
            return sorted(parse_cpu_list(recorded)) if recorded is not None else self._read_cpuset(path)
        for pid in sorted(js.pids):
            key = self._affinity_key(pid)
            if key is None:
                continue
            recorded = self.originals.get(key)
            if recorded is not None:
                return sorted(recorded)
            try:
                return sorted(os.sched_getaffinity(pid))
            except ProcessLookupError:
                continue
        return []

    @staticmethod
    def level_share(level: int) -> float:
        return 0.5 ** level  # cores halved per level; bandwidth roughly follows

    def max_levels(self, sample: Sample) -> dict[str, int]:
        return {j: max_level(len(self.original_cpus(js))) for j, js in sample.jobs.items() if js.kind == CPU}

    def _affinity_key(self, pid: int) -> str | None:
        # The start time tells a reused pid from the process we recorded.
        fields = stat_fields(self.proc, pid)
        return None if fields is None else f"affinity:{pid}:{fields[STARTTIME].decode()}"

    # -- writes
    def _write_cpuset_tree(self, root: str, cpus: list[int], writes: list[str]) -> None:
        dirs = [d for d, _sub, files in os.walk(root) if "cpuset.cpus" in files]
        wanted = set(cpus)
        for d in dirs:
            self.originals.record(f"cpuset:{d}", format_cpu_list(self._read_cpuset(d)))
        current = set(self._read_cpuset(root))
        growing = not wanted <= current
        order = dirs if growing else list(reversed(dirs))  # parents first when growing
        for d in order:
            original = set(parse_cpu_list(self.originals.get(f"cpuset:{d}")))
            target = (original & wanted) or wanted
            text = format_cpu_list(target)
            writes.append(f"{d}/cpuset.cpus <- {text}")
            if not self.dry_run:
                with open(os.path.join(d, "cpuset.cpus"), "w") as f:
                    f.write(text)

    def _set_affinity(self, pid: int, cpus: list[int], writes: list[str]) -> None:
        key = self._affinity_key(pid)
        if key is None:
            return
        try:
            self.originals.record(key, sorted(os.sched_getaffinity(pid)))
            tids = [int(t) for t in os.listdir(f"{self.proc}/{pid}/task")]
        except (ProcessLookupError, FileNotFoundError):
            return
        writes.append(f"sched_setaffinity({pid} and its {len(tids)} threads, {format_cpu_list(cpus)})")
        if self.dry_run:
            return
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                pass

    def _set_level(self, job: str, level: int, sample: Sample, writes: list[str]) -> None:
        js = sample.jobs[job]
        original = self.original_cpus(js)
        if not original:
            raise OSError(f"no CPUs known for job {js.id}")
        cpus = kept_cpus(original, level)
        path = self._cpuset_dir(js)
        if path:
            self._write_cpuset_tree(path, cpus, writes)
            if level == 0:
                for d, _sub, _files in os.walk(path):
                    self.originals.forget(f"cpuset:{d}")
            return
        for pid in sorted(js.pids):
            key = self._affinity_key(pid)
            if level == 0 and key is not None and self.originals.get(key) is not None:
                cpus = sorted(self.originals.get(key))
            self._set_affinity(pid, cpus, writes)
            if level == 0 and key is not None:
                self.originals.forget(key)

    def release_all(self, sample: Sample | None = None) -> None:
        self.current.clear()
        self.restore_all()

    def restore_all(self) -> list[str]:
        """Put back every recorded original (after a stop, or a crash before this start)."""
        restored = []
        for key, value in self.originals.items():
            kind, _, where = key.partition(":")
            try:
                if kind == "cpuset" and os.path.isdir(where):
                    if not self.dry_run:
                        with open(os.path.join(where, "cpuset.cpus"), "w") as f:
                            f.write(value)
                    restored.append(f"{where}/cpuset.cpus <- {value}")
                elif kind == "affinity":
                    pid = int(where.split(":")[0])
                    if self._affinity_key(pid) == key and not self.dry_run:
                        for tid in os.listdir(f"{self.proc}/{pid}/task"):
                            try:
                                os.sched_setaffinity(int(tid), value)
                            except ProcessLookupError:
                                pass
                    restored.append(f"sched_setaffinity({pid}, {format_cpu_list(value)})")
            except OSError as e:
                log.warning("restoring %s failed: %s", key, e)
                continue
            if not self.dry_run:
                self.originals.forget(key)
        return restored
