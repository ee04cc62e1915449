"""Jobs: discovery (cgroups, registered process trees, labels) and new-process events.
(Each job's resctrl monitoring group is the samplers' business: noded.samplers.mongroups.)"""

from noded.jobs.cgroups import CgroupSource, cgroup_version
from noded.jobs.discovery import JobDiscovery, LabelFile, RegisteredLabels
from noded.jobs.model import Job, JobMeta
from noded.jobs.procevents import ProcessEvents

__all__ = ["CgroupSource", "Job", "JobDiscovery", "JobMeta", "LabelFile", "ProcessEvents", "RegisteredLabels",
           "cgroup_version"]
