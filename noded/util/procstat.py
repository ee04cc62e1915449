"""Reading /proc/PID/stat: the fields after the command name, which may itself hold
spaces and parentheses (so split after the last ')')."""

from __future__ import annotations

PPID = 1  # indices into stat_fields(): field 4 of proc(5) is index 1 here
STARTTIME = 19  # field 22: clock ticks after boot; tells a reused pid from the old process


def stat_fields(proc: str, pid: int) -> list[bytes] | None:
    """The fields from the state onwards, or None when no such process exists (any more)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(b")") + 2 :].split()
