"""A Kubernetes pod's identity, read from the cgroup names kubelet and the runtime make.

kubelet puts each pod in a cgroup named after its UID, under its QoS class's cgroup
(a Guaranteed pod directly under the root ``kubepods``), and the container runtime puts
each container in a cgroup below the pod's, named after the container's id:

=========  =============================================================================
driver     cgroup path (relative to the hierarchy's root; v1 and v2 alike)
=========  =============================================================================
systemd    ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<U>.slice/``
           ``cri-containerd-<id>.scope`` (``crio-<id>.scope``, ``docker-<id>.scope``);
           ``<U>`` is the UID with ``_`` for ``-`` (``-`` separates a slice's parents);
           Guaranteed: ``kubepods.slice/kubepods-pod<U>.slice``
cgroupfs   ``kubepods/burstable/pod<uid>/<id>`` (CRI-O: ``crio-<id>``);
           Guaranteed: ``kubepods/pod<uid>``
=========  =============================================================================

The pod's name and namespace are not in the tree: they are joined on the UID (see the
README's Kubernetes section). Parsing is per job directory, so discovery pays for it
once per pod, and the container listing again only when the pod's processes change.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

QOS_CLASSES = ("guaranteed", "burstable", "besteffort")

# A pod UID as the API server writes it (RFC 4122, lower-case), or a static pod's as
# kubelet names its cgroup: the hex digest of its manifest, no dashes. A static pod's mirror
# pod in the API has another metadata.uid, so a join on the UID (README) misses static pods.
# kubelet's systemd names carry '_' for '-'.
def _uid(sep: str) -> str:
    return sep.join(f"[0-9a-f]{{{n}}}" for n in (8, 4, 4, 4, 12)) + "|[0-9a-f]{32}"


_UID, _SLICE_UID = _uid("-"), _uid("_")
_SYSTEMD_POD = re.compile(rf"kubepods(?:-(burstable|besteffort))?-pod({_SLICE_UID})\.slice")
_CGROUPFS_POD = re.compile(rf"pod({_UID})")

# A container's cgroup below its pod's: systemd scopes carry the runtime's prefix;
# cgroupfs has the bare id (containerd, Docker) or CRI-O's ``crio-<id>``. CRI-O's monitor
# (conmon) sits beside its container as ``crio-conmon-<id>``: not a container.
_CONTAINER_ID = r"[0-9a-f]{64}"
_SYSTEMD_CONTAINER = re.compile(rf"(cri-containerd|crio|docker)-({_CONTAINER_ID})\.scope")
_CGROUPFS_CONTAINER = re.compile(rf"(?:(crio)-)?({_CONTAINER_ID})")
# the runtime's name as a pod's status (containerStatuses[].containerID) writes it
_RUNTIME = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}


@dataclass(frozen=True)
class PodCgroup:
    """What a pod's own cgroup directory says of it."""

    uid: str  # as the API server writes it: metadata.uid
    qos: str  # guaranteed | burstable | besteffort
    driver: str  # systemd | cgroupfs: kubelet's cgroup driver that named it


@dataclass(frozen=True)
class PodIdentity:
    """A pod job's identity, for ``nodectl jobs``/``explain``."""

    uid: str
    qos: str
    driver: str
    # "<runtime>://<id>" as the pod's status and kube-state-metrics write a container id;
    # the bare id where the name does not tell the runtime (containerd or Docker on
    # cgroupfs). The pod's sandbox ("pause") container is one of them: the tree does not
    # tell it apart. Sorted.
    containers: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"uid": self.uid, "qos": self.qos, "driver": self.driver, "containers": list(self.containers)}


def pod_uid(name: str) -> str | None:
    """The UID of the pod whose cgroup kubelet names ``name`` (either driver's form, any
    QoS class), or None where kubelet names no pod's cgroup so: a job source's pod
    patterns (``pod*``) match any name, and only kubelet's are pods."""
    m = _SYSTEMD_POD.fullmatch(name)
    if m is not None:
        return m.group(2).replace("_", "-")
    m = _CGROUPFS_POD.fullmatch(name)
    return m.group(1) if m is not None else None


