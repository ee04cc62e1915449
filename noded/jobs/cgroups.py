"""Jobs found as cgroups: Slurm jobs, Kubernetes pods, systemd units, any glob.

A source names a cgroup hierarchy (the v2 mount, or one v1 hierarchy such as
``/sys/fs/cgroup/cpuset``) and glob patterns relative to it; every directory a
pattern matches is one job, and its processes are those in the directory and
below. The same patterns match a process's own cgroup path (from
``/proc/PID/cgroup``), so a new process is placed in its job the moment it execs.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import os
import stat
import time
from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple

from noded.jobs.cgroupwalk import NODED_SHORT_OF, Node, read_at, vanished, walk_cgroups
from noded.jobs.kubepods import pod_uid
from noded.jobs.proccgroup import ProcCgroups
from noded.util import paths as fs_paths  # (paths: a name its functions use)

KINDS = ("slurm", "kubernetes", "systemd", "cgroup")

# Each QoS class spelled out: a '*' between kubepods and the pod would match Guaranteed
# pods too, and every tick would list each of those pods' directories for nothing.
_KUBEPODS = ("kubepods.slice/kubepods-pod*.slice",
             "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod*.slice",
             "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod*.slice",
             "kubepods/pod*", "kubepods/burstable/pod*", "kubepods/besteffort/pod*")

# Where each manager puts its jobs, by cgroup version, relative to the hierarchy root.
DEFAULT_PATTERNS: dict[tuple[str, int], tuple[str, ...]] = {
    ("slurm", 2): ("system.slice/slurmstepd.scope/job_*",),
    # Slurm built with --enable-multiple-slurmd (Debian's slurm-wlm is) names its root
    # slurm_<NodeName> instead of slurm.
    ("slurm", 1): ("slurm/uid_*/job_*", "slurm_*/uid_*/job_*"),
    # kubelet's systemd driver, then its cgroupfs driver: either can run on either version
    # (Guaranteed pods directly under kubepods, the others under their QoS class's cgroup)
    ("kubernetes", 2): _KUBEPODS,
    ("kubernetes", 1): _KUBEPODS,
}


def check_pattern(pattern: str) -> str | None:
    """Why a job source pattern could match outside its hierarchy's root, or nowhere a
    process's cgroup path can be (None: it is a usable pattern). The config's validation
    and CgroupSource.create both ask this, so the two never disagree."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in pattern):
        return f"{pattern!r} contains a control character"
    if pattern.startswith("/"):
        return f"{pattern!r} must be relative to the source's root"
    parts = pattern.split("/")
    if ".." in parts or "." in parts:
        return f"{pattern!r} must be relative to the source's root, without '..' or '.' components"
    if "" in parts:
        return f"{pattern!r} has an empty component (a trailing or doubled '/')" if pattern else "empty pattern"
    return None


def v1_hierarchy_key(mount: str) -> str:
    """How a parsed /proc/PID/cgroup (``ProcCgroup.paths``) names the v1 hierarchy mounted
    at ``mount``, by the mount's name: one of its controllers (the parser keys each one of
    ``cpu,cpuacct`` alone: the first), or ``name=systemd``."""
    base = os.path.basename(mount)
    return f"name={base}" if base == "systemd" else base.split(",")[0]


def cgroup_version(root: str) -> int:
    return 2 if os.path.exists(os.path.join(root, "cgroup.controllers")) else 1


