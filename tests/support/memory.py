"""Reading jobs' memory cgroups as the daemon's sampler does, for tests that drive the
soft limits' writer by hand."""

from noded.samplers.memcgroups import MemoryCgroupSampler


def observe(owner, jobs):
    """(cgroups, unplaced) of ``jobs``, read with ``owner``'s /proc and mounts file."""
    r = MemoryCgroupSampler(proc=owner.proc, mounts=owner.mounts).sample(jobs)
    return dict(r.cgroups), dict(r.unplaced)
