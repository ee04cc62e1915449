"""How many threads of a capped job are busy now: what picks the curve a cap is steered on.

MBA limits each core's requests (sim/nodesim/resctrl_emulator/mba.py), so one MB value gives a job
bandwidth in proportion to the threads that run at once. Those are read from the kernel,
not assumed: the job's tasks are its cap group's ``tasks`` file (every thread of the job,
and only those: the job is wholly in its own group), each thread's run state from
``/proc/TID/stat`` (``R``: running or runnable), and at most as many as the CPUs those
threads may run on (a runnable thread waiting for a CPU issues no requests): after fewer
cores, fewer busy threads.

A tenant owns those tasks: ``/proc/TID/stat`` is read as bytes and split after the last
``)`` (a thread names itself anything, ``)`` and spaces included); a thread gone between
the listing and the read is not counted. The cost is bounded: at most ``MAX_TASKS`` stat
files a read (a job with more is sampled, ``MAX_TASKS`` of them a read, in turn, and
scaled), the tasks file is listed again at most every ``RELIST_S`` (a thread started
since is counted from then; listing it costs the kernel a walk over every thread on the
host), and the count is the mean of the last ``WINDOW`` reads, so a thread that sleeps now
and then is counted for the share of the time it runs.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Callable

#: stat files read at most per read (a holder reads every period: 100 ms)
MAX_TASKS = 256
#: reads averaged (half a second at the holder's period)
WINDOW = 5
#: the tasks file listed again after this long (seconds)
RELIST_S = 1.0
#: bytes read of a tasks file at most: MAX_TASKS ids are far fewer
_TASKS_BYTES = 1 << 20


def parse_tasks(data: bytes) -> list[int]:
    """Thread ids of a resctrl ``tasks`` file, one decimal a line; anything else skipped."""
    out = []
    for line in data.split(b"\n"):
        line = line.strip()
        if line.isdigit() and len(line) <= 10:
            out.append(int(line))
    return out


def run_state(stat: bytes) -> bytes | None:
    """The state letter of a ``/proc/TID/stat`` (after the command name, which may hold
    anything but a NUL: split after its last ``)``); None where it is not one."""
    end = stat.rfind(b")")
    if end < 0 or len(stat) < end + 3:
        return None
    state = stat[end + 2 : end + 3]
    return state if state.isalpha() else None


def read_state(proc: str, tid: int) -> bytes | None:
    try:
        with open(f"{proc}/{tid}/stat", "rb") as f:
            return run_state(f.read(4096))
    except OSError:  # gone, or not ours to read
        return None


def allowed_cpus(tid: int) -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(tid))
    except OSError:
        return frozenset()


class BusyThreads:
    """Reads the busy threads of the job in ``tasks`` (a cap group's tasks file)."""

    def __init__(self, tasks: str, *, proc: str = "/proc", max_tasks: int = MAX_TASKS, window: int = WINDOW,
                 affinity: Callable[[int], frozenset[int]] = allowed_cpus,
                 clock: Callable[[], float] = time.monotonic):
        self.tasks = tasks
        self.clock = clock
        self._tids: list[int] = []
        self._listed: float | None = None
        self.proc = proc
        self.max_tasks = max_tasks
        self.affinity = affinity
        self.recent: deque[float] = deque(maxlen=window)
        self._offset = 0  # where the next read's sample of a large job starts

    def now(self) -> float:
        """Busy threads at this moment (a job over ``max_tasks`` threads: scaled from a sample)."""
        now = self.clock()
        if self._listed is None or now - self._listed >= RELIST_S:
            try:
                with open(self.tasks, "rb") as f:
                    self._tids = parse_tasks(f.read(_TASKS_BYTES))
            except OSError:
                self._tids = []
            self._listed = now
        tids = self._tids
        if not tids:
            return 0.0
        if len(tids) > self.max_tasks:
            start = self._offset % len(tids)
            self._offset = start + self.max_tasks
            sample = (tids + tids)[start : start + self.max_tasks]
        else:
            sample = tids
        running = [t for t in sample if read_state(self.proc, t) == b"R"]
        if not running:
            return 0.0
        cpus = frozenset().union(*(self.affinity(t) for t in running))
        scaled = len(running) * len(tids) / len(sample)
        return min(scaled, float(len(cpus))) if cpus else scaled

    def __call__(self) -> int:
        """The busy threads over the last reads (at least one: a job held at a cap moves
        something, and a curve is per one thread or more)."""
        self.recent.append(self.now())
        return max(1, round(sum(self.recent) / len(self.recent)))
