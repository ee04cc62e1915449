"""bench.daemon_cost's host estimate: noded's resctrl sampler over a tmpfs copy of the mount
reads what it reads on the mount (the goal's verdict rests on it); bench.host_costs, the
terms only a real host can measure."""

import collections
import json
import math
import os
import subprocess
import sys

import pytest

from bench.bare_tick import mbm_files
from bench.daemon_cost import MirrorSampler, mirror_resctrl
from support.system import REPO
from nodesim.nvml_lib import library_dir
from nodesim.nvml_shm import ENV, GpuState, NodeState, SharedGpus
from resctrl.mbm import parse_counter

pytestmark = pytest.mark.fuse


def test_the_mirror_holds_the_mounts_counters_and_the_sampler_reads_noded_groups_there(emulator, open_resctrl,
                                                                                         tmp_path):
    emu = emulator("intel")
    rc = open_resctrl(emu)
    level = rc.create_ctrl_group("noded-mba-1")
    for name in ("noded-job-a", "noded-job-b"):
        rc.root_group().create_mon_group(name)
    level.create_mon_group("noded-job-c")
    os.mkdir(os.path.join(emu.root, "mon_groups", "someone-elses"))  # not noded's: not sampled
    mirror = str(tmp_path / "mirror")
    mirror_resctrl(emu.root, mirror)

    assert not os.path.exists(os.path.join(mirror, "info"))
    mounted, copied = mbm_files(emu.root), mbm_files(mirror)
    assert [os.path.relpath(f, mirror) for f in copied] == [os.path.relpath(f, emu.root) for f in mounted]
    for f in copied:
        with open(f) as counter:
            parse_counter(counter.read())  # a counter's content, as the kernel gives it

    on_mirror = MirrorSampler(mirror, rc.caps)
    assert on_mirror.sample_cpu_s() > 0
    sample = on_mirror.last
    assert set(sample.job_bps) == {"noded-job-a", "noded-job-b", "noded-job-c"}
    assert None not in sample.node_bps.values()  # every counter found and read
    # what it read (observed) over one thin cycle, as noded reads a quiet node: the 2 control
    # groups' counters on every domain each sample, each of the 3 job groups' at least once,
    # a share of the jobs a sample; none of the foreign group's
    domains = os.listdir(os.path.join(emu.root, "mon_data"))
    read, cycle = on_mirror.files, on_mirror.cycle
    times = collections.Counter(read)
    jobs = [f for f in times if "/mon_groups/" in f]
    ctrl = [f for f in times if "/mon_groups/" not in f]
    assert cycle > 1 and len(ctrl) == 2 * len(domains) and all(times[f] == cycle for f in ctrl)
    assert len(jobs) == 3 * len(domains)
    assert sum(times[f] for f in jobs) == math.ceil(3 / cycle) * cycle * len(domains)
    assert all(os.path.isfile(f) for f in read)
    assert not any("someone-elses" in f for f in read)
    assert all(f.startswith(mirror + "/") for f in read)  # the copy's, never the mount's


def host_costs(tmp_path, *args, gpus=None):
    """bench.host_costs in a fresh process: with the stand-in NVML publishing ``gpus`` (a
    NodeState), or with no NVML library to be found."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", ENV)}
    node = None
    if gpus is not None:
        node = SharedGpus(str(tmp_path / "nvml.shm"))
        node.publish(gpus)
        env.update({"LD_LIBRARY_PATH": library_dir("current"), ENV: node.path})
    try:
        return subprocess.run([sys.executable, "-m", "bench.host_costs", "--passes", "2", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
    finally:
        if node is not None:
            node.close()


def test_host_costs_times_counters_against_kernfs_files_and_nvml_against_the_stand_in(emulator, open_resctrl,
                                                                                      tmp_path):
    emu = emulator("intel")
    open_resctrl(emu).root_group().create_mon_group("noded-job-a")
    out, dc = tmp_path / "costs.json", tmp_path / "daemon_cost.json"
    dc.write_text(json.dumps({"gpus": 8, "baseline_parts_cpu_s_per_tick": {"nvml": 0.0004}}))
    gpus = NodeState([GpuState(f"GPU-5e3a000{i}-6f1c-4b2e-9d7a-c0ffee00000{i}", processes=[(4242, 1 << 30)])
                      for i in range(2)])
    done = host_costs(tmp_path, "--resctrl", emu.root, "--json", str(out), "--daemon-cost", str(dc),
                      "--kernfs", str(tmp_path / "nothing-*"), "--kernfs", "/proc/self/stat", gpus=gpus)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    counters, nvml = result["counters"], result["nvml"]
    assert counters["files"] == len(mbm_files(emu.root)) == 2 * len(os.listdir(os.path.join(emu.root, "mon_data")))
    assert counters["kernfs_example"] == "/proc/self/stat"  # the first pattern that matched
    assert all(v > 0 for v in counters["per_read_us"].values())
    assert nvml["gpus"] == 2 and nvml["cpu_ms_per_gpu_tick"] > 0 and nvml["stand_in_cpu_ms_per_gpu_tick"] == 0.05
    assert result["skipped"] == []
    expected = counters["noded_extra_cpu_ms_per_tick"] + (nvml["cpu_ms_per_gpu_tick"] - 0.05) * 2
    assert result["add_to_estimate_ms_per_tick"] == pytest.approx(expected)
    assert "add to bench.daemon_cost's host estimate" in done.stdout


def test_host_costs_skips_what_is_missing_and_fails_with_nothing_to_measure(emulator, tmp_path):
    emu = emulator("intel")
    done = host_costs(tmp_path, "--resctrl", emu.root, "--json", str(tmp_path / "a.json"),
                      "--kernfs", "/proc/self/stat")
    assert done.returncode == 0, done.stderr
    assert "NVML: skipped: NVML unavailable (LibraryNotFound)" in done.stdout
    done = host_costs(tmp_path, "--resctrl", str(tmp_path), "--json", str(tmp_path / "b.json"))
    assert done.returncode != 0 and not (tmp_path / "b.json").exists()
    assert f"nothing to measure here: {tmp_path} has no mon_data" in done.stderr and "LibraryNotFound" in done.stderr