@dataclass(frozen=True)
class CgroupSource:
    kind: str
    root: str
    patterns: tuple[str, ...]
    version: int

    @classmethod
    def create(cls, kind: str, root: str, patterns: tuple[str, ...] | list[str] | None = None,
               version: int | None = None) -> "CgroupSource":
        if kind not in KINDS:
            raise ValueError(f"job source kind must be one of {KINDS}, not {kind!r}")
        version = version or cgroup_version(root)
        pats = tuple(patterns) if patterns else DEFAULT_PATTERNS.get((kind, version), ())
        if not pats:
            raise ValueError(f"job source {kind!r} at {root} needs explicit patterns (no default for v{version})")
        for p in pats:
            reason = check_pattern(p)
            if reason:
                raise ValueError(f"job source pattern at {root}: {reason}")
        return cls(kind, os.path.normpath(root), pats, version)

    @functools.cached_property
    def mount(self) -> str:
        """The cgroup filesystem mount the source's root lies in (found once: a new process's
        placement asks for it, and each ``ismount`` is two stats)."""
        path = self.root
        while not os.path.ismount(path) and path != os.path.dirname(path):
            path = os.path.dirname(path)
        return path

    @functools.cached_property
    def _below_mount(self) -> tuple[str, ...]:
        """The root's path components below its mount."""
        return tuple(p for p in os.path.relpath(self.root, self.mount).split("/") if p not in ("", "."))

    @functools.cached_property
    def hierarchy(self) -> str:
        """The key of this hierarchy in a process's parsed /proc/PID/cgroup ('' for v2; found
        once, as the mount is)."""
        return "" if self.version == 2 else v1_hierarchy_key(self.mount)

    def job_id(self, rel: str) -> str | None:
        """The id of the job in directory ``rel`` (relative to root), from its name; None
        where a Slurm or Kubernetes source's pattern matched a name its manager never gives a
        job (``job_<number>``, kubelet's pod names): no job, rather than an id of whatever
        bytes the name holds (an empty one, or control characters for logs and metrics)."""
        name = rel.rsplit("/", 1)[-1]
        if self.kind == "slurm":
            number = name.removeprefix("job_")
            return "slurm:" + number if name.startswith("job_") and number.isascii() and number.isdigit() else None
        if self.kind == "kubernetes":
            uid = pod_uid(name)
            return None if uid is None else "k8s:" + uid
        if self.kind == "systemd":
            return "systemd:" + name
        return "cgroup:" + rel

    def match(self, cgroup_path: str) -> str | None:
        """The job directory (relative to root) a process's cgroup path lies in, if any.

        ``cgroup_path`` is as /proc/PID/cgroup shows it: relative to the mount.
        """
        below = self._below_mount
        parts = [p for p in cgroup_path.split("/") if p]
        if tuple(parts[: len(below)]) != below:
            return None
        parts = parts[len(below):]
        for pattern in self.patterns:
            pp = pattern.split("/")
            if len(parts) >= len(pp) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pp)):
                return "/".join(parts[: len(pp)])
        return None

    def scan(self) -> dict[str, str]:
        """job id -> absolute job directory, for every directory the patterns match now.

        Raises OSError where the tree cannot be read (EMFILE, EACCES, …): an unreadable
        hierarchy means the jobs are unknown, never that there are none.
        """
        if not fs_paths.isdir(self.root):  # an error (EACCES) raised as it is, not taken for "no directory"
            raise FileNotFoundError(errno.ENOENT, "job source root is not a directory", self.root)
        paths = [p for pattern in self.patterns for p in match_dirs(self.root, pattern)]
        return one_directory_each(self.directories_by_id(paths))[0]

    def directories_by_id(self, paths: list[str]) -> dict[str, list[str]]:
        """job id -> the matched directories (each root joined with the rest) that give it."""
        out: dict[str, list[str]] = {}
        for path in paths:
            job_id = self.job_id(path[len(self.root):].lstrip("/"))
            if job_id is not None:
                out.setdefault(job_id, []).append(path)
        return out


#: at most this many cgroups read below each directory that shares its job id with another
SHARED_ID_MOST = 64


def one_directory_each(by_id: Mapping[str, list[str]]) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """job id -> its one directory, and the ids no one directory can be told for.

    Several directories may give one id: a pod's stale directory beside its live one (kubelet
    after a restart with another cgroup driver, or a QoS class the pod had), a Slurm job's
    under two uids. The one with processes is the job; where several have processes (or
    cannot be read, so may have), which is the job cannot be told: the id is left out, with
    its directories, for the caller to say (never the last one listed, silently: with a
    stale directory listed last the running job was no job at all)."""
    out: dict[str, str] = {}
    ambiguous: dict[str, tuple[str, ...]] = {}
    for job_id, paths in by_id.items():
        if len(paths) == 1:
            out[job_id] = paths[0]
            continue
        live = [p for p in paths if _may_hold_processes(p)]
        if len(live) <= 1:
            out[job_id] = (live or paths)[0]
        else:
            ambiguous[job_id] = tuple(live)
    return out, ambiguous


