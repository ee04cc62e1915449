"""Kubernetes pods as jobs: the cgroup trees kubelet makes with either cgroup driver, on
cgroup v1 and v2, for every QoS class, with containers below the pod; the pod identity
parsed out of them; and the same on this machine's real v1 cpuset hierarchy."""

import os
import uuid

import pytest
from hypothesis import given, strategies as st

from noded.admin import answertext
from noded.jobs import CgroupSource, JobDiscovery
from noded.jobs.cgroups import CgroupScanner
from noded.jobs.kubepods import (QOS_CLASSES, PodCgroup, PodIdentities, PodIdentity, container_id,
                                 list_containers, parse_pod_dir)

RUNTIMES = ("containerd", "cri-o", "docker")


# The test's oracle: the names kubelet and the runtimes give, written out from their
# documented rules, independently of the parser under test.
def pod_dir(uid: str, qos: str, driver: str) -> str:
    if driver == "systemd":
        name = uid.replace("-", "_")
        if qos == "guaranteed":
            return f"kubepods.slice/kubepods-pod{name}.slice"
        return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{name}.slice"
    return f"kubepods/pod{uid}" if qos == "guaranteed" else f"kubepods/{qos}/pod{uid}"


def container_dir(runtime: str, cid: str, driver: str) -> str:
    if driver == "systemd":
        return {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}[runtime] + f"-{cid}.scope"
    return f"crio-{cid}" if runtime == "cri-o" else cid


def expected_id(runtime: str, cid: str, driver: str) -> str:
    # cgroupfs names tell CRI-O's containers only
    return f"{runtime}://{cid}" if driver == "systemd" or runtime == "cri-o" else cid


uids = st.uuids().map(str) | st.binary(min_size=16, max_size=16).map(bytes.hex)  # API server's, static pods'
container_ids = st.binary(min_size=32, max_size=32).map(bytes.hex)


@given(uid=uids, qos=st.sampled_from(QOS_CLASSES), driver=st.sampled_from(("systemd", "cgroupfs")))
def test_every_pod_directory_kubelet_makes_parses_to_its_uid_and_class(uid, qos, driver):
    rel = pod_dir(uid, qos, driver)
    assert parse_pod_dir(rel) == PodCgroup(uid, qos, driver)
    # and the job id discovery gives it carries the same UID
    src = CgroupSource.create("kubernetes", "/sys/fs/cgroup", version=2)  # the default patterns
    assert src.job_id(rel) == f"k8s:{uid}"
    assert src.match("/" + rel + "/some-container") == rel


@given(runtime=st.sampled_from(RUNTIMES), cid=container_ids, driver=st.sampled_from(("systemd", "cgroupfs")))
def test_every_container_cgroup_name_parses_to_its_id(runtime, cid, driver):
    assert container_id(container_dir(runtime, cid, driver), driver) == expected_id(runtime, cid, driver)
    # CRI-O's monitor beside its container is no container
    conmon = f"crio-conmon-{cid}.scope" if driver == "systemd" else f"crio-conmon-{cid}"
    assert container_id(conmon, driver) is None


@given(name=st.text(max_size=90), driver=st.sampled_from(("systemd", "cgroupfs")))
def test_any_other_name_is_no_container_and_never_an_error(name, driver):
    got = container_id(name, driver)
    if got is not None:  # then it is exactly one of the runtimes' shapes
        cid = got.rsplit("/", 1)[-1]
        assert len(cid) == 64 and name in {container_dir(r, cid, driver) for r in RUNTIMES}


POD_PARTS = ["kubepods", "kubepods.slice", "burstable", "besteffort", "guaranteed", "kubepods-burstable.slice",
             "kubepods-besteffort.slice", "podUID", "x", "kubepods-podUID.slice", "kubepods-burstable-podUID.slice",
             "kubepods-besteffort-podUID.slice", "kubepods-guaranteed-podUID.slice"]


def with_uid(parts, uid):
    """The parts joined, UID put in where a pod's name would carry it (the systemd driver's
    slices with '_' for '-'): the placeholder, not "pod", so "kubepods" stays itself."""
    return "/".join(p.replace("UID", uid.replace("-", "_") if p.endswith(".slice") else uid) for p in parts)


