"""Putting back what noded recorded of jobs' CPUs: every cpuset and affinity whose original
is in ``originals.json``, at stop (``CpuSetOwner.release_all``) and at the next start after a
crash (``CpuSetOwner.restore_all``, before the first tick), only where the value is still one
noded wrote (``noded.actuators.cpuview.ours``): a value someone else set meanwhile (a
scheduler's resize) is theirs, left as it is and its record forgotten. Cpusets go back in an
order the kernel accepts (a child inside its parent), each job's tree as a whole; processes
the job forked while its CPUs were changed get the job's original too."""

from __future__ import annotations

import errno
import logging
import os
from typing import Any, Mapping

from resctrl.cpulist import format_cpu_list, parse_cpu_list

from noded.actuators.cpuio import read_cpuset
from noded.actuators.cpuio import set_affinity
from noded.actuators.cpuio import write_cpuset
from noded.actuators.cpurecords import WrittenValues
from noded.actuators.cpurecords import cpus_of
from noded.actuators.cpurecords import cpuset_key
from noded.actuators.cpuview import CpuNode, JobCpus, alive, ours, parent_of
from noded.jobs.cgroups import read_subtree_procs
from noded.jobs.cgroupwalk import NODED_SHORT_OF
from noded.jobs.proctree import descendants
from noded.jobs.proctree import read_ppids
from noded.jobs.polling import DEFAULT_MAX_POLLED
from noded.jobs.procscan import pids_below
from noded.stores.originals import OriginalValues
from noded.stores.originals import StateWriteError
from noded.util import paths
from noded.util.cputree import CpuSet
from noded.util.cputree import cpuset_steps
from noded.util.cputree import fitted
from noded.util.halving import halvings
from noded.util.journal import log_change, printable

log = logging.getLogger(__name__)

#: what reading a recorded cgroup's cpuset.cpus answers where it is no cpuset: no such file,
#: no directory on the way, a link (never followed)
NOT_A_CPUSET = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def forget_unrecorded_writes(originals: OriginalValues, written: WrittenValues) -> None:
    """What noded wrote into CPUs whose original is no longer recorded: nothing to tell apart."""
    recorded = {k for k, _ in originals.items()}
    written.update({k: None for k in written.keys() if k not in recorded})


