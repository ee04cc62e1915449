"""Directory trees of any depth, as a tenant shapes a delegated cgroup subtree: nested
names past PATH_MAX, made and removed by directory descriptors (a path to them cannot
be opened). On the real cgroup hierarchy or on a test's own tmp_path."""

from __future__ import annotations

import os
from typing import Callable

from support.waiting import wait_for

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW


def write_at(dir_fd: int, name: str, text: str, create: bool = False) -> None:
    """Writes ``text`` to the file ``name`` in the directory open at ``dir_fd`` (one write)."""
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if create else 0), 0o644,
                 dir_fd=dir_fd)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_at(dir_fd: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def make_chain(top: str, names: list[str], fill: Callable[[int, int, int], None] | None = None) -> None:
    """``top/names[0]/names[1]/...`` made by descriptors, whatever the length of the whole;
    ``fill(parent_fd, dir_fd, depth)`` is called in each new directory (depth 1 first)."""
    fd = os.open(top, _DIR)
    try:
        for depth, name in enumerate(names, 1):
            os.mkdir(name, dir_fd=fd)
            nfd = os.open(name, _DIR, dir_fd=fd)
            try:
                if fill is not None:
                    fill(fd, nfd, depth)
            finally:
                os.close(fd)
                fd = nfd
    finally:
        os.close(fd)


def remove_tree(top: str, cgroupfs: bool = False) -> None:
    """Removes everything below ``top`` and ``top`` itself, deepest first, by descriptors
    (no recursion: any depth). On cgroupfs every process in it is killed first and each
    cgroup waited on to empty; elsewhere files are unlinked."""
    stack: list[tuple[int, str, int]] = []  # (parent fd, name, own fd)
    fd = os.open(top, _DIR)
    stack.append((-1, top, fd))
    try:
        while stack:
            parent, name, fd = stack[-1]
            sub = None
            with os.scandir(fd) as entries:
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        sub = e.name
                        break
                    if not cgroupfs:
                        os.unlink(e.name, dir_fd=fd)
            if sub is not None:
                stack.append((fd, sub, os.open(sub, _DIR, dir_fd=fd)))
                continue
            if cgroupfs:
                for pid in read_at(fd, "cgroup.procs").split():
                    try:
                        os.kill(int(pid), 9)
                    except ProcessLookupError:
                        pass
                wait_for(lambda: read_at(fd, "cgroup.procs") == "", what=f"cgroup {name[:40]} to empty")
            stack.pop()
            os.close(fd)
            if parent == -1:
                os.rmdir(name)
            else:
                os.rmdir(name, dir_fd=parent)
    finally:
        for _, _, fd in stack:
            os.close(fd)
