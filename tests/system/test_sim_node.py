"""The simulated node and noded as separate processes (issue #14, items 2 and 3):
`noded sim-node` prints what another process needs; a plain Python process sees its GPUs
through the real pynvml; `noded run --config` started as systemd starts it (no simulation
code in its process) finds the node's jobs in their cgroups, sees the GPU jobs and
throttles the hog; each stops clean, and a killed simulated node leaves nothing running
or mounted (its empty cgroups go at the next start)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from support.system import CPUSET, leftovers, running_daemon, running_node, scrape, start_sim_node

from support.waiting import wait_for

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(not os.path.isdir(CPUSET), reason="no v1 cpuset hierarchy")]


def test_a_separate_daemon_on_the_simulated_node_sees_its_gpu_jobs_and_throttles_the_hog(tmp_path):
    with running_node(tmp_path) as env:
        nvml = {k: env[k] for k in ("LD_LIBRARY_PATH", "NODED_SIM_NVML")}
        seen = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import json, pynvml
            pynvml.nvmlInit()
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                out.append([pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetUUID(h),
                            [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]])
            print(json.dumps(out))
        """)], env={**os.environ, **nvml}, capture_output=True, text=True, timeout=30, cwd="/")
        gpus = json.loads(seen.stdout)
        assert len(gpus) == 4 and all(name == "NVIDIA A100-SXM4-80GB" and uuid.startswith("GPU-")
                                      for name, uuid, _ in gpus)
        with running_daemon(env) as url:
            bert, hog = "cgroup:bert", "cgroup:hog"  # the node's jobs by their cgroups' names
            wait_for(lambda: re.search(rf'noded_job_gpu_utilization_ratio{{[^}}]*job_id="{re.escape(bert)}"',
                                       scrape(url)), timeout=30, interval=0.25, what="the GPU job seen through the library")
            wait_for(lambda: re.search(rf'noded_job_throttle_level{{job_id="{re.escape(hog)}",method="mba"}} [1-9]',
                                       scrape(url)), timeout=60, interval=0.25, what="the hog throttled")


def test_a_killed_simulated_node_leaves_nothing_running_or_mounted(tmp_path):
    node, env = start_sim_node(tmp_path)
    top = env["NODED_SIM_CGROUP"]

    def job_pids() -> list[int]:
        pids = []
        for d in os.listdir(top):
            if os.path.isdir(os.path.join(top, d)):
                with open(os.path.join(top, d, "cgroup.procs")) as f:
                    pids += [int(p) for p in f.read().split()]
        return pids

    wait_for(lambda: len(job_pids()) >= 2, timeout=30, what="the scenario's first jobs in their cgroups")
    jobs = job_pids()
    node.kill()
    node.wait()

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True

    wait_for(lambda: all(map(gone, jobs)), timeout=10, what="the jobs dead with their node")
    wait_for(lambda: not any(env["NODED_SIM_RESCTRL"] in line for line in open("/proc/mounts")), timeout=15,
             what="the emulator unmounted")
    # a dying process cannot remove its cgroups: the next simulated node does (this call's,
    # or one another test's node made at its start meanwhile: they run beside this one)
    from nodesim.sim_node import remove_stale_cgroups

    removed = remove_stale_cgroups(CPUSET)
    assert (top in removed or not os.path.exists(top)) and leftovers(env) == [], (removed, leftovers(env))
