"""What a job is: a unit the operator recognises, with stable identity across ticks."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from noded.jobs.kubepods import PodIdentity

CATEGORIES = ("CV", "NLP", "Speech")


@dataclass(frozen=True)
class JobMeta:
    """Optional facts about a job, from its registration or the label file."""

    category: str | None = None  # CODA's CV / NLP / Speech
    model: str | None = None  # e.g. "ResNet-50", for the simulator, explanations and co-location
    batch_size: int | None = None  # with model: the co-location profile this job is measured into
    requested_cores: int | None = None
    priority: int = 0
    exempt: bool = False  # never throttled
    # CODA V-B's hints for a GPU job's first core count (noded.rightsize.sizing.HINTS):
    # pipelined input -1 core per GPU, many weights -1, heavy per-iteration processing +1
    pipelined: bool = False
    many_weights: bool = False
    heavy_preprocessing: bool = False
    # Synergy's cache curve (Sec. 3.1) for memory right-sizing: the bytes the job reads each
    # epoch, and its throughput with nothing cached as a share of fully cached (the owner
    # measures it once with a cold cache). Both or neither.
    dataset_gb: float | None = None
    uncached_share: float | None = None

    def __post_init__(self):
        # Labels come from a file anyone with write access to it shapes: a quoted "no"
        # must not exempt a job, nor a list stand in for a model name.
        for name, kind, what in (("model", str, "a string"), ("batch_size", int, "an integer"),
                                 ("requested_cores", int, "an integer"), ("priority", int, "an integer"),
                                 ("exempt", bool, "true or false"), ("pipelined", bool, "true or false"),
                                 ("many_weights", bool, "true or false"),
                                 ("heavy_preprocessing", bool, "true or false")):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                raise ValueError(f"{name} must be {what}, not {value!r:.60}")
        if None in (self.priority, self.exempt, self.pipelined, self.many_weights, self.heavy_preprocessing):
            raise ValueError("priority, exempt and the hints take no null")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {self.batch_size}")
        if self.category is not None and self.category not in CATEGORIES:
            raise ValueError(f"category must be one of {CATEGORIES}, not {self.category!r}")
        if self.requested_cores is not None and self.requested_cores < 1:
            raise ValueError(f"requested_cores must be >= 1, not {self.requested_cores}")
        # uncached_share: at least 1 %: a job 100x faster cached than not is beyond any
        # storage the cache model describes (and a tiny share would outweigh every other job)
        for name, ok, what in (("dataset_gb", lambda v: 0 < v <= 1e6, "above 0 and at most 1e+06"),
                               ("uncached_share", lambda v: 0.01 <= v <= 1, "at least 0.01 and at most 1")):
            value = getattr(self, name)
            if value is None:
                continue
            # a bool is an int to Python, and .inf/.nan parse as floats: none is a size
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise ValueError(f"{name} must be a number {what}, not {value!r:.60}")
        if (self.dataset_gb is None) != (self.uncached_share is None):
            raise ValueError("dataset_gb and uncached_share go together (the job's cache curve): give both or neither")

    def set_labels(self) -> dict:
        """The labels that say something: those not at their defaults (what a label file or
        a registration would have to say to make this record)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def hints(self) -> dict[str, bool]:
        """The right-sizing hints set on this job, as the allocator reads labels."""
        return {name: True for name in ("pipelined", "many_weights", "heavy_preprocessing") if getattr(self, name)}

    @classmethod
    def from_mapping(cls, data: dict, where: str) -> "JobMeta":
        known = {"category", "model", "batch_size", "requested_cores", "priority", "exempt", "pipelined",
                 "many_weights", "heavy_preprocessing", "dataset_gb", "uncached_share"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{where}: unknown label key(s) {sorted(unknown)}; known: {sorted(known)}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None


@dataclass(frozen=True)
class Job:
    id: str  # "slurm:4242", "k8s:<pod uid>", "systemd:train.service", "pid:1234"
    source: str  # slurm | kubernetes | systemd | cgroup | registered
    pids: frozenset[int]
    cgroup: str | None = None  # the job's cgroup directory, where it has one
    meta: JobMeta = field(default_factory=JobMeta)
    # a Kubernetes pod's UID, QoS class and containers, read from its cgroup (never from
    # the label file: whoever may write labels must not be able to rename a pod)
    pod: PodIdentity | None = None
