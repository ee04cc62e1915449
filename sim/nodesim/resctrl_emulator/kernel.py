"""The resctrl kernel behaviour, as a state machine with no FUSE in it.

``ResctrlKernel`` answers the file operations the FUSE layer forwards (lookup,
readdir, read, write, mkdir, rmdir, rename) with the kernel's semantics: the same
files, the same errno values and the same ``info/last_cmd_status`` text. Its rules
follow ``fs/resctrl/rdtgroup.c`` and ``ctrlmondata.c`` and the kernel's own documentation
(``Documentation/filesystems/resctrl.rst``); each rule names its kernel source in a comment.

It also carries the bandwidth model: demand per task and domain (set from the
control socket), spread over the task's busy threads, capped by the task's control
group's MB value as the profile's ``mba_model`` says (``mba.py`` has the hardware's rules
and their sources) and by the domain's peak, integrated into per-RMID byte counters
whenever they are read. Under mba_MBps the kernel's own controller runs once a second of
the model's clock, as the kernel's MBM worker runs it.

All methods are called with ``self.lock`` held by the caller (the FUSE layer and
the control server both take it); the class itself is single-threaded.
"""

from __future__ import annotations

import errno
import math
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from resctrl.cpulist import format_cpu_list as _format_cpu_list
from resctrl.cpulist import parse_cpu_list as _parse_cpu_list
from resctrl.cpulist import parse_cpu_mask as _parse_cpu_mask
from nodesim.resctrl_emulator import mba, procfs
from nodesim.resctrl_emulator.profiles import Profile

CTRL = "ctrl_mon"
MON = "mon"

U32_MAX = 0xFFFFFFFF
AMD_MB_UNIT_BYTES = mba.AMD_MB_UNIT_BYTES
MIB = 1 << 20  # the kernel's "MBps" is MiB/s (mbm bytes >> 20)


class KernelError(OSError):
    """A failed file operation: the errno the syscall would return."""

    def __init__(self, err: int):
        super().__init__(err, os.strerror(err))


def kstrtoint(text: str) -> int | None:
    """The kernel's kstrtoint(s, 0, &v): an optional sign, then hex after 0x, octal after a
    leading 0, else decimal; one trailing newline; a 32-bit int. None where it fails."""
    body = text[:-1] if text.endswith("\n") else text
    negative = body.startswith("-")
    if body[:1] in "+-" and body:
        body = body[1:]
    if body[:2].lower() == "0x":
        digits, base = body[2:], 16
    elif body.startswith("0"):
        digits, base = body, 8
    else:
        digits, base = body, 10
    allowed = "0123456789abcdef"[:base]
    if not digits or any(c not in allowed for c in digits.lower()):
        return None
    value = -int(digits, base) if negative else int(digits, base)
    return value if -(1 << 31) <= value < (1 << 31) else None


@dataclass
class Group:
    name: str
    kind: str
    closid: int
    rmid: int
    parent: "Group | None" = None
    # resource name -> domain id -> value (L3 masks and MB values as ints)
    ctrl: dict[str, dict[int, int]] = field(default_factory=dict)
    cpus: set[int] = field(default_factory=set)
    mon: dict[str, "Group"] = field(default_factory=dict)
    # mba_MBps_event: the event the kernel's MBps controller steers this group by
    mbps_event: str = "mbm_local_bytes"

    @property
    def ctrl_group(self) -> "Group":
        return self.parent if self.kind == MON and self.parent is not None else self

    def rmids(self) -> list[int]:
        """RMIDs whose counts this group's mon_data reports (CTRL_MON sums its MON groups)."""
        if self.kind == MON:
            return [self.rmid]
        return [self.rmid] + [m.rmid for m in self.mon.values()]


@dataclass
class TaskState:
    closid: int
    rmid: int
    start: int


@dataclass
class Counter:
    total: float = 0.0
    local: float = 0.0
    rate: float = 0.0  # last achieved bytes/s, for the control API


@dataclass(frozen=True)
class Node:
    is_dir: bool
    writable: bool = False