class CpuRestore:
    """Every recorded original of jobs' CPUs put back (see the module's docstring)."""

    def __init__(self, originals: OriginalValues, written: WrittenValues, proc: str = "/proc",
                 most: int = DEFAULT_MAX_POLLED):
        self.originals = originals
        self.written = written
        self.proc = proc
        self.most = most  # a job's cgroups walked at most, before its processes are taken from /proc

    def restore(self) -> dict[str, bool]:
        """Every record put back, but only where the value is still one noded set: a value
        someone else changed meanwhile (a scheduler's resize) is theirs, and left as it is."""
        done: dict[str, bool] = {}
        records = dict(self.originals.items())
        dirs = sorted(k.partition(":")[2] for k in records if k.startswith("cpuset:"))
        tops = [d for d in dirs if not any(d.startswith(t + os.sep) for t in dirs)]
        for top in tops:
            tree = [d for d in dirs if d == top or d.startswith(top + os.sep)]
            done.update(self._restore_tree(tree, records))
        for key, value in records.items():
            kind, _, where = key.partition(":")
            if kind not in ("affinity", "affinity_job"):
                continue
            try:
                if kind == "affinity":
                    pid_text, _, start = where.partition(":")
                    if alive(self.proc, int(pid_text), start):
                        self._restore_affinity(int(pid_text), frozenset(value), key)
            except OSError as e:
                log.warning("restoring %s failed: %s", key, e)
                done[key] = False
                continue
            done[key] = True
        for key, value in records.items():  # after each process's own: what the job forked meanwhile
            if key.startswith("affinity_job:"):
                try:
                    for pid in self._job_pids(value):
                        self._restore_affinity(pid, frozenset(value["original"]), key, inherited_only=True)
                except OSError as e:
                    log.warning("restoring %s failed: %s", key, e)
                    done[key] = False
                    continue
                done[key] = True
        for key, ok in done.items():
            if ok:
                try:
                    self.originals.forget(key)
                except StateWriteError as e:
                    log.warning("restored %s but could not forget its record: %s", key, e)
        try:
            forget_unrecorded_writes(self.originals, self.written)
        except StateWriteError as e:
            log.warning("could not forget what noded wrote into CPUs now restored: %s", e)
        return done

    def _restore_tree(self, tree: list[str], records: Mapping[str, Any]) -> dict[str, bool]:
        """One job's recorded cgroups (parents first) back to their originals, in an order
        the kernel accepts; a cgroup gone, not a cpuset, or changed by someone else is left."""
        done: dict[str, bool] = {}
        nodes: list[CpuNode] = []
        for d in tree:
            key = cpuset_key(d)
            try:
                if not paths.isdir(d):
                    done[key] = True  # gone: nothing is left to restore
                    continue
                now = frozenset(parse_cpu_list(read_cpuset(d)))
            except OSError as e:
                if e.errno not in NOT_A_CPUSET:
                    # shut to noded (a tenant's chmod: EACCES), an I/O error: it is there, and
                    # noded's value may be in it; an error is not "gone" (the record stays)
                    log.warning("not restoring %s now: %s; noded's record kept, tried again at the next stop or "
                                "start", d, printable(str(e)))
                    done[key] = False
                    continue
                log.warning("not restoring %s: not a cpuset (%s); forgetting noded's record", d, e)
                done[key] = True
                continue
            except ValueError as e:
                log.warning("not restoring %s: not a cpuset (%s); forgetting noded's record", d, e)
                done[key] = True
                continue
            nodes.append(CpuNode(key, d, now, cpus_of(records[key]), parent_of(nodes, d)))
        if not nodes:
            return done
        v = JobCpus("", None, True, tuple(nodes), nodes[0].original)
        targets = []
        for n in nodes:
            if ours(self.written, v, n):
                targets.append(n.original)
            else:
                log.warning("not restoring %s/cpuset.cpus: it is %s, which noded did not set (someone else changed "
                            "it); forgetting noded's record", n.where, format_cpu_list(sorted(n.now)))
                targets.append(n.now)
        targets = fitted(nodes, targets)
        steps = cpuset_steps([(n.now, t, n.parent) for n, t in zip(nodes, targets)])
        last = {i: k for k, (i, _value) in enumerate(steps)}
        failed_at = None
        for k, (i, value) in enumerate(steps):
            try:
                write_cpuset(str(nodes[i].where), format_cpu_list(sorted(value)))
            except OSError as e:
                log.warning("restoring %s/cpuset.cpus failed: %s", nodes[i].where, e)
                failed_at = k
                break
            if last[i] == k:
                log_change("restored", None, cpuset=nodes[i].where, cpus=format_cpu_list(sorted(value)),
                           reason="cpuset.cpus written back")
        for i, n in enumerate(nodes):
            done[n.key] = failed_at is None or last.get(i, -1) < failed_at
        return done

    def _restore_affinity(self, pid: int, original: CpuSet, key: str, inherited_only: bool = False) -> None:
        try:
            now = frozenset(os.sched_getaffinity(pid))
        except ProcessLookupError:
            return
        if now == original:
            return
        written = self.written.get(key)
        if not (now in written if written is not None else now in halvings(original)):
            if not inherited_only:
                log.warning("not restoring the affinity of %d: it is %s, which noded did not set; forgetting "
                            "noded's record", pid, format_cpu_list(sorted(now)))
            return
        set_affinity(self.proc, pid, sorted(original))
        log_change("restored", None, pid=pid, cpus=format_cpu_list(sorted(original)), reason="sched_setaffinity back")

    def _job_pids(self, record: Mapping) -> set[int]:
        """The processes of a job whose CPUs are set by affinity now: its cgroup's, else its
        tree's. Its subtree is walked for at most ``most`` cgroups (the common job: one
        cgroup read); where that is not all of it (a tenant's thousands of cgroups, names
        past PATH_MAX, a part or the job's own directory shut to noded), every process of
        it is taken from /proc/PID/cgroup instead, whose cost is the host's processes and
        not the tenant's cgroups: what noded recorded is put back whole either way."""
        cgroup, root = record.get("cgroup"), record.get("root")
        why = None
        if cgroup:
            try:  # a directory above it shut to noded is an error here, not its cgroup gone
                got = read_subtree_procs(cgroup, self.most) if paths.isdir(cgroup) else None
            except OSError as e:
                if e.errno in NODED_SHORT_OF:
                    raise
                why = f"{e.filename or cgroup}: {e.strerror or e}"
            else:
                if got is not None and got.partial is None:
                    return set(got.pids)
                why = got.partial if got is not None else None
        if why is not None:
            log.info("restoring the CPUs of the processes in %s: its subtree not read whole (%s); its processes "
                     "taken from /proc/PID/cgroup", cgroup, printable(why))
            return pids_below(cgroup, self.proc)
        if root and alive(self.proc, int(root[0]), str(root[1])):
            return descendants(int(root[0]), read_ppids(self.proc))
        return set()
