"""What noded watches: its job sources, its GPUs, resctrl; each either watched or not, with why.

noded starts and runs with none of them (a CPU-only host has no GPU; a host without RDT
has no resctrl; the default config names no job source), and then protects less or
nothing at all. So each is said loudly, in the same words everywhere: a line when it
starts or stops being watched (noded.loop.lasting), a field of `nodectl status`, and the gauge
``noded_watching{what}`` an alert keys on (NodedNotWatching).
"""

from __future__ import annotations

from dataclasses import dataclass

from noded.config import Config
from noded.samplers.sample import Sample

#: what noded watches, in the order it is shown
WHAT = ("jobs", "gpus", "resctrl")

#: where an operator finds how to configure a job source
JOB_SOURCE_HELP = ("add one to jobs.sources (examples for Slurm, Kubernetes and plain cgroups are in the commented "
                   "config, /etc/noded/noded.yaml)")
_NO_SOURCE = ("no job source configured (jobs.sources is empty): noded discovers no job, so it throttles, sizes and "
              "exports none; " + JOB_SOURCE_HELP)


@dataclass(frozen=True)
class Watch:
    what: str  # jobs | gpus | resctrl
    watching: bool
    why: str  # what noded watches there, or why nothing


def no_job_source(config: Config) -> str | None:
    """Why noded, started with ``config``, discovers no job whatever the host runs, or None."""
    if config.jobs.sources:
        return None
    return _NO_SOURCE


def watching(sample: Sample, config: Config) -> tuple[Watch, ...]:
    """Each of WHAT, as this tick's sample saw it."""
    return (_jobs(sample), _gpus(sample, config), _resctrl(sample, config))


def _jobs(sample: Sample) -> Watch:
    sources = sample.job_sources
    if not sources and not sample.jobs:  # jobs registered through the admin socket are watched all the same
        return Watch("jobs", False, _NO_SOURCE)
    roots = ", ".join(sources) or "registrations only"
    if not sample.jobs_known:
        return Watch("jobs", False, f"job discovery failed ({roots}): no job is known, every decision is held")
    return Watch("jobs", True, f"{len(sample.jobs)} jobs from {roots}")


def _gpus(sample: Sample, config: Config) -> Watch:
    if not config.nvml:
        return Watch("gpus", False, "nvml is false in the config: no job is seen on a GPU, so none is protected "
                                    "(every job counts as a CPU job)")
    if not sample.nvml_available:
        return Watch("gpus", False, f"NVML unavailable ({sample.nvml_reason or 'no reason given'}): no job is seen "
                                    "on a GPU, so none is protected")
    if not sample.gpus:
        return Watch("gpus", False, "NVML answers but lists no GPU: no job is seen on a GPU, so none is protected")
    return Watch("gpus", True, f"{len(sample.gpus)} GPUs through NVML")


def _resctrl(sample: Sample, config: Config) -> Watch:
    if sample.resctrl is None:
        why = next((m.partition(": ")[2] for m in sample.missing if m.startswith("resctrl: ")), "not mounted")
        return Watch("resctrl", False, f"resctrl unavailable at {config.resctrl.root} ({why}): no memory bandwidth "
                                       "is measured, so no contention is seen and nothing is throttled for it")
    return Watch("resctrl", True, f"resctrl at {config.resctrl.root}")
