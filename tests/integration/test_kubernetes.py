"""integrations/kubernetes: the kustomize base (cgroup v2 nodes) and its cgroup v1 overlay,
rendered by kubectl's built-in kustomize, validated offline against the Kubernetes API
schemas (and the ServiceMonitor against prometheus-operator's), checked for consistency
between their parts and with noded's own config, and their noded.yaml run through
`noded check-config` on a cgroup tree of the version each is for."""

import copy
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from noded.commands.hostcheck import CGROUP_FILESYSTEMS, filesystem_type

from noded.config import load_config
from support.paths import REPO_ROOT

REPO = REPO_ROOT
KUBERNETES = os.path.join(REPO, "integrations", "kubernetes")
# each kustomization, and the job source root its noded.yaml must have
VARIANTS = {"base": "/sys/fs/cgroup", "overlays/cgroup-v1": "/sys/fs/cgroup/cpuset"}
VALIDATOR = os.path.join(REPO, "tests", "kubernetes", "validate_manifests.py")


def need(tool: str) -> str:
    path = shutil.which(tool)
    assert path, f"{tool} is missing: `make deps` installs it (see the Makefile's k8s-test-deps)"
    return path


def render(variant: str) -> list[dict]:
    run = subprocess.run([need("kubectl"), "kustomize", os.path.join(KUBERNETES, variant)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d is not None]


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request) -> tuple[str, list[dict]]:
    return request.param, render(request.param)


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return render("base")


def one(docs, kind):
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def validate_offline(docs) -> subprocess.CompletedProcess:
    """The validator in a network namespace of its own: no network at all."""
    need("node")
    return subprocess.run(["unshare", "--net", sys.executable, VALIDATOR], input=yaml.safe_dump_all(docs),
                          capture_output=True, text=True, timeout=120)


def test_the_base_renders_to_what_noded_needs_and_validates_offline(variant):
    _, rendered = variant
    assert sorted(d["kind"] for d in rendered) == ["ConfigMap", "DaemonSet", "Namespace", "Service",
                                                  "ServiceAccount", "ServiceMonitor"]
    assert {d["metadata"].get("namespace") for d in rendered if d["kind"] != "Namespace"} == {"noded"}
    run = validate_offline(rendered)
    assert run.returncode == 0 and run.stdout == "", run.stdout + run.stderr


def _daemonset_pod(docs):
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]


BREAKAGES = {
    # a misspelt field: strict schemas refuse what the API server would drop or refuse
    "DaemonSet: hostPid": (lambda d: _daemonset_pod(d).update(hostPid=True), "'hostPid' was unexpected"),
    "DaemonSet: hostPath type a number": (
        lambda d: _daemonset_pod(d)["volumes"][1]["hostPath"].update(type=3), "/hostPath/type: 3 is not of type"),
    "DaemonSet: no containers": (lambda d: _daemonset_pod(d).pop("containers"), "'containers' is a required"),
    "Service: port a string": (lambda d: one(d, "Service")["spec"]["ports"][0].update(port="9464"),
                               "/spec/ports/0/port: '9464' is not of type 'integer'"),
    "ServiceMonitor: port a number": (
        lambda d: one(d, "ServiceMonitor")["spec"]["endpoints"][0].update(port=9464),
        "ServiceMonitor/noded: /spec/endpoints/0/port: must be string"),
    "ServiceMonitor: interval not a duration": (
        lambda d: one(d, "ServiceMonitor")["spec"]["endpoints"][0].update(interval="15 s"),
        "/spec/endpoints/0/interval: must match pattern"),
    "ServiceMonitor: no selector": (lambda d: one(d, "ServiceMonitor")["spec"].pop("selector"),
                                    "ServiceMonitor/noded: /spec: must have required property selector"),
    "an unknown kind": (lambda d: d.append({"apiVersion": "example.com/v1", "kind": "Widget",
                                            "metadata": {"name": "w"}}),
                        "Widget/w: Couldn't find schema for kind Widget"),
    "an unknown custom resource": (lambda d: d.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "Widget",
                                                       "metadata": {"name": "w"}}),
                                   "Widget/w: no schema for this custom resource"),
}


def broken(rendered, breakage: str) -> list[dict]:
    docs = copy.deepcopy(rendered)
    BREAKAGES[breakage][0](docs)
    return docs