@given(parts=st.lists(st.sampled_from(POD_PARTS) | st.text(max_size=40), min_size=1, max_size=5), uid=uids)
def test_only_the_paths_kubelet_makes_are_pods(parts, uid):
    # names built around a real UID, in arbitrary places: a pod only where kubelet would put one
    rel = with_uid(parts, uid)
    got = parse_pod_dir(rel)
    if got is not None:
        assert rel == pod_dir(got.uid, got.qos, got.driver)


def test_the_pod_paths_property_draws_real_pods_too():
    # the property above would pass vacuously if no drawn path could be a pod
    uid = str(uuid.uuid4())
    assert parse_pod_dir(with_uid(["kubepods", "burstable", "podUID"], uid)).uid == uid
    assert parse_pod_dir(with_uid(["kubepods.slice", "kubepods-besteffort.slice",
                                   "kubepods-besteffort-podUID.slice"], uid)).qos == "besteffort"
    assert parse_pod_dir(with_uid(["kubepods.slice", "kubepods-podUID.slice"], uid)).qos == "guaranteed"
    assert parse_pod_dir(with_uid(["kubepods", "guaranteed", "podUID"], uid)) is None


@pytest.mark.parametrize("rel", [
    "kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod0b1c2d3e_4f50_6172_8394_a5b6c7d8e9f0.slice",
    "kubepods.slice/kubepods-burstable.slice/kubepods-pod0b1c2d3e_4f50_6172_8394_a5b6c7d8e9f0.slice",
    "kubepods.slice/kubepods-pod0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0.slice",  # '-' splits slices: never in a UID
    "kubepods/guaranteed/pod0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0",  # Guaranteed pods have no class cgroup
    "kubepods/burstable/pod0B1C2D3E-4F50-6172-8394-A5B6C7D8E9F0",  # the API server writes lower case
    "kubepods/burstable/pod1b2c-33d4",
    "kubepods/pod0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0/x",
])
def test_near_misses_are_not_pods(rel):
    assert parse_pod_dir(rel) is None


CASES = [(d, v, q, r) for d in ("systemd", "cgroupfs") for v in (1, 2) for q in QOS_CLASSES for r in RUNTIMES
         if not (d == "cgroupfs" and r == "docker")]  # Docker's cgroupfs name is containerd's: one case covers both


@pytest.mark.parametrize("driver,version,qos,runtime", CASES)
def test_pods_are_found_with_their_identity_in_every_layout(tmp_path, sleeper, driver, version, qos, runtime):
    root = tmp_path / "cgroup"
    root.mkdir()
    if version == 2:
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    uid, other = str(uuid.uuid4()), str(uuid.uuid4())
    app, pause = os.urandom(32).hex(), os.urandom(32).hex()
    a, b, c = sleeper(), sleeper(), sleeper()
    pod = root / pod_dir(uid, qos, driver)
    for cid, p in ((app, a), (pause, b)):
        (pod / container_dir(runtime, cid, driver)).mkdir(parents=True)
        (pod / container_dir(runtime, cid, driver) / "cgroup.procs").write_text(f"{p.pid}\n")
    if runtime == "cri-o":  # conmon beside the container, in the pod's cgroup
        conmon = pod / (f"crio-conmon-{app}.scope" if driver == "systemd" else f"crio-conmon-{app}")
        conmon.mkdir()
        (conmon / "cgroup.procs").write_text(f"{c.pid}\n")
    # another pod, of another class, with nothing running: no job
    (root / pod_dir(other, "besteffort" if qos != "besteffort" else "burstable", driver)).mkdir(parents=True)
    # the QoS cgroups' own processes are no pod's
    (root / ("kubepods.slice" if driver == "systemd" else "kubepods") / "cgroup.procs").write_text(f"{c.pid}\n")

    src = CgroupSource.create("kubernetes", str(root))
    assert src.version == version
    jobs = JobDiscovery([src]).discover()
    assert set(jobs) == {f"k8s:{uid}"}
    job = jobs[f"k8s:{uid}"]
    assert job.pids == ({a.pid, b.pid, c.pid} if runtime == "cri-o" else {a.pid, b.pid})
    assert job.cgroup == str(pod)
    assert job.pod == PodIdentity(uid, qos, driver, tuple(sorted(expected_id(runtime, x, driver) for x in (app, pause))))
    # a process of the pod's app container is placed in it by its own cgroup path (as
    # /proc/PID/cgroup shows it: from the mount, here the tmp dir's file system)
    below_mount = os.path.relpath(src.root, src.mount)
    assert src.match(f"/{below_mount}/{pod_dir(uid, qos, driver)}/{container_dir(runtime, app, driver)}") \
        == pod_dir(uid, qos, driver)


