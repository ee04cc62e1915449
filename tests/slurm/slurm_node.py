"""A one-host Slurm beside a simulated GPU node and noded, as a site runs them: what the
end-to-end Slurm tests and the Slurm benchmark share.

* the simulated node (``nodesim.node.SimNode``, in this process, stepped by a thread):
  the resctrl emulator (no MBA: noded throttles by halving a job's CPUs), one GPU behind
  the stand-in NVML library, the MPS stand-in; a Slurm job's process is *adopted* by it
  (``adopt``) so that its bandwidth (a CPU job's) or its GPU and the utilisation
  contention leaves it (a GPU job's) are modelled as for the node's own jobs;
* noded, a process of its own (``noded run --config``), its jobs found by the ``slurm``
  job source on this machine's cpuset hierarchy, co-location on;
* Slurm (``slurm_cluster.SlurmCluster``) with the shipped hooks (integrations/slurm/) as
  its Prolog, Epilog and TaskProlog, pointed at this noded by a hooks config file.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading

import yaml

from nodesim.launch import Lines, spawn, stop
from slurm_cluster import CPUSET, SlurmCluster, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOKS = os.path.join(REPO, "integrations", "slurm")
PEAK_GBPS = 10.0
#: a profile for the admission tests (compact profile format: model -> batch size -> C, M, window)
PROFILES = "BiDAF: {32: {C: 12.0e6, M: 10.0e6, window_us: 1.0e6}}\n"


class SlurmNode:
    def __init__(self, workdir: str, *, on_refusal: str = "hold", tick_s: float = 0.25,
                 contention: dict | None = None, timed_prolog: bool = False):
        """``tick_s`` and ``contention``: noded's (default: fast reactions, for tests);
        ``timed_prolog``: the Prolog's wrapper records each run's wall time in
        ``prolog_timings`` (job id, mode, ns), and runs the hook only while ``prolog_mode``
        is not "off" (``set_prolog_mode``): a benchmark's baseline on the same Slurm."""
        from nodesim.node import SimNode
        from nodesim.scenario import NodeSpec, Scenario

        self.dir = workdir
        os.chmod(workdir, 0o755)
        self.tick_s = tick_s
        self.contention = {"hold_s": 2, "settle_s": 0.5} if contention is None else contention
        self.timed_prolog = timed_prolog
        self.prolog_timings = os.path.join(workdir, "prolog-timings")
        self.prolog_mode = os.path.join(workdir, "prolog-mode")
        self.sim = SimNode(Scenario(duration_s=86400, events=(),
                                    node=NodeSpec(profile="no-mba", gpus=1, peak_gbps=PEAK_GBPS), tick_s=0.1),
                           workdir=workdir)
        self.on_refusal = on_refusal
        self.env_dir = os.path.join(workdir, "slurm-env")
        self.record_dir = os.path.join(workdir, "slurm-records")  # the Prolog's records, for the Epilog
        self.hooks_conf = os.path.join(workdir, "slurm-hooks.conf")
        self.daemon: subprocess.Popen | None = None
        self.slurm: SlurmCluster | None = None
        self._stop = threading.Event()
        self._stepper: threading.Thread | None = None
        self.lock = threading.Lock()  # the stepper and adopt/release take turns on the node

    # -- lifecycle
    def start(self) -> "SlurmNode":
        try:
            self.sim.start()
            self._stepper = threading.Thread(target=self._step, daemon=True)
            self._stepper.start()
            self._start_daemon()
            self.write_hooks_conf(self.on_refusal)
            self.slurm = SlurmCluster(self.dir, prolog=self._wrapper("prolog"), epilog=self._wrapper("epilog"),
                                      task_prolog=self._wrapper("task-prolog")).start()
        except BaseException:
            self.stop()
            raise
        return self

    def _step(self) -> None:
        while not self._stop.wait(0.1):
            with self.lock:
                self.sim.step()

    def config(self) -> dict:
        from nodesim.mps_standin import write_launcher

        with open(os.path.join(self.dir, "profiles.yaml"), "w") as f:
            f.write(PROFILES)
        assert self.sim.emu is not None
        return {
            "tick_s": self.tick_s, "metrics": {"address": "127.0.0.1", "port": 0},
            "contention": self.contention,
            "peak_gbps_per_domain": PEAK_GBPS, "state_dir": os.path.join(self.dir, "state"),
            "runtime_dir": os.path.join(self.dir, "run"),
            "resctrl": {"root": self.sim.emu.root, "mounts": self.sim.emu.mounts_file},
            "jobs": {"sources": [{"kind": "slurm", "root": CPUSET}]},
            "colocation": {"enabled": True, "profiles": os.path.join(self.dir, "profiles.yaml"),
                           "mps": {"control": write_launcher(self.dir), "log_dir": os.path.join(self.dir, "mps-log")}},
        }

    def _start_daemon(self) -> None:
        path = os.path.join(self.dir, "noded.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(self.config(), f)
        self.socket = os.path.join(self.dir, "run", "noded.sock")
        self.daemon = spawn(["run", "--config", path], stderr=subprocess.STDOUT, cwd="/",
                            env={**os.environ, **self.sim.nvml_env})
        Lines(self.daemon.stdout).wait_for(lambda line: "admin socket at" in line, "noded's admin socket", 90)

    def write_hooks_conf(self, on_refusal: str) -> None:
        """The site's hooks config (read by each hook run: a change holds from the next job)."""
        partial = self.hooks_conf + ".tmp"
        with open(partial, "w") as f:
            f.write(f"NODED_SOCKET={self.socket}\nNODED_SLURM_ON_REFUSAL={on_refusal}\n"
                    f"NODED_SLURM_ENV_DIR={self.env_dir}\nNODED_SLURM_RECORD_DIR={self.record_dir}\n")
        os.chmod(partial, 0o644)
        os.replace(partial, self.hooks_conf)

    def _wrapper(self, hook: str) -> str:
        """The shipped hook, with this test's hooks config and Python (a site's are in /etc/noded
        and /opt/noded)."""
        path = os.path.join(self.dir, f"{hook}.sh")
        head = f"#!/bin/sh\nexport NODED_SLURM_HOOKS_CONF={self.hooks_conf} NODED_PYTHON={sys.executable}\n"
        with open(path, "w") as f:
            if hook == "prolog" and self.timed_prolog:
                self.set_prolog_mode("on")
                # `read` is the shell's own: the baseline ("off") pays the same forks (two dates)
                f.write(head + f"read mode < {self.prolog_mode}\nt0=$(date +%s%N)\n"
                        f"[ \"$mode\" = off ] || {os.path.join(HOOKS, hook)}\nt1=$(date +%s%N)\n"
                        f"echo \"$SLURM_JOB_ID $mode $((t1 - t0))\" >> {self.prolog_timings}\nexit 0\n")
            else:
                f.write(head + f"exec {os.path.join(HOOKS, hook)}\n")
        os.chmod(path, 0o755)
        return path

    def set_prolog_mode(self, mode: str) -> None:
        with open(self.prolog_mode, "w") as f:
            f.write(mode + "\n")

    def prolog_time(self, job_id: str) -> tuple[str, int] | None:
        """(mode, ns) of job ``job_id``'s Prolog run, once it ran (``timed_prolog``)."""
        try:
            with open(self.prolog_timings) as f:
                for line in f:
                    j, mode, ns = line.split()
                    if j == job_id:
                        return mode, int(ns)
        except FileNotFoundError:
            pass
        return None

    def stop(self) -> None:
        if self.slurm is not None:
            self.slurm.stop()
            self.slurm = None
        if self.daemon is not None:
            stop(self.daemon)  # SIGTERM, then SIGKILL past 60 s
        self._stop.set()
        if self._stepper is not None:
            self._stepper.join()
        self.sim.stop()

    def __enter__(self) -> "SlurmNode":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- noded
    def scontrol_update(self, job_id: str, **fields: str) -> None:
        """``scontrol update JobId=N Field=value ...``, as a job's submitter may run it."""
        argv = ["scontrol", "update", f"JobId={job_id}", *(f"{k}={v}" for k, v in fields.items())]
        r = subprocess.run(argv, env=self.slurm.env, capture_output=True, text=True, timeout=30)
        if r.returncode != 0 or r.stderr.strip():
            raise AssertionError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr}")

    def ask(self, command: str, **args):
        from noded.admin.request import request

        return request(self.socket, command, args, timeout=10)

    def noded_job(self, job: str) -> dict | None:
        """noded's last look at ``job`` (``nodectl jobs``' entry), or None where it has none."""
        return next((j for j in self.ask("jobs") if j["job"] == job), None)

    # -- Slurm jobs
    def job_pids(self, job_id: str) -> set[int]:
        pids: set[int] = set()
        for cgroup in self.slurm.job_cgroups(job_id):
            if cgroup.startswith(CPUSET + "/"):
                for dirpath, _dirs, files in os.walk(cgroup):
                    if "cgroup.procs" in files:
                        with contextlib.suppress(FileNotFoundError):
                            pids.update(int(p) for p in open(os.path.join(dirpath, "cgroup.procs")).read().split())
        return pids

    def job_cpuset(self, job_id: str) -> str:
        cgroup = next(c for c in self.slurm.job_cgroups(job_id) if c.startswith(CPUSET + "/"))
        with open(os.path.join(cgroup, "cpuset.cpus")) as f:
            return f.read().strip()

    def adopt(self, sim_id: str, job_id: str, **spec) -> int:
        """Slurm job ``job_id``'s process (once it runs) modelled by the simulated node as
        ``JobSpec(sim_id, **spec)``; its pid."""
        from nodesim.scenario import JobSpec

        pid = min(wait_for(lambda: self.job_pids(job_id), 30, what=f"a process in Slurm job {job_id}"))
        with self.lock:
            self.sim.adopt(JobSpec(sim_id, **spec), pid)
        return pid

    def release(self, sim_id: str) -> None:
        with self.lock:
            self.sim.release(sim_id)


def job_output(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def parse_exports(text: str) -> dict[str, str]:
    return dict(re.findall(r"^(\w+)=(.*)$", text, re.M))
