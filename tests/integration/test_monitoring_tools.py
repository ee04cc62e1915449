"""The tools operators already run on GPU hosts, unmodified, against `noded sim-node` (issue
#24, item 1): gpustat (text and --json) and nvitop (once-mode text and its Python API) see
the simulated GPUs with their names, memory, utilisation, temperature and power, and the
simulated jobs' processes by pid. Each tool runs as its own process with only the node's
NVML environment, as a developer would point it at the node."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from support.system import CPUSET, running_node, shared_node

from support.waiting import wait_for

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(not os.path.isdir(CPUSET), reason="no v1 cpuset hierarchy")]

A100_MIB = 80 * 1024


def needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed (pip install -e '.[test]')")


def tool(env: dict[str, str], *argv: str) -> str:
    """``python -m argv...`` with the node's NVML environment; its stdout (it must succeed)."""
    nvml = {k: env[k] for k in ("LD_LIBRARY_PATH", "NODED_SIM_NVML")}
    done = subprocess.run([sys.executable, *argv], env={**os.environ, **nvml, "COLUMNS": "120"}, cwd="/",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def job_pids(env: dict[str, str]) -> set[int]:
    """Every process in the simulated jobs' cgroups."""
    top, pids = env["NODED_SIM_CGROUP"], set()
    for d in os.listdir(top):
        if os.path.isdir(os.path.join(top, d)):
            with open(os.path.join(top, d, "cgroup.procs")) as f:
                pids |= {int(p) for p in f.read().split()}
    return pids


def gpu_processes(env: dict[str, str]) -> dict[int, set[int]]:
    """GPU index -> the pids the node publishes on it now (what NVML lists)."""
    node = shared_node(env).published
    return {i: {node.gpus[i].procs[k].pid for k in range(node.gpus[i].nprocs)} for i in range(node.gpu_count)}


def busy_node(env: dict[str, str]) -> dict[int, set[int]]:
    """Waits until the scenario's GPU jobs run (their processes published, and busy)."""
    def ready():
        procs = gpu_processes(env)
        node = shared_node(env).published
        busy = {i for i, p in procs.items() if p and node.gpus[i].util_gpu > 0}
        return procs if busy and all(p <= job_pids(env) for p in procs.values()) else None
    return wait_for(ready, timeout=30, interval=0.1, what="the scenario's GPU jobs running")


@needs("gpustat")
def test_gpustat_shows_the_simulated_gpus_and_the_jobs_processes(tmp_path):
    with running_node(tmp_path) as env:
        procs = busy_node(env)
        busy = sorted(i for i, p in procs.items() if p)
        report = json.loads(tool(env, "-m", "gpustat", "--json"))
        assert report["driver_version"] == "550.54.15"
        gpus = report["gpus"]
        assert [g["index"] for g in gpus] == list(range(len(procs)))
        for g in gpus:
            i = g["index"]
            assert g["name"] == "NVIDIA A100-SXM4-80GB" and g["uuid"].startswith("GPU-")
            assert g["memory.total"] == A100_MIB
            assert {p["pid"] for p in g["processes"]} == procs[i]
            assert g["memory.used"] == sum(p["gpu_memory_usage"] for p in g["processes"])
            assert 32 <= g["temperature.gpu"] < 90 and g["fan.speed"] is None  # passively cooled: N/A
            assert g["enforced.power.limit"] == 400 and 60 <= g["power.draw"] <= 400
            if i in busy:
                assert g["utilization.gpu"] > 0 and g["power.draw"] > 60
            else:
                assert g["utilization.gpu"] == 0 and g["power.draw"] == 60 and g["processes"] == []
        text = tool(env, "-m", "gpustat", "--no-color", "-p")
        for i, p in procs.items():
            line = next(line for line in text.splitlines() if line.startswith(f"[{i}]"))
            assert "NVIDIA A100-SXM4-80GB" in line and f"/ {A100_MIB} MB" in line
            assert set(map(int, re.findall(r"/(\d+)\(", line))) == p  # root/PID(MEM)


@needs("nvitop")
def test_nvitop_once_mode_draws_every_gpu_with_its_sensors_and_the_jobs_processes(tmp_path):
    with running_node(tmp_path) as env:
        procs = busy_node(env)
        text = tool(env, "-m", "nvitop", "-1", "--only-compute")
        assert "Driver Version: 550.54.15" in text and "CUDA Driver Version: 12.4" in text
        # each GPU: its name, persistence on, bus id, then fan N/A, temperature, P0, power / limit
        assert len(re.findall(r"│\s+\d+\s+A100-SXM4-80GB\s+On │ 0000000\d:[0-9A-F]{2}:00\.0 Off", text)) == len(procs)
        sensors = re.findall(r"│ N/A\s+(\d+)C\s+P0\s+(\d+)W / 400W │", text)
        assert len(sensors) == len(procs) and all(32 <= int(t) < 90 and 60 <= int(w) <= 400 for t, w in sensors)
        # the process table: GPU, PID, C (compute), user, GPU memory
        shown = {int(pid): int(gpu) for gpu, pid in re.findall(r"│\s+(\d+)\s+(\d+) C\s+\S+\s+\d+MiB", text)}
        assert shown == {pid: gpu for gpu, pids in procs.items() for pid in pids}


@needs("nvitop")
def test_nvitops_python_api_reads_devices_and_the_jobs_processes(tmp_path):
    with running_node(tmp_path) as env:
        procs = busy_node(env)
        out = json.loads(tool(env, "-c", textwrap.dedent("""
            import json
            from nvitop import Device
            out = []
            for d in Device.all():
                out.append({"name": d.name(), "total": d.memory_total(), "util": d.gpu_utilization(),
                            "temp": d.temperature(), "power": d.power_usage(), "limit": d.power_limit(),
                            "fan": d.fan_speed(), "clocks": list(d.clock_infos()), "pstate": d.performance_state(),
                            "graphics": [p.pid for p in d.processes().values() if p.type == "G"],
                            "pids": sorted(d.processes()), "bus_id": d.bus_id()})
            print(json.dumps(out))
        """)))
        assert len(out) == len(procs)
        for i, d in enumerate(out):
            assert d["name"] == "NVIDIA A100-SXM4-80GB" and d["total"] == A100_MIB << 20
            assert set(d["pids"]) == procs[i] and d["graphics"] == []
            assert isinstance(d["temp"], int) and d["fan"] == "N/A" and d["limit"] == 400_000
            assert 60_000 <= d["power"] <= 400_000 and d["pstate"] == "P0"
            assert d["clocks"][2] == 1593  # HBM2e's clock, busy or not
            assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", d["bus_id"])
