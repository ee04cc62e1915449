"""What `noded run` would refuse at start on this host, for `noded check-config` too.

One function that both call (``start_check``), so the two never disagree, and that
creates and changes nothing:

* the state and runtime directories (and the admin socket's, and MPS's pipe and log
  directories where co-location is on) must be ones only root can change (checked as
  ``SecureDir`` checks them);
* every path the config names (noded.commands.configpaths) is where noded may use it: none
  meets another, nothing noded makes is inside the resctrl mount, a cgroup tree or a
  kernel filesystem, a socket's path holds nothing but a stale socket, and an existing
  MPS pipe directory is one noded made (recorded in the state directory);
* the config file and every file noded reads or runs (the mount table, the labels file,
  the co-location profiles, MPS's control binary) are ones only root can change
  (noded.stores.trustedfile): another user's would choose what noded does as root;
* the metrics listener can bind (a port in use, an address not this host's);
* each job source's root is on a cgroup filesystem;
* the files read at start parse, bounded: the calibration (when the config gives no
  peak), the co-location profiles, and NVML's library loads where co-location is on.

What noded starts without (a labels file or a co-location model it cannot use, both
used once fixed or refused with a log line) are warnings. Where a noded already runs
with this runtime directory, its own listeners are not counted against the config; a
reload (SIGHUP) runs the same check, so a config `noded run` would refuse is refused
whole there too, never half applied.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass, field

from noded.config import Config, ConfigError
from noded.stores.securedir import DirectoryMissing, SecureDir, SecureDirError, StateFileError, StateReadError
from noded.stores.trustedfile import untrusted_reason
from noded.util import paths as fs_paths  # (paths: a name its functions use)

CGROUP_FILESYSTEMS = ("cgroup", "cgroup2")
#: filesystems whose directories and files are the kernel's: noded makes nothing of its own there
KERNEL_FILESYSTEMS = (*CGROUP_FILESYSTEMS, "resctrl", "proc", "sysfs")
#: the library pynvml loads, through the dynamic loader's search
NVML_LIBRARY = "libnvidia-ml.so.1"


@dataclass
class StartCheck:
    #: (key, reason) for each thing that stops `noded run` at start
    problems: list[tuple[str, str]] = field(default_factory=list)
    #: (key, what) for each thing noded starts without
    warnings: list[tuple[str, str]] = field(default_factory=list)


_MOUNTINFO_ESCAPE = re.compile(rb"\\([0-7]{3})")


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem ``path`` is on (the longest mount point above it).

    mountinfo is read as bytes, as the kernel writes it (proc(5)): lines end at '\\n',
    fields are separated by ' ', and only space, tab, newline and backslash are escaped
    (as octal) in a mount point; any user may mount (FUSE) at a path whose name is not
    UTF-8 or holds any other byte."""
    real = os.fsencode(os.path.realpath(path))
    best, fstype = -1, None
    with open(mountinfo, "rb") as f:
        for line in f.read().split(b"\n"):
            left, _, right = line.partition(b" - ")
            fields = left.split(b" ")
            if len(fields) < 5 or not right:
                continue
            point = _MOUNTINFO_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), fields[4])
            if (real == point or real.startswith(point.rstrip(b"/") + b"/")) and len(point) > best:
                best, fstype = len(point), os.fsdecode(right.split(b" ")[0])
    return fstype


def _directory(path: str, mode: int, what: str) -> str | None:
    try:
        SecureDir(path, mode=mode, create=False, what=what).close()
    except DirectoryMissing:
        return _uncreatable(path, what)  # noded makes it, under checked parents, where it can
    except SecureDirError as e:
        return e.reason
    return None


def _uncreatable(path: str, what: str) -> str | None:
    """Why noded could not make the missing directory ``path`` (None: nothing stops it):
    the nearest directory above it that is there is on a read-only filesystem. noded run
    refused it at start ('Read-only file system') where check-config, the unit's
    ExecStartPre, had said ok."""
    there = path
    while not os.path.isdir(there):
        parent = os.path.dirname(there)
        if parent == there:
            return None
        there = parent
    try:
        read_only = bool(os.statvfs(there).f_flag & os.ST_RDONLY)
    except OSError:
        return None  # what it is, SecureDir says when noded makes it
    if not read_only:
        return None
    return (f"{what} {path}: cannot create {path}: {there} is on a read-only filesystem (under the unit's "
            "ProtectSystem=strict, everything but its StateDirectory, RuntimeDirectory and ReadWritePaths is)")


