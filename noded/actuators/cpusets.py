"""The one owner of every job's CPUs: whatever set a policy wants, written here only.

Contention core halving, right-sizing and lending all want to change a job's CPUs; they
say what they want (a CPU set per job, or no wish), ``noded.rightsize.cpuplan`` composes
it, and ``CpuSetOwner`` carries it out with the same rules for every one of them:

* **Where a job's CPUs are set.** A job with a cpuset cgroup of its own (the v1 cpuset
  hierarchy, or v2 with the cpuset controller) is confined by its directory's and its
  descendants' ``cpuset.cpus``; any other job by the affinity of every thread of every
  process (new threads and children inherit it). What the kernel shows now comes from
  the Sample (``CpuPlacement``), never from what noded remembers having written.
* **What each of them gets.** The job's directory (or each process) gets the wanted set,
  a descendant what its own original keeps of its parent's new set plus whatever the
  parent got beyond its original (lent CPUs reach the tasks), or all of the parent's
  where that leaves nothing (``derived``). A wish equal to the job's original, or no
  wish, puts every recorded original back.
* **Record before you touch.** Before the first write to a cpuset or an affinity its
  original goes durably into ``originals.json`` (``OriginalValues``) and every value noded
  is about to leave there (the target, and what a cpuset holds between two writes) into
  ``cpus_written.json``; when either cannot be written nothing is changed, and the
  change fails saying why.
* **Only differences, in an order the kernel accepts.** A child's CPUs must stay inside
  its parent's: what shrinks is shrunk children first, what grows grown parents first,
  and a change that is both (CPUs swapped) shrinks what it can first, grows to the
  union, then shrinks to the target (``cpuset_steps``). All writes go through
  ``O_NOFOLLOW`` and never create a file.
* **Someone else's change is theirs.** A value that is neither the original nor one noded
  wrote (a scheduler's resize, an operator) means the job's CPUs are someone else's now:
  noded forgets its records of the job and leaves every value as it is. Such a value only
  below the job's own directory (its owner's, in a delegated subtree) is taken as that
  cgroup's original: the job's CPUs are still noded's to put back, and a child is always
  kept inside what its parent gets back (``fitted``), so CPUs lent are never kept that way.
* **What appears meanwhile is recorded at once.** A cgroup or a process that appears in a
  changed job holding what it inherited from noded's write (a new Slurm step, a fork) gets
  the original of its parent (its cgroup's, or the job's) recorded, so neither a release
  nor a crash leaves it changed.
* **Restored** when the job's wish goes, at stop (``release_all``), and at the next start
  after a crash (``restore_all``), only where the value is still one noded wrote
  (``noded.actuators.cpurestore``; a job's view, its values and records, is
  ``noded.actuators.cpuview``'s).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping

from resctrl.cpulist import format_cpu_list

from noded.actuators.cpuio import set_affinity
from noded.actuators.cpuio import write_cpuset
from noded.actuators.cpurecords import WrittenValues
from noded.actuators.cpurecords import affinity_job_key
from noded.actuators.cpurecords import affinity_key
from noded.actuators.cpurecords import cpus_of
from noded.actuators.cpurecords import cpuset_key
from noded.actuators.cpurestore import CpuRestore, forget_unrecorded_writes
from noded.actuators.cpuview import CpuNode, JobCpus, alive, ours, parent_of
from noded.samplers.sample import JobSample
from noded.samplers.sample import Sample
from noded.stores.originals import OriginalValues
from noded.stores.originals import StateWriteError
from noded.util import paths
from noded.util.cputree import CpuSet
from noded.util.cputree import cpuset_steps
from noded.util.cputree import derived
from noded.util.cputree import fitted
from noded.util.journal import log_change

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CpuChange:
    """One job's change: ``cpus`` the wanted set (None: its originals back); ``writes``
    what was (in dry-run: would be) written; ``error`` why it failed."""

    job: str
    cpus: tuple[int, ...] | None
    writes: tuple[str, ...]
    error: str | None = None
    from_cpus: tuple[int, ...] = ()

    @property
    def operation(self) -> str:
        return "release" if self.cpus is None else "set"


@dataclass(frozen=True)
class CpuSetResult:
    applied: tuple[CpuChange, ...]  # every change tried (dry-run: only news)
    cpus: Mapping[str, tuple[int, ...]]  # per job with a wish other than its original: the set it has now
    failed: tuple[CpuChange, ...] = ()
    housekeeping_failed: tuple[str, ...] = ()  # "record": an original not recorded or forgotten
    # per job at its own CPUs after this apply (found there, or put back): its original set
    at_original: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))


class CpuSetOwner:
    """Applies a wanted CPU set per job (see the module's docstring). ``originals``: the
    durable records (their directory also holds ``cpus_written.json``)."""

    def __init__(self, originals: OriginalValues, *, proc: str = "/proc", dry_run: bool = False):
        self.originals = originals
        self.written = WrittenValues(originals.dir)
        self.notes = self.written.notes
        self.proc = proc
        self.dry_run = dry_run
        self.restorer = CpuRestore(originals, self.written, proc)
        self._would: dict[str, tuple[tuple[int, ...] | None, tuple[str, ...]]] = {}

    # -- reading (no I/O: the Sample and the records)
    def view(self, job: str, js: JobSample) -> JobCpus | None:
        p = js.cpus
        if p is None or (not p.cpusets and not p.affinities):
            return None
        if p.cpusets:
            nodes: list[CpuNode] = []
            for d, now in p.cpusets:
                nodes.append(CpuNode(cpuset_key(d), d, now, self._recorded(cpuset_key(d)), parent_of(nodes, d)))
            return JobCpus(job, js, True, tuple(nodes), nodes[0].original)
        procs = tuple(CpuNode(affinity_key(pid, start), pid, now, self._recorded(affinity_key(pid, start)))
                      for pid, start, now in p.affinities)
        record = self.originals.get(affinity_job_key(job))
        if isinstance(record, dict):
            original = frozenset(record["original"])
        else:
            original = next((n.recorded for n in procs if n.recorded is not None), procs[0].now)
        return JobCpus(job, js, False, procs, original)

    def _recorded(self, key: str) -> CpuSet | None:
        value = self.originals.get(key)
        return None if value is None else cpus_of(value)

    def original_cpus(self, js: JobSample) -> list[int]:
        """The job's CPUs before noded touched them: recorded, else as they are now."""
        v = self.view(js.id, js)
        return sorted(v.original) if v is not None else []

    def targets(self, v: JobCpus, wanted: Iterable[int] | None) -> list[CpuSet]:
        """What each cgroup or process of the job gets for ``wanted`` (None, or the job's
        original: every recorded original back, the rest as it is)."""
        w = None if wanted is None else frozenset(wanted)
        if w is None or w == v.original:
            return fitted(v.nodes, [n.original for n in v.nodes]) if v.cpusets else [n.original for n in v.nodes]
        if not v.cpusets:
            return [derived(n.original, v.original, w) for n in v.nodes]
        out: list[CpuSet] = []
        for n in v.nodes:
            out.append(w if n.parent is None else derived(n.original, v.nodes[n.parent].original, out[n.parent]))
        return out

    def matches(self, v: JobCpus, wanted: Iterable[int] | None) -> bool:
        """Whether the kernel shows what ``wanted`` gives the job, every cgroup or process."""
        return all(t == n.now for t, n in zip(self.targets(v, wanted), v.nodes))

    def changed_by_others(self, v: JobCpus) -> bool:
        """Whether a recorded value of the job is neither its original nor one noded wrote."""
        return any(not ours(self.written, v, n) for n in v.recorded)

    # -- before the changes: forget what is stale, record what appeared
    def prepare(self, sample: Sample, wishes: Mapping[str, Iterable[int] | None]) -> list[str]:
        """Forget records of what is gone and of jobs someone else changed, record what
        appeared in a changed job, forget the records of jobs back at their originals with
        no wish. Returns the failures ("record"), once per kind of step."""
        if self.dry_run:
            return []
        failed = self._forget_gone(sample)
        if failed:
            return failed
        for job, js in sorted(sample.jobs.items()):
            v = self.view(job, js)
            if v is None:
                continue
            keys = [n.key for n in v.recorded] + ([affinity_job_key(job)] if not v.cpusets and
                                                  self.originals.get(affinity_job_key(job)) is not None else [])
            if not keys:
                continue
            try:
                foreign = [n for n in v.recorded if not ours(self.written, v, n)]  # see changed_by_others
                if foreign and v.cpusets and ours(self.written, v, v.nodes[0]):
                    # Only cgroups below the job's own (its owner's, delegated): their values
                    # are theirs, but the job's CPUs are still noded's to put back. Their
                    # records go; each is recorded afresh below as what it holds now.
                    for n in foreign:
                        log.warning("job=%s %s/cpuset.cpus is %s, which noded did not set (its owner changed it): "
                                    "taken as its original", job, n.where, format_cpu_list(sorted(n.now)))
                    self._forget(n.key for n in foreign)
                    v = self.view(job, js)
                    keys = [n.key for n in v.recorded]
                elif foreign:
                    log.warning("job=%s its CPUs were changed by someone else since noded recorded them (%s is %s); "
                                "forgetting noded's records, leaving them as they are", job, foreign[0].where,
                                format_cpu_list(sorted(foreign[0].now)))
                    self._forget(keys)
                    continue
                if any(n.now != n.recorded for n in v.recorded):
                    self._record_inherited(v)
                wish = wishes.get(job)
                if (wish is None or frozenset(wish) == v.original) and self.matches(v, None):
                    self._forget(keys)
            except StateWriteError as e:
                log.warning("job=%s recording or forgetting originals failed: %s", job, e)
                return ["record"]
        return []

    def _record_inherited(self, v: JobCpus) -> None:
        """A cgroup or process with no record in a changed job: holding what its parent holds
        (its cgroup's now, or a set noded gave the job's processes), it inherited noded's
        write, and its original is its parent's; a cgroup holding anything else keeps its own."""
        for n in v.nodes:
            if n.recorded is not None:
                continue
            if v.cpusets:
                parent = v.nodes[n.parent] if n.parent is not None else None
                inherited = parent is not None and n.now == parent.now and parent.now != parent.original
                original = parent.original if inherited and parent is not None else n.now
            else:
                given = set(self.written.get(affinity_job_key(v.job)) or ()) | {
                    p.now for p in v.recorded if p.recorded == v.original and p.now != p.recorded}
                if n.now not in given:
                    continue  # its own affinity: not noded's to restore
                inherited, original = True, v.original
            if inherited:
                self.written.update({n.key: [n.now]})
            self.originals.record(n.key, format_cpu_list(sorted(original)) if v.cpusets else sorted(original))
            log.info("job=%s %s appeared while its CPUs are changed; original recorded: %s", v.job, n.where,
                     format_cpu_list(sorted(original)))

    def _forget(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for key in keys:
            self.originals.forget(key)
        self.written.update({k: None for k in keys})

    def _forget_gone(self, sample: Sample) -> list[str]:
        """Records of cgroups removed, processes exited and jobs ended: nothing is left to
        restore. Written values with no original left go too."""
        for key, _value in self.originals.items():
            kind, _, where = key.partition(":")
            if kind == "cpuset":
                try:
                    gone = not paths.isdir(where)
                except OSError:
                    gone = False  # shut to noded (a tenant's chmod): there, maybe with noded's value: kept
            elif kind == "affinity_job":
                gone = where not in sample.jobs
            elif kind == "affinity":
                pid_text, _, start = where.partition(":")
                gone = not alive(self.proc, int(pid_text), start)
            else:
                continue  # not a record of CPUs (a GPU's compute mode)
            if gone:
                try:
                    self.originals.forget(key)
                except StateWriteError as e:
                    log.warning("forgetting the original of %s (gone) failed: %s", where, e)
                    return ["record"]
        try:
            forget_unrecorded_writes(self.originals, self.written)
        except StateWriteError as e:
            log.warning("forgetting what noded wrote into CPUs no longer recorded failed: %s", e)
            return ["record"]
        return []

    # -- the changes
    def change(self, v: JobCpus, wanted: Iterable[int] | None, writes: list[str]) -> None:
        """Give one job ``wanted`` (None: its originals back), writing only what differs.
        Raises OSError (a write failed: ``writes`` holds those made) or StateWriteError
        (an original or the values about to be written could not be recorded: nothing written)."""
        w = None if wanted is None else frozenset(wanted)
        restoring = w is None or w == v.original
        targets = self.targets(v, w)
        if v.cpusets:
            steps = cpuset_steps([(n.now, t, n.parent) for n, t in zip(v.nodes, targets)])
        else:
            steps = [(i, t) for i, (n, t) in enumerate(zip(v.nodes, targets)) if t != n.now]
        if not steps:
            return
        if self.dry_run:
            writes.extend(self._describe(v, i, value) for i, value in steps)
            return
        touched = list(dict.fromkeys(i for i, _ in steps))
        # Record before you touch: what noded may leave there, then the originals.
        update: dict[str, list[CpuSet]] = {}
        for i in touched:
            n = v.nodes[i]
            values = [n.now] + [value for j, value in steps if j == i]
            update[n.key] = [x for x in values if x != n.original]
        if not v.cpusets and not restoring:
            before = [x for x in (self.written.get(affinity_job_key(v.job)) or ()) if x in {n.now for n in v.nodes}]
            update[affinity_job_key(v.job)] = before + [w]
        self.written.update(update)
        # Every cgroup or process of a job noded changes, touched or not: one of them could
        # not be told later from one that inherited noded's write.
        for n in v.nodes if not restoring else [v.nodes[i] for i in touched]:
            self.originals.record(n.key, format_cpu_list(sorted(n.now)) if v.cpusets else sorted(n.now))
        if not v.cpusets and not restoring:
            # The job as a whole, so whatever it forks while noded is down is put back too.
            root = min(v.js.cpus.affinities, key=lambda a: (int(a[1]), a[0]))
            self.originals.record(affinity_job_key(v.job), {"original": sorted(v.original), "cgroup": v.js.cgroup,
                                                            "root": [root[0], root[1]]})
        for i, value in steps:
            n = v.nodes[i]
            if v.cpusets:
                write_cpuset(str(n.where), format_cpu_list(sorted(value)))
            else:
                set_affinity(self.proc, int(n.where), sorted(value))
            writes.append(self._describe(v, i, value))  # made: a refused write is the error's
        if restoring:
            keys = [n.key for n in v.recorded] + ([] if v.cpusets else [affinity_job_key(v.job)])
            self._forget(keys)

    @staticmethod
    def _describe(v: JobCpus, i: int, value: CpuSet) -> str:
        n = v.nodes[i]
        if v.cpusets:
            return f"{n.where}/cpuset.cpus <- {format_cpu_list(sorted(value))}"
        return f"sched_setaffinity({n.where} and its threads, {format_cpu_list(sorted(value))})"

    def apply(self, wishes: Mapping[str, Iterable[int] | None], sample: Sample) -> CpuSetResult:
        """Every job of the Sample to its wish (no wish: its originals), only what differs;
        jobs losing CPUs first, so CPUs taken from one job are free before another gets them."""
        if not sample.jobs_known:
            return CpuSetResult((), MappingProxyType({}))
        housekeeping = self.prepare(sample, wishes)
        todo = []
        held: dict[str, tuple[int, ...]] = {}
        own: dict[str, tuple[int, ...]] = {}
        for job, js in sorted(sample.jobs.items()):
            v = self.view(job, js)
            if v is None:
                continue
            wish = wishes.get(job)
            w = None if wish is None or frozenset(wish) == v.original else frozenset(wish)
            if self.matches(v, w):
                if w is not None:
                    held[job] = tuple(sorted(w))
                else:
                    own[job] = tuple(sorted(v.original))
                continue
            growing = not frozenset().union(*self.targets(v, w)) <= v.now
            todo.append((growing, job, v, w))
        out: list[CpuChange] = []
        for _growing, job, v, w in sorted(todo, key=lambda t: (t[0], t[1])):
            writes: list[str] = []
            cpus = None if w is None else tuple(sorted(w))
            try:
                self.change(v, w, writes)
            except (OSError, StateWriteError) as e:
                out.append(CpuChange(job, cpus, tuple(writes), str(e), tuple(sorted(v.now))))
                continue
            out.append(CpuChange(job, cpus, tuple(writes), None, tuple(sorted(v.now))))
            if cpus is not None and not self.dry_run:
                held[job] = cpus
            elif not self.dry_run:
                own[job] = tuple(sorted(v.original))
        shown = self._dry_run_news(out) if self.dry_run else out
        for c in shown:
            to = format_cpu_list(list(c.cpus)) if c.cpus is not None else "original"
            if c.error:
                log_change("apply-failed", c.job, severity=logging.WARNING, actuator="cpusets",
                           cpus_from=format_cpu_list(list(c.from_cpus)), cpus=to,
                           reason=c.error + (f" (after: {'; '.join(c.writes)})" if c.writes else ""))
            else:
                log_change("dry-run" if self.dry_run else "applied", c.job, actuator="cpusets",
                           cpus_from=format_cpu_list(list(c.from_cpus)), cpus=to,
                           reason=("would write " if self.dry_run else "") + "; ".join(c.writes))
        return CpuSetResult(tuple(shown), MappingProxyType(held), tuple(c for c in out if c.error),
                            tuple(housekeeping), MappingProxyType(own))

    def _dry_run_news(self, out: list[CpuChange]) -> list[CpuChange]:
        news = [c for c in out if self._would.get(c.job) != (c.cpus, c.writes)]
        self._would = {c.job: (c.cpus, c.writes) for c in out}
        return news

    # -- stop, and the start after a crash (noded.actuators.cpurestore)
    def release_all(self) -> list[str]:
        """Put back every recorded original; returns what could not be restored."""
        return [key for key, ok in self._restore().items() if not ok]

    def restore_all(self) -> list[str]:
        """Put back every recorded original (at start: a crash left them changed)."""
        return [key for key, ok in self._restore().items() if ok]

    def _restore(self) -> dict[str, bool]:
        return {} if self.dry_run else self.restorer.restore()
