"""Every path a config names, what noded does there, and which of them may not meet.

A config names paths of three kinds: places noded makes and removes things (its state
and runtime directories, the pid file, the admin and report sockets, MPS's pipe and log
directories), kernel trees it acts in (the resctrl mount, each job source's cgroup
root) and files it only reads or runs (the mount table, the labels file, the profiles,
MPS's control binary). Two of them must not meet where one would become the other:

* no two paths are the same where noded makes one of them (an admin socket at the
  report socket's path is the 0666 report socket; a pipe directory at the state
  directory is emptied with it);
* nothing noded makes lies inside a kernel tree (a state directory made inside the
  resctrl mount is a control group);
* nothing noded makes, and no kernel tree, lies inside a directory whose entries are
  all noded's (the state directory, MPS's directories), and nothing at all inside the
  MPS pipe directory, whose content is removed at each start of MPS.

``named_paths`` lists them (a test holds it to every path key of noded.config), and
``overlap_problems`` says what meets; noded.commands.hostcheck calls it with real paths, for
``noded run`` and ``noded check-config`` alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from noded.config import Config
from noded.stores.lockfile import DEFAULT_LOCK_DIR

#: noded makes it, writes it, and may remove it
MADE = "made"
#: a kernel tree noded acts in: never a place for noded's own files
TREE = "tree"
#: a file noded only reads, or runs
READ = "read"

PID_FILE = "noded.pid"


@dataclass(frozen=True)
class NamedPath:
    key: str  # the config key that names it (runtime_dir for the files made in it)
    path: str
    what: str  # for messages: "the state directory"
    role: str  # MADE, TREE or READ
    #: a directory whose every entry is noded's: nothing made elsewhere, and no kernel tree, inside it
    private: bool = False
    #: a directory whose content noded removes: nothing at all inside it
    emptied: bool = False


def named_paths(config: Config) -> list[NamedPath]:
    """The paths ``config`` names, each with the key that names it; the ones a config
    key sets itself come after the built-in ones they could collide with, so that a
    collision is told at the key that made it."""
    runtime = config.runtime_dir.rstrip("/") or "/"
    admin_key = "admin.socket" if config.admin.socket else "runtime_dir"
    out = [NamedPath("(built in)", DEFAULT_LOCK_DIR, "the host lock directory", MADE, private=True),
           NamedPath("runtime_dir", runtime, "the runtime directory", MADE),
           NamedPath("runtime_dir", os.path.join(runtime, PID_FILE), "the pid file", MADE),
           NamedPath("runtime_dir", config.report_socket, "the report socket", MADE),
           NamedPath("state_dir", config.state_dir, "the state directory", MADE, private=True),
           NamedPath(admin_key, config.admin_socket, "the admin socket", MADE),
           NamedPath("resctrl.root", config.resctrl.root, "the resctrl mount", TREE),
           NamedPath("resctrl.mounts", config.resctrl.mounts, "the mount table", READ)]
    out += [NamedPath(f"jobs.sources[{i}].root", s.root, "a job source's cgroup root", TREE)
            for i, s in enumerate(config.jobs.sources)]
    if config.jobs.labels:
        out.append(NamedPath("jobs.labels", config.jobs.labels, "the labels file", READ))
    cc = config.colocation
    if cc.enabled:  # the co-location keys are used only with it on
        pipe_key = "colocation.mps.pipe_dir" if cc.mps.pipe_dir else "runtime_dir"
        out += [NamedPath(pipe_key, config.mps_pipe_dir, "the MPS pipe directory", MADE, private=True, emptied=True),
                NamedPath("colocation.mps.log_dir", cc.mps.log_dir, "the MPS log directory", MADE, private=True),
                NamedPath("colocation.mps.control", cc.mps.control, "the MPS control binary", READ)]
        if cc.profiles:
            out.append(NamedPath("colocation.profiles", cc.profiles, "the profiles file", READ))
    return out


def _inside(path: str, directory: str) -> bool:
    return path != directory and path.startswith(directory.rstrip("/") + "/")


def overlap_problems(paths: list[NamedPath], resolve: Callable[[str], str] = lambda p: p) -> list[tuple[str, str]]:
    """(key, reason) for each path that meets an earlier one in a way noded cannot
    take (see the module's doc); ``resolve`` gives the path the kernel will take
    (os.path.realpath on a host: a symbolic link may make two paths one)."""
    real = [resolve(p.path) for p in paths]
    out: list[tuple[str, str]] = []
    for j, b in enumerate(paths):
        for i, a in enumerate(paths):
            if i == j:
                continue
            reason = _meeting(a, real[i], b, real[j], same_ok=i > j)
            if reason:
                out.append((b.key, reason))
                break  # one reason a path is refused is enough
    return out


def _meeting(a: NamedPath, a_real: str, b: NamedPath, b_real: str, *, same_ok: bool) -> str | None:
    """Why ``b`` may not be where it is, given ``a`` (None: it may). A sameness is told
    once, at the later of the two (``same_ok`` for the earlier)."""
    shown = f"{b.what} {b.path}" + (f" (that is {b_real})" if b_real != b.path else "")
    if a_real == b_real:
        if same_ok or MADE not in (a.role, b.role):
            return None
        return f"{shown} is also {a.what} ({a.key}): noded makes one of them, and would make or remove the other"
    if _inside(b_real, a_real):
        if a.role == TREE and b.role == MADE:
            return (f"{shown} is inside {a.what} {a.path} ({a.key}): what noded makes there would be the kernel's "
                    "(a directory in resctrl is a control group, one in a cgroup tree a cgroup)")
        if a.emptied:
            return f"{shown} is inside {a.what} {a.path} ({a.key}), whose content noded removes"
        if a.private and b.role in (MADE, TREE):
            return f"{shown} is inside {a.what} {a.path} ({a.key}), whose entries are all noded's own"
    return None
