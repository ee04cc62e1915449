"""Jobs: discovery (cgroups, registered process trees, labels), new-process events,
and one resctrl monitoring group per job."""

from noded.jobs.cgroups import CgroupSource, cgroup_version
from noded.jobs.discovery import JobDiscovery, LabelFile, RegisteredLabels
from noded.jobs.model import Job, JobMeta
from noded.jobs.monitoring import JobMonitor, MonitorReport, group_name
from noded.jobs.procevents import ProcessEvents

__all__ = ["CgroupSource", "Job", "JobDiscovery", "JobMeta", "JobMonitor", "LabelFile", "MonitorReport",
           "ProcessEvents", "RegisteredLabels", "cgroup_version", "group_name"]
