"""Walking a job's cgroup subtree as root may, whatever shape its owner gave it.

Whoever owns a delegated subtree (systemd ``Delegate=``, a Slurm job's own cgroup, a pod)
shapes it: names of 255 bytes nested past PATH_MAX, thousands of cgroups, a directory
shut with ``chmod 000`` (noded's unit keeps no CAP_DAC_OVERRIDE nor CAP_DAC_READ_SEARCH).
None of these may freeze noded's view of the job. So the walk:

* reaches each cgroup below the job's own from its parent's descriptor (``fstatat``, and
  ``openat`` of ``name/cgroup.procs`` or of the directory to list it), never by a whole
  path: a subtree of any depth reads as the kernel lets root read it;
* goes breadth first, the job's own cgroup and the shallow ones first, and stops after
  ``most`` cgroups: what it read is used, and the rest said (``Walk.more``);
* holds at most ``WALK_FDS`` directory descriptors open at once, whatever the shape (a
  parent beyond them is opened again, name by name from its nearest ancestor holding one,
  when its children are read): a 50 000-deep chain never costs 50 000 descriptors;
* passes over a cgroup removed meanwhile (the job ending), and one it may not read (EACCES,
  a ``cgroup.procs`` that is not a file) with its subtree, said in ``Walk.unread``; only an
  error at the job's own directory, or one that says noded itself is short (descriptors,
  memory), is raised.

Every tick reads every job's subtree, so it is lean: a directory is opened and listed only
where its link count (the one stat each cgroup costs) says it has subdirectories. On
cgroupfs (kernfs, v1 and v2) the count is 2 + its subdirectories, refreshed at each stat; job
sources are refused on any other filesystem (``noded.commands.hostcheck``), and tmpfs, where
tests lay out v2 trees, keeps the count too.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Callable

from noded.util.journal import word

#: errors that say noded itself is short of something: every job's reading would fail alike
NODED_SHORT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})

#: directory descriptors one walk keeps open at once at most (the parents whose children
#: are still to be read; beyond, a parent is opened again when they are)
WALK_FDS = 64

#: the unreadable parts one walk names at most (it counts them all)
UNREAD_NAMED = 4

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW


def vanished(e: OSError) -> bool:
    """A cgroup removed while it was read (ENODEV: a cgroup file read after its cgroup went)."""
    return e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENODEV, errno.ESRCH)


class Node:
    """One directory of the walk: its name below its parent (the top's: its path)."""

    __slots__ = ("parent", "name", "fd", "length", "_path")

    def __init__(self, parent: "Node | None", name: str):
        self.parent = parent
        self.name = name
        self.fd = -1  # held open while its children are still to be read (at most WALK_FDS)
        self.length: int = len(name) if parent is None else parent.length + 1 + len(name)  # its path's
        self._path: str | None = name if parent is None else None

    @property
    def path(self) -> str:
        """Its path (a string only: it may be longer than PATH_MAX, and is never opened);
        built from the nearest ancestor whose path was asked for (a walk that asks for every
        one, parents first, pays one join each), with no recursion: any depth."""
        if self._path is None:
            names = []
            node: Node = self
            while node._path is None:
                names.append(node.name)
                node = node.parent  # type: ignore[assignment]  (the top's path is always set)
            names.append(node._path.rstrip("/"))
            self._path = "/".join(reversed(names))
        return self._path

    def short(self) -> str:
        """Its path for a message: the top, '/…/' and its own name where longer than 300."""
        if self.length <= 300:
            return self.path
        top = self
        while top.parent is not None:
            top = top.parent
        return f"{top.name.rstrip('/')}/…/{self.name[:100]}"


@dataclass(slots=True)
class Walk:
    """What one walk read: ``read`` cgroups (at most ``most``); ``more``: directories whose
    subdirectories the bound left unread (0: every one found was read); ``unread``: (path,
    why) of the parts it could not read, each with its subtree (the first ``UNREAD_NAMED``
    of ``unread_count``), ``first_errno`` the first one's error."""

    top: str
    most: int | None
    read: int = 0
    more: int = 0
    unread: list[tuple[str, str]] = field(default_factory=list)
    unread_count: int = 0
    first_errno: int = 0

    @property
    def partial(self) -> str | None:
        """Why only part of the subtree was read (None: all of it)."""
        parts = []
        if self.more:
            parts.append(f"more than {self.most} cgroups in it and below it: the first {self.most} read, "
                         "breadth first")
        if self.unread_count:
            named = "; ".join(f"{word(p)}: {why}" for p, why in self.unread)  # a path a tenant named: one word
            extra = self.unread_count - len(self.unread)
            parts.append(f"{self.unread_count} part(s) unreadable, each with its subtree ({named}"
                         + (f"; {extra} more" if extra > 0 else "") + ")")
        return "; ".join(parts) or None

    def _unreadable(self, node: Node, e: OSError) -> None:
        if e.errno in NODED_SHORT_OF:
            raise e
        self.unread_count += 1
        self.first_errno = self.first_errno or e.errno or 0
        if len(self.unread) < UNREAD_NAMED:
            self.unread.append((node.short(), e.strerror or str(e)))


def walk_cgroups(top: str, visit: Callable[[int | None, str, Node], bool], most: int | None = None, *,
                 top_visited: bool = False) -> Walk:
    """Calls ``visit(dir_fd, base, node)`` for the job's directory ``top`` and each directory
    below it, breadth first, at most ``most`` of them (None: all). ``visit`` opens the
    directory's files as ``base + name`` relative to ``dir_fd`` (its parent's descriptor
    and its own name, a path of two components; for ``top``: None and its path) and returns
    whether the walk goes on below that directory. An OSError from ``visit`` is the
    directory's: raised for ``top``, else that directory and its subtree are passed over
    (said in the Walk; passed over silently where it vanished).

    ``top_visited``: the caller read ``top`` already (and found it has subdirectories): the
    walk starts below it.

    Raises OSError where ``top`` itself cannot be read (an empty Walk where it is gone: the
    job ended), and whatever says noded is short of descriptors or memory."""
    if most is not None and most < 1:
        raise ValueError(f"most must be at least 1, not {most}")
    walk = Walk(top, most)
    root = Node(None, top)
    # The top by its path (the scanner found it by it, so it is within PATH_MAX): the
    # common job, one cgroup without children, costs what a path's stat and read cost.
    if not top_visited:
        try:
            links = os.stat(top).st_nlink
            go_on = visit(None, f"{top.rstrip('/')}/", root)
        except OSError as e:  # the top's errors are the job's
            if vanished(e):
                return walk
            raise
        if not go_on or links == 2:
            walk.read = 1
            return walk
    walk.read = 1
    try:
        root.fd = os.open(top, _DIR_FLAGS)
    except OSError as e:
        if vanished(e):
            return walk
        raise
    _Below(walk, visit).run(root)
    return walk


class _Below:
    """The walk below the top, level by level: each level's cgroups read from their parents'
    descriptors, at most ``WALK_FDS`` of them held open at once."""

    def __init__(self, walk: Walk, visit: Callable[[int | None, str, Node], bool]):
        self.walk = walk
        self.visit = visit
        self.held = 1  # directory descriptors open now (the top's is held to the end)
        self.queued = 0  # directories found so far, the top's included

    def run(self, root: Node) -> None:
        """Reads every level below ``root`` (its descriptor open; closed here)."""
        level: list[tuple[Node, str]] = []
        parents: list[Node] = []  # the nodes holding descriptors for ``level``'s entries
        try:
            self.queued = _list(root, root.fd, level, 1, self.walk)
            while level:
                nxt: list[tuple[Node, str]] = []
                held_now: list[Node] = []
                try:
                    self._level(level, nxt, held_now)
                finally:
                    for p in parents:  # this level is read: its parents' descriptors are done with
                        if p.fd >= 0:
                            os.close(p.fd)
                            p.fd = -1
                            self.held -= 1
                    parents = held_now  # closed by the next level, or below where an error ends the walk
                level = nxt
        finally:
            for p in parents:  # an error raised out of a level: the descriptors it kept
                if p.fd >= 0:
                    os.close(p.fd)
                    p.fd = -1
            os.close(root.fd)

    def _level(self, level: list[tuple[Node, str]], nxt: list[tuple[Node, str]], held_now: list[Node]) -> None:
        """Reads one level's cgroups, their subdirectories into ``nxt`` (the nodes that keep a
        descriptor for them into ``held_now``)."""
        reopened: tuple[Node, int] | None = None  # a parent opened again from the top, while its children are read
        try:
            for parent, name in level:
                parent_fd = parent.fd
                if parent_fd < 0:
                    if reopened is None or reopened[0] is not parent:
                        if reopened is not None and reopened[1] >= 0:
                            os.close(reopened[1])
                        reopened = None
                        try:
                            reopened = (parent, _reopen(parent))
                        except OSError as e:
                            if not vanished(e):
                                self.walk._unreadable(parent, e)
                            reopened = (parent, -1)  # its other children are passed over too
                    parent_fd = reopened[1]
                    if parent_fd < 0:
                        continue
                self._cgroup(Node(parent, name), parent_fd, nxt, held_now)
        finally:
            if reopened is not None and reopened[1] >= 0:
                os.close(reopened[1])

    def _cgroup(self, node: Node, parent_fd: int, nxt: list[tuple[Node, str]], held_now: list[Node]) -> None:
        """One cgroup below the top: visited, and listed where it has subdirectories."""
        walk, name = self.walk, node.name
        # a leaf (most cgroups) costs a stat and its files' reads, by two-component
        # paths from its parent's descriptor; one with children is opened to list them
        try:
            links = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_nlink
            walk.read += 1
            if not self.visit(parent_fd, name + "/", node) or links == 2:
                return
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as e:
            if not vanished(e):
                walk._unreadable(node, e)
            return
        keep = False
        try:
            before = len(nxt)
            self.queued = _list(node, fd, nxt, self.queued, walk)
            if len(nxt) > before and self.held < WALK_FDS:
                node.fd, keep = fd, True
                self.held += 1
                held_now.append(node)
        except OSError as e:
            if not vanished(e):
                walk._unreadable(node, e)
        finally:
            if not keep:
                os.close(fd)


def _list(node: Node, fd: int, out: list[tuple[Node, str]], queued: int, walk: Walk) -> int:
    """Appends ``node``'s subdirectories to ``out`` while the walk's bound leaves room
    (counting those beyond it in ``walk.more``, listing no further than one past it);
    returns the directories found so far."""
    most = walk.most
    with os.scandir(fd) as entries:
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                continue
            if most is not None and queued >= most:
                walk.more += 1
                break  # one past the bound says there are more; listing on would cost for nothing
            out.append((node, e.name))
            queued += 1
    return queued


def _reopen(node: Node) -> int:
    """A descriptor of ``node``'s directory, opened again name by name from the nearest
    ancestor that still holds one (two descriptors open at once at most)."""
    names = []
    anchor = node
    while anchor.fd < 0:
        names.append(anchor.name)
        anchor = anchor.parent
    fd = anchor.fd
    owned = False
    try:
        for name in reversed(names):
            nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            if owned:
                os.close(fd)
            fd, owned = nfd, True
    except BaseException:
        if owned:
            os.close(fd)
        raise
    return fd


#: A read into a larger buffer that returns fewer bytes than this got the whole file, for the
#: files noded reads this way (``cgroup.procs``, a cpuset's CPU list): a kernfs seq_file read
#: stops short of the buffer only at the file's end, or where its next record would overflow
#: the seq_file's own buffer (a page at least, 4096 bytes), and a ``cgroup.procs`` record is
#: at most 8 bytes ("4194303\n"); a one-record file is returned whole by its first read; a
#: regular file's short read is its end. So the common cgroup costs one read, not two.
WHOLE_BELOW = 2048


def read_whole(fd: int, offset: int | None = None) -> bytes:
    """A small kernel file, whole, from its descriptor: by ``read`` from where the descriptor
    is, or by ``pread`` from ``offset`` (0: a kernfs seq_file lists afresh)."""
    chunk = os.read(fd, 65536) if offset is None else os.pread(fd, 65536, offset)
    if len(chunk) < WHOLE_BELOW:
        return chunk
    chunks = [chunk]
    while True:
        if offset is None:
            chunk = os.read(fd, 65536)
        else:
            offset += len(chunk)
            chunk = os.pread(fd, 65536, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def read_at(dir_fd: int | None, path: str, node: Node | str) -> bytes:
    """A small kernel file, whole: ``path`` relative to ``dir_fd`` (None: as it is);
    ``node``: the directory it is in, for an error's file name (a Node, or the top's path)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        e.filename = f"{node if isinstance(node, str) else node.short()}/{path.rsplit('/', 1)[-1]}"
        raise
    try:
        return read_whole(fd)
    except OSError as e:
        # os.read's error names no file: the message must
        e.filename = f"{node if isinstance(node, str) else node.short()}/{path.rsplit('/', 1)[-1]}"
        raise
    finally:
        os.close(fd)