def _may_hold_processes(path: str) -> bool:
    try:
        got = read_subtree_procs(path, most=SHARED_ID_MOST)
    except OSError:
        return True  # unreadable: it may, so it is not set aside
    return bool(got.pids) or got.partial is not None  # a part unread may hold some


def _has_magic(part: str) -> bool:
    return any(c in part for c in "*?[")


#: (directory, pattern part) -> (its listing, the paths in it that match the part)
Matches = dict[tuple[str, str], tuple[list[str], list[str]]]


def match_dirs(root: str, pattern: str, subdirs: Callable[[str], list[str]] | None = None,
               matched: Matches | None = None, matched_now: Matches | None = None,
               unlisted: dict[str, str] | None = None) -> list[str]:
    """Directories below ``root`` matching a relative glob ``pattern``, component by
    component (fnmatch rules; ``*`` skips names starting with a dot, as glob does).

    Unlike ``glob.glob``, which turns every error into "no match", only a directory
    that vanished while we looked (a job ending) is passed over; any other error is
    raised. ``subdirs(path)`` lists a directory's subdirectories, sorted (a
    ``DirListings`` keeps them between calls); by default each is listed afresh.
    ``matched`` holds the listings' matches of an earlier call, reused where ``subdirs``
    gives the very listing kept there (a ``DirListings`` gives the same list while the
    directory is unchanged); ``matched_now`` gets this call's (those not asked for again
    are so forgotten, as their listings are).

    ``unlisted``: where given, a directory below ``root`` that cannot be looked into (EACCES:
    whoever owns it shut it) is passed over and put there with why, not raised: one
    directory's owner must not make every job unknown. Errors at ``root`` itself, and those
    that say noded is short of descriptors or memory, are raised.
    """
    subdirs = subdirs or list_subdirs

    def shut(base: str, e: OSError) -> bool:
        if unlisted is None or base == root or e.errno in NODED_SHORT_OF:
            return False
        unlisted[base] = e.strerror or str(e)
        return True

    paths = [root]
    for part in pattern.split("/"):
        found: list[str] = []
        for base in paths:
            if not _has_magic(part):
                path = os.path.join(base, part)
                try:
                    if stat.S_ISDIR(os.stat(path).st_mode):
                        found.append(path)
                except (FileNotFoundError, NotADirectoryError):
                    pass
                except OSError as e:
                    if not shut(base, e):
                        raise
                continue
            try:
                names = subdirs(base)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as e:
                if not shut(base, e):
                    raise
                continue
            kept = matched.get((base, part)) if matched is not None else None
            if kept is not None and kept[0] is names:
                if matched_now is not None:
                    matched_now[(base, part)] = kept
                found += kept[1]
                continue
            hidden_ok = part.startswith(".")
            sep = "" if base.endswith("/") else "/"  # os.path.join's rule, without its cost per name
            paths_matching = [f"{base}{sep}{n}" for n in names
                              if fnmatch.fnmatchcase(n, part) and (hidden_ok or not n.startswith("."))]
            if matched_now is not None:
                matched_now[(base, part)] = (names, paths_matching)
            found += paths_matching
        paths = found
    return paths


def list_subdirs(path: str) -> list[str]:
    """The names of a directory's subdirectories, sorted."""
    with os.scandir(path) as entries:
        return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))