class ResctrlKernel:
    def __init__(
        self,
        profile: Profile,
        *,
        proc: str = "/proc",
        clock: Callable[[], float],
        limbo_s: float = 1.0,
        tasks_write: str = "single",
    ):
        if tasks_write not in ("single", "list"):
            raise ValueError(f"tasks_write must be 'single' or 'list', not {tasks_write!r}")
        self.profile = profile
        self.proc = proc
        self.clock = clock
        self.limbo_s = limbo_s
        # "single": kernels before 6.7 take one PID per write(); "list": 6.7+ take
        # a comma-separated list, applied in order, stopping at the first failure.
        self.tasks_write = tasks_write
        self.lock = threading.RLock()
        self._start_state()

    def _start_state(self) -> None:
        """What a fresh mount has: no group but the default one, every domain online, no
        demand, no fault, every id free."""
        profile, clock = self.profile, self.clock
        self.last_cmd_status = ""
        self.online: list[int] = list(profile.domains)
        self.all_cpus = set(profile.online_cpus)
        self.nr_cpu_ids = max(self.all_cpus) + 1
        self.root = Group("", CTRL, 0, 0, ctrl=self._default_ctrl(), cpus=set(self.all_cpus))
        self.groups: dict[str, Group] = {}
        self.free_closids = list(range(1, profile.ctrl_closids))
        self.free_rmids: deque[int] = deque(range(1, profile.num_rmids))
        self.limbo: dict[int, float] = {}  # rmid -> time freed
        self.tasks: dict[int, TaskState] = {}
        self.counters: dict[tuple[int, int], Counter] = {}  # (rmid, domain)
        self.faults: dict[tuple[int | None, int | None, str | None], str] = {}
        self.demand: dict[int, dict[int, float]] = {}  # tid -> domain -> bytes/s
        # tid -> (busy threads its demand is spread over, the CPUs they run on or None)
        self.threads: dict[int, tuple[int, tuple[int, ...] | None]] = {}
        # mba_MBps: (closid, domain) -> the percentage the kernel's controller has written
        self.mbps_percent: dict[tuple[int, int], int] = {}
        self._mbps_seen: dict[tuple[int, int], tuple[float, float]] = {}  # (rmid, domain) -> counts at its last run
        self._next_mbps_run = clock() + mba.MBPS_INTERVAL_S
        self.peak: dict[int, float] = {d: profile.peak_bytes_per_s for d in profile.domains}
        self.last_advance = clock()
        self._active: dict[int, set[int]] = {}  # domain -> RMIDs with traffic at the last advance
        # domain -> every byte moved on it since the mount, whatever group counted it (groups
        # come and go with their counts): what traffic averaged over a while was
        self.moved: dict[int, float] = dict.fromkeys(self.profile.domains, 0.0)
        if profile.has_mon:
            for d in profile.domains:
                self.counters[(0, d)] = Counter()

    # ------------------------------------------------------------------ helpers
    def _resources(self) -> list[str]:
        names = []
        if self.profile.has_l3:
            names += ["L3CODE", "L3DATA"] if self.profile.cdp else ["L3"]
        if self.profile.has_mb:
            names.append("MB")
        return names

    def _default_value(self, resource: str) -> int:
        if resource == "MB":
            return self.profile.mb_default
        return (1 << self.profile.cbm_len) - 1

    def _default_ctrl(self) -> dict[str, dict[int, int]]:
        return {r: {d: self._default_value(r) for d in self.profile.domains} for r in self._resources()}

    def _status(self, text: str) -> None:
        self.last_cmd_status += text + "\n"

    def _fail(self, err: int, text: str | None = None) -> KernelError:
        if text:
            self._status(text)
        return KernelError(err)

    # ---------------------------------------------------------------- task table
    def resolve_task(self, tid: int) -> TaskState | None:
        """The (CLOSID, RMID) of a live thread; unseen threads inherit from their creator."""
        state = self.tasks.get(tid)
        if state is not None:
            return state
        info = procfs.read_task(self.proc, tid)
        if info is None:
            return None
        # A new thread inherits from the thread that created it; we know only its
        # thread group, so take the group leader. A new process inherits from its parent.
        parent = info.tgid if info.tgid != tid else info.ppid
        if parent <= 0 or parent == tid:
            inherited = TaskState(0, 0, info.start)
        else:
            p = self.resolve_task(parent)
            inherited = TaskState(p.closid, p.rmid, info.start) if p else TaskState(0, 0, info.start)
        self.tasks[tid] = inherited
        return inherited

    def _pin_descendants(self, tid: int) -> None:
        # Threads and children that already exist keep the ids they inherited
        # when their creator moves later: resolve them before the move.
        info = procfs.read_task(self.proc, tid)
        if info is None:
            return
        for t in procfs.threads_of(self.proc, info.tgid):
            self.resolve_task(t)
        for c in procfs.children_of(self.proc, tid):
            self.resolve_task(c)

    def collect_dead_tasks(self) -> None:
        for tid in list(self.tasks):
            info = procfs.read_task(self.proc, tid)
            if info is None or info.start != self.tasks[tid].start:
                del self.tasks[tid]
                self.demand.pop(tid, None)
                self.threads.pop(tid, None)

    # --------------------------------------------------------------- path model
    def _group_at(self, parts: list[str]) -> tuple[Group, list[str]] | None:
        """Split a path into the group it names and the rest inside that group."""
        group = self.root
        rest = parts
        if rest and rest[0] in self.groups:
            group = self.groups[rest[0]]
            rest = rest[1:]
        if len(rest) >= 2 and rest[0] == "mon_groups" and rest[1] in group.mon:
            group = group.mon[rest[1]]
            rest = rest[2:]
        return group, rest

    def _group_files(self, group: Group) -> dict[str, bool]:
        """File name -> writable, for a group directory."""
        files = {"tasks": True, "cpus": True, "cpus_list": True}
        if group.kind == CTRL and self.profile.alloc_capable:
            files.update({"schemata": True, "mode": True, "size": False})
            if self.profile.mba_mbps:
                files["mba_MBps_event"] = True
        return files

    def _group_dirs(self, group: Group) -> list[str]:
        dirs = []
        if self.profile.has_mon:
            dirs.append("mon_data")
            if group.kind == CTRL:
                dirs.append("mon_groups")
        return dirs

    def _info_tree(self) -> dict[str, dict[str, str] | str]:
        p = self.profile
        tree: dict[str, dict[str, str] | str] = {"last_cmd_status": self.last_cmd_status or "ok\n"}
        for res in self._resources():
            if res == "MB":
                d = {
                    "num_closids": f"{p.num_closids_mb}\n",
                    "min_bandwidth": f"{p.mb_min}\n",
                    "bandwidth_gran": f"{p.mb_gran}\n",
                    "delay_linear": f"{int(p.delay_linear)}\n",
                }
                if p.thread_throttle_mode is not None:
                    d["thread_throttle_mode"] = f"{p.thread_throttle_mode}\n"
            else:
                d = {
                    "num_closids": f"{p.num_closids_l3}\n",
                    "cbm_mask": f"{(1 << p.cbm_len) - 1:x}\n",
                    "min_cbm_bits": f"{p.min_cbm_bits}\n",
                    "shareable_bits": "0\n",
                    "sparse_masks": f"{int(p.sparse_masks)}\n",
                }
            tree[res] = d
        if p.has_mon:
            tree["L3_MON"] = {
                "num_rmids": f"{p.num_rmids}\n",
                "mon_features": "".join(f"{e}\n" for e in p.mon_features),
                "max_threshold_occupancy": f"{p.l3_bytes // p.cbm_len // p.mon_scale * p.mon_scale}\n",
            }
        return tree

    def lookup(self, parts: list[str]) -> Node:
        if not parts:
            return Node(True)
        if parts[0] == "info":
            node: dict | str = self._info_tree()
            for name in parts[1:]:
                if not isinstance(node, dict) or name not in node:
                    raise KernelError(errno.ENOENT)
                node = node[name]
            return Node(isinstance(node, dict), writable=parts[1:] == ["L3_MON", "max_threshold_occupancy"])
        group, rest = self._group_at(parts)
        if not rest:
            return Node(True)
        files = self._group_files(group)
        if len(rest) == 1:
            if rest[0] in files:
                return Node(False, files[rest[0]])
            if rest[0] in self._group_dirs(group):
                return Node(True)
            raise KernelError(errno.ENOENT)
        if rest[0] == "mon_data" and "mon_data" in self._group_dirs(group):
            dom = self._domain_dir(rest[1])
            if dom is None:
                raise KernelError(errno.ENOENT)
            if len(rest) == 2:
                return Node(True)
            if len(rest) == 3 and rest[2] in self.profile.mon_features:
                return Node(False)
        raise KernelError(errno.ENOENT)

    def _domain_dir(self, name: str) -> int | None:
        for d in self.online:
            if name == f"mon_L3_{d:02d}":
                return d
        return None

    def readdir(self, parts: list[str]) -> list[str]:
        if not self.lookup(parts).is_dir:
            raise KernelError(errno.ENOTDIR)
        if parts and parts[0] == "info":
            node: dict | str = self._info_tree()
            for name in parts[1:]:
                node = node[name]  # type: ignore[index]
            return list(node)  # type: ignore[arg-type]
        group, rest = self._group_at(parts)
        if not rest:
            names = list(self._group_files(group)) + self._group_dirs(group)
            if group is self.root:
                names = ["info"] + names + list(self.groups)
            return names
        if rest == ["mon_groups"]:
            return list(group.mon)
        if rest == ["mon_data"]:
            return [f"mon_L3_{d:02d}" for d in self.online]
        return list(self.profile.mon_features)

    # --------------------------------------------------------------------- read
    def read(self, parts: list[str]) -> str:
        if self.lookup(parts).is_dir:
            raise KernelError(errno.EISDIR)
        if parts[0] == "info":
            node: dict | str = self._info_tree()
            for name in parts[1:]:
                node = node[name]  # type: ignore[index]
            return node  # type: ignore[return-value]
        group, rest = self._group_at(parts)
        name = rest[-1]
        if rest[0] == "mon_data":
            return self._read_counter(group, self._domain_dir(rest[1]), name)
        if name == "tasks":
            return "".join(f"{t}\n" for t in sorted(self._members(group)))
        if name == "cpus":
            return self._format_cpu_mask(group.cpus)
        if name == "cpus_list":
            return _format_cpu_list(group.cpus) + "\n"
        if name == "schemata":
            return self._format_schemata(group)
        if name == "mode":
            return "shareable\n"
        if name == "size":
            return self._format_size(group)
        if name == "mba_MBps_event":
            return group.mbps_event + "\n"
        raise KernelError(errno.EINVAL)

    def _members(self, group: Group) -> list[int]:
        # rdtgroup_tasks_show: a CTRL_MON group lists every task with its CLOSID
        # (its MON groups' tasks included); a MON group lists tasks with its RMID.
        # is_closid_match needs an allocation-capable host: on a monitoring-only one the
        # default group's tasks file lists nothing.
        if group.kind == CTRL and not self.profile.alloc_capable:
            return []
        out = []
        for tid in procfs.all_thread_ids(self.proc):
            st = self.resolve_task(tid)
            if st is None:
                continue
            if group.kind == CTRL and st.closid == group.closid:
                out.append(tid)
            elif group.kind == MON and st.rmid == group.rmid:
                out.append(tid)
        return out

    def _format_per_domain(self, group: Group, text: Callable[[str, int], str]) -> str:
        # Both schemata and size print one line per resource, names right-aligned.
        names = self._resources()
        width = max(len(n) for n in names)
        return "".join(
            f"{res:>{width}}:" + ";".join(f"{d}={text(res, group.ctrl[res][d])}" for d in self.online) + "\n"
            for res in names
        )

    def _format_schemata(self, group: Group) -> str:
        legacy = self.profile.legacy_format
        digits = (self.profile.cbm_len + 3) // 4

        def text(res: str, v: int) -> str:
            if res == "MB":
                return f"{v:>3}" if legacy else f"{v}"
            return f"{v:0{digits}x}" if legacy else f"{v:x}"

        return self._format_per_domain(group, text)

    def _format_size(self, group: Group) -> str:
        p = self.profile
        return self._format_per_domain(
            group, lambda res, v: f"{v if res == 'MB' else p.l3_bytes * bin(v).count('1') // p.cbm_len}")

    def _format_cpu_mask(self, cpus: set[int]) -> str:
        # %*pb: zero-padded hex over all CPU ids (nr_cpu_ids), a comma between 32-bit words.
        ncpus = self.nr_cpu_ids
        value = sum(1 << c for c in cpus)
        digits = f"{value:0{(ncpus + 3) // 4}x}"
        words = []
        while digits:
            words.insert(0, digits[-8:])
            digits = digits[:-8]
        return ",".join(words) + "\n"

    # -------------------------------------------------------------- MBM counters
    def _fault(self, rmid: int, domain: int, event: str) -> str | None:
        """The word one RMID's read gives now (an injected fault), or None: a value."""
        for key in ((rmid, domain, event), (rmid, domain, None), (rmid, None, None),
                    (None, domain, event), (None, domain, None), (None, None, event), (None, None, None)):
            if key in self.faults:
                return self.faults[key]
        return None

    def _read_counter(self, group: Group, domain: int | None, event: str) -> str:
        assert domain is not None
        self.advance(self.clock())
        # As mon_event_count: a CTRL_MON group's RMID, then each MON group's; an RMID whose
        # read fails is left out, silently, where any read succeeded ("Discard error if any
        # of the monitor event reads succeeded"); where none did, the last failure's word.
        read, word = [], None
        for r in group.rmids():
            failed = self._fault(r, domain, event)
            if failed is None:
                read.append(r)
            else:
                word = failed
        if not read:
            return f"{word}\n"
        scale = self.profile.mon_scale
        if event == "llc_occupancy":
            occ = sum(self._occupancy(r, domain) for r in read)
            return f"{int(occ) // scale * scale}\n"
        attr = "total" if event == "mbm_total_bytes" else "local"
        total = sum(getattr(self.counters.get((r, domain), Counter()), attr) for r in read)
        return f"{int(total) // scale * scale}\n"

    def _occupancy(self, rmid: int, domain: int) -> float:
        # Crude cache model: a group occupies about 1 ms of its traffic, up to the cache size.
        c = self.counters.get((rmid, domain))
        return min(self.profile.l3_bytes, c.rate * 1e-3) if c else 0.0

    def _ctrl_of_closid(self, closid: int) -> Group:
        return self.root if closid == 0 else next(g for g in self.groups.values() if g.closid == closid)

    def _cap(self, closid: int, domain: int) -> float:
        """The "group" model: one cap on the whole group's traffic."""
        if not self.profile.has_mb:
            return math.inf
        value = self._ctrl_of_closid(closid).ctrl["MB"][domain]
        if self.profile.mba_mbps:
            return value * MIB  # an ideal controller: the target, applied exactly
        if self.profile.vendor == "amd":
            return value * AMD_MB_UNIT_BYTES
        return value / 100.0 * self.peak[domain]

    def set_demand(self, tid: int, bytes_per_s: float, domain: int | None = None, *,
                   threads: int = 1, cpus: tuple[int, ...] | None = None) -> None:
        """What a task asks of memory from now on, spread evenly over ``threads`` busy
        threads (one per CPU of ``cpus`` where given, which SMT sharing needs)."""
        if bytes_per_s < 0:
            raise ValueError("bytes_per_s must be >= 0")
        if cpus is not None:
            cpus = tuple(int(c) for c in cpus)
            if not cpus:
                raise ValueError("cpus must name at least one CPU")
            threads = len(cpus)
        if threads < 1:
            raise ValueError("threads must be >= 1")
        domains = [domain] if domain is not None else list(self.profile.domains)
        for d in domains:
            if d not in self.profile.domains:
                raise ValueError(f"no L3 domain {d}")
        self.advance(self.clock())
        for d in domains:
            self.demand.setdefault(tid, {})[d] = bytes_per_s
        self.threads[tid] = (threads, cpus)

    def mb_percent(self, closid: int, domain: int) -> int:
        """The percentage an Intel part applies to a CLOSID now: under mba_MBps the one the
        kernel's controller last wrote, else the schemata value through the part's table."""
        if self.profile.mba_mbps:
            return self.mbps_percent.get((closid, domain), mba.MAX_MBA_BW)
        return mba.applied_percent(self.profile, self._ctrl_of_closid(closid).ctrl["MB"][domain])

    def _thread_limit(self, closid: int, domain: int, cpu: int | None, busy_cpus: dict[int, int]) -> float:
        """The "request" model: what one busy thread of a CLOSID may move."""
        p = self.profile
        if not p.has_mb:
            return math.inf
        if p.vendor == "amd":
            return mba.amd_thread_limit(self._ctrl_of_closid(closid).ctrl["MB"][domain])
        sibling = busy_cpus.get(mba.sibling_cpu(cpu)) if cpu is not None else None
        percent = mba.core_setting(p.thread_throttle_mode, self.mb_percent(closid, domain), sibling)
        return mba.thread_limit(p, percent)

    def _granted(self, domain: int) -> list[tuple[int, float]]:
        """(RMID, bytes/s) of every task with demand on a domain, before the domain's peak."""
        busy: list[tuple[int, int, float, int | None]] = []  # rmid, closid, demand, cpu per thread
        for tid, per_domain in list(self.demand.items()):
            want = per_domain.get(domain, 0.0)
            if want <= 0:
                continue
            st = self.resolve_task(tid)
            if st is None:
                continue
            count, cpus = self.threads.get(tid, (1, None))
            busy += [(st.rmid, st.closid, want / count, cpus[i] if cpus else None) for i in range(count)]
        if self.profile.mba_model == "request":
            busy_cpus = {cpu: self.mb_percent(closid, domain) for _, closid, _, cpu in busy
                         if cpu is not None and self.profile.has_mb and self.profile.vendor != "amd"}
            return [(rmid, min(want, self._thread_limit(closid, domain, cpu, busy_cpus)))
                    for rmid, closid, want, cpu in busy]
        want_of: dict[int, float] = {}
        for _, closid, want, _ in busy:
            want_of[closid] = want_of.get(closid, 0.0) + want
        return [(rmid, want * min(1.0, self._cap(closid, domain) / want_of[closid]))
                for rmid, closid, want, _ in busy]

    def advance(self, now: float) -> None:
        """Integrate achieved bandwidth into the counters up to ``now``; under mba_MBps
        (with the hardware's own rules), run the kernel's controller at each second passed."""
        if self.profile.mba_mbps and self.profile.mba_model == "request":
            while self._next_mbps_run <= now:
                self._integrate(self._next_mbps_run)
                self._run_mbps_controller()
                self._next_mbps_run += mba.MBPS_INTERVAL_S
        self._integrate(now)

    def _run_mbps_controller(self) -> None:
        # mbm_handle_overflow -> update_mba_bw for every control group, the default included
        p = self.profile
        for group in [self.root, *self.groups.values()]:
            attr = "total" if group.mbps_event == "mbm_total_bytes" else "local"
            for d in self.online:
                moved = 0.0
                for rmid in group.rmids():
                    c = self.counters.get((rmid, d))
                    if c is None:
                        continue
                    seen = self._mbps_seen.get((rmid, d), (0.0, 0.0))
                    moved += max(0.0, getattr(c, attr) - (seen[0] if attr == "total" else seen[1]))
                key = (group.closid, d)
                current = self.mbps_percent.get(key, mba.MAX_MBA_BW)
                self.mbps_percent[key] = mba.kernel_mbps_step(
                    current, group.ctrl["MB"][d], moved / MIB / mba.MBPS_INTERVAL_S, p.mb_min, p.mb_gran)
        self._mbps_seen = {k: (c.total, c.local) for k, c in self.counters.items()}

    def rates_now(self, domain: int) -> dict[int, float]:
        """RMID -> the bytes/s it moves on a domain at this moment (the domain's peak shared)."""
        got = self._granted(domain)
        node_total = sum(r for _, r in got)
        squeeze = min(1.0, self.peak[domain] / node_total) if node_total > 0 else 1.0
        rates: dict[int, float] = {}
        for rmid, rate in got:
            rates[rmid] = rates.get(rmid, 0.0) + rate * squeeze
        return rates

    def _integrate(self, now: float) -> None:
        dt = now - self.last_advance
        if dt <= 0:
            return
        self.last_advance = now
        for domain in self.online:
            rates = self.rates_now(domain)
            # Only counters with traffic now or before need touching (reads are hot).
            was_active = self._active.get(domain, set())
            for rmid in was_active | rates.keys():
                c = self.counters.get((rmid, domain))
                if c is None:
                    continue
                c.rate = rates.get(rmid, 0.0)
                c.total += c.rate * dt
                c.local += c.rate * dt * self.profile.local_fraction
            self._active[domain] = {r for r, v in rates.items() if v > 0}
            self.moved[domain] = self.moved.get(domain, 0.0) + sum(rates.values()) * dt

    # -------------------------------------------------------------------- write
    def write(self, parts: list[str], data: bytes, caller_pid: int, caller_uid: int) -> int:
        # A write may move a task or change a cap: traffic until now is counted under the
        # placement it had, as the hardware counts it as it happens.
        self.advance(self.clock())
        node = self.lookup(parts)
        if node.is_dir:
            raise KernelError(errno.EISDIR)
        if not node.writable:
            raise KernelError(errno.EACCES)
        if parts[0] == "info":
            self.last_cmd_status = ""
            text = data.decode(errors="replace").strip()
            if not text.isdigit():
                raise KernelError(errno.EINVAL)
            return len(data)
        group, rest = self._group_at(parts)
        name = rest[-1]
        if name == "tasks":
            self._write_tasks(group, data, caller_pid, caller_uid)
        elif name == "schemata":
            self._write_schemata(group, data)
        elif name in ("cpus", "cpus_list"):
            self._write_cpus(group, data, as_list=name == "cpus_list")
        elif name == "mode":
            self.last_cmd_status = ""
            if data.decode(errors="replace").strip() != "shareable":
                raise self._fail(errno.EINVAL, "Unknown or unsupported mode")
        elif name == "mba_MBps_event":
            self.last_cmd_status = ""
            event = data.decode(errors="replace").strip()
            if event not in ("mbm_local_bytes", "mbm_total_bytes") or event not in self.profile.mon_features:
                raise KernelError(errno.EINVAL)
            group.mbps_event = event
        return len(data)

    def _write_tasks(self, group: Group, data: bytes, caller_pid: int, caller_uid: int) -> None:
        text = data.decode(errors="replace")
        if self.tasks_write == "single":
            # Pre-6.7: kstrtoint(strstrip(buf)) before last_cmd_clear(), so a
            # parse error leaves the previous status in place.
            pid = kstrtoint(text.strip())
            if pid is None or pid < 0:
                raise KernelError(errno.EINVAL)
            self.last_cmd_status = ""
            self._move_task(pid, group, caller_pid, caller_uid)
            return
        self.last_cmd_status = ""
        # rdtgroup_tasks_write (6.7+): take comma-separated tokens until the rest of the
        # buffer is empty or starts with a newline, so "" and "5,\n" are fine, "5,,6" is not.
        rest: str | None = text
        while rest and rest[0] != "\n":
            token, sep, after = rest.partition(",")
            rest = after if sep else None
            token = token.strip()
            pid = kstrtoint(token)
            if pid is None:
                raise self._fail(errno.EINVAL, f"Task list parsing error pid {token}")
            if pid < 0:
                raise self._fail(errno.EINVAL, f"Invalid pid {pid}")
            try:
                self._move_task(pid, group, caller_pid, caller_uid)
            except KernelError:
                self._status(f"Error while processing task {pid}")
                raise

    def _move_task(self, pid: int, group: Group, caller_pid: int, caller_uid: int) -> None:
        tid = pid or caller_pid
        info = procfs.read_task(self.proc, tid)
        if info is None:
            raise self._fail(errno.ESRCH, f"No task {pid}")
        # rdtgroup_task_write_permission: root, or the task's real/saved uid.
        if caller_uid != 0 and caller_uid not in (info.uids[0], info.uids[2]):
            raise self._fail(errno.EPERM, f"No permission to move task {tid}")
        self._pin_descendants(tid)
        st = self.resolve_task(tid)
        assert st is not None
        if group.kind == CTRL:
            st.closid, st.rmid = group.closid, group.rmid
        else:
            assert group.parent is not None
            if st.closid != group.parent.closid:
                raise self._fail(errno.EINVAL, "Can't move task to different control group")
            st.rmid = group.rmid

    def _write_schemata(self, group: Group, data: bytes) -> None:
        # rdtgroup_schemata_write: the buffer must end in a newline, every line is
        # parsed and staged, then everything is applied at once.
        if not data or not data.endswith(b"\n"):
            raise KernelError(errno.EINVAL)
        self.last_cmd_status = ""
        staged: dict[str, dict[int, int]] = {}
        names = self._resources()
        for line in data[:-1].decode(errors="replace").split("\n"):
            resname, sep, rest = line.partition(":")
            resname = resname.strip()
            if not sep:
                raise self._fail(errno.EINVAL, "Missing ':'")
            if rest == "":
                raise self._fail(errno.EINVAL, f"Missing '{resname}' value")
            if resname not in names:
                raise self._fail(errno.EINVAL, f"Unknown or unsupported resource name '{resname}'")
            self._parse_line(resname, rest, staged.setdefault(resname, {}))
        for res, values in staged.items():
            group.ctrl[res].update(values)

    def _parse_line(self, res: str, line: str, staged: dict[int, int]) -> None:
        for item in line.split(";"):
            if item == "":
                return  # parse_line stops at an empty remainder
            ident, sep, value = item.partition("=")
            if not sep or not ident.isdigit():
                raise self._fail(errno.EINVAL, "Missing '=' or non-numeric domain")
            dom = int(ident)
            value = value.strip()
            if dom not in self.online:
                raise KernelError(errno.EINVAL)  # quirk: no message for an unknown domain
            if dom in staged:
                raise self._fail(errno.EINVAL, f"Duplicate domain {dom}")
            staged[dom] = self._parse_mb(value) if res == "MB" else self._parse_cbm(value)

    def _parse_mb(self, text: str) -> int:
        # bw_validate: kstrtou32(buf, 10) (an optional '+', ASCII digits, at most U32_MAX),
        # then, under mba_MBps, any such value as it is.
        p = self.profile
        digits = text[1:] if text.startswith("+") else text
        if not digits or not all("0" <= c <= "9" for c in digits) or int(digits) > U32_MAX:
            raise self._fail(errno.EINVAL, f"Invalid MB value {text}")
        bw = int(digits)
        if p.mba_mbps:
            return bw
        if bw < p.mb_min or bw > p.mb_max:
            raise self._fail(errno.EINVAL, f"MB value {bw} out of range [{p.mb_min},{p.mb_max}]")
        return -(-bw // p.mb_gran) * p.mb_gran  # roundup() to the granularity

    def _parse_cbm(self, text: str) -> int:
        p = self.profile
        try:
            val = int(text, 16)
        except ValueError:
            raise self._fail(errno.EINVAL, f"Non-hex character in the mask {text}") from None
        full = (1 << p.cbm_len) - 1
        if (p.min_cbm_bits > 0 and val == 0) or val > full:
            raise self._fail(errno.EINVAL, "Mask out of range")
        # cbm_validate: gaps are refused unless the part has sparse bitmasks; the
        # minimum counts the first run of ones only (zero_bit - first_bit).
        low = (val & -val).bit_length() - 1 if val else p.cbm_len
        run = val >> low if val else 0
        first_run = (run & ~(run + 1)).bit_length()
        if not p.sparse_masks and run & (run + 1):
            raise self._fail(errno.EINVAL, f"The mask {val:x} has non-consecutive 1-bits")
        if first_run < p.min_cbm_bits:
            raise self._fail(errno.EINVAL, f"Need at least {p.min_cbm_bits} bits in the mask")
        return val

    def _write_cpus(self, group: Group, data: bytes, as_list: bool) -> None:
        self.last_cmd_status = ""
        text = data.decode(errors="replace").strip()
        try:
            cpus = _parse_cpu_list(text) if as_list else _parse_cpu_mask(text)
        except ValueError:
            raise self._fail(errno.EINVAL, "Bad CPU list/mask") from None
        if cpus and max(cpus) >= self.nr_cpu_ids:
            # cpulist_parse/cpumask_parse refuse a CPU past nr_cpu_ids (ERANGE/EOVERFLOW)
            raise self._fail(errno.EINVAL, "Bad CPU list/mask")
        if not cpus <= self.all_cpus:
            raise self._fail(errno.EINVAL, "Can only assign online CPUs")
        if group.kind == MON:
            self._cpus_mon_write(group, cpus)
        else:
            self._cpus_ctrl_write(group, cpus)

    def _cpus_mon_write(self, group: Group, cpus: set[int]) -> None:
        # cpus_mon_write: only the parent's CPUs; CPUs dropped go back to the parent (which
        # still has them in its own mask); CPUs added leave the sibling MON groups.
        parent = group.parent
        assert parent is not None
        if not cpus <= parent.cpus:
            raise self._fail(errno.EINVAL, "Can only add CPUs to mongroup that belong to parent")
        added = cpus - group.cpus
        for sibling in parent.mon.values():
            if sibling is not group:
                sibling.cpus -= added
        group.cpus = set(cpus)

    def _cpus_ctrl_write(self, group: Group, cpus: set[int]) -> None:
        # cpus_ctrl_write: CPUs dropped go to the default group (which can drop none);
        # CPUs added leave whichever group had them, the default group included, and
        # that group's MON groups (cpumask_rdtgrp_clear); then every MON group of this
        # group loses all its CPUs, whatever the write changed ("a new parent mask").
        dropped = group.cpus - cpus
        if dropped and group is self.root:
            raise self._fail(errno.EINVAL, "Can't drop CPUs from default group")
        self.root.cpus |= dropped
        added = cpus - group.cpus
        for other in [self.root, *self.groups.values()]:
            if other is not group and other.cpus & added:
                other.cpus -= added
                for m in other.mon.values():
                    m.cpus &= other.cpus
        group.cpus = set(cpus)
        for m in group.mon.values():
            m.cpus = set()

    # ---------------------------------------------------------- mkdir / rmdir
    def _alloc_rmid(self) -> int:
        self._drain_limbo()
        if self.free_rmids:
            return self.free_rmids.popleft()
        err = errno.EBUSY if self.limbo else errno.ENOSPC
        raise self._fail(err, "Out of RMIDs")

    def _drain_limbo(self) -> None:
        now = self.clock()
        for rmid, freed in list(self.limbo.items()):
            if now - freed >= self.limbo_s:
                del self.limbo[rmid]
                self.free_rmids.append(rmid)

    def drain_limbo_now(self) -> None:
        self.free_rmids.extend(self.limbo)
        self.limbo.clear()

    def _free_rmid(self, rmid: int) -> None:
        for d in self.profile.domains:
            self.counters.pop((rmid, d), None)
        if "llc_occupancy" in self.profile.mon_features and self.limbo_s > 0:
            self.limbo[rmid] = self.clock()  # waits until its cache lines drain
        else:
            self.free_rmids.append(rmid)

    def _new_counters(self, rmid: int) -> None:
        self.advance(self.clock())
        for d in self.profile.domains:
            self.counters[(rmid, d)] = Counter()

    def mkdir(self, parts: list[str]) -> None:
        self.last_cmd_status = ""
        name = parts[-1]
        if "\n" in name:
            raise KernelError(errno.EINVAL)
        try:
            self.lookup(parts)
            raise KernelError(errno.EEXIST)
        except KernelError as e:
            if e.errno != errno.ENOENT:
                raise
        if len(parts) == 1:
            if not self.profile.alloc_capable:
                raise KernelError(errno.EPERM)
            self._mkdir_ctrl(name)
            return
        parent_parts = parts[:-2]
        if parts[-2] == "mon_groups" and (not parent_parts or parent_parts == [parent_parts[0]]):
            parent, rest = self._group_at(parent_parts)
            if not rest and parent.kind == CTRL and self.profile.has_mon:
                rmid = self._alloc_rmid()
                self._new_counters(rmid)
                parent.mon[name] = Group(name, MON, parent.closid, rmid, parent=parent)
                return
        raise KernelError(errno.EPERM)

    def _mkdir_ctrl(self, name: str) -> None:
        if not self.free_closids:
            raise self._fail(errno.ENOSPC, "Out of CLOSIDs")
        closid = self.free_closids.pop(0)
        rmid = 0
        if self.profile.has_mon:
            try:
                rmid = self._alloc_rmid()
            except KernelError:
                self.free_closids.insert(0, closid)
                raise
            self._new_counters(rmid)
        self.groups[name] = Group(name, CTRL, closid, rmid, ctrl=self._default_ctrl())
        for d in self.profile.domains:  # a CLOSID comes back unthrottled (the kernel resets its MSRs)
            self.mbps_percent.pop((closid, d), None)

    def rmdir(self, parts: list[str]) -> None:
        self.advance(self.clock())  # its tasks move to the parent from now on
        self.last_cmd_status = ""
        node = self.lookup(parts)
        if not node.is_dir:
            raise KernelError(errno.ENOTDIR)
        group, rest = self._group_at(parts)
        if rest or group is self.root:
            raise KernelError(errno.EPERM)  # root, info, mon_data, mon_groups, mon_L3_XX
        if group.kind == MON:
            parent = group.parent
            assert parent is not None
            for st in self.tasks.values():
                if st.rmid == group.rmid:
                    st.rmid = parent.rmid
            parent.cpus |= group.cpus
            del parent.mon[group.name]
            self._free_rmid(group.rmid)
            return
        for st in self.tasks.values():
            if st.closid == group.closid:
                st.closid, st.rmid = 0, 0
        self.root.cpus |= group.cpus
        for m in group.mon.values():
            self._free_rmid(m.rmid)
        if self.profile.has_mon:
            self._free_rmid(group.rmid)
        del self.groups[group.name]
        self.free_closids.append(group.closid)
        self.free_closids.sort()

    def rename(self, old: list[str], new: list[str]) -> None:
        # rdtgroup_rename: only a MON group into another CTRL_MON's mon_groups/.
        self.last_cmd_status = ""
        src, rest = self._group_at(old)
        if rest or src.kind != MON:
            raise self._fail(errno.EPERM, "Source must be a MON group")
        if len(new) < 2 or new[-2] != "mon_groups":
            raise self._fail(errno.EPERM, "Destination must be a mon_groups subdirectory")
        dst, drest = self._group_at(new[:-2])
        if drest or dst.kind != CTRL:
            raise self._fail(errno.EPERM, "Destination must be a mon_groups subdirectory")
        if new[-1] in dst.mon:
            raise KernelError(errno.EEXIST)
        if src.cpus and src.parent is not dst:
            # its CPUs belong to its parent: renaming in place keeps them, moving cannot
            raise self._fail(errno.EPERM, "Cannot move a MON group that monitors CPUs")
        old_parent = src.parent
        assert old_parent is not None
        del old_parent.mon[src.name]
        src.name, src.parent, src.closid = new[-1], dst, dst.closid
        dst.mon[src.name] = src
        for st in self.tasks.values():
            if st.rmid == src.rmid:
                st.closid = dst.closid

    # ------------------------------------------------------------ fault control
    def set_domain_online(self, domain: int, online: bool) -> None:
        if domain not in self.profile.domains:
            raise ValueError(f"no L3 domain {domain} in profile {self.profile.name}")
        self.advance(self.clock())
        # A domain is offline when its last CPU is: its CPUs leave every group
        # (resctrl_offline_cpu) and come back in the default group (resctrl_online_cpu).
        cpus = self.profile.cpus_of_domains[domain]
        if online and domain not in self.online:
            self.online = sorted(self.online + [domain])
            self.all_cpus |= cpus
            self.root.cpus |= cpus
            for g in [self.root, *self.groups.values()]:
                for res in g.ctrl:
                    g.ctrl[res][domain] = self._default_value(res)
            for (rmid, d), c in self.counters.items():
                if d == domain:
                    c.total = c.local = c.rate = 0.0
        elif not online and domain in self.online:
            self.online.remove(domain)
            self.all_cpus -= cpus
            for g in [self.root, *self.groups.values()]:
                g.cpus -= cpus
                for m in g.mon.values():
                    m.cpus -= cpus

    def reset(self) -> list[str]:
        """Back to the state of a fresh mount of the same profile and options, as an unmount
        and a mount would leave it (a test module's one mount between its tests). The paths
        of the groups that vanished (the caller drops them from the VFS's caches)."""
        gone = [f"/mon_groups/{name}" for name in self.root.mon] + [f"/{name}" for name in self.groups]
        self._start_state()
        return gone

    def reset_counters(self, rmid: int | None, domain: int | None) -> None:
        self.advance(self.clock())
        for (r, d), c in self.counters.items():
            if (rmid is None or r == rmid) and (domain is None or d == domain):
                c.total = c.local = 0.0

    def group_by_path(self, path: str) -> Group:
        parts = [p for p in path.strip("/").split("/") if p]
        group, rest = self._group_at(parts)
        if rest:
            raise ValueError(f"{path!r} is not a resctrl group")
        return group
