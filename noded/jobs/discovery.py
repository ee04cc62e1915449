"""Finding the jobs on the host: cgroup sources, registered process trees, labels."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Mapping, NamedTuple

from noded.util.journal import printable, words
from noded.util.ratelimit import RateLimitedLog
from noded.stores.securedir import SecureDir, StateWriteError
from noded.jobs.labelwords import REGISTRABLE
from noded.util.yamlsafe import read_yaml_file
from noded.jobs.cgroups import CgroupScanner, CgroupSource, read_process_cgroups
from noded.jobs.heldsubtrees import HeldSubtrees
from noded.jobs.cgroupwalk import NODED_SHORT_OF
from noded.jobs.proccgroup import ProcCgroupError
from noded.jobs.kubepods import PodIdentities
from noded.jobs.model import Job, JobMeta
from noded.jobs.polling import DEFAULT_MAX_POLLED, SourceCost, SourcePoll
from noded.jobs.procscan import ProcRotation
from noded.jobs.proctree import TREE_READS, TreeOverBound, descendants, read_ppids, tree_of

log = logging.getLogger(__name__)
#: processes attributed to no job because their /proc/PID/cgroup was refused
_UNATTRIBUTED = RateLimitedLog(log, interval_s=60.0)

NO_LABELS = JobMeta()  # a job nobody labelled (frozen: one serves them all)


class _Short(NamedTuple):
    """A job whose subtree a walk could not read whole: what it read, and why."""

    poll: SourcePoll
    job_id: str
    path: str
    pids: frozenset[int]
    why: str


class LabelFile:
    """YAML mapping job id -> labels (category, model, batch_size, requested_cores, priority, exempt,
    the right-sizing hints pipelined, many_weights, heavy_preprocessing, and the cache curve
    dataset_gb, uncached_share).

    Re-read when its mtime changes. A broken file keeps the previous labels and logs
    why once (a typo must not drop every job's exemption).
    """

    def __init__(self, path: str | None):
        self.path = path
        self._mtime: float | None = None
        self.labels: dict[str, JobMeta] = {}
        self.error: str | None = None

    def refresh(self) -> dict[str, JobMeta]:
        if not self.path:
            return self.labels
        try:
            mtime = os.stat(self.path).st_mtime
        except FileNotFoundError:
            self.labels, self._mtime = {}, None
            return self.labels
        if mtime == self._mtime:
            return self.labels
        self._mtime = mtime
        try:
            self.labels = parse_labels(self.path)
            self.error = None
        except (OSError, ValueError) as e:  # ValueError: yamlsafe.YamlError and bad labels
            self.error = str(e)
            log.error("labels=%s rejected, keeping the previous ones: %s", self.path, e)
        return self.labels


def parse_labels(path: str) -> dict[str, JobMeta]:
    data = read_yaml_file(path).data or {}  # bounded; refuses aliases and duplicate job ids
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of job id to labels, got {type(data).__name__}")
    out = {}
    for job_id, labels in data.items():
        if not isinstance(job_id, str):  # else 1 and "1" would both be job "1", one silently lost
            raise ValueError(f"{path}: job id {job_id!r} must be a string such as slurm:4242")
        if not isinstance(labels, dict):
            raise ValueError(f"{path}: labels of {job_id!r} must be a mapping")
        out[job_id] = JobMeta.from_mapping(labels, f"{path}: {job_id}")
    return out


#: where registered labels are kept in the state directory
REGISTERED_FILE = "registered_labels.json"
#: how long a job with registered labels may be missing from every source before they are
#: forgotten (its Epilog missed noded): longer than a Prolog runs before the job's cgroup exists
ABSENT_FORGET_S = 3600.0


def parse_registered(raw: object, limit: int) -> dict[str, JobMeta]:
    """The registered-labels file's content; ValueError names what is wrong (the file is
    then moved aside, not trusted in part)."""
    if not isinstance(raw, dict):
        raise ValueError(f"expected a mapping of job id to labels, got {type(raw).__name__}")
    if len(raw) > limit:
        raise ValueError(f"{len(raw)} jobs, more than the {limit} kept")
    out = {}
    for job_id, labels in raw.items():
        if not isinstance(labels, dict):
            raise ValueError(f"labels of {job_id!r} must be a mapping")
        refused = sorted(set(labels) - set(REGISTRABLE))
        if refused:
            raise ValueError(f"labels of {job_id!r}: {refused} cannot be registered")
        out[job_id] = JobMeta.from_mapping(labels, f"labels of {job_id!r}")
    return out


class RegisteredLabels:
    """Labels registered at run time by a job manager's hook (a Slurm prolog through
    `nodectl label`), job id -> JobMeta, until its end hook forgets them (`nodectl forget`).

    Kept in ``state`` (the state directory) where one is given: in force once written
    (a write that fails raises StateWriteError and changes nothing), so a restart of noded
    keeps the labels of the jobs running through it. At most ``limit`` jobs (a hook whose
    end never runs must not grow noded without bound): beyond, a registration is refused.
    """

    def __init__(self, limit: int = 4096, *, state: SecureDir | None = None, persist: bool = True):
        self.limit = limit
        self.state = state
        self.persist = persist and state is not None  # persist=False: a dry run writes nothing
        self._lock = threading.Lock()
        self._labels: dict[str, JobMeta] = {}
        self._absent_since: dict[str, float] = {}  # job id -> when discovery first missed it
        self.notes: list[str] = []  # what was found corrupt at load, and where it went
        if state is not None:
            loaded, note = state.load_json(REGISTERED_FILE, "registered labels",
                                           lambda raw: parse_registered(raw, limit))
            self._labels = loaded or {}
            if note:
                self.notes.append(note)

    def _keep(self, labels: dict[str, JobMeta]) -> None:
        # under self._lock; memory changes only after this returns
        if self.persist:
            self.state.write_json(REGISTERED_FILE, {j: m.set_labels() for j, m in labels.items()})
        self._labels = labels

    def set(self, job_id: str, labels: dict) -> JobMeta:
        """Registers ``labels`` (a mapping of ``REGISTRABLE`` keys) for ``job_id``, replacing
        any before; raises ValueError naming what was wrong (or StateWriteError where they
        could not be kept), and then changes nothing."""
        refused = sorted(set(labels) - set(REGISTRABLE))
        if refused:
            raise ValueError(f"label(s) {refused} cannot be registered for a job (allowed: {', '.join(REGISTRABLE)}; "
                             "exempt and priority are the operator's: jobs.labels or nodectl exempt)")
        meta = JobMeta.from_mapping(dict(labels), f"labels of {job_id}")
        with self._lock:
            if job_id not in self._labels and len(self._labels) >= self.limit:
                raise ValueError(f"{len(self._labels)} jobs hold registered labels already, the most kept: forget "
                                 "ended jobs first (nodectl forget JOB, a Slurm epilog's work)")
            self._keep({**self._labels, job_id: meta})
        return meta

    def forget(self, job_id: str) -> bool:
        with self._lock:
            if job_id not in self._labels:
                return False
            self._keep({j: m for j, m in self._labels.items() if j != job_id})
            return True

    def snapshot(self) -> dict[str, JobMeta]:
        with self._lock:
            return dict(self._labels)

    def forget_absent(self, present: set[str], now: float) -> list[str]:
        """Forgets the jobs absent from ``present`` (every job directory the sources list,
        and the registered process trees) for ``ABSENT_FORGET_S`` in a row: a job whose end
        hook never reached noded (noded down during a Slurm Epilog) must not hold a place
        under the cap for good. Absence is counted from this process's start; a write that
        fails forgets nothing (it is tried again at the next discovery). The ids forgotten."""
        with self._lock:
            for job_id in self._labels.keys() - present:
                self._absent_since.setdefault(job_id, now)
            for job_id in list(self._absent_since):
                if job_id in present or job_id not in self._labels:
                    del self._absent_since[job_id]
            gone = sorted(j for j, t in self._absent_since.items() if now - t >= ABSENT_FORGET_S)
            if not gone:
                return []
            try:
                self._keep({j: m for j, m in self._labels.items() if j not in gone})
            except StateWriteError as e:
                log.warning("registered labels of %d ended job(s) not forgotten: %s", len(gone), e)
                return []
            for job_id in gone:
                del self._absent_since[job_id]
        for job_id in gone:
            log.info("job=%s registered labels forgotten: no cgroup of it for %.0f s (its end hook never "
                     "reached noded)", job_id, ABSENT_FORGET_S)  # one word of its line by the handler
        return gone


class JobDiscovery:
    """All jobs now: ``discover()`` polls; ``job_of_new_process`` answers for one new process.

    Each source's directories are listed lazily and read within a budget per tick
    (``max_polled``: noded.jobs.polling), so what discovery costs follows the jobs noded
    acts on, not the number of cgroups users make."""

    def __init__(self, sources: list[CgroupSource], *, proc: str = "/proc", labels: LabelFile | None = None,
                 registered_labels: RegisteredLabels | None = None, max_polled: int = DEFAULT_MAX_POLLED,
                 relist_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.sources = sources
        self.clock = clock
        self._polls = [SourcePoll(CgroupScanner(src, relist_s), max_polled) for src in sources]
        # the processes of jobs whose subtree a walk cannot read whole, from /proc/PID/cgroup
        self.rotation = ProcRotation(self._place, max_polled, proc)
        self._woken: set[str] = set()  # job ids a process was just placed in: read at the next discovery
        #: per source, what the last discovery read (noded_job_source_* metrics)
        self.cost: tuple[SourceCost, ...] = ()
        self.proc = proc
        self.labels = labels or LabelFile(None)
        # A job in the label file takes its labels from there alone: the operator's word wins.
        self.registered_labels = registered_labels or RegisteredLabels()
        self._lock = threading.Lock()
        self._registered: dict[str, tuple[int, JobMeta]] = {}  # job id -> (root pid, meta)
        self._pods = PodIdentities()  # kubernetes sources' pods, parsed once per pod
        self._last: dict[str, Job] = {}  # the cgroup sources' jobs as last discovered
        #: small job subtrees held open between ticks (each job's cgroups read without a path)
        self.held = HeldSubtrees()
        #: job id -> why its cgroup could not be read in the last discovery, where no process of
        #: it was found (held as last seen), or which of its directories is the job cannot be told
        self.unreadable: dict[str, str] = {}
        #: job id -> why only part of its subtree was read in the last discovery (the processes
        #: found there, and those /proc/PID/cgroup puts in it, are the job's: a part it cannot
        #: read, its own directory shut, or its size, never freezes it)
        self.partial: dict[str, str] = {}
        #: directories below a source's root the last discovery could not look into -> why
        #: (shut by whoever owns them): the jobs last found below them are still read
        self.unlisted: dict[str, str] = {}
        #: new processes whose /proc/PID/cgroup was refused (not the kernel's grammar): no job's
        self.unattributed = 0
        #: the /proc files the last discovery read for the registered process trees
        self.tree_reads = 0

    def register(self, pid: int, job_id: str | None = None, meta: JobMeta | None = None) -> str:
        """A process tree as a job (e.g. from a prolog or the admin socket)."""
        if pid <= 0 or not os.path.exists(f"{self.proc}/{pid}"):
            raise ValueError(f"cannot register pid {pid}: no such process")
        job_id = job_id or f"pid:{pid}"
        with self._lock:
            self._registered[job_id] = (pid, meta or JobMeta())
        return job_id

    def unregister(self, job_id: str) -> None:
        with self._lock:
            self._registered.pop(job_id, None)

    def _all_labels(self) -> dict[str, JobMeta]:
        return {**self.registered_labels.snapshot(), **self.labels.refresh()}

    def discover(self) -> dict[str, Job]:
        """Every job now. Raises OSError where a source cannot be read or noded itself runs
        short (descriptors, memory): the jobs are then unknown, never none. A job whose own
        subtree cannot be read (a delegated subtree its owner made unreadable, a cgroup.procs
        that fails) is held as last seen, and said in ``unreadable``: one tenant's cgroups
        must not blind noded to every job on the node. A job of which only a part could be
        read (more cgroups than the bound, a directory shut to noded) is what that part
        holds, and said in ``partial``; where that part holds no process, it is held as last
        seen and said in ``unreadable``."""
        labels = self._all_labels()
        jobs: dict[str, Job] = {}
        unreadable: dict[str, str] = {}
        partial: dict[str, str] = {}
        with self._lock:
            woken, self._woken = self._woken, set()
        cost = []
        listed: set[str] = set()  # every job directory the sources list now, read or not
        paths: set[str] = set()  # the directories of those
        short: list[_Short] = []  # jobs whose subtree was not read whole
        try:
            for poll in self._polls:
                found = poll.scanner.scan()
                listed.update(found)
                paths.update(found.values())
                if poll.scanner.listings.listed and poll.scanner.source.version == 2:
                    # listed again: each held job's directory checked against its path (v1's
                    # are, at each read: noded.jobs.heldsubtrees)
                    self.held.verify(found.values())
                cost.append(self._read_listed(poll, found, woken, labels, jobs, unreadable, partial, short))
                self._hold_ambiguous(poll.scanner.ambiguous, jobs, unreadable)
                listed.update(poll.scanner.ambiguous)
            self._complete(short, labels, jobs, unreadable, partial)
        finally:
            self._pods.forget_unseen()
        self.held.retain(paths)
        unlisted = {path: why for poll in self._polls for path, why in poll.scanner.unlisted.items()}
        for path in unlisted.keys() - self.unlisted.keys():
            log.warning("job source directory %s cannot be looked into (said once): %s; the jobs last found "
                        "below it are read by their paths, new ones there are not seen", printable(path),
                        printable(unlisted[path]))
        for path in self.unlisted.keys() - unlisted.keys():
            log.info("job source directory %s can be looked into again", printable(path))
        self.unlisted = unlisted
        for job_id in unreadable.keys() - self.unreadable.keys():
            log.warning("job=%s cgroup unreadable (said once): %s", job_id,
                        printable(unreadable[job_id]))
        for job_id in partial.keys() - self.partial.keys():
            log.warning("job=%s cgroup partly read, the processes found there and by /proc/PID/cgroup are the "
                        "job's (said once): %s", job_id, printable(partial[job_id]))
        for job_id in self.partial.keys() - partial.keys() - unreadable.keys():
            if job_id in listed:
                log.info("job=%s cgroup read whole again", job_id)
        self.unreadable = unreadable
        self.partial = partial
        self.cost = tuple(cost)
        self._last = {j: job for j, job in jobs.items()}
        jobs.update(self._registered_jobs(labels))
        if self.sources:  # only a node that lists job directories can tell a job is gone
            self.registered_labels.forget_absent(listed | jobs.keys(), self.clock())
        return jobs

    def _hold_ambiguous(self, ambiguous: Mapping[str, tuple[str, ...]], jobs: dict[str, Job],
                        unreadable: dict[str, str]) -> None:
        """A job id that several directories with processes give: which is the job cannot be
        told, so none is read as it; held as last seen (if ever seen), and said."""
        for job_id, paths in ambiguous.items():
            unreadable[job_id] = (f"{len(paths)} directories with processes give this job id "
                                  f"({words(paths)}): which is the job cannot be told; held as last seen")
            if (held := self._last.get(job_id)) is not None:
                jobs[job_id] = held

    def _read_listed(self, poll: SourcePoll, found: Mapping[str, str], woken: set[str],
                     labels: Mapping[str, JobMeta], jobs: dict[str, Job], unreadable: dict[str, str],
                     partial: dict[str, str], short: list[_Short]) -> SourceCost:
        """One source's jobs into ``jobs``: those its poll chooses this tick read, the rest
        held as last seen. A job whose subtree could not be read whole (its own directory
        or a part of it shut to noded, more cgroups than the bound) goes to ``short``: its
        processes are completed from /proc/PID/cgroup once every source is read
        (``_complete``). Returns the poll's cost."""
        src = poll.scanner.source
        chosen = poll.choose(found, woken)
        for job_id in chosen:
            path = found[job_id]
            try:
                got = self.held.read(path, most=poll.max_polled, hold_procs=src.version == 2)
            except OSError as e:
                if e.errno in NODED_SHORT_OF:
                    raise
                short.append(_Short(poll, job_id, path, frozenset(),
                                    f"{e.filename or path}: {e.strerror or e} (its own directory)"))
                continue
            if got.partial is not None:
                short.append(_Short(poll, job_id, path, got.pids, f"{path}: {got.partial}"
                                    + (" (jobs.max_polled_per_source)" if got.over_bound else "")))
                continue
            self._read_job(poll, job_id, path, got.pids, labels, jobs)
        read = set(chosen)
        for job_id, why in self.unreadable.items():  # not read this tick: as it was (logged once)
            if job_id in found and job_id not in read:
                unreadable[job_id] = why
        for job_id, why in self.partial.items():
            if job_id in found and job_id not in read:
                partial[job_id] = why
        for job_id in poll.held(read):  # over the budget: not read this tick
            if (held := self._last.get(job_id)) is not None:
                jobs[job_id] = held
                if held.pod is not None:
                    self._pods.identify(src.root, held.cgroup, held.pids)
        return poll.cost(len(found), len(chosen))

    def _read_job(self, poll: SourcePoll, job_id: str, path: str, pids: frozenset[int],
                  labels: Mapping[str, JobMeta], jobs: dict[str, Job]) -> None:
        """A job read: its processes ``pids`` (none: no job now)."""
        src = poll.scanner.source
        poll.read(job_id, bool(pids))
        if pids:
            pod = self._pods.identify(src.root, path, pids) if src.kind == "kubernetes" else None
            meta = labels.get(job_id, NO_LABELS)
            last = self._last.get(job_id)
            if (last is not None and last.pids == pids and last.cgroup == path and last.meta is meta
                    and last.pod is pod):
                jobs[job_id] = last  # the same as read last tick: the same Job (what follows may compare by identity)
            else:
                jobs[job_id] = Job(job_id, src.kind, pids, path, meta, pod)

    def _place(self, paths: Mapping[str, str]) -> tuple[str, ...]:
        """The job directories a process's cgroups (its /proc/PID/cgroup) put it in."""
        out = []
        for src in self.sources:
            where = paths.get(src.hierarchy)
            rel = src.match(where) if where else None
            if rel:
                out.append(os.path.join(src.root, rel))
        return tuple(out)

    def _complete(self, short: list["_Short"], labels: Mapping[str, JobMeta], jobs: dict[str, Job],
                  unreadable: dict[str, str], partial: dict[str, str]) -> None:
        """The jobs whose subtree was read only in part, or not at all (their own directory
        shut to noded): their processes are what the walk read and those the processes'
        /proc/PID/cgroup put in them (``noded.jobs.procscan``: ``max_polled`` files a tick,
        in turn), so the part noded cannot walk neither hides a process for long nor freezes
        the job. A process of the job as last seen whose /proc/PID/cgroup is not read yet
        is held. Where none is found the job has no process now, and is said unreadable."""
        if not short:
            self.rotation.reset()
            return
        self.rotation.step()
        rot = self.rotation
        for s in short:
            found = rot.pids_in(s.path)
            last = self._last.get(s.job_id)
            held = frozenset(p for p in last.pids if rot.not_read_yet(p)) if last is not None else frozenset()
            pids = s.pids | found | held
            how = rot.describe() + (f"; {len(held)} process(es) as last seen, not read again yet" if held else "")
            if pids:
                partial[s.job_id] = f"{s.why}; the rest of its processes from /proc/PID/cgroup ({how})"
            else:
                unreadable[s.job_id] = (f"{s.why}; no process of it found in /proc/PID/cgroup yet ({how})"
                                        if rot.unread else f"{s.why}; /proc/PID/cgroup puts no process in it")
            self._read_job(s.poll, s.job_id, s.path, pids, labels, jobs)

    def _registered_jobs(self, labels: Mapping[str, JobMeta]) -> dict[str, Job]:
        """The jobs registered by their process tree, each with every process under its root;
        one whose tree is gone has ended, and is forgotten."""
        jobs: dict[str, Job] = {}
        with self._lock:
            registered = dict(self._registered)
        ppids: dict[int, int] | None = None
        reads = 0
        if registered:
            for job_id, (root, meta) in registered.items():
                # each tree from its processes' children lists (noded.jobs.proctree), within
                # TREE_READS files for them all; past that, the whole /proc scan, read once
                pids = None
                if ppids is None:
                    try:
                        tree = tree_of(root, self.proc, TREE_READS - reads)
                        pids, reads = tree.pids, reads + tree.reads
                    except TreeOverBound as e:
                        ppids = read_ppids(self.proc)
                        reads += e.reads + len(ppids)
                if pids is None:
                    pids = descendants(root, ppids)
                if not pids:
                    with self._lock:  # the tree is gone: the job ended
                        self._registered.pop(job_id, None)
                    continue
                meta = labels.get(job_id, meta)
                jobs[job_id] = Job(job_id, "registered", frozenset(pids), None, meta)
        self.tree_reads = reads
        return jobs

    def job_of_new_process(self, pid: int, known: dict[str, Job]) -> Job | None:
        """The job a just-exec'd process belongs to, from its cgroup (None: not a job's)."""
        try:
            cgroups = read_process_cgroups(self.proc, pid)
        except ProcCgroupError as e:
            # its file is not the kernel's grammar (a forged record in a cgroup name) or
            # cannot be read: no job's, never a guessed one's; an exec storm says it once a minute
            self.unattributed += 1
            _UNATTRIBUTED.log(logging.WARNING, "proc-cgroup", "pid=%d attributed to no job: %s", pid,
                              printable(str(e)))
            return None
        for src in self.sources:
            path = cgroups.get(src.hierarchy)
            rel = src.match(path) if path else None
            job_id = src.job_id(rel) if rel else None
            if job_id is not None:
                with self._lock:
                    self._woken.add(job_id)  # its directory is read at the next discovery, whatever the budget
                prev = known.get(job_id)
                pids = (prev.pids if prev else frozenset()) | {pid}
                meta = prev.meta if prev else (self.labels.labels.get(job_id)
                                               or self.registered_labels.snapshot().get(job_id, NO_LABELS))
                return Job(job_id, src.kind, pids, os.path.join(src.root, rel), meta, prev.pod if prev else None)
        return None