class DirListings:
    """Directory listings kept from one scan to the next, each listed again only when
    its directory changed, or ``relist_s`` after it was last listed.

    What says a directory changed is its stat: the inode (a directory removed and made
    again), the link count and the times. On cgroupfs (kernfs, v1 and v2) a directory's
    link count is 2 + its subdirectories, refreshed at each stat, while its mtime and
    ctime do NOT move when a child cgroup is made or removed (checked on this host's
    v1 cpuset hierarchy): a create and a remove between two scans keep the count, so
    a listing is redone every ``relist_s`` whatever its stat says. Noded's cost per scan
    is then one stat per directory it walks, not one entry per cgroup users made.
    """

    def __init__(self, relist_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.relist_s = relist_s
        self.clock = clock
        self._kept: dict[str, tuple[tuple[int, int, int, int], float, list[str]]] = {}
        self._seen: set[str] = set()
        self.listed = 0  # directories listed afresh since the last begin()
        self.changed = False  # some listing differs from what it was (since the last begin())

    def begin(self) -> None:
        """A scan starts: listings not asked for in it are forgotten at ``end()``."""
        self._seen = set()
        self.listed = 0
        self.changed = False

    def end(self) -> None:
        if len(self._seen) != len(self._kept):
            self.changed = True
            self._kept = {p: v for p, v in self._kept.items() if p in self._seen}

    def __call__(self, path: str) -> list[str]:
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        key = (st.st_ino, st.st_nlink, st.st_mtime_ns, st.st_ctime_ns)
        now = self.clock()
        self._seen.add(path)
        kept = self._kept.get(path)
        if kept is not None and kept[0] == key and now - kept[1] < self.relist_s:
            return kept[2]
        names = list_subdirs(path)
        self.listed += 1
        if kept is None or kept[2] != names:
            self.changed = True
        self._kept[path] = (key, now, names)
        return names


class CgroupScanner:
    """A source's job directories, scan after scan, listed lazily (``DirListings``),
    with the owner (uid) of each: what it costs grows with what changed, not with how
    many cgroups there are. ``scan()`` returns the same mapping while nothing changed."""

    def __init__(self, source: "CgroupSource", relist_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.source = source
        self.listings = DirListings(relist_s, clock)
        self.generation = 0  # moves each time scan() finds something different
        self._found: dict[str, str] = {}
        self._matched_paths = 0  # the directories the patterns matched when _found was made (jobs or not)
        self._owners: dict[str, int] = {}  # job directory -> its owner's uid
        self._matched: Matches = {}  # the last scan's matches, by listing
        self._shared: dict[str, list[str]] = {}  # job id -> its directories, where more than one gives it
        self._resolved: dict[str, str] = {}  # what the last scan returned
        #: job id -> its directories with processes, where more than one has them: no job
        self.ambiguous: dict[str, tuple[str, ...]] = {}
        #: directories below the root the last scan could not look into -> why (EACCES)
        self.unlisted: dict[str, str] = {}

    def scan(self) -> dict[str, str]:
        """job id -> absolute job directory (as ``CgroupSource.scan``)."""
        root = self.source.root
        if not fs_paths.isdir(root):  # an error (EACCES) raised as it is, not taken for "no directory"
            raise FileNotFoundError(errno.ENOENT, "job source root is not a directory", root)
        self.listings.begin()
        # each listing's matches kept while its listing is: a scan matches only what changed
        matched, self._matched = self._matched, {}
        unlisted: dict[str, str] = {}
        paths = [p for pattern in self.source.patterns
                 for p in match_dirs(root, pattern, self.listings, matched, self._matched, unlisted)]
        self.listings.end()
        if unlisted:
            # a directory shut to noded below the root: the job directories last found below it
            # are read still, by their paths (noded.jobs.discovery reads a job it cannot walk
            # through /proc), and new ones there are not seen until it opens again
            below = tuple(d.rstrip("/") + "/" for d in unlisted)
            last = {p for ps in ({j: [p] for j, p in self._found.items()} | self._shared).values() for p in ps}
            paths += sorted(p for p in last if p.startswith(below) and p not in paths)
            self.listings.changed = True  # what is kept of them is not a listing's: matched again next scan
        self.unlisted = unlisted
        if self.listings.changed or len(paths) != self._matched_paths:
            self._matched_paths = len(paths)
            by_id = self.source.directories_by_id(paths)
            found = {job_id: ps[0] for job_id, ps in by_id.items()}
            self._shared = {job_id: ps for job_id, ps in by_id.items() if len(ps) > 1}
            if found != self._found:
                self._found = found
                self.generation += 1
                present = {p for ps in by_id.values() for p in ps}
                self._owners = {p: uid for p, uid in self._owners.items() if p in present}
        if self._shared:
            # which of an id's directories holds processes can change without a listing's: asked each scan
            resolved, self.ambiguous = one_directory_each({**{j: [p] for j, p in self._found.items()},
                                                           **self._shared})
        else:
            resolved, self.ambiguous = self._found, {}
        if resolved is not self._resolved and resolved != self._resolved:
            self.generation += 1
        self._resolved = resolved
        return resolved

    def owner(self, path: str) -> int:
        """The uid owning a job directory (-1 where it is gone): whose directories they are,
        so that one user's many cannot crowd out another's."""
        uid = self._owners.get(path)
        if uid is None:
            try:
                uid = os.stat(path).st_uid
            except OSError:
                uid = -1
            self._owners[path] = uid
        return uid


class SubtreeProcs(NamedTuple):  # a tuple: made for every job every tick, at a tenth of a frozen dataclass's cost
    """The processes in the part of a job's subtree one walk read (``noded.jobs.cgroupwalk``),
    and why that was only part of it (None: the whole subtree)."""

    pids: frozenset[int]
    partial: str | None = None
    over_bound: bool = False  # more cgroups than the read's bound (the rest of ``partial``: unreadable parts)
    errno: int = 0  # the first unreadable part's error (0: none)
    cgroups: int = 1  # the cgroups read


def read_subtree_procs(cgroup_dir: str, most: int | None = None) -> SubtreeProcs:
    """Every process in a cgroup and its descendants (cgroup.procs, v1 and v2 alike), read
    breadth first by directory descriptors (any depth), at most ``most`` cgroups (None: all).

    Whoever owns a delegated subtree may make thousands of cgroups, nest names past PATH_MAX
    or shut a directory to noded: what can be read is used, the rest said in ``partial``
    (a cgroup removed while we walk, the job ending, is passed over and not said). Raises
    OSError where the job's own directory cannot be read (an empty result where it is gone)
    and where noded itself is short (EMFILE, ENOMEM, ...): never mistaken for no processes.
    """
    # the job's own cgroup first, here: most have no child, and pay no more than its stat and
    # read (every job, every tick: no walk's objects made for them)
    try:
        links = os.stat(cgroup_dir).st_nlink
    except OSError as e:
        if vanished(e):
            return SubtreeProcs(frozenset())  # the job ended
        raise
    pids: set[int] = set()
    go_on = True
    try:
        pids.update(map(int, read_at(None, f"{cgroup_dir.rstrip('/')}/cgroup.procs", cgroup_dir).split()))
    except OSError as e:
        if e.errno == errno.EOPNOTSUPP:
            go_on = False  # a threaded cgroup (v2): its threaded domain lists its processes and its children's
        elif e.errno != errno.ENOENT:  # ENOENT: not a cgroup, though some may be below it
            if vanished(e):
                return SubtreeProcs(frozenset())
            raise
    if not go_on or links == 2:
        return SubtreeProcs(frozenset(pids))

    def visit(dir_fd: int | None, base: str, node: Node) -> bool:
        try:
            data = read_at(dir_fd, base + "cgroup.procs", node)
        except OSError as e:
            if e.errno == errno.EOPNOTSUPP:
                # a threaded cgroup (v2, made by whoever owns the subtree): its processes are
                # listed by its threaded domain's cgroup.procs, read already; so are its children's
                return False
            if e.errno == errno.ENOENT:
                return True  # no cgroup.procs: not a cgroup, though it may hold some below
            raise
        pids.update(map(int, data.split()))
        return True

    walk = walk_cgroups(cgroup_dir, visit, most, top_visited=True)
    if not (walk.more or walk.unread_count):
        return SubtreeProcs(frozenset(pids), cgroups=walk.read)
    return SubtreeProcs(frozenset(pids), walk.partial, walk.more > 0, walk.first_errno, walk.read)


@functools.lru_cache(maxsize=16)
def proc_cgroups(proc: str) -> ProcCgroups:
    """The reader of processes' cgroups under a proc root: one per root, sharing the
    kernel's list of hierarchies it read (the same for every process of the host)."""
    return ProcCgroups(proc)


def read_process_cgroups(proc: str, pid: int) -> dict[str, str]:
    """Hierarchy (controller list, '' for v2) -> cgroup path of a process ({} where it is
    gone). Raises ProcCgroupError where its /proc/PID/cgroup cannot be read or is not the
    kernel's grammar (a forged record in a cgroup name): such a process is no job's."""
    return proc_cgroups(proc).of(pid)