def watchdog_problem(tick_s: float, watchdog_s: float | None) -> str | None:
    """Why systemd's watchdog would kill a noded ticking every ``tick_s`` (None: it would
    not, or there is no watchdog). The loop tells the watchdog once a round, and a round
    lasts a tick at least: one longer than half the watchdog's interval (the margin
    sd_watchdog_enabled(3) asks for) gets noded killed, restarted and killed again, with
    check-config content (it cannot know the unit's WatchdogSec)."""
    if watchdog_s is None or tick_s <= watchdog_s / 2:
        return None
    return (f"{tick_s:g} seconds is longer than half of systemd's watchdog interval ({watchdog_s:g}s, the unit's "
            f"WatchdogSec): noded tells the watchdog once a tick and would be killed as hung; give at most "
            f"{watchdog_s / 2:g}, or raise WatchdogSec to at least twice tick_s")


def start_check(config: Config, *, path: str | None = None, reloading: bool = False,
                watchdog_s: float | None = None) -> StartCheck:
    """What `noded run` would refuse at start with ``config`` (read from the file at
    ``path``) on this host, and what it would start without; creates and changes nothing.
    ``reloading``: the noded asking runs, and its sockets and port are its own (a change
    to them needs a restart). ``watchdog_s``: systemd's watchdog interval for the noded
    that would run it (None: none, or not known, as to check-config)."""
    from noded.stores.lockfile import instance_holder

    check = StartCheck()
    out = check.problems
    reason = watchdog_problem(config.tick_s, watchdog_s)
    if reason:
        out.append(("tick_s", reason))
    if path is not None:
        reason = untrusted_reason(path, "the config file")
        if reason:
            out.append(("(file)", reason))
    directories = [("state_dir", config.state_dir, 0o700, "state directory"),
                   ("runtime_dir", config.runtime_dir, 0o755, "runtime directory"),
                   ("admin.socket", os.path.dirname(config.admin_socket), 0o755, "admin socket directory")]
    if config.colocation.enabled:
        # MPS (as root) writes its log and its pipes there: another user who could change
        # them could plant a link for root to write through
        mps = config.colocation.mps
        directories += [("colocation.mps.pipe_dir" if mps.pipe_dir else "runtime_dir", config.mps_pipe_dir, 0o755,
                         "MPS pipe directory"),
                        ("colocation.mps.log_dir", mps.log_dir, 0o755, "MPS log directory")]
    for key, path, mode, what in directories:
        reason = _directory(path, mode, what)
        if reason:
            out.append((key, reason))
    # A noded running with this runtime directory listens where this config would: its
    # own sockets and port are not the config's problem (a second start is refused anyway).
    running = reloading or instance_holder(config.runtime_dir) is not None
    out += path_problems(config, sockets=not running)
    out += read_file_problems(config)
    if not running:
        out += listener_problems(config)
    for i, source in enumerate(config.jobs.sources):
        try:
            is_dir = fs_paths.isdir(source.root)
        except OSError as e:  # shut to noded (EACCES), a loop: that, not "no directory"
            out.append((f"jobs.sources[{i}].root", f"{source.root}: {e.strerror or e}"))
            continue
        if not is_dir:
            out.append((f"jobs.sources[{i}].root", f"{source.root} is not a directory"))
            continue
        fstype = filesystem_type(source.root)
        if fstype not in CGROUP_FILESYSTEMS:
            out.append((f"jobs.sources[{i}].root", f"{source.root} is not in a cgroup hierarchy (it is on {fstype})"))
    out += calibration_problems(config)
    out += colocation_problems(config)
    check.warnings += source_warnings(config) + file_warnings(config)
    return check


def refusal(path: str, problems: list[tuple[str, str]]) -> ConfigError:
    """``problems`` (key, reason) of the config file at ``path`` as one ConfigError, each at
    the line of its key (none where the file no longer parses)."""
    from noded.util.yamlsafe import YamlError, read_yaml_file

    try:
        doc = read_yaml_file(path)
    except YamlError:  # changed since it was read: said without lines
        doc = None
    return ConfigError.of([ConfigError(path, key, doc.line_of(key) if doc else None, reason)
                           for key, reason in problems])


def source_warnings(config: Config) -> list[tuple[str, str]]:
    """A config that names no job source starts and watches nothing: said at start and by
    check-config, and after that by ``nodectl status`` and ``noded_watching{what="jobs"}``."""
    from noded.loop.watching import no_job_source

    why = no_job_source(config)
    return [("jobs.sources", why)] if why else []


def path_problems(config: Config, *, sockets: bool = True) -> list[tuple[str, str]]:
    """Every path the config names, checked as the kernel will take it: none meets
    another (noded.commands.configpaths), nothing noded makes is inside the resctrl mount, a job
    source's cgroup root or a kernel filesystem, and (with ``sockets``) a socket's path
    holds nothing noded would have to remove but a stale socket."""
    from noded.admin.server import socket_path_problem
    from noded.commands.configpaths import MADE, named_paths, overlap_problems

    paths = named_paths(config)
    out = overlap_problems(paths, os.path.realpath)
    refused = {key for key, _ in out}
    for p in paths:
        if p.role != MADE or p.key in refused or p.key == "(built in)":
            continue
        fstype = filesystem_type(p.path)
        if fstype in KERNEL_FILESYSTEMS:
            out.append((p.key, f"{p.what} {p.path} is on a {fstype} filesystem: its files are the kernel's, and a "
                               "directory made there is one of the kernel's objects"))
            refused.add(p.key)
    if not sockets:
        return out
    named = [("admin.socket" if config.admin.socket else "runtime_dir", config.admin_socket)]
    if config.colocation.enabled or config.rightsize.enabled:
        named.append(("runtime_dir", config.report_socket))
    for key, path in named:
        reason = socket_path_problem(path)
        if reason and key not in refused:
            out.append((key, reason))
    return out