@pytest.fixture(scope="module")
def each_broken(rendered) -> dict[str, list[str]]:
    """Each breakage's problems as the validator finds them: every breakage checked by one
    run of it (``--each``, offline too), where a run each took 0.7 core-seconds, most of it
    starting Python, kubernetes_validate and Node."""
    need("node")
    sets = {breakage: broken(rendered, breakage) for breakage in BREAKAGES}
    run = subprocess.run(["unshare", "--net", sys.executable, VALIDATOR, "--each"], input=json.dumps(sets),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    found = json.loads(run.stdout)
    assert sorted(found) == sorted(BREAKAGES), found
    return found


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_manifest_fails_validation_naming_what_and_where(each_broken, breakage):
    found = each_broken[breakage]
    assert found, f"{breakage}: no problem found"  # its own run would have exited 0
    assert BREAKAGES[breakage][1] in "\n".join(found), found


def test_the_validator_exits_1_and_prints_each_problem_for_a_broken_manifest(rendered, each_broken):
    """What a run on one set says (the exit status, a line a problem), as the
    --each run found for it."""
    run = validate_offline(broken(rendered, "Service: port a string"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.splitlines() == each_broken["Service: port a string"], run.stdout


def test_the_parts_agree_with_each_other_and_with_noded_yaml(variant, tmp_path):
    name, rendered = variant
    ds, svc, sm, cm = (one(rendered, k) for k in ("DaemonSet", "Service", "ServiceMonitor", "ConfigMap"))
    pod = ds["spec"]["template"]["spec"]
    [container] = pod["containers"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports.keys()
    for probe in ("livenessProbe", "startupProbe"):  # /healthz: a hung loop still serves /metrics
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # what noded needs of the host
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    assert pod["automountServiceAccountToken"] is False and "hostIPC" not in pod
    assert container["securityContext"]["privileged"] is True

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}  # KeyError: no such volume
    # the config mounted is the ConfigMap kustomize generated (its name carries a hash)
    assert mounts["/etc/noded"]["configMap"]["name"] == cm["metadata"]["name"]
    config_file = tmp_path / "noded.yaml"
    config_file.write_text(cm["data"]["noded.yaml"])
    cfg = load_config(str(config_file))
    assert [(s.kind, s.root) for s in cfg.jobs.sources] == [("kubernetes", VARIANTS[name])]
    assert cfg.metrics.address == "0.0.0.0" and ports["metrics"] == cfg.metrics.port
    # every host path noded reads or writes is the host's own, at the same path: cgroup
    # paths are matched against /proc/PID/cgroup, originals are recorded by host path, and
    # jobs reach the sockets under runtime_dir
    host_paths = {path: v["hostPath"]["path"] for path, v in mounts.items() if "hostPath" in v}
    assert all(inside == host for inside, host in host_paths.items()), host_paths
    for needed in [cfg.state_dir, cfg.runtime_dir, cfg.resctrl.root, "/run/noded-locks",
                   cfg.colocation.mps.log_dir, cfg.mps_pipe_dir, os.path.dirname(cfg.admin_socket)] \
            + [s.root for s in cfg.jobs.sources]:
        assert any(needed == p or needed.startswith(p + "/") for p in host_paths), f"{needed} is not mounted"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NUMBA_CACHE_DIR"].startswith(cfg.state_dir + "/")  # the root file system is read-only


def test_the_configmaps_noded_yaml_passes_check_config_on_a_cgroup_v2_node(rendered, tmp_path):
    """As on the node it is meant for: the cgroup v2 hierarchy at /sys/fs/cgroup (mounted
    in a mount namespace of this test's own; this machine's own is v1)."""
    config_file = tmp_path / "noded.yaml"
    config_file.write_text(one(rendered, "ConfigMap")["data"]["noded.yaml"])
    noded = os.path.join(os.path.dirname(sys.executable), "noded")
    script = 'umount -R -l /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && exec "$0" check-config "$1"'
    run = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, noded,
                          str(config_file)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == f"{config_file}: ok", run.stdout + run.stderr
    if filesystem_type("/sys/fs/cgroup") not in CGROUP_FILESYSTEMS:
        # and on a v1 tree (this development machine's), where that root is no hierarchy,
        # it says so and fails
        run = subprocess.run([noded, "check-config", str(config_file)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 1 and "jobs.sources[0].root: /sys/fs/cgroup is not in a cgroup hierarchy" \
            in run.stderr


def test_the_v1_overlays_noded_yaml_passes_check_config_on_this_machines_v1_tree(tmp_path):
    if not os.path.isdir("/sys/fs/cgroup/cpuset/") or os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        pytest.skip("this machine has no cgroup v1 cpuset hierarchy")
    config_file = tmp_path / "noded.yaml"
    config_file.write_text(one(render("overlays/cgroup-v1"), "ConfigMap")["data"]["noded.yaml"])
    noded = os.path.join(os.path.dirname(sys.executable), "noded")
    run = subprocess.run([noded, "check-config", str(config_file)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == f"{config_file}: ok", run.stdout + run.stderr


def test_the_readmes_pod_name_join_gives_each_pod_jobs_namespace_and_name(tmp_path):
    """The README's PromQL joining a pod's job with kube-state-metrics' kube_pod_info on
    the UID, run by promtool over series shaped as both exporters write them."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    section = text[text.index("### Kubernetes"):]
    [query] = [line for line in section.split("\n## ", 1)[0].splitlines() if line.startswith("label_replace(")]
    uid = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f'noded_job_throttle_level{{instance="10.0.0.5:9464",job="noded",node="gpu-1",'
                       f'job_id="k8s:{uid}",method="mba"}}', "values": "2x5"},
            {"series": 'noded_job_throttle_level{instance="10.0.0.5:9464",job="noded",node="gpu-1",'
                       'job_id="slurm:4242",method="mba"}', "values": "1x5"},
            {"series": f'kube_pod_info{{instance="ksm:8080",job="kube-state-metrics",namespace="team-a",'
                       f'pod="train-0",uid="{uid}",node="gpu-1",host_network="false"}}', "values": "1x5"},
            {"series": 'kube_pod_info{instance="ksm:8080",job="kube-state-metrics",namespace="team-b",'
                       'pod="idle-0",uid="ffffffff-0000-0000-0000-000000000000",node="gpu-2",host_network="false"}',
             "values": "1x5"},
        ],
        "promql_expr_test": [{"expr": query, "eval_time": "3m", "exp_samples": [{
            "labels": f'{{instance="10.0.0.5:9464",job="noded",node="gpu-1",job_id="k8s:{uid}",method="mba",'
                      f'uid="{uid}",namespace="team-a",pod="train-0"}}', "value": 2}]}],
    }]}
    path = tmp_path / "join.test.yml"
    path.write_text(yaml.safe_dump(tests))
    run = subprocess.run([need("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
