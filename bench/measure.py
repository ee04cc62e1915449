"""What the benchmarks that run noded beside a simulated node (nodesim.launch starts both)
measure: CPU time from ``/proc`` (a process's, its descendants') and series in a scrape."""

from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- CPU time from /proc

def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command (field 3, the state, is [0])."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def descendants(pid: int) -> list[int]:
    """Every living process whose ancestry leads to ``pid`` (not ``pid`` itself)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parent[int(name)] = int(stat_fields(int(name))[1])
            except (OSError, IndexError, ValueError):
                continue
    children: dict[int, list[int]] = {}
    for p, pp in parent.items():
        children.setdefault(pp, []).append(p)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """pid -> CPU seconds, for ``pid`` and each living descendant (one that is gone by the
    time it is read is left out)."""
    out = {}
    for p in [pid, *descendants(pid)]:
        try:
            out[p] = cpu_seconds(p)
        except (OSError, IndexError):
            continue
    return out


def tree_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds a tree used between two ``tree_cpu_seconds`` readings: those alive at
    both, plus what new ones used since they started (those gone by the second reading
    are not counted; a steady node has none)."""
    return sum(v - before.get(p, 0.0) for p, v in after.items())


def metric(text: str, name: str, labels: str = "") -> float | None:
    """The value of a series in a scrape (``labels``: a regex over the label set), or None."""
    pattern = rf"^{re.escape(name)}" + (rf"\{{[^}}]*{labels}[^}}]*\}}" if labels else r"(?:\{[^}]*\})?") + r" (\S+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else None


def count_series(text: str, name: str, labels: str = "") -> int:
    return len(re.findall(rf"^{re.escape(name)}\{{[^}}]*{labels}[^}}]*\}} ", text, re.M))
