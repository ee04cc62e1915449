"""noded's configuration: YAML -> frozen dataclasses, validated at load.

The file is untrusted input (read through noded.util.yamlsafe: bounded, UTF-8, no aliases,
no duplicate keys). Every key is known (an unknown one is an error, not ignored), every
value has a type and a range (numbers finite and bounded, paths absolute and
normalised), and anything ``noded run`` would refuse at start is refused here, so
``check-config`` and a reload catch it. An error names the file, the line and the key.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from noded.jobs.cgroups import KINDS, check_pattern
from noded.util.journal import printable
from noded.util.yamlsafe import Document, YamlError, parse_yaml, read_regular_file

GB = 1e9
#: where a job can come from: a cgroup source's kind, or a process tree registered with noded
JOB_SOURCES = (*KINDS, "registered")
#: the node peak when neither the config nor a calibration gives one (GB/s per L3 domain)
DEFAULT_PEAK_GBPS = 50.0


class ConfigError(ValueError):
    """What is wrong with a config: ``where``, ``key``, ``line`` and ``reason`` of the
    first problem; ``problems`` lists every one found (this one first), and the message
    has a FILE:LINE: KEY: REASON line for each."""

    def __init__(self, where: str, key: str, line: int | None, reason: str):
        self.where, self.key, self.line, self.reason = where, key, line, reason
        self.problems: tuple[ConfigError, ...] = (self,)
        super().__init__(self.line_text)

    @property
    def line_text(self) -> str:
        at = f":{self.line}" if self.line else ""
        # One line, whatever the file's keys hold ("\e[2J" or "\n" in a quoted key): it
        # goes to a terminal (check-config) and to the journal (a refused reload).
        return printable(f"{self.where}{at}: {self.key}: {self.reason}")

    def summary(self, limit: int = 20) -> str:
        """The first ``limit`` problems, and how many more: for the journal, where one
        record must stay readable (check-config prints them all)."""
        shown = [p.line_text for p in self.problems[:limit]]
        more = len(self.problems) - len(shown)
        return "\n".join(shown) + (f"\n... and {more} more (`noded check-config {self.where}` lists them all)"
                                   if more > 0 else "")

    @classmethod
    def of(cls, problems: list["ConfigError"]) -> "ConfigError":
        """One error for several problems, in the order of their lines in the file."""
        ordered = sorted(problems, key=lambda p: p.line or 0)
        first = ordered[0]
        error = cls(first.where, first.key, first.line, first.reason)
        error.problems = tuple(ordered)
        error.args = ("\n".join(p.line_text for p in ordered),)
        return error


class EmptyConfig(ConfigError):
    """A file with no keys (empty, or only comments), where one is required (a reload)."""


class _Recorded(Exception):
    """A value whose problems are already in the list of errors: its key is left out."""


@dataclass(frozen=True)
class ResctrlConfig:
    root: str = "/sys/fs/resctrl"
    mounts: str = "/proc/mounts"
    prefix: str = "noded-"
    #: while the node is quiet (below half the contention threshold, for contention.hold_s;
    #: nothing throttled, capped or overridden; no per-job cap, source cap or GPU reserve
    #: configured), each job's counters are read every this many ticks, the node's every
    #: tick (1: every job every tick)
    quiet_read_every: int = 5


@dataclass(frozen=True)
class JobSourceConfig:
    kind: str
    root: str = "/sys/fs/cgroup"
    patterns: tuple[str, ...] = ()
    #: every CPU job of this source is held at this bandwidth (GB/s; null: no default cap)
    cap_gbps: float | None = None


@dataclass(frozen=True)
class JobsConfig:
    sources: tuple[JobSourceConfig, ...] = ()
    labels: str | None = None
    process_events: bool = True
    rmid_retry_s: float = 10.0
    # What one tenant's cgroups and execs may cost noded (issue #22): beyond these, the
    # rest waits for a later tick, counted in noded_job_source_capped and
    # noded_process_events_dropped_total.
    #: job directories read per source and tick at most (those with processes first); also
    #: the most cgroups read below one job (a job with more is held as last seen)
    max_polled_per_source: int = 256
    #: new processes per uid and second placed at once on their exec; the rest by the next tick
    exec_events_per_uid: int = 100


@dataclass(frozen=True)
class ContentionConfig:
    #: node bandwidth at or above this share of the peak (with a GPU job slowed) triggers
    threshold: float = 0.75
    #: below this share, held for hold_s, throttles are released one step at a time
    release_threshold: float = 0.60
    hold_s: float = 10.0
    #: after a throttle step, wait this long for its effect before the next step
    settle_s: float = 2.0
    #: fail safe: when node bandwidth stays unknown this long, release every throttle
    missing_release_s: float = 30.0
    #: a GPU job counts as slowed when its utilisation falls this share below its baseline
    gpu_drop_margin: float = 0.10
    #: how fast the uncontended baseline follows a GPU job's utilisation (EWMA weight)
    baseline_alpha: float = 0.2
    #: any CPU job above this bandwidth is throttled regardless (GB/s; null: no cap)
    cpu_job_cap_gbps: float | None = None
    #: bandwidth kept free for GPU jobs while one runs (GB/s, node-wide): CPU jobs are
    #: capped to share what the peak leaves (null: no reserve, levels step as before)
    gpu_reserve_gbps: float | None = None
    #: MBA throttle levels as shares of unthrottled bandwidth, mildest first
    mba_levels: tuple[float, ...] = (0.8, 0.6, 0.4, 0.2, 0.1)
    #: "mba", "cores", or "auto" (MBA where the host has it, else halve cores)
    method: str = "auto"


@dataclass(frozen=True)
class AdminConfig:
    #: the admin socket; null: noded.sock in runtime_dir
    socket: str | None = None
    #: members of this group (and root) may use it; the socket is root:group 0660
    group: str = "noded-admin"
    #: the deadline for a client's whole request and its reply (admin and report sockets)
    timeout_s: float = 5.0
    #: reports taken per second on the report socket from one uid, and for one job; the
    #: rest is answered "dropped" unread (noded_reports_dropped_total)
    reports_per_uid: int = 20
    reports_per_job: int = 10


@dataclass(frozen=True)
class MpsConfig:
    control: str = "/usr/bin/nvidia-cuda-mps-control"
    #: CUDA_MPS_PIPE_DIRECTORY; null: mps/ in runtime_dir. Clients must use the same.
    pipe_dir: str | None = None
    log_dir: str = "/var/log/noded/mps"
    #: GPUs MPS serves, by UUID; empty: all of them
    gpus: tuple[str, ...] = ()
    #: put those GPUs in EXCLUSIVE_PROCESS compute mode while MPS runs (NVIDIA's advice)
    exclusive_process: bool = True
    #: the MPS daemon serves several users at once (else one user's jobs per GPU)
    multi_user: bool = False
    #: how long a start waits on NVML for co-location (listing the GPUs, their compute
    #: modes): a driver hung longer fails co-location's start instead of holding noded's
    nvml_timeout_s: float = 20.0


@dataclass(frozen=True)
class ColocationConfig:
    enabled: bool = False
    #: compact profile file (model -> batch size -> {C, M, window_us})
    profiles: str | None = None
    #: ΣC (time-normalised, average occupancy %) one GPU may hold
    threshold_c: float = 60.0
    max_jobs_per_gpu: int = 3
    mps: MpsConfig = field(default_factory=MpsConfig)


@dataclass(frozen=True)
class RightsizeMemoryConfig:
    """Right-sizing's memory (noded.rightsize.memsplit): soft limits only, off unless
    ``cache_gb`` is set."""

    #: the node memory sized GPU jobs' data caches share, GiB; null: memory is not sized
    cache_gb: float | None = None
    #: the units that memory is split in (Synergy-OPT over memory units)
    units: int = 16
    #: a job's soft limit is its process memory, its cache share and this much more (GiB)
    headroom_gb: float = 1.0


@dataclass(frozen=True)
class RightsizeConfig:
    """Right-sizing the CPU side of GPU jobs (issue #13; noded.rightsize). Off unless
    ``sources`` names a job source."""

    #: job sources (kinds as in jobs.sources, or registered) whose GPU jobs are sized; empty: off
    sources: tuple[str, ...] = ()
    #: job sources whose CPU jobs may borrow the GPU array's idle cores (taken back at once)
    lend_to: tuple[str, ...] = ()
    #: top (the whole share first, then the fewest cores within noise_margin of the best
    #: measured), coda (CODA's adaptive search) or synergy (Synergy's binary search from the maximum)
    method: str = "top"
    #: a step up is kept only for a gain above this share of the throughput
    noise_margin: float = 0.03
    #: a measurement ends once its interval's half-width is this share of the mean
    tolerance: float = 0.02
    #: ... or after this long at one core count, steady or not
    max_window_s: float = 90.0
    #: samples before this long after a change of cores describe the old one: skipped
    warmup_s: float = 5.0
    #: the GPU array's cores per GPU of the node; null: from the answers found before
    #: (their mean per GPU), 4 per GPU without history
    reserve_per_gpu: int | None = None
    #: soft memory limits from each job's declared cache curve (off unless memory.cache_gb is set)
    memory: RightsizeMemoryConfig = field(default_factory=RightsizeMemoryConfig)

    @property
    def enabled(self) -> bool:
        return bool(self.sources)


@dataclass(frozen=True)
class MetricsConfig:
    address: str = "127.0.0.1"
    port: int = 9464


@dataclass(frozen=True)
class Config:
    tick_s: float = 1.0
    #: the node's peak memory bandwidth per L3 domain, GB/s; None: the calibration in
    #: state_dir (noded.stores.calibration), else DEFAULT_PEAK_GBPS
    peak_gbps_per_domain: float | None = None
    state_dir: str = "/var/lib/noded"
    #: pid file (one noded per host) and, later, the admin socket
    runtime_dir: str = "/run/noded"
    nvml: bool = True
    resctrl: ResctrlConfig = field(default_factory=ResctrlConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    contention: ContentionConfig = field(default_factory=ContentionConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    colocation: ColocationConfig = field(default_factory=ColocationConfig)
    rightsize: RightsizeConfig = field(default_factory=RightsizeConfig)

    @property
    def peak_bytes_per_domain(self) -> float:
        """Settled by noded.stores.calibration.with_node_peak at start; the default stands in before that."""
        peak = self.peak_gbps_per_domain if self.peak_gbps_per_domain is not None else DEFAULT_PEAK_GBPS
        return peak * GB

    @property
    def mps_pipe_dir(self) -> str:
        return self.colocation.mps.pipe_dir or f"{self.runtime_dir.rstrip('/')}/mps"

    @property
    def report_socket(self) -> str:
        """Where training jobs report iteration times (only `report`, from the job itself)."""
        return f"{self.runtime_dir.rstrip('/')}/report.sock"

    @property
    def admin_socket(self) -> str:
        return self.admin.socket or f"{self.runtime_dir.rstrip('/')}/noded.sock"


# ---------------------------------------------------------------- validation
#
# A check takes a converted value and returns why it is wrong, or None. Every float is
# also finite (see _convert): no key takes inf or nan, and none means "forever".

Check = Callable[[Any], "str | None"]

#: Linux's PATH_MAX, with its NUL
PATH_MAX = 4096
#: sun_path of a Unix socket holds 107 bytes and a NUL
SOCKET_PATH_MAX = 107
#: names in resctrl's root and groups: a prefix that any starts with would claim it
RESCTRL_NAMES = ("info", "mon_data", "mon_groups", "tasks", "cpus", "cpus_list", "schemata", "mode", "size",
                 "ctrl_hw_id", "mon_hw_id")
PREFIX_MAX = 32


def _must(predicate: Callable[[Any], bool], what: str) -> Check:
    return lambda v: None if predicate(v) else f"{_shown(v)} must be {what}"


def _between(lo: float, hi: float, unit: str = "", *, above: bool = False, nullable: str = "") -> Check:
    """lo <= v <= hi (lo < v with ``above``); ``nullable`` says what null means."""
    low = f"above {lo:g}" if above else f"at least {lo:g}"
    what = f"{low} and at most {hi:g}{unit}" + (f", or null {nullable}" if nullable else "")
    return _must(lambda v: (nullable and v is None) or (v is not None and (lo < v if above else lo <= v) and v <= hi),
                 what)


def path_problem(path: str | None) -> str | None:
    """Why ``path`` is not an absolute, normalised path noded can use (None: it is)."""
    if path is None:
        return None
    if not path:
        return "empty; give an absolute path"
    if any(ord(c) < 0x20 or c == "\x7f" for c in path):
        return f"{_shown(path)} contains a control character (NUL, newline, …)"
    if not path.startswith("/"):
        return f"{_shown(path)} is relative; give an absolute path"
    if len(path.encode()) >= PATH_MAX:
        return f"longer than {PATH_MAX - 1} bytes"
    normal = "/" + os.path.normpath(path).lstrip("/")
    if normal != path:
        return f"{_shown(path)} is not normalised; write {normal!r}"
    return None


def prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot be the owner prefix of noded's resctrl groups (None: it can).
    noded's safety rests on touching only groups named with it."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix):
        return f"{_shown(prefix)} must be letters, digits, '_', '.' and '-' (at least one)"
    if len(prefix) > PREFIX_MAX:
        return f"{_shown(prefix)} is longer than {PREFIX_MAX} characters"
    if prefix.startswith("."):
        return f"{_shown(prefix)} must not start with '.'"
    claimed = [n for n in RESCTRL_NAMES if n.startswith(prefix)]
    if claimed:
        return f"{_shown(prefix)} would claim resctrl's own {', '.join(claimed)}"
    return None


def address_problem(address: str) -> str | None:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"{_shown(address)} must be an IP address literal (IPv4 such as 127.0.0.1, or IPv6 such as ::1), not a name"
    if ip.is_multicast or ip == ipaddress.ip_address("255.255.255.255"):
        return f"{_shown(address)} is a multicast or broadcast address: nothing can connect to a server there"
    if ip.version == 6 and ip.is_link_local:
        return f"{_shown(address)} is link-local: it needs an interface, which the config cannot name; use :: or a global address"
    return None


def group_problem(group: str) -> str | None:
    if not group or len(group) > 256 or any(c.isspace() or not c.isprintable() or c in ":/" for c in group):
        return f"{_shown(group)} must be a group name (1 to 256 printable characters, no spaces, ':' or '/')"
    return None


def gpu_uuid_problem(uuid: str) -> str | None:
    if not re.fullmatch(r"(GPU|MIG)-[A-Za-z0-9/-]{1,120}", uuid):
        return f"{_shown(uuid)} must be a GPU UUID as NVML gives it (GPU-…, or MIG-… for a MIG instance)"
    return None


_PATH_KEYS = ("state_dir", "runtime_dir", "resctrl.root", "resctrl.mounts", "jobs.sources.root", "jobs.labels",
              "admin.socket", "colocation.profiles", "colocation.mps.control", "colocation.mps.pipe_dir",
              "colocation.mps.log_dir")

# dotted key (list indices removed) -> check of the whole value
_RULES: dict[str, Check] = {
    "tick_s": _between(0.01, 60, " seconds"),
    "peak_gbps_per_domain": _between(0, 10_000, " GB/s", above=True, nullable="for the calibrated peak"),
    "contention.threshold": _between(0, 1, " (a share of the peak)", above=True),
    "contention.release_threshold": _between(0, 1, " (a share of the peak)", above=True),
    "contention.hold_s": _between(0, 3600, " seconds"),
    "contention.settle_s": _between(0, 600, " seconds"),
    "contention.missing_release_s": _between(0, 3600, " seconds", above=True),
    "contention.gpu_drop_margin": _must(lambda v: 0 < v < 1, "a share in (0, 1)"),
    "contention.baseline_alpha": _between(0, 1, above=True),
    "contention.cpu_job_cap_gbps": _between(0, 10_000, " GB/s", above=True, nullable="for no cap"),
    "contention.gpu_reserve_gbps": _between(0, 10_000, " GB/s", above=True, nullable="for no reserve"),
    "jobs.sources.cap_gbps": _between(0, 10_000, " GB/s", above=True, nullable="for no default cap"),
    "contention.mba_levels": _must(lambda v: 1 <= len(v) <= 16 and all(a > b for a, b in zip(v, v[1:])),
                                   "1 to 16 shares, mildest (largest) first, each smaller than the one before"),
    "contention.method": _must(lambda v: v in ("auto", "mba", "cores"), "one of auto, mba, cores"),
    "metrics.address": address_problem,
    "metrics.port": _between(0, 65535, " (a TCP port; 0 picks a free one)"),
    "admin.timeout_s": _between(0, 300, " seconds", above=True),
    "admin.group": group_problem,
    "colocation.threshold_c": _between(0, 1000, above=True),
    "colocation.max_jobs_per_gpu": _between(1, 48, " (MPS's client limit)"),
    "colocation.mps.gpus": _must(lambda v: len(set(v)) == len(v), "distinct UUIDs (one is listed twice)"),
    "colocation.mps.nvml_timeout_s": _between(0, 300, " seconds", above=True),
    "jobs.rmid_retry_s": _between(0, 3600, " seconds", above=True),
    "jobs.max_polled_per_source": _between(16, 1_000_000, " directories per tick"),
    "jobs.exec_events_per_uid": _between(1, 1_000_000, " per second"),
    "admin.reports_per_uid": _between(1, 100_000, " per second"),
    "admin.reports_per_job": _between(1, 100_000, " per second"),
    "jobs.sources.kind": _must(lambda v: v in KINDS, f"one of {', '.join(KINDS)}"),
    "resctrl.prefix": prefix_problem,
    "resctrl.quiet_read_every": _between(1, 60, " ticks"),
    "rightsize.sources": _must(lambda v: len(set(v)) == len(v), "distinct source kinds (one is listed twice)"),
    "rightsize.lend_to": _must(lambda v: len(set(v)) == len(v), "distinct source kinds (one is listed twice)"),
    "rightsize.method": _must(lambda v: v in ("top", "coda", "synergy"), "one of top, coda, synergy"),
    "rightsize.noise_margin": _must(lambda v: 0 < v <= 0.5, "a share above 0 and at most 0.5"),
    "rightsize.tolerance": _must(lambda v: 0 < v <= 0.5, "a share above 0 and at most 0.5"),
    "rightsize.max_window_s": _between(1, 3600, " seconds"),
    "rightsize.warmup_s": _between(0, 600, " seconds"),
    "rightsize.reserve_per_gpu": _between(1, 1024, " cores per GPU", nullable="to size it from history"),
    "rightsize.memory.cache_gb": _between(0, 1_000_000, " GiB", above=True, nullable="not to size memory"),
    "rightsize.memory.units": _between(1, 256, " units"),
    "rightsize.memory.headroom_gb": _between(0, 1024, " GiB"),
    **{k: path_problem for k in _PATH_KEYS},
}

# dotted key of a list (indices removed) -> check of each item, with the item's own line
_ITEM_RULES: dict[str, Check] = {
    "contention.mba_levels": _must(lambda v: 0 < v < 1, "a share in (0, 1)"),
    "jobs.sources.patterns": check_pattern,
    "colocation.mps.gpus": gpu_uuid_problem,
    "rightsize.sources": _must(lambda v: v in JOB_SOURCES, f"one of {', '.join(JOB_SOURCES)}"),
    "rightsize.lend_to": _must(lambda v: v in JOB_SOURCES, f"one of {', '.join(JOB_SOURCES)}"),
}


def _rule_key(key: str) -> str:
    return re.sub(r"\[\d+\]", "", key)


#: a number as YAML 1.2 writes it that YAML 1.1 (PyYAML) reads as text: 1e9, 1.5e9
_EXPONENT_TEXT = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][0-9]+")


def _convert(tp: Any, value: Any, key: str, where: str, doc: Document, errors: list[ConfigError]) -> Any:
    """``value`` as type ``tp``. Raises ConfigError for the value itself; a mapping or list
    records each of its problems in ``errors`` and raises _Recorded when it had any."""
    line = doc.line_of(key)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, key, where, doc, errors)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key, where, doc, errors)
    if origin is tuple:
        return _convert_list(tp, value, key, where, doc, errors, line)
    return _convert_scalar(tp, value, key, where, line)


def _convert_list(tp: Any, value: Any, key: str, where: str, doc: Document, errors: list[ConfigError],
                  line: int | None) -> tuple:
    """A list as a tuple of ``tp``'s item type, each item checked by its rule (``_ITEM_RULES``);
    every bad item recorded in ``errors``, and then _Recorded raised: the list is left out whole."""
    if not isinstance(value, list):
        raise ConfigError(where, key, line, f"expected a list, got {_shown(value)}")
    item_type, item_rule = typing.get_args(tp)[0], _ITEM_RULES.get(_rule_key(key))
    items, bad = [], False
    for i, v in enumerate(value):
        item_key = f"{key}[{i}]"
        try:
            item = _convert(item_type, v, item_key, where, doc, errors)
        except _Recorded:
            bad = True
            continue
        except ConfigError as e:
            errors.append(e)
            bad = True
            continue
        reason = item_rule(item) if item_rule else None
        if reason:
            errors.append(ConfigError(where, item_key, doc.line_of(item_key), reason))
            bad = True
        items.append(item)
    if bad:  # the whole list is left out: a list with items missing would shift their indices
        raise _Recorded()
    return tuple(items)


def _convert_scalar(tp: Any, value: Any, key: str, where: str, line: int | None) -> Any:
    """A number (finite), an integer, true or false, or a string; ConfigError for anything else."""
    if tp is float and isinstance(value, str) and _EXPONENT_TEXT.fullmatch(value):
        raise ConfigError(where, key, line, f"expected a number, got {_shown(value)}: YAML 1.1 reads an exponent "
                                            "as a number only with a dot before it and a sign in it (1.5e+9)")
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(where, key, line, f"expected a number, got {_shown(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(where, key, line, f"{_shown(value)} is not a finite number (no key takes inf or nan; "
                                                "none means forever)")
        return number
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, key, line, f"expected an integer, got {_shown(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, key, line, f"expected true or false, got {_shown(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(where, key, line, f"expected a string, got {_shown(value)}")
        return value
    raise TypeError(f"config type {tp} not handled")  # a bug in this module, not in the file


def _shown(value: Any) -> str:
    """A value for a message, cut short: a file may hold a megabyte in one value."""
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    return _cut(repr(value))


def _cut(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _build(cls: type, data: Any, prefix: str, where: str, doc: Document, errors: list[ConfigError]):
    """``cls`` from a mapping. Every key is checked: a bad one is recorded in ``errors``
    and left out, its default standing in so that the keys after it are checked too (the
    caller refuses the whole when ``errors`` holds anything). Raises _Recorded when a
    required key is missing (nothing can stand in for it)."""
    if not isinstance(data, dict):
        raise ConfigError(where, prefix or "(top level)", doc.line_of(prefix), f"expected a mapping, got {_shown(data)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            errors.append(ConfigError(where, _cut(key), doc.line_of(key),
                                      f"unknown key; known here: {', '.join(sorted(names))}"))
            continue
        try:
            value = _convert(hints[k], v, key, where, doc, errors)
        except _Recorded:
            continue
        except ConfigError as e:
            errors.append(e)
            continue
        rule = _RULES.get(_rule_key(key))
        reason = rule(value) if rule else None
        if reason:
            errors.append(ConfigError(where, key, doc.line_of(key), reason))
            continue
        kwargs[k] = value
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in data]
    for name in missing:
        key = f"{prefix}.{name}" if prefix else name
        errors.append(ConfigError(where, key, doc.line_of(prefix), "required key missing"))
    if missing or any(name not in kwargs for name in required):
        raise _Recorded()
    return cls(**kwargs)


def _failed(keys: tuple[str, ...], failed: set[str]) -> bool:
    """Whether any of ``keys``, or anything inside one, had a problem of its own."""
    return any(f == k or f.startswith((f"{k}.", f"{k}[")) for k in keys for f in failed)


def _check_caps(config: Config, where: str, doc: Document, failed: set[str]) -> list[ConfigError]:
    """Caps in GB/s are held with MBA (a control group a job): a host told to throttle by
    halving cores has nothing to hold them with; a source kind has one default cap (a job
    knows its source by kind). The reserve is node-wide, and the domains are counted only
    at start: what it leaves is said at run time (``nodectl explain``)."""
    errors, c = [], config.contention
    capped = [(f"jobs.sources[{i}].cap_gbps", s) for i, s in enumerate(config.jobs.sources) if s.cap_gbps is not None]
    keys = [k for k, _ in capped] + (["contention.gpu_reserve_gbps"] if c.gpu_reserve_gbps is not None else [])
    if keys and c.method == "cores" and "contention.method" not in failed:
        errors.append(ConfigError(where, keys[0], doc.line_of(keys[0]), "a cap in GB/s is held with MBA, and "
                                  "contention.method is cores: set method to auto or mba, or leave the caps null"))
    by_kind: dict[str, float] = {}
    for key, src in capped:
        if by_kind.setdefault(src.kind, src.cap_gbps) != src.cap_gbps:
            errors.append(ConfigError(where, key, doc.line_of(key), f"another {src.kind} source caps at "
                                      f"{by_kind[src.kind]:g} GB/s: a source kind has one default cap"))
    return errors


def _check_whole(config: Config, where: str, doc: Document, failed: set[str]) -> list[ConfigError]:
    """What no single key shows: relations between keys, and paths made from several.
    A relation is checked only where each of its keys was right on its own (``failed``:
    the keys with problems): a default standing in for a bad key proves nothing."""
    errors = []
    c = config.contention
    if not _failed(("contention.threshold", "contention.release_threshold"), failed) \
            and c.release_threshold >= c.threshold:
        errors.append(ConfigError(where, "contention.release_threshold", doc.line_of("contention.release_threshold"),
                                  f"{c.release_threshold} must be below contention.threshold ({c.threshold}) for "
                                  "hysteresis"))
    for i, src in enumerate(config.jobs.sources):
        if src.kind in ("systemd", "cgroup") and not src.patterns:
            key = f"jobs.sources[{i}].patterns"
            errors.append(ConfigError(where, key, doc.line_of(key), f"a {src.kind} source needs explicit patterns "
                                                                     "(noded never guesses which units are jobs)"))
    errors += _check_caps(config, where, doc, failed)
    r = config.rightsize
    if not _failed(("rightsize.noise_margin", "rightsize.tolerance"), failed) and r.tolerance >= r.noise_margin:
        errors.append(ConfigError(where, "rightsize.tolerance", doc.line_of("rightsize.tolerance"),
                                  f"{r.tolerance} must be below rightsize.noise_margin ({r.noise_margin}): a "
                                  "measurement must be finer than the difference it has to tell"))
    if not _failed(("rightsize.warmup_s", "rightsize.max_window_s"), failed) and r.warmup_s >= r.max_window_s:
        errors.append(ConfigError(where, "rightsize.warmup_s", doc.line_of("rightsize.warmup_s"),
                                  f"{r.warmup_s} must be shorter than rightsize.max_window_s ({r.max_window_s})"))
    if not _failed(("rightsize.memory.cache_gb", "rightsize.memory.units"), failed) \
            and r.memory.cache_gb is not None and r.memory.cache_gb / r.memory.units < 0.25:
        errors.append(ConfigError(where, "rightsize.memory.cache_gb", doc.line_of("rightsize.memory.cache_gb"),
                                  f"{r.memory.cache_gb:g} GiB in {r.memory.units} units is "
                                  f"{r.memory.cache_gb / r.memory.units * 1024:.3g} MiB a unit, below the 256 MiB "
                                  "steps soft limits are written in: give at least 0.25 GiB a unit"))
    if not _failed(("rightsize.memory.cache_gb", "rightsize.sources"), failed) and r.memory.cache_gb is not None \
            and not r.sources:
        errors.append(ConfigError(where, "rightsize.memory.cache_gb", doc.line_of("rightsize.memory.cache_gb"),
                                  "memory is sized only for the GPU jobs right-sizing sizes, and rightsize.sources "
                                  "is empty: name the sources, or leave cache_gb null"))
    if not _failed(("admin.socket", "runtime_dir"), failed):
        sockets = [("admin.socket" if config.admin.socket else "runtime_dir", config.admin_socket),
                   ("runtime_dir", config.report_socket)]
        for key, path in sockets:
            if len(path.encode()) > SOCKET_PATH_MAX and not any(e.key == key for e in errors):
                errors.append(ConfigError(where, key, doc.line_of(key),
                                          f"the socket {_shown(path)} would be longer than the {SOCKET_PATH_MAX} "
                                          "bytes a Unix socket path may have"))
    return errors


def parse_config(text: str | bytes, where: str = "<config>", *, empty_ok: bool = True) -> Config:
    """A Config from YAML text; raises only ConfigError, with every problem in the file in
    its ``problems``: each key is checked whatever was wrong with the ones before it.
    ``empty_ok=False``: a text with no keys raises EmptyConfig instead of being the defaults."""
    try:
        doc = parse_yaml(text, where)
    except YamlError as e:
        raise ConfigError(where, e.key or ("(yaml)" if e.line else "(file)"), e.line, e.reason) from None
    if doc.data is None and not empty_ok:
        raise EmptyConfig(where, "(file)", None, "no keys (empty, or only comments): taken for every default, "
                                                 "it would reset them all (a reload refuses it)")
    errors: list[ConfigError] = []
    try:
        config = _build(Config, {} if doc.data is None else doc.data, "", where, doc, errors)
    except ConfigError as e:  # not a mapping at all
        errors.append(e)
        config = None
    if config is not None:
        errors += _check_whole(config, where, doc, {e.key for e in errors})
    if errors:
        raise ConfigError.of(errors)
    return config


def load_config(path: str, *, empty_ok: bool = True, settle_s: float | None = None,
                now: Callable[[], float] = time.time) -> Config:
    """The config in a file; raises only ConfigError, whatever the file holds or is
    (a directory, a FIFO, a device, too large: never read, never blocked on);
    EmptyConfig for a file with no keys unless ``empty_ok``. Where ``settle_s`` is given
    (a reload), raises noded.util.settled.Unsettled, before anything is parsed, for a file
    that changed while it was read or less than ``settle_s`` seconds of ``now`` before."""
    try:
        data = read_regular_file(path, settle_s=settle_s, now=now)
    except YamlError as e:
        raise ConfigError(path, "(file)", None, e.reason) from None
    return parse_config(data, path, empty_ok=empty_ok)
