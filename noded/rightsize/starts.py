"""Where a job's search starts (CODA V-B1): N_start from the history, the model, the
owner, the category and the job's hints.

The owner's remembered answer for the same model and batch size (with the same GPUs and
signal) is only confirmed: one measurement, and if the job is not slower than the margin
there, that is the answer. The same answer on other GPUs or with another signal is a start,
per GPU. Then, ours, *the same model before the category*: the owner's newest answer for
this model with another batch size, else any owner's newest answer for this model, per GPU
times the job's GPUs. CODA goes from the exact job straight to the owner's category, but one
owner's models of a category can be far apart (here Transformer at 2 cores per GPU, BiDAF
at 6: BiDAF started from its owner's Transformer answer probed at half speed for 8 of its
26 minutes), and the model's optimum per GPU is what carries over (IV-B2). Otherwise
N_start is the largest cores per GPU of the owner's recent answers in the job's category,
scaled by its GPUs (CODA's "we choose the largest core number"); else the paper's defaults
for a tenant's first job, 3 cores per GPU for CV and 5 for NLP and Speech (4 with no
category: ours, between the two), adjusted by the job's hints (labels, each ``true`` or
``false``: ``sizing.HINTS``). Ours again: the owner's answers in the category raise the
start above the default but never lower it below: they were found for other models (the
same model is taken first), and a start below the optimum costs the most (Fig. 3: the
throughput rises linearly up to the optimum and "drops slightly" past it; a low start runs
slow while it probes and wastes its first step down). The owner's answers are used as they
are when the job has no category.

* ``pipelined``: the input pipeline overlaps reading and pre-processing: -1 core per GPU;
* ``many_weights``: a large model, longer GPU work per iteration: -1;
* ``heavy_preprocessing``: much CPU work between iterations: +1.

Hints adjust the defaults only: an owner's history was measured on their own jobs and
already reflects how they write them.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Mapping

from noded.rightsize.history import HistoryView
from noded.rightsize.sizing import (FROM_CATEGORY, FROM_DEFAULT, FROM_HISTORY, FROM_HISTORY_SCALED, FROM_MODEL,
                                    FROM_OWNER, JobSpec, Start)

#: CODA V-B1: the first job of a tenant starts here, cores per GPU.
DEFAULT_START: Mapping[str, int] = MappingProxyType({"CV": 3, "NLP": 5, "Speech": 5})
#: Ours: a job whose category is unknown and whose owner has no history.
UNKNOWN_START = 4


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def start_point(spec: JobSpec, history: HistoryView | None) -> Start:
    """N_start for a job (V-B1), clamped to 1..max_cores. Raises HintError for a bad hint."""
    history = history or HistoryView()

    def clamp(cores: float) -> int:
        return min(spec.max_cores, max(1, _round(cores)))

    delta = spec.hint_delta()  # checked whatever the source: a bad label is an error either way
    known = history.exact(spec.owner, spec.model, spec.batch_size)
    if known is not None:
        if known.gpus == spec.gpus and known.signal == spec.signal and known.cores <= spec.max_cores:
            return Start(known.cores, FROM_HISTORY, known.throughput)
        return Start(clamp(known.cores / known.gpus * spec.gpus), FROM_HISTORY_SCALED)
    # ours, before CODA's category rule: the same model's answer (the owner's first)
    model = history.same_model(spec.model, spec.owner)
    if model is not None:
        return Start(clamp(model.cores / model.gpus * spec.gpus), FROM_MODEL)
    default = max(1, (UNKNOWN_START if spec.category is None else DEFAULT_START[spec.category]) + delta)
    largest = history.largest_per_gpu(spec.owner, spec.category)
    if largest is not None and (spec.category is None or largest >= default):
        return Start(clamp(largest * spec.gpus), FROM_OWNER)
    # ours: the owner's answers for other models of the category lift the start above the
    # default, never below it (see the module's docstring)
    return Start(clamp(default * spec.gpus), FROM_DEFAULT if spec.category is None else FROM_CATEGORY)
