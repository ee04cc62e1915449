"""Scenario files: what happens on the simulated node, and when.

```yaml
seed: 7                # noise in GPU utilisation is drawn from this
duration_s: 30
tick_s: 0.25           # how often the workload model updates the hardware
node: {profile: intel, gpus: 4, peak_gbps: 20}   # cpus: 16 (the simulated host's CPUs),
                                                  # nvml: no_v3 (a driver older than pynvml)
events:
  - {at: 0,  start: {id: bert, model: BiDAF, gpu: 0}}
  - {at: 0,  start: {id: cv, model: AlexNet, gpu: 1, command: "python3 -m bench.victims decode"}}
  - {at: 0,  start: {id: tf, model: Transformer, gpu: 2, cpu_curve: true, reports: true}}
  - {at: 3,  start: {id: hog, cpu: hog}}            # or cpu_gbps: 14
  - {at: 12, set: {id: hog, cpu_gbps: 1}}           # the hog calms down
  - {at: 15, stop: {id: hog}}
  - {at: 16, change: {id: tf, model: BiDAF}}       # tf's input or batch changed: another curve
  - {at: 18, fault: {gpu_lost: 1}}                  # or counters: Unavailable|Error|null,
                                                    #    nvml_lost: true|false, domain_offline: 1,
                                                    #    nvml_call: {call: processes, code: 999},
                                                    #    (a GPU's or, without gpu:, every GPU's
                                                    #    NVML call failing; code null: fixed),
                                                    #    nvml_call: {call: count, slow_ms: 5000}
                                                    #    (slow; null: fixed), nvml_driver: false
                                                    #    (nvmlInit fails DRIVER_NOT_LOADED)
```

Every key is checked; an error names the file, the event and the key. A job's
process is ``sleep infinity`` unless ``command`` (a string split as the shell
would, or a list) names a real workload to run in its place, such as a victim
of ``bench/victims``; its output is discarded.

**Cores (issue #13).** A GPU job with ``cpu_curve: true`` runs at the share of its
model's core curve (``noded.rightsize.curves.MODEL_CURVES``) that the cores it has now
give it: its real CPUs (the affinity of its process, which its cpuset bounds) scaled to
the simulated host's ``node.cpus`` (default: the CPUs this process may run on, one
simulated core per real CPU). ``cpu_curve`` defaults to true for every GPU job where
``node.cpus`` is given, and to false otherwise (the contention model alone, as before).
``reports: true`` (needs the curve, and no ``command``) makes the job's process a
reporter (``nodesim.reporter``) that reports every iteration's time to noded's report
socket, as a training script does.

**A job that changes (issue #23).** ``change: {id, model}`` gives a running GPU job
another model's curve and speed from then on, its process, cgroup and labels as they were:
what a training job's new input pipeline, batch size or data does to its throughput (not
for a job with ``reports: true``: its process draws its iteration times from the model it
was started with).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field

from nodesim.resctrl_emulator.profiles import PROFILES

from noded.util.yamlsafe import YamlError, parse_yaml, read_regular_file
from nodesim.workload import CPU_JOBS, MODELS


#: the most CPUs a simulated host may have (``node.cpus``)
MAX_CPUS = 4096


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class JobSpec:
    id: str
    model: str | None = None  # GPU job
    gpu: int | None = None
    cpu_gbps: float | None = None  # CPU job
    exempt: bool = False
    command: tuple[str, ...] | None = None  # the job's process (None: a placeholder)
    cpu_curve: bool = False  # GPU utilisation follows the model's core curve at the job's cores
    reports: bool = False  # the job's process reports iteration times (needs cpu_curve)

    @property
    def is_gpu(self) -> bool:
        return self.model is not None


@dataclass(frozen=True)
class Event:
    at: float
    action: str  # start | stop | set | fault
    args: dict


@dataclass(frozen=True)
class NodeSpec:
    profile: str = "intel"
    gpus: int = 4
    peak_gbps: float = 20.0
    cpus: int | None = None  # the simulated host's CPUs (None: the real ones this process may use)
    nvml: str = "current"  # the driver's NVML: current, or no_v3 (older than pynvml: no _v3 entry points)


@dataclass(frozen=True)
class Scenario:
    duration_s: float
    events: tuple[Event, ...]
    node: NodeSpec = NodeSpec()
    seed: int = 0
    tick_s: float = 0.25
    name: str = "scenario"
    jobs: dict[str, JobSpec] = field(default_factory=dict)


def _keys(d: dict, where: str, required: set[str], optional: set[str]) -> None:
    if not isinstance(d, dict):
        raise ScenarioError(f"{where}: expected a mapping, got {type(d).__name__}")
    missing = required - set(d)
    unknown = set(d) - required - optional
    if missing:
        raise ScenarioError(f"{where}: missing key(s) {sorted(missing)}")
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(required | optional)}")


def _number(v, where: str, lo: float = 0.0) -> float:
    try:
        x = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    except OverflowError:  # an integer of hundreds of digits
        x = math.inf
    if not math.isfinite(x) or x < lo:
        raise ScenarioError(f"{where}: expected a finite number >= {lo}, got {v!r:.60}")
    return x


def parse_scenario(text: str | bytes, name: str = "scenario") -> Scenario:
    try:
        data = parse_yaml(text, name).data  # bounded; no aliases, no duplicate keys
    except YamlError as e:
        raise ScenarioError(f"{e.location}: not valid YAML for a scenario: {e.detail}") from None
    _keys(data, name, {"duration_s", "events"}, {"seed", "tick_s", "node"})
    node_d = data.get("node", {})
    _keys(node_d, f"{name}: node", set(), {"profile", "gpus", "peak_gbps", "cpus", "nvml"})
    node = NodeSpec(**node_d)
    from nodesim.nvml_lib import VARIANTS

    if node.nvml not in VARIANTS:
        raise ScenarioError(f"{name}: node.nvml {node.nvml!r} is not one of {', '.join(VARIANTS)}")
    if node.profile not in PROFILES:
        raise ScenarioError(f"{name}: node.profile {node.profile!r} is not one of {sorted(PROFILES)}")
    if not isinstance(node.gpus, int) or not 0 <= node.gpus <= 64:
        raise ScenarioError(f"{name}: node.gpus must be an integer 0..64, got {node.gpus!r}")
    _number(node.peak_gbps, f"{name}: node.peak_gbps", 0.1)
    if node.cpus is not None and (not isinstance(node.cpus, int) or isinstance(node.cpus, bool)
                                  or not 1 <= node.cpus <= MAX_CPUS):
        raise ScenarioError(f"{name}: node.cpus must be an integer 1..{MAX_CPUS} (the simulated host's CPUs), "
                            f"got {node.cpus!r:.60}")
    duration = _number(data["duration_s"], f"{name}: duration_s", 0.1)
    tick = _number(data.get("tick_s", 0.25), f"{name}: tick_s", 0.01)
    seed = data.get("seed", 0)
    if not isinstance(seed, int):
        raise ScenarioError(f"{name}: seed must be an integer, got {seed!r}")
    if not isinstance(data["events"], list):
        raise ScenarioError(f"{name}: events must be a list")
    events, jobs, live = [], {}, set()
    last_at = 0.0
    for i, ev in enumerate(data["events"]):
        where = f"{name}: events[{i}]"
        if not isinstance(ev, dict) or "at" not in ev or len(ev) != 2:
            raise ScenarioError(f"{where}: expected {{at: SECONDS, start|stop|set|change|fault: {{...}}}}")
        at = _number(ev["at"], f"{where}.at")
        if at < last_at:
            raise ScenarioError(f"{where}.at: {at} is before the previous event ({last_at}); keep events in time order")
        last_at = at
        action = next(k for k in ev if k != "at")
        args = ev[action]
        w = f"{where}.{action}"
        if action == "start":
            _keys(args, w, {"id"}, {"model", "gpu", "cpu", "cpu_gbps", "exempt", "command", "cpu_curve", "reports"})
            jid = str(args["id"])
            command = _command(args.get("command"), f"{w}.command")
            if jid in jobs:
                raise ScenarioError(f"{w}.id: job {jid!r} started twice")
            if "model" in args:
                if args["model"] not in MODELS:
                    raise ScenarioError(f"{w}.model: {args['model']!r} is not one of {sorted(MODELS)}")
                gpu = args.get("gpu", 0)
                if not isinstance(gpu, int) or not 0 <= gpu < node.gpus:
                    raise ScenarioError(f"{w}.gpu: {gpu!r} is not a GPU index below {node.gpus}")
                if "cpu" in args or "cpu_gbps" in args:
                    raise ScenarioError(f"{w}: a job is a GPU job (model) or a CPU job (cpu/cpu_gbps), not both")
                curve = _flag(args, "cpu_curve", node.cpus is not None, w)
                reports = _flag(args, "reports", False, w)
                if reports and not curve:
                    raise ScenarioError(f"{w}.reports: iteration times come from the job's core curve: "
                                        "set cpu_curve: true (or node.cpus)")
                if reports and command is not None:
                    raise ScenarioError(f"{w}.reports: the reporter is the job's process; it cannot also run "
                                        "a command")
                spec = JobSpec(jid, model=args["model"], gpu=gpu, exempt=bool(args.get("exempt", False)),
                               command=command, cpu_curve=curve, reports=reports)
            else:
                for key in ("cpu_curve", "reports"):
                    if key in args:
                        raise ScenarioError(f"{w}.{key}: only a GPU job (model) follows a core curve and reports "
                                            "iterations; a CPU job's bandwidth follows its cores already")
                gbps = _cpu_gbps(args, w)
                spec = JobSpec(jid, cpu_gbps=gbps, exempt=bool(args.get("exempt", False)), command=command)
            jobs[jid] = spec
            live.add(jid)
        elif action == "change":
            _keys(args, w, {"id", "model"}, set())
            jid = str(args["id"])
            if jid not in live:
                raise ScenarioError(f"{w}.id: job {jid!r} is not running at {at}s")
            if not jobs[jid].is_gpu:
                raise ScenarioError(f"{w}: only a GPU job's curve can change")
            if jobs[jid].reports:
                raise ScenarioError(f"{w}: a reporting job's iteration times come from its own process, "
                                    "started with its model; its curve cannot change")
            if args["model"] not in MODELS:
                raise ScenarioError(f"{w}.model: {args['model']!r} is not one of {sorted(MODELS)}")
            args = {"id": jid, "model": args["model"]}
        elif action in ("stop", "set"):
            _keys(args, w, {"id"}, {"cpu", "cpu_gbps"} if action == "set" else set())
            jid = str(args["id"])
            if jid not in live:
                raise ScenarioError(f"{w}.id: job {jid!r} is not running at {at}s")
            if action == "stop":
                live.discard(jid)
            else:
                if jobs[jid].is_gpu:
                    raise ScenarioError(f"{w}: only a CPU job's bandwidth can be set")
                args = {"id": jid, "cpu_gbps": _cpu_gbps(args, w)}
        elif action == "fault":
            _keys(args, w, set(), {"gpu_lost", "counters", "nvml_lost", "domain_offline", "domain_online",
                                   "nvml_call", "nvml_driver"})
            if len(args) != 1:
                raise ScenarioError(f"{w}: exactly one fault per event")
            if "gpu_lost" in args and not (isinstance(args["gpu_lost"], int) and 0 <= args["gpu_lost"] < node.gpus):
                raise ScenarioError(f"{w}.gpu_lost: {args['gpu_lost']!r} is not a GPU index below {node.gpus}")
            if "counters" in args and args["counters"] not in ("Unavailable", "Error", "Unassigned", None):
                raise ScenarioError(f"{w}.counters: expected Unavailable, Error, Unassigned or null")
            if "nvml_call" in args:
                _nvml_call(args["nvml_call"], node.gpus, f"{w}.nvml_call")
            if "nvml_driver" in args and not isinstance(args["nvml_driver"], bool):
                raise ScenarioError(f"{w}.nvml_driver: expected true (loaded) or false (not loaded)")
        else:
            raise ScenarioError(f"{where}: unknown action {action!r}; use start, stop, set, change or fault")
        events.append(Event(at, action, dict(args)))
    return Scenario(duration, tuple(events), node, seed, tick, name, jobs)


def _nvml_call(fault, gpus: int, where: str) -> None:
    from nodesim.nvml_shm import CALL_INDEX

    if not isinstance(fault, dict) or not set(fault) <= {"call", "code", "slow_ms", "gpu"} or "call" not in fault \
            or ("code" in fault) == ("slow_ms" in fault):
        raise ScenarioError(f"{where}: expected {{call: NAME, code: NVML_RETURN_CODE|null, gpu: INDEX}} or "
                            "{call: NAME, slow_ms: MILLISECONDS|null, gpu: INDEX}")
    if fault["call"] not in CALL_INDEX:
        raise ScenarioError(f"{where}.call: {fault['call']!r} is not one of {', '.join(CALL_INDEX)}")
    code = fault.get("code")
    if code is not None and (type(code) is not int or not 1 <= code <= 999):
        raise ScenarioError(f"{where}.code: expected an NVML return code 1..999 or null, not {code!r}")
    slow = fault.get("slow_ms")
    if slow is not None and (type(slow) is not int or not 1 <= slow <= 600_000):
        raise ScenarioError(f"{where}.slow_ms: expected milliseconds 1..600000 or null, not {slow!r}")
    gpu = fault.get("gpu")
    if gpu is not None and (type(gpu) is not int or not 0 <= gpu < gpus):
        raise ScenarioError(f"{where}.gpu: {gpu!r} is not a GPU index below {gpus}")


def _flag(args: dict, key: str, default: bool, where: str) -> bool:
    value = args.get(key, default)
    if not isinstance(value, bool):
        raise ScenarioError(f"{where}.{key}: expected true or false, got {value!r:.60}")
    return value


def _command(value, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as e:
            raise ScenarioError(f"{where}: {e}") from None
    elif isinstance(value, list) and all(isinstance(a, str) for a in value):
        argv = list(value)
    else:
        raise ScenarioError(f"{where}: expected a command line (a string or a list of strings), got {value!r}")
    if not argv:
        raise ScenarioError(f"{where}: empty command")
    return tuple(argv)


def _cpu_gbps(args: dict, where: str) -> float:
    if ("cpu" in args) == ("cpu_gbps" in args):
        raise ScenarioError(f"{where}: give exactly one of cpu: {sorted(CPU_JOBS)} or cpu_gbps: NUMBER")
    if "cpu" in args:
        if args["cpu"] not in CPU_JOBS:
            raise ScenarioError(f"{where}.cpu: {args['cpu']!r} is not one of {sorted(CPU_JOBS)}")
        return CPU_JOBS[args["cpu"]]
    return _number(args["cpu_gbps"], f"{where}.cpu_gbps")


def load_scenario(path: str) -> Scenario:
    try:
        data = read_regular_file(path)
    except YamlError as e:
        raise ScenarioError(str(e)) from None
    return parse_scenario(data, path)
