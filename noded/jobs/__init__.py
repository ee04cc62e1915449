"""Jobs: discovery (cgroups, registered process trees, labels), new-process events,
and one resctrl monitoring group per job."""

from .cgroups import CgroupSource, cgroup_version
from .discovery import JobDiscovery, LabelFile, RegisteredLabels
from .model import Job, JobMeta
from .monitoring import JobMonitor, MonitorReport, group_name
from .procevents import ProcessEvents

__all__ = ["CgroupSource", "Job", "JobDiscovery", "JobMeta", "JobMonitor", "LabelFile", "MonitorReport",
           "ProcessEvents", "RegisteredLabels", "cgroup_version", "group_name"]
