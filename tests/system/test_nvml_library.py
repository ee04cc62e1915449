"""The stand-in libnvidia-ml.so.1 (issue #14, item 1): the real pynvml, unmodified, in a
plain separate process, loads it through LD_LIBRARY_PATH and sees the GPUs the simulated
node publishes in shared memory, with NVIDIA's return codes, texts and quirks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pynvml
import pytest

from nodesim.nvml_lib import library_dir, library_path
from nodesim.nvml_shm import ENV, GpuState, NodeState, SharedGpus, check_layout

UUID0 = "GPU-5e3a0000-6f1c-4b2e-9d7a-c0ffee000000"
UUID1 = "GPU-5e3a0001-6f1c-4b2e-9d7a-c0ffee000001"
GIB = 1 << 30


@pytest.fixture
def shared(tmp_path):
    node = SharedGpus(str(tmp_path / "nvml.shm"))
    yield node
    node.close()


def in_process(shared, script: str, *, variant="current", python=(sys.executable,), env_extra=None, cwd=None) -> dict:
    """Run ``script`` (which sets ``out``) in a fresh Python with the node's environment (in
    ``cwd``); returns ``out``."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", ENV)}
    env.update({"LD_LIBRARY_PATH": library_dir(variant), ENV: shared.path, **(env_extra or {})})
    code = "import json, pynvml\nout = {}\n" + textwrap.dedent(script) + "\nprint(json.dumps(out))\n"
    done = subprocess.run([*python, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def two_gpus(**first) -> NodeState:
    return NodeState([GpuState(UUID0, util_gpu=40, util_memory=12, processes=[(4242, 3 * GIB)], **first),
                      GpuState(UUID1, name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0),
                               mps_server_pid=777, mps_clients=[(501, GIB), (502, 2 * GIB)])])


def test_the_mirror_matches_the_compiled_layout():
    check_layout(library_path("current"))
    check_layout(library_path("no_v3"))


def test_a_plain_process_sees_the_gpus_through_unmodified_pynvml(shared):
    shared.publish(two_gpus())
    out = in_process(shared, """
        pynvml.nvmlInit()
        out["driver"] = pynvml.nvmlSystemGetDriverVersion()
        out["count"] = pynvml.nvmlDeviceGetCount()
        out["gpus"] = []
        for i in range(out["count"]):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            u = pynvml.nvmlDeviceGetUtilizationRates(h)
            m = pynvml.nvmlDeviceGetMemoryInfo(h)
            out["gpus"].append({
                "name": pynvml.nvmlDeviceGetName(h), "uuid": pynvml.nvmlDeviceGetUUID(h),
                "index": pynvml.nvmlDeviceGetIndex(h), "util": [u.gpu, u.memory], "mem": [m.total, m.used, m.free],
                "procs": [[p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)],
                "mps": [[p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h)],
                "cc": list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                "mode": pynvml.nvmlDeviceGetComputeMode(h)})
        out["by_uuid"] = pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(%r))
        pynvml.nvmlShutdown()
    """ % UUID1)
    assert out["driver"] == "550.54.15" and out["count"] == 2 and out["by_uuid"] == 1
    g0, g1 = out["gpus"]
    assert (g0["name"], g0["uuid"], g0["index"], g0["util"], g0["cc"], g0["mode"]) == (
        "NVIDIA A100-SXM4-80GB", UUID0, 0, [40, 12], [8, 0], 0)
    reserved = 531 << 20
    assert g0["mem"] == [80 * GIB, 3 * GIB + reserved, 80 * GIB - 3 * GIB - reserved]
    assert g0["procs"] == [[4242, 3 * GIB]] and g0["mps"] == []
    # under MPS the driver sees the server, holding its clients' memory; the clients apart
    assert g1["procs"] == [[777, 3 * GIB]] and g1["mps"] == [[501, GIB], [502, 2 * GIB]]
    assert g1["name"] == "NVIDIA H100 80GB HBM3" and g1["cc"] == [9, 0]
    idle = in_process(shared, """
        pynvml.nvmlInit()
        out["used"] = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(1)).used
    """)
    assert idle["used"] > 0  # never 0 on a real GPU


def test_process_utilisation_is_samples_with_their_own_timestamps_and_not_found_when_none_is_new(shared):
    t0 = 1_700_000_000_000_000
    shared.record_samples(0, t0, [(4242, 55, 20), (4243, 0, 0)])  # 4243 idle: no sample at all
    shared.record_samples(0, t0 + 500_000, [(4242, 60, 21)])
    shared.publish(two_gpus())
    out = in_process(shared, f"""
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out["all"] = [[s.pid, s.timeStamp, s.smUtil, s.memUtil] for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)]
        out["newer"] = [[s.pid, s.timeStamp] for s in pynvml.nvmlDeviceGetProcessUtilization(h, {t0})]
        try:
            pynvml.nvmlDeviceGetProcessUtilization(h, {t0 + 500_000})
        except pynvml.NVMLError_NotFound as e:
            out["none"] = str(e)
    """)
    assert out["all"] == [[4242, t0, 55, 20], [4242, t0 + 500_000, 60, 21]]
    assert out["newer"] == [[4242, t0 + 500_000]]
    assert out["none"] == "Not Found"


@pytest.mark.parametrize("code, error, text", [
    (15, "NVMLError_GpuIsLost", "GPU is lost"), (3, "NVMLError_NotSupported", "Not Supported"),
    (4, "NVMLError_NoPermission", "Insufficient Permissions"), (999, "NVMLError_Unknown", "Unknown Error"),
    (18, "NVMLError_LibRmVersionMismatch", "RM has detected an NVML/RM version mismatch."),
])
def test_an_injected_fault_is_nvidias_error_with_nvidias_text(shared, code, error, text):
    shared.publish(two_gpus(faults={"utilization": code}))
    out = in_process(shared, """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        try:
            pynvml.nvmlDeviceGetUtilizationRates(h)
        except pynvml.NVMLError as e:
            out["error"], out["text"] = type(e).__name__, str(e)
        out["name"] = pynvml.nvmlDeviceGetName(h)  # only the call with the fault fails
    """)
    assert (out["error"], out["text"], out["name"]) == (error, text, "NVIDIA A100-SXM4-80GB")


def test_every_error_text_is_the_one_nvidias_bindings_know(shared):
    shared.publish(two_gpus())
    out = in_process(shared, """
        pynvml.nvmlInit()
        out["texts"] = {str(code): [known, pynvml.nvmlErrorString(code)]
                        for code, known in pynvml.NVMLError._errcode_to_string.items()}
    """)
    assert len(out["texts"]) >= 20
    assert {code: pair for code, pair in out["texts"].items() if pair[0] != pair[1]} == {}


def test_faults_in_init_count_and_handles_and_a_lost_gpu(shared):
    state = two_gpus()
    state.driver_loaded = False
    shared.publish(state)
    script = """
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            out["init"] = type(e).__name__
    """
    assert in_process(shared, script)["init"] == "NVMLError_DriverNotLoaded"
    state = two_gpus(lost=True)
    state.faults = {"count": 999}
    shared.publish(state)
    out = in_process(shared, """
        pynvml.nvmlInit()
        try:
            pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            out["count"] = type(e).__name__
        try:
            pynvml.nvmlDeviceGetHandleByIndex(0)
        except pynvml.NVMLError as e:
            out["lost"] = type(e).__name__
        out["other"] = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(1))
    """)
    assert out == {"count": "NVMLError_Unknown", "lost": "NVMLError_GpuIsLost", "other": "NVIDIA H100 80GB HBM3"}


def test_without_the_shared_node_the_driver_is_not_loaded(shared):
    out = in_process(shared, """
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            out["init"] = type(e).__name__
    """, env_extra={ENV: shared.path + ".absent"})
    assert out["init"] == "NVMLError_DriverNotLoaded"


def test_a_slow_call_takes_its_time(shared):
    shared.publish(two_gpus(slow_ms={"processes": 300}))
    out = in_process(shared, """
        import time
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        t = time.monotonic()
        pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        out["took"] = time.monotonic() - t
    """)
    assert out["took"] >= 0.3


def test_a_driver_without_the_v3_queries_is_a_library_mismatch(shared):
    shared.publish(two_gpus())
    out = in_process(shared, """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        try:
            pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        except Exception as e:
            out["error"] = type(e).__name__
            out["is_nvml_error"] = isinstance(e, pynvml.NVMLError)
    """, variant="no_v3")
    assert out == {"error": "NVMLLibraryMismatchError", "is_nvml_error": False}


def test_setting_a_compute_mode_needs_root():
    # a directory every user can reach, with what nobody loads there: NVIDIA's pynvml (one
    # file) and the library (the checkout's build may be in a directory only root enters)
    where = tempfile.mkdtemp(prefix="noded-nvml-")
    os.chmod(where, 0o755)
    shutil.copy(pynvml.__file__, os.path.join(where, "pynvml.py"))
    shutil.copy(library_path(), os.path.join(where, "libnvidia-ml.so.1"))
    shared = SharedGpus(os.path.join(where, "nvml.shm"))
    try:
        shared.publish(two_gpus())
        script = """
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            try:
                pynvml.nvmlDeviceSetComputeMode(h, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
                out["set"] = "ok"
            except pynvml.NVMLError as e:
                out["set"] = type(e).__name__
            out["mode"] = pynvml.nvmlDeviceGetComputeMode(h)
        """
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]
        assert in_process(shared, script, python=as_nobody, env_extra={"PYTHONPATH": where, "LD_LIBRARY_PATH": where},
                          cwd=where) == {"set": "NVMLError_NoPermission", "mode": 0}
        assert in_process(shared, script) == {"set": "ok", "mode": 3}
        assert shared.compute_mode(0) == 3 and shared.compute_mode(1) == 0
    finally:
        shared.close()
        shutil.rmtree(where)


def test_a_reader_never_sees_half_a_publish(shared):
    """Two values the writer always changes together are always read together."""
    stop = time.monotonic() + 1.5

    def state(k):
        return NodeState([GpuState(UUID0, util_gpu=k, util_memory=k, processes=[(100 + k, k)])])

    shared.publish(state(0))
    reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import pynvml, sys, time
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        torn = 0
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            u = pynvml.nvmlDeviceGetUtilizationRates(h)
            torn += u.gpu != u.memory
        print(torn)
    """)], env={**os.environ, "LD_LIBRARY_PATH": library_dir(), ENV: shared.path}, stdout=subprocess.PIPE, text=True)
    k = 0
    while reader.poll() is None and time.monotonic() < stop:
        k = (k + 1) % 100
        shared.publish(state(k))
    out, _ = reader.communicate(timeout=30)
    assert reader.returncode == 0 and out.strip() == "0"