def test_containers_are_listed_again_only_when_the_pods_processes_or_subdirectories_change(tmp_path):
    root = tmp_path / "cgroup"
    uid = str(uuid.uuid4())
    pod = root / pod_dir(uid, "burstable", "cgroupfs")
    first, second = os.urandom(32).hex(), os.urandom(32).hex()
    (pod / first).mkdir(parents=True)
    pods = PodIdentities()
    one = pods.identify(str(root), str(pod), frozenset({10}))
    assert one == PodIdentity(uid, "burstable", "cgroupfs", (first,))
    # nothing changed: the identity is the one already known (no listing)
    assert pods.identify(str(root), str(pod), frozenset({10})) is one
    # a container's cgroup made before its process: seen with the same processes
    (pod / second).mkdir()
    two = pods.identify(str(root), str(pod), frozenset({10}))
    assert two.containers == tuple(sorted((first, second)))
    # and one gone after its process ended: forgotten at once
    (pod / first).rmdir()
    assert pods.identify(str(root), str(pod), frozenset({10})).containers == (second,)
    # a new process: listed again
    (pod / first).mkdir()
    assert pods.identify(str(root), str(pod), frozenset({10, 11})).containers == tuple(sorted((first, second)))
    pods.forget_unseen()
    pods.forget_unseen()  # not identified since: forgotten, so a pod ending frees its entry
    assert pods._known == {}
    # a directory that is no pod's is remembered as none, and a vanished pod lists nothing
    assert pods.identify(str(root), str(root / "kubepods" / "burstable"), frozenset({1})) is None
    assert list_containers(str(pod / "gone"), "cgroupfs") == ()


def test_pod_identity_reaches_nodectl_jobs_and_explain():
    pod = PodIdentity("0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0", "burstable", "systemd", ("containerd://" + "ab" * 32,))
    row = {"job": "k8s:" + pod.uid, "kind": "cpu", "bandwidth_bytes_per_s": 1e9, "gpu_util": None, "level": 0,
           "override": False, "exempt": False, "monitoring": "own", "pod": pod.as_dict()}
    assert "pod burstable" in answertext.format_jobs([row])
    explain = {"job": row["job"], "kind": "cpu", "level": 0, "bandwidth_bytes_per_s": 1e9, "gpu_util": None,
               "baseline": None, "node_share_of_peak": 0.5, "threshold": 0.75, "slowed_gpu_jobs": [], "why": [],
               "held": [], "decisions": [], "sizing": None, "borrowed_cpus": None, "memory": None,
               "pod": pod.as_dict()}
    text = answertext.format_explain(explain)
    assert f"pod uid {pod.uid}, QoS burstable (kubelet's systemd cgroup driver), containers: containerd://{'ab' * 32}" in text


@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
def test_pods_on_the_real_v1_cpuset_hierarchy(v1_cpuset, sleeper, driver):
    """The kernel's own tree and /proc/PID/cgroup: a container's process found in its pod."""
    base, mkcg = v1_cpuset
    uid, cid = str(uuid.uuid4()), os.urandom(32).hex()
    rel = pod_dir(uid, "besteffort", driver)
    container = mkcg(rel + "/" + container_dir("containerd", cid, driver))
    p = sleeper()
    with open(f"{container}/cgroup.procs", "w") as f:
        f.write(str(p.pid))
    src = CgroupSource.create("kubernetes", base)
    assert src.version == 1 and src.hierarchy == "cpuset"
    discovery = JobDiscovery([src])
    jobs = discovery.discover()
    assert set(jobs) == {f"k8s:{uid}"} and jobs[f"k8s:{uid}"].pids == {p.pid}
    assert jobs[f"k8s:{uid}"].pod == PodIdentity(uid, "besteffort", driver,
                                                 (expected_id("containerd", cid, driver),))
    # the process's own cgroup path (as the connector's path places a new process) finds the same pod
    placed = discovery.job_of_new_process(p.pid, jobs)
    assert placed is not None and placed.id == f"k8s:{uid}" and placed.pod == jobs[f"k8s:{uid}"].pod