def parse_pod_dir(rel: str) -> PodCgroup | None:
    """The pod a job directory (relative to its hierarchy's root) is, or None where the
    path is not one kubelet makes for a pod."""
    parts = rel.split("/")
    if len(parts) < 2:
        return None
    if parts[0] == "kubepods.slice":
        m = _SYSTEMD_POD.fullmatch(parts[-1])
        if m is None:
            return None
        qos = m.group(1) or "guaranteed"
        # the parent slices must be the class's own: kubepods.slice[/kubepods-<class>.slice]
        want = ["kubepods.slice"] + ([] if qos == "guaranteed" else [f"kubepods-{qos}.slice"])
        if parts[:-1] != want:
            return None
        return PodCgroup(m.group(2).replace("_", "-"), qos, "systemd")
    if parts[0] == "kubepods":
        m = _CGROUPFS_POD.fullmatch(parts[-1])
        if m is None:
            return None
        middle = parts[1:-1]
        if middle == []:
            qos = "guaranteed"
        elif len(middle) == 1 and middle[0] in ("burstable", "besteffort"):
            qos = middle[0]
        else:
            return None
        return PodCgroup(m.group(1), qos, "cgroupfs")
    return None


def container_id(name: str, driver: str) -> str | None:
    """A container's id from its cgroup's name below the pod's ("<runtime>://<id>", or
    the bare id where the name does not say the runtime), or None where the name is no
    container's (CRI-O's conmon, anything else)."""
    if driver == "systemd":
        m = _SYSTEMD_CONTAINER.fullmatch(name)
        return f"{_RUNTIME[m.group(1)]}://{m.group(2)}" if m else None
    m = _CGROUPFS_CONTAINER.fullmatch(name)
    if m is None:
        return None
    return f"cri-o://{m.group(2)}" if m.group(1) else m.group(2)


def list_containers(pod_dir: str, driver: str) -> tuple[str, ...]:
    """The containers' ids below a pod's cgroup now (sorted; none where it vanished)."""
    try:
        with os.scandir(pod_dir) as entries:
            names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):  # the pod ended while we looked
        return ()
    return tuple(sorted(c for n in names if (c := container_id(n, driver)) is not None))


class PodIdentities:
    """Pod identity per job directory, kept across ticks: the path is parsed once per
    pod, its containers listed again only when the pod's processes or its directory's
    subdirectories changed."""

    def __init__(self) -> None:
        # job directory -> (its pod, the pids and link count its containers were listed at,
        # the identity)
        self._known: dict[str, tuple[PodCgroup | None, tuple[frozenset[int], int], PodIdentity | None]] = {}
        self._seen: set[str] = set()

    def identify(self, root: str, job_dir: str, pids: frozenset[int]) -> PodIdentity | None:
        """The identity of the pod in ``job_dir`` (below hierarchy ``root``) holding ``pids``."""
        self._seen.add(job_dir)
        try:
            # a container's cgroup comes and goes a little apart from its processes: the
            # pod directory's link count (2 + its subdirectories) says when its list changed
            links = os.stat(job_dir).st_nlink
        except (FileNotFoundError, NotADirectoryError):
            links = 0  # the pod ended while we looked
        known = self._known.get(job_dir)
        if known is not None and known[1] == (pids, links):
            return known[2]
        pod = known[0] if known is not None else parse_pod_dir(os.path.relpath(job_dir, root))
        identity = None if pod is None else PodIdentity(pod.uid, pod.qos, pod.driver,
                                                        list_containers(job_dir, pod.driver))
        self._known[job_dir] = (pod, (pids, links), identity)
        return identity

    def forget_unseen(self) -> None:
        """Drop the pods not identified since the last call (they ended): bounded by the
        pods alive."""
        for path in self._known.keys() - self._seen:
            del self._known[path]
        self._seen = set()
