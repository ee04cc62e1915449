"""The simulated node's workload model, grounded in the CODA paper (Sec. IV).

CODA measured eight training models' host memory-bandwidth demand (its Fig. 6) and
their slowdown beside a bandwidth hog (its Fig. 7), but prints the findings only in
words. The numbers below are ours, chosen to reproduce those words; each row says
which statement it rests on. ``solo_util`` is the GPU utilisation alone on the node.

| model       | category | demand GB/s | sensitivity | solo util | CODA says |
|-------------|----------|-------------|-------------|-----------|-----------|
| AlexNet     | CV       | 6.0 | 0.35 | 85 | lowest complexity needs most CPU and bandwidth; "only Alexnet is affected" among CV |
| VGG16       | CV       | 2.0 | 0.03 | 95 | complex model, long iterations: insensitive |
| InceptionV3 | CV       | 2.5 | 0.03 | 93 | insensitive |
| ResNet-50   | CV       | 3.0 | 0.03 | 94 | insensitive |
| BiDAF       | NLP      | 0.5 | 0.60 | 80 | NLP demand "very small" (data in memory) yet "at least a 50% performance drop" |
| Transformer | NLP      | 0.6 | 0.55 | 85 | same; preprocessing, batching and shuffling between iterations |
| WaveNet     | Speech   | 3.5 | 0.15 | 88 | re-cuts audio: more bandwidth, less sensitive than DeepSpeech |
| DeepSpeech  | Speech   | 1.5 | 0.40 | 90 | "Deepspeech is more sensitive than Wavenet" |

Contention is the share of the node's memory bandwidth in use: below ``knee``
(60 %) a job runs at its solo speed; from there to saturation its GPU utilisation
falls linearly to ``solo × (1 − sensitivity)``. CODA's 75 % default threshold sits
inside that ramp, where the first losses show.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class ModelProfile:
    name: str
    category: str
    demand_gbps: float
    sensitivity: float  # fraction of GPU utilisation lost at full saturation
    solo_util: float  # percent


MODELS: dict[str, ModelProfile] = {m.name: m for m in (
    ModelProfile("AlexNet", "CV", 6.0, 0.35, 85.0),
    ModelProfile("VGG16", "CV", 2.0, 0.03, 95.0),
    ModelProfile("InceptionV3", "CV", 2.5, 0.03, 93.0),
    ModelProfile("ResNet-50", "CV", 3.0, 0.03, 94.0),
    ModelProfile("BiDAF", "NLP", 0.5, 0.60, 80.0),
    ModelProfile("Transformer", "NLP", 0.6, 0.55, 85.0),
    ModelProfile("WaveNet", "Speech", 3.5, 0.15, 88.0),
    ModelProfile("DeepSpeech", "Speech", 1.5, 0.40, 90.0),
)}

#: Named CPU job shapes for scenarios (GB/s of memory bandwidth they demand).
CPU_JOBS = {"hog": 16.0, "stream": 10.0, "batch": 2.0, "idle": 0.1}


def contention(node_utilisation: float, knee: float = 0.6) -> float:
    """0 below the knee, rising linearly to 1 at a saturated node."""
    return min(1.0, max(0.0, (node_utilisation - knee) / (1.0 - knee)))


def gpu_utilisation(model: ModelProfile, node_utilisation: float, knee: float = 0.6) -> float:
    return model.solo_util * (1.0 - model.sensitivity * contention(node_utilisation, knee))
