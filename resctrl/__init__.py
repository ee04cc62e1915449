"""A typed library over the Linux resctrl filesystem (Intel RDT / AMD PQoS).

Root paths are parameters; every method that touches the filesystem says so by
its name (read_*, write_*, create_*, add_*, remove). Errors are typed and carry
the kernel's own ``info/last_cmd_status`` text.
"""

from resctrl.errors import (
    ForeignGroupError,
    GroupNotFoundError,
    NoSuchTaskError,
    NotMountedError,
    OutOfClosidsError,
    OutOfRmidsError,
    ResctrlError,
    RmidsInLimboError,
    SchemataError,
    TaskMoveError,
    UnsupportedError,
)
from resctrl.groups import DEFAULT_PREFIX, DEFAULT_ROOT, CtrlGroup, Group, MonGroup, Resctrl, TaskMoveResult
from resctrl.info import CacheInfo, Capabilities, MbInfo, MonInfo, read_capabilities
from resctrl.mbm import BandwidthMeter, CounterReading, MbmSample, parse_counter, rate_between, read_mbm
from resctrl.mounts import Mount, find_resctrl_mount, parse_mounts
from resctrl.schemata import (
    MbFlavour,
    MbLimits,
    SchemataParseError,
    changed_values,
    format_schemata,
    normalize_mb,
    parse_schemata,
)

__all__ = [name for name in dir() if not name.startswith("_")]