# -- names over the kernel's whole alphabet, and a tenant's own cgroups below its pod

# a cgroup's name: any byte but '/' and NUL, 1 to 255 of them (not "." or "..")
cgroup_names = st.binary(min_size=1, max_size=255).map(lambda b: b.replace(b"/", b"_").replace(b"\0", b"_")) \
    .filter(lambda b: b not in (b".", b".."))
# ...and those near kubelet's own: a pod's prefix, then anything
near_pod_names = st.tuples(st.sampled_from([b"pod", b"kubepods-burstable-pod", b"kubepods-pod"]), cgroup_names) \
    .map(b"".join).filter(lambda b: len(b) <= 255)


@given(names=st.lists(cgroup_names | near_pod_names, min_size=1, max_size=6))
def test_only_the_directories_kubelet_names_for_a_pod_are_jobs(names):
    """Whatever else sits where kubelet puts pods (a name over the kernel's alphabet, one
    that begins as a pod's, an empty UID), only a pod cgroup kubelet names is a job, with
    its UID for id: never "k8s:" alone, nor an id of control characters for noded's logs and
    metrics, nor a directory taken for another pod's."""
    import tempfile

    uid = str(uuid.uuid4())
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "cgroup")
        parents = [os.path.join(root, p) for p in ("kubepods", "kubepods/burstable", "kubepods.slice",
                                                  "kubepods.slice/kubepods-burstable.slice")]
        for parent in parents:
            os.makedirs(parent)
            for name in names:
                os.makedirs(os.path.join(os.fsencode(parent), name), exist_ok=True)
        os.makedirs(os.path.join(root, pod_dir(uid, "burstable", "cgroupfs")), exist_ok=True)
        src = CgroupSource.create("kubernetes", root, version=1)
        found = src.scan()
        assert f"k8s:{uid}" in found and CgroupScanner(src).scan() == found
        for job_id, path in found.items():
            pod = parse_pod_dir(os.path.relpath(path, root))
            assert pod is not None and job_id == f"k8s:{pod.uid}", (job_id, path)
        for parent in parents:  # a process in such a directory is no pod's either
            for name in names:
                rel = src.match(os.path.join("/", os.path.relpath(parent, src.mount), os.fsdecode(name)))
                if rel is not None:
                    assert src.job_id(rel) is None or parse_pod_dir(rel) is not None, rel


def test_a_tenants_cgroups_below_its_pod_are_its_pods(tmp_path, sleeper):
    """A tenant with its container's cgroup delegated makes, below it, cgroups named as
    kubelet names other pods (and as other pods' containers): its processes there stay its
    pod's, no other pod appears, and the pod's containers are those the runtime made."""
    root = tmp_path / "cgroup"
    mine, other = str(uuid.uuid4()), str(uuid.uuid4())
    app, others_container = os.urandom(32).hex(), os.urandom(32).hex()
    container = root / pod_dir(mine, "burstable", "cgroupfs") / app
    forged = [container / pod_dir(other, "burstable", "cgroupfs"), container / f"pod{other}",
              container / pod_dir(other, "guaranteed", "systemd") / f"cri-containerd-{others_container}.scope",
              container / others_container]
    p = sleeper()
    for d in forged:
        d.mkdir(parents=True)
    (forged[0] / "cgroup.procs").write_text(f"{p.pid}\n")
    src = CgroupSource.create("kubernetes", str(root), version=1)
    discovery = JobDiscovery([src])
    jobs = discovery.discover()
    assert set(jobs) == {f"k8s:{mine}"} and jobs[f"k8s:{mine}"].pids == {p.pid}
    assert jobs[f"k8s:{mine}"].pod.containers == (app,)
    below_mount = os.path.relpath(src.root, src.mount)
    for d in forged:
        assert src.match(f"/{below_mount}/{os.path.relpath(d, root)}") == pod_dir(mine, "burstable", "cgroupfs")
