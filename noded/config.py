"""noded's configuration: YAML -> frozen dataclasses, validated at load.

Every key is known (an unknown one is an error, not ignored), every value has a
type and a range, and an error names the file, the key and its line.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

GB = 1e9
#: the node peak when neither the config nor a calibration gives one (GB/s per L3 domain)
DEFAULT_PEAK_GBPS = 50.0


class ConfigError(ValueError):
    def __init__(self, where: str, key: str, line: int | None, reason: str):
        self.where, self.key, self.line, self.reason = where, key, line, reason
        at = f":{line}" if line else ""
        super().__init__(f"{where}{at}: {key}: {reason}")


@dataclass(frozen=True)
class ResctrlConfig:
    root: str = "/sys/fs/resctrl"
    mounts: str = "/proc/mounts"
    prefix: str = "noded-"


@dataclass(frozen=True)
class JobSourceConfig:
    kind: str
    root: str = "/sys/fs/cgroup"
    patterns: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobsConfig:
    sources: tuple[JobSourceConfig, ...] = ()
    labels: str | None = None
    process_events: bool = True
    rmid_retry_s: float = 10.0


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
    #: a client that sends nothing for this long is dropped
    timeout_s: float = 5.0


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
class MetricsConfig:
    address: str = "127.0.0.1"
    port: int = 9464


@dataclass(frozen=True)
class Config:
    tick_s: float = 1.0
    #: the node's peak memory bandwidth per L3 domain, GB/s; None: the calibration in
    #: state_dir (noded.calibration), else DEFAULT_PEAK_GBPS
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

    @property
    def peak_bytes_per_domain(self) -> float:
        """Settled by noded.calibration.with_node_peak at start; the default stands in before that."""
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


# Range checks: dotted key -> (predicate, what it must be)
_RULES: dict[str, tuple[typing.Callable[[Any], bool], str]] = {
    "tick_s": (lambda v: 0.01 <= v <= 60, "between 0.01 and 60 seconds"),
    "peak_gbps_per_domain": (lambda v: v is None or v > 0, "positive, or null for the calibrated peak"),
    "contention.threshold": (lambda v: 0 < v <= 1, "a share in (0, 1]"),
    "contention.release_threshold": (lambda v: 0 < v <= 1, "a share in (0, 1]"),
    "contention.hold_s": (lambda v: v >= 0, ">= 0"),
    "contention.settle_s": (lambda v: v >= 0, ">= 0"),
    "contention.missing_release_s": (lambda v: v > 0, "positive"),
    "contention.gpu_drop_margin": (lambda v: 0 < v < 1, "a share in (0, 1)"),
    "contention.baseline_alpha": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "contention.cpu_job_cap_gbps": (lambda v: v is None or v > 0, "positive or null"),
    "contention.mba_levels": (lambda v: len(v) > 0 and all(0 < x < 1 for x in v)
                              and list(v) == sorted(v, reverse=True), "shares in (0, 1), mildest first"),
    "contention.method": (lambda v: v in ("auto", "mba", "cores"), "one of auto, mba, cores"),
    "metrics.port": (lambda v: 0 <= v <= 65535, "a TCP port (0 picks a free one)"),
    "admin.timeout_s": (lambda v: 0 < v <= 300, "in (0, 300] seconds"),
    "colocation.threshold_c": (lambda v: 0 < v <= 1000, "in (0, 1000]"),
    "colocation.max_jobs_per_gpu": (lambda v: 1 <= v <= 48, "from 1 to 48 (MPS's client limit)"),
    "jobs.rmid_retry_s": (lambda v: v > 0, "positive"),
    "jobs.sources.kind": (lambda v: v in ("slurm", "kubernetes", "systemd", "cgroup"),
                          "one of slurm, kubernetes, systemd, cgroup"),
}


def _lines(node: yaml.Node, prefix: str, out: dict[str, int]) -> None:
    """Dotted key -> line number (1-based), for error messages."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = f"{prefix}.{k.value}" if prefix else str(k.value)
            out[key] = k.start_mark.line + 1
            _lines(v, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out.setdefault(f"{prefix}[{i}]", v.start_mark.line + 1)
            _lines(v, f"{prefix}[{i}]", out)


def _convert(tp: Any, value: Any, key: str, where: str, lines: dict[str, int]) -> Any:
    line = lines.get(key)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, key, where, lines)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key, where, lines)
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(where, key, line, f"expected a list, got {type(value).__name__}")
        item = typing.get_args(tp)[0]
        return tuple(_convert(item, v, f"{key}[{i}]", where, lines) for i, v in enumerate(value))
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(where, key, line, f"expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, key, line, f"expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, key, line, f"expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(where, key, line, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"config type {tp} not handled")  # a bug in this module, not in the file


def _build(cls: type, data: Any, prefix: str, where: str, lines: dict[str, int]):
    if not isinstance(data, dict):
        raise ConfigError(where, prefix or "(top level)", lines.get(prefix), f"expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            raise ConfigError(where, key, lines.get(key), f"unknown key; known here: {', '.join(sorted(names))}")
        value = _convert(hints[k], v, key, where, lines)
        rule = _RULES.get(_rule_key(key))
        if rule and not rule[0](value):
            raise ConfigError(where, key, lines.get(key), f"{value!r} must be {rule[1]}")
        kwargs[k] = value
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for name in required:
        if name not in kwargs:
            key = f"{prefix}.{name}" if prefix else name
            raise ConfigError(where, key, lines.get(prefix), "required key missing")
    return cls(**kwargs)


def _rule_key(key: str) -> str:
    import re

    return re.sub(r"\[\d+\]", "", key)


def parse_config(text: str, where: str = "<config>") -> Config:
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(where, "(syntax)", mark.line + 1 if mark else None, str(e).replace("\n", " ")) from None
    lines: dict[str, int] = {}
    if node is not None:
        _lines(node, "", lines)
    config = _build(Config, data or {}, "", where, lines)
    c = config.contention
    if c.release_threshold >= c.threshold:
        raise ConfigError(where, "contention.release_threshold", lines.get("contention.release_threshold"),
                          f"{c.release_threshold} must be below contention.threshold ({c.threshold}) for hysteresis")
    for i, src in enumerate(config.jobs.sources):
        if src.kind in ("systemd", "cgroup") and not src.patterns:
            key = f"jobs.sources[{i}].patterns"
            raise ConfigError(where, key, lines.get(f"jobs.sources[{i}]"),
                              f"a {src.kind} source needs explicit patterns (noded never guesses which units are jobs)")
    return config


def load_config(path: str) -> Config:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(path, "(file)", None, e.strerror or str(e)) from None
    return parse_config(text, path)
