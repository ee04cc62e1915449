"""The contention scenario on this machine: real processes in real cpusets.

The victim runs in a cpuset of its own CPUs, the stressor in one spanning all of
them (on a 2-core host: the victim on CPU 1, the stressor on 0-1), and noded halves
the stressor's cpuset when it acts - a real write to ``cpuset.cpus``, felt by the
victim for real. What this machine lacks is replaced at the lowest boundary only:
resctrl by the emulator (profile ``no-mba``: MBM counters, no MBA, as on a host
whose RDT has no allocation), whose counters integrate the bandwidth each process
reports about itself (no hardware counter exists here to measure it), and NVML by
the stand-in library, with one GPU whose utilisation follows the victim's measured
throughput (solo: ``SOLO_UTIL``). noded runs as a host runs it: ``noded run --config``, a
process of its own (``noded_run.NodedRun``), its CPU measured apart.

On a host with RDT (``resctrl`` given: the host's mount) the emulator is not used:
MBM counts the processes' traffic itself and noded throttles with MBA where the host
has it (``contention.method: auto``), else halves cores. NVML stays the fake GPU:
the victim is a CPU-side pipeline standing in for a training job.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import threading
import uuid
from typing import Callable

from noded.samplers.cpus import read_cpuset_file
from noded.config import Config, JobsConfig, JobSourceConfig, ResctrlConfig
from nodesim.gpus import SimGpus, SimProcess, make_gpus
from nodesim.resctrl_emulator import MountedEmulator

from .noded_run import SCENARIO_CONTENTION, NodedRun, outcome
from .procs import ReportingProcess

GB = 1e9
SOLO_UTIL = 90  # the victim's GPU utilisation when alone (percent)
FEED_S = 0.2  # how often reported rates are passed on to the emulator and the fake GPU


def find_cpuset_root() -> str:
    """The cpuset hierarchy: cgroup v1's cpuset mount, or v2's unified one with the controller."""
    if os.path.exists("/sys/fs/cgroup/cpuset/cpuset.cpus"):
        return "/sys/fs/cgroup/cpuset"
    try:
        with open("/sys/fs/cgroup/cgroup.controllers") as f:
            if "cpuset" in f.read().split():
                return "/sys/fs/cgroup"
    except OSError:
        pass
    raise RuntimeError("no cpuset cgroup hierarchy here (neither /sys/fs/cgroup/cpuset nor v2 with cpuset)")


class Cpusets:
    """A private subtree of the cpuset hierarchy; removed (processes killed) on close."""

    def __init__(self, root: str):
        self.root = root
        self.base = os.path.join(root, f"noded-bench-{uuid.uuid4().hex[:8]}")
        self.made: list[str] = []
        self.v2 = os.path.exists(os.path.join(root, "cgroup.controllers"))

    def _read(self, path: str, name: str) -> str:
        value = read_cpuset_file(path, name)
        if not value:
            raise RuntimeError(f"{path}: no {name}")
        return value

    def make(self, rel: str, cpus: str) -> str:
        if not self.made:
            os.mkdir(self.base)
            self.made.append(self.base)
            if self.v2:
                with open(os.path.join(self.base, "cgroup.subtree_control"), "w") as f:
                    f.write("+cpuset")
            else:
                for name in ("cpuset.cpus", "cpuset.mems"):
                    with open(os.path.join(self.base, name), "w") as f:
                        f.write(self._read(self.root, name))
        path = os.path.join(self.base, rel)
        os.mkdir(path)
        self.made.append(path)
        with open(os.path.join(path, "cpuset.mems"), "w") as f:
            f.write(self._read(self.base, "cpuset.mems"))
        with open(os.path.join(path, "cpuset.cpus"), "w") as f:
            f.write(cpus)
        return path

    def cpus(self, rel: str) -> str:
        return self._read(os.path.join(self.base, rel), "cpuset.cpus")

    def close(self) -> None:
        for path in reversed(self.made):
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        os.kill(int(pid), 9)
            except (OSError, ValueError):
                pass
        for path in reversed(self.made):
            for _ in range(200):  # a killed process leaves its cgroup when it has exited
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    threading.Event().wait(0.01)
        self.made.clear()


class CpusetNode:
    unit = "samples/s"  # what the victim column measures
    key = "cpusets"

    def __init__(self, victim: str, peak_gbps: float, *, victim_cpus: str, stressor_cpus: str,
                 stressor_threads: int, size_mib: int = 256, tick_s: float = 0.5,
                 resctrl: tuple[str, str] | None = None):
        self.resctrl = resctrl  # (root, mounts file) of the host's resctrl; None: the emulator
        self.name = ("this machine (real cpusets, core halving)" if resctrl is None else
                     f"this host (real cpusets, resctrl at {resctrl[0]}: MBA where present)")
        self.victim_name = victim
        self.peak_gbps = peak_gbps
        self.victim_cpus, self.stressor_cpus = victim_cpus, stressor_cpus
        self.stressor_threads = stressor_threads
        self.size_mib = size_mib
        self.tick_s = tick_s
        self.cpusets = Cpusets(find_cpuset_root())
        self.tmp = tempfile.TemporaryDirectory(prefix="noded-bench-")
        self.emu: MountedEmulator | None = None
        self.gpus: SimGpus | None = None
        self.victim: ReportingProcess | None = None
        self.stressor: ReportingProcess | None = None
        self.solo_rate: float | None = None
        self.cells = 0  # noded's runs so far (each a process of its own, its files apart)
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, name="feed", daemon=True)

    def start(self) -> "CpusetNode":
        try:
            victim_cg = self.cpusets.make("victim", self.victim_cpus)
            self.cpusets.make("stressor", self.stressor_cpus)
            if self.resctrl is None:
                self.emu = MountedEmulator("no-mba", workdir=self.tmp.name,
                                           extra_args=["--peak-gbps", str(self.peak_gbps)]).start()
            self.gpus = SimGpus(os.path.join(self.tmp.name, "nvml.shm"), make_gpus(1))  # noded sees it via .env
            self.victim = ReportingProcess("bench.victims", [self.victim_name], cgroup=victim_cg,
                                           cpus=self.victim_cpus)
            if not self.victim.wait_reports(2, timeout=120):
                raise RuntimeError(f"the victim did not report: {self.victim.failure()}")
            self.gpus[0].processes[self.victim.pid] = SimProcess(self.victim.pid, sm_util=SOLO_UTIL)
            self.gpus.publish()
            self._feeder.start()
        except BaseException:
            self.close()
            raise
        return self

    def _feed(self) -> None:
        """Pass each process's reported bandwidth to the emulator, the victim's pace to the GPU."""
        assert self.gpus is not None
        control = self.emu.control if self.emu is not None else None
        sent: dict[int, float] = {}
        while not self._stop.wait(FEED_S):
            if control is not None:  # (a host's MBM counts the traffic itself)
                self._feed_bandwidth(control, sent)
            latest = self.victim.latest() if self.victim else None
            if latest is not None and self.solo_rate:
                util = int(round(min(100, SOLO_UTIL * latest["samples_per_s"] / self.solo_rate)))
                self.gpus[0].processes[self.victim.pid].sm_util = util
                self.gpus[0].util_gpu = util
            self.gpus.publish()  # the driver samples the victim's kernels all the time

    def _feed_bandwidth(self, control, sent: dict[int, float]) -> None:
        for proc, key in ((self.victim, "approx_gbps"), (self.stressor, "achieved_gbps")):
            latest = proc.latest() if proc is not None and proc.proc.poll() is None else None
            if latest is not None and sent.get(proc.pid) != latest[key]:
                control.set_demand(proc.pid, latest[key] * GB, domain=0)
                sent[proc.pid] = latest[key]

    def config(self) -> Config:
        if self.emu is not None:
            resctrl, method = ResctrlConfig(root=self.emu.root, mounts=self.emu.mounts_file), "cores"
        else:
            assert self.resctrl is not None
            resctrl, method = ResctrlConfig(root=self.resctrl[0], mounts=self.resctrl[1]), "auto"
        return Config(
            tick_s=self.tick_s, peak_gbps_per_domain=self.peak_gbps, state_dir=f"{self.tmp.name}/state",
            runtime_dir=f"{self.tmp.name}/run", resctrl=resctrl,
            jobs=JobsConfig(sources=(JobSourceConfig("cgroup", self.cpusets.base, ("victim", "stressor")),)),
            contention=dataclasses.replace(SCENARIO_CONTENTION, method=method))

    def run_cell(self, share: float | None, with_noded: bool, warmup_s: int, seconds: int, progress=None,
                 until: Callable[[], bool] | None = None) -> dict:
        """Victim alone (share None) or beside the stressor at ``share`` of the peak, for
        ``seconds`` of the victim's reports; or fewer where ``until`` (asked after each
        report) holds first: a test's cell ends when what it waits for has happened."""
        assert self.victim is not None
        noded = None
        if with_noded:
            self.cells += 1
            workdir = os.path.join(self.tmp.name, f"noded-{self.cells}")
            os.mkdir(workdir)
            noded = NodedRun(self.config(), self.gpus.env, workdir).start()
        try:
            self.victim.wait_reports(len(self.victim.reports) + warmup_s, timeout=warmup_s + 30)
            if share is not None:
                target = [] if share >= 1 else ["--target-gbps", f"{share * self.peak_gbps:.3f}"]
                self.stressor = ReportingProcess(
                    "bench.stress", ["--threads", str(self.stressor_threads), "--size", str(self.size_mib), *target],
                    cgroup=os.path.join(self.cpusets.base, "stressor"), cpus=self.stressor_cpus)
                if not self.stressor.wait_reports(1, timeout=120):
                    raise RuntimeError(f"the stressor did not report: {self.stressor.failure()}")
            first = len(self.victim.reports)
            for k in range(seconds):
                self.victim.wait_reports(first + k + 1, timeout=30)
                if progress:
                    progress(k + 1, seconds)
                if until is not None and until():
                    break
            victim = self.victim.since(first)
            stressor = self.stressor.since(0) if self.stressor else []
            cpus_during = self.cpusets.cpus("stressor")
        finally:
            if self.stressor is not None:
                self.stressor.stop()
                self.stressor = None
            if noded is not None:
                noded.stop()
        rate = statistics.mean(r["samples_per_s"] for r in victim)
        if share is None and not with_noded:
            self.solo_rate = rate
        node = statistics.mean(r["approx_gbps"] for r in victim) + (
            statistics.mean(r["achieved_gbps"] for r in stressor[1:]) if len(stressor) > 1 else 0.0)
        return {"victim": round(rate, 2), "node_gbps": round(node, 2),
                "victim_per_second": [r["samples_per_s"] for r in victim],
                "stressor_cpus_at_end": cpus_during if share is not None else None, **outcome(noded)}

    def close(self) -> None:
        self._stop.set()
        if self._feeder.is_alive():
            self._feeder.join()
        for proc in (self.stressor, self.victim):
            if proc is not None:
                proc.stop()
        if self.gpus is not None:
            self.gpus.close()
        if self.emu is not None:
            self.emu.stop()
            self.emu = None
        self.cpusets.close()
        self.tmp.cleanup()

    def __enter__(self) -> "CpusetNode":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