def read_file_problems(config: Config) -> list[tuple[str, str]]:
    """The files noded reads or runs as root, each one only root (or noded's uid) can change."""
    from noded.commands.configpaths import READ, named_paths

    out = []
    for p in named_paths(config):
        if p.role == READ:
            reason = untrusted_reason(p.path, p.what)
            if reason:
                out.append((p.key, reason))
    return out


def listener_problems(config: Config) -> list[tuple[str, str]]:
    """Whether the metrics listener can bind: bound here, as run binds it, and closed
    (port 0 too: the address must still be this host's)."""
    from noded.server.stream import ListenError, listen_tcp

    try:
        listen_tcp(config.metrics.address, config.metrics.port, what="metrics").close()
    except ListenError as e:
        return [("metrics.address" if e.address_wrong else "metrics.port", str(e))]
    return []


def calibration_problems(config: Config) -> list[tuple[str, str]]:
    """The calibration run reads for its node peak (where the config gives none)."""
    if config.peak_gbps_per_domain is not None:
        return []
    from noded.stores.calibration import CalibrationError, read_calibration

    try:
        read_calibration(config.state_dir)
    except CalibrationError as e:
        return [("peak_gbps_per_domain", f"null, so the calibration is read, and it cannot be used: {e}")]
    return []


def colocation_problems(config: Config) -> list[tuple[str, str]]:
    """Co-location's files and its driver: the profiles, an existing pipe directory
    (one noded made), and NVML's library."""
    cc = config.colocation
    if not cc.enabled:
        return []
    out = []
    if cc.profiles:
        from noded.colocation.profiles import ProfileError, load_profiles

        try:
            load_profiles(cc.profiles)
        except ProfileError as e:
            out.append(("colocation.profiles", str(e)))
    reason = pipe_dir_problem(config)
    if reason:
        out.append(("colocation.mps.pipe_dir" if cc.mps.pipe_dir else "runtime_dir", reason))
    reason = nvml_library_problem()
    if reason:
        out.append(("colocation.enabled", reason))
    return out


def pipe_dir_problem(config: Config) -> str | None:
    """Whether MPS's pipe directory is one noded may empty and remove: none there yet,
    or the one an earlier run made (as recorded in the state directory)."""
    from mps.control import made_dir_key, pipe_dir_problem as problem

    from noded.stores.originals import FILE as ORIGINALS

    path = config.mps_pipe_dir
    if not os.path.lexists(path):
        return None
    recorded = False
    try:
        with SecureDir(config.state_dir, create=False) as state:
            data = state.read_json(ORIGINALS)
        recorded = isinstance(data, dict) and made_dir_key(path) in data
    except (SecureDirError, StateFileError, StateReadError):
        pass  # no records readable: nothing is known to be noded's
    return problem(path, recorded)


def nvml_library_problem() -> str | None:
    """Whether NVML's library loads as pynvml loads it (co-location lists and sets GPUs through it)."""
    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError as e:
        search = os.environ.get("LD_LIBRARY_PATH")
        where = f"LD_LIBRARY_PATH={search}, then " if search else "LD_LIBRARY_PATH unset; "
        return (f"co-location needs NVML, and its library {NVML_LIBRARY} could not be loaded ({where}the loader's "
                f"cache /etc/ld.so.cache and the system library directories searched): {e}")
    return None


def file_warnings(config: Config) -> list[tuple[str, str]]:
    """Files noded starts without where it cannot use them (and says so): the labels
    file, and the co-location model (admissions decided by the ΣC rule instead)."""
    out = []
    if config.jobs.labels and os.path.lexists(config.jobs.labels):
        from noded.jobs.discovery import parse_labels

        try:
            parse_labels(config.jobs.labels)
        except (OSError, ValueError) as e:
            out.append(("jobs.labels", f"{e} (noded runs without these labels until the file is fixed)"))
    if config.colocation.enabled:
        from noded.colocation.outcomes import MODEL_FILE, ModelError, read_model

        try:
            read_model(os.path.join(config.state_dir, MODEL_FILE))
        except ModelError as e:
            out.append(("state_dir", f"{e} (admissions are decided by the ΣC rule until `nodectl model fit` "
                                     "writes a usable one)"))
    return out
