"""Intel's pqos (intel-cmt-cat, Debian's 4.5; the OS interface, ``pqos -I``) against the
resctrl emulator: a tool operators already run on RDT hosts must find the kernel it
expects. Each result is compared with what the kernel's documentation
(Documentation/filesystems/resctrl.rst) and source (fs/resctrl/rdtgroup.c, ctrlmondata.c)
say, read back from the emulator's files.

Each pqos command runs in a mount namespace of its own (tests/support/pqos.py): nothing
on the host changes. What pqos learns from CPUID (vendor, cache geometry) cannot be faked,
so the emulator takes this machine's L3 domains and a profile of this machine's vendor.
"""

import os
import re

import pytest

from support.pqos import PQOS_MISSING, PqosHarness, host_profile
from resctrl.cpulist import parse_cpu_list
from nodesim.resctrl_emulator import MountedEmulator
from nodesim.resctrl_emulator.topology import read_host_topology

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(PQOS_MISSING is not None, reason=PQOS_MISSING or "")]


@pytest.fixture
def pqos(tmp_path):
    """Factory: pqos(profile=host's vendor, *emulator args) -> a PqosHarness on a fresh emulator
    with this host's topology, stopped after the test."""
    started = []

    def start(profile=None, *extra_args):
        emu = MountedEmulator(profile or host_profile(), workdir=str(tmp_path / f"emu{len(started)}"),
                              extra_args=list(extra_args), topology="host")
        started.append(emu)
        emu.start()
        return PqosHarness(emu, str(tmp_path / f"pqos{len(started)}"))

    yield start
    for emu in started:
        emu.stop()


def cpus_list(h: PqosHarness, group: str = "") -> set[int]:
    return parse_cpu_list(h.read(os.path.join(group, "cpus_list")))


# ------------------------------------------------------------------ the harness


def test_pqos_starts_on_the_emulator_and_leaves_the_host_alone(pqos):
    lock_before = os.path.exists("/run/lock/libpqos")
    with open("/proc/filesystems") as f:
        filesystems_before = f.read()
    h = pqos()
    r = h.run("-d")
    assert r.returncode == 0, r.output
    assert "L3 CAT" in r.stdout and "Memory Bandwidth Allocation (MBA)" in r.stdout, r.output
    # the namespace's mounts (and pqos's lock file on its tmpfs) ended with it
    with open("/proc/self/mounts") as f:
        assert "noded-pqos" not in f.read()
    with open("/proc/filesystems") as f:
        assert f.read() == filesystems_before
    assert os.path.exists("/run/lock/libpqos") == lock_before


# ------------------------------------------------------------------ discovery


def info(h: PqosHarness, rel: str) -> str:
    return h.read(os.path.join("info", rel)).strip()


def field(output: str, section: str, name: str) -> str:
    """The value of 'name: value' on the first such line after the line naming 'section'."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(section))
    for line in lines[start + 1:]:
        key, sep, value = line.strip().partition(": ")
        if sep and key == name:
            return value
    raise AssertionError(f"no {name!r} after {section!r} in:\n{output}")


def test_discovery_reports_what_info_says(pqos):
    # os_cap.c reads num_closids, cbm_mask, min_cbm_bits, shareable_bits, MB's min_bandwidth,
    # bandwidth_gran and delay_linear, L3_MON's num_rmids and mon_features. Not compared:
    # the "Cache information" block and the L3's way size (pqos reads them with CPUID),
    # and the PMU events (LLC misses, IPC: pqos assumes perf has them without asking).
    h = pqos()
    r = h.run("-D")
    assert r.returncode == 0, r.output
    out = r.stdout
    assert field(out, "L3 CAT", "Num COS") == info(h, "L3/num_closids")
    assert field(out, "L3 CAT", "Max CBM bits") == str(int(info(h, "L3/cbm_mask"), 16).bit_length())
    assert field(out, "L3 CAT", "Min CBM bits") == info(h, "L3/min_cbm_bits")
    assert int(field(out, "L3 CAT", "Ways contention bit-mask"), 16) == int(info(h, "L3/shareable_bits"), 16)
    assert field(out, "Memory Bandwidth Allocation (MBA)", "Num COS") == info(h, "MB/num_closids")
    assert field(out, "Memory Bandwidth Allocation (MBA)", "Granularity") == info(h, "MB/bandwidth_gran")
    assert field(out, "Memory Bandwidth Allocation (MBA)", "Min B/W") == info(h, "MB/min_bandwidth")
    linear = "linear" if info(h, "MB/delay_linear") == "1" else "nonlinear"
    assert field(out, "Memory Bandwidth Allocation (MBA)", "Type") == linear
    events = {"llc_occupancy": "LLC Occupancy (LLC)", "mbm_local_bytes": "Local Memory Bandwidth (LMEM)",
              "mbm_total_bytes": "Total Memory Bandwidth (TMEM)"}
    for event in info(h, "L3_MON/mon_features").split():
        assert field(out, events[event], "max rmid") == info(h, "L3_MON/num_rmids")
    short = h.run("-d")
    assert short.returncode == 0 and "Num COS: " + info(h, "L3/num_closids") in short.stdout, short.output


# ------------------------------------------------------------------ allocation


def host_l3_ids() -> list[int]:
    return list(read_host_topology().domains)


def host_cpus() -> list[int]:
    return sorted(read_host_topology().cpus)


def test_show_names_the_hosts_domains_and_real_class_ids(pqos):
    # With domains other than the host's, pqos could not parse schemata and printed
    # uninitialised memory as class ids ("L3CA COS3948345323 => ERROR").
    h = pqos()
    assert h.run("-e", "llc:1=0x3").returncode == 0
    r = h.run("-s")
    assert r.returncode == 0, r.output
    num_closids = int(info(h, "L3/num_closids"))
    classes = [int(c) for c in re.findall(r"L3CA COS(\d+) =>", r.stdout)]
    assert classes == list(range(num_closids)), r.stdout
    assert "ERROR" not in r.stdout
    assert re.search(r"L3CA COS1 => MASK 0x3\b", r.stdout), r.stdout
    l3_ids = {int(i) for i in re.findall(r"L3ID (\d+) =>", r.stdout)}
    assert l3_ids and l3_ids <= set(host_l3_ids()), r.stdout
    # without @ids, pqos sets the class on every L3 domain
    assert h.read("COS1/schemata").splitlines()[0] == "L3:" + ";".join(f"{d}=3" for d in host_l3_ids())


def test_allocation_by_core_and_taking_the_core_back(pqos):
    # The sequence: core 0 to COS1, then back to COS0. Back means a write of the
    # default group's cpus, which takes the CPU from COS1 (cpus_ctrl_write).
    h = pqos()
    r = h.run("-a", "core:1=0")
    assert r.returncode == 0 and "Allocation configuration altered." in r.stdout, r.output
    assert cpus_list(h, "COS1") == {0}
    assert 0 not in cpus_list(h)
    r = h.run("-a", "core:0=0")
    assert r.returncode == 0 and "Allocation configuration altered." in r.stdout, r.output
    assert cpus_list(h, "COS1") == set()
    assert 0 in cpus_list(h)
    assert re.search(r"Core 0, L2ID \d+, L3ID \d+ => COS0", h.run("-s").stdout)


def test_allocation_by_pid(pqos, sleeper):
    h = pqos()
    p = sleeper()
    r = h.run("-a", f"pid:2={p.pid}")
    assert r.returncode == 0 and "Allocation configuration altered." in r.stdout, r.output
    assert h.read("COS2/tasks").split() == [str(p.pid)]
    assert str(p.pid) not in h.read("tasks").split()
    assert re.search(rf"COS2 => {p.pid}\b", h.run("-s").stdout)
    assert h.run("-a", f"pid:1={p.pid}").returncode == 0  # from one group to another
    assert h.read("COS2/tasks") == "" and h.read("COS1/tasks").split() == [str(p.pid)]


def test_reset_puts_cores_tasks_and_schemata_back(pqos, sleeper):
    h = pqos()
    p = sleeper()
    for args in (["-a", "core:1=0"], ["-a", f"pid:2={p.pid}"], ["-e", "llc:1=0x3"]):
        assert h.run(*args).returncode == 0
    r = h.run("-R")
    assert r.returncode == 0 and "Allocation reset successful" in r.stdout, r.output
    assert cpus_list(h) == set(host_cpus())
    assert cpus_list(h, "COS1") == set()
    assert h.read("COS2/tasks") == ""
    assert str(p.pid) in h.read("tasks").split()
    assert h.read("COS1/schemata") == h.read("schemata")


def test_mbps_mode_allocation(pqos):
    # Under mba_MBps the MB value is a bandwidth in MBps, any u32 (bw_validate); pqos finds
    # the mode from values above 100 and resets to U32_MAX rounded down to the granularity.
    # (The kernel offers mba_MBps on Intel only; pqos's MBps handling reads no vendor.)
    h = pqos("intel-mbps")
    r = h.run("-e", "mba_max:1=2000")
    assert r.returncode == 0 and "MBA COS1 => 2000 MBps" in r.stdout, r.output
    l3_ids = host_l3_ids()
    assert h.read("COS1/schemata").splitlines()[-1] == "MB:" + ";".join(f"{d}=2000" for d in l3_ids)
    assert "MBA COS1 => 2000 MBps" in h.run("-s").stdout
    assert "CTRL: enabled" in h.run("-d").stdout
    assert h.run("-R").returncode == 0
    assert h.read("COS1/schemata").splitlines()[-1] == "MB:" + ";".join(f"{d}=4294967290" for d in l3_ids)


def test_kernel_refusals_reach_pqos_with_the_kernels_status(pqos):
    # cbm_validate: a mask wider than cbm_mask is EINVAL, "Mask out of range"; nothing applied.
    h = pqos()
    too_wide = int(info(h, "L3/cbm_mask"), 16) + 1
    r = h.run("-e", f"llc:1={too_wide:#x}")
    assert r.returncode != 0 and "Allocation configuration error!" in r.stdout, r.output
    assert info(h, "last_cmd_status") == "Mask out of range"
    assert h.read("COS1/schemata") == h.read("schemata")


# ------------------------------------------------------------------ monitoring


def has_pmu() -> bool:
    """Whether perf can count this CPU's hardware events (LLC misses, cycles, instructions)."""
    return os.path.exists("/sys/bus/event_source/devices/cpu/events/cache-misses")


NO_PMU = ("this machine has no hardware performance counters (no "
          "/sys/bus/event_source/devices/cpu/events/cache-misses): pqos's IPC and LLC-miss "
          "events come from perf, not resctrl, and cannot be emulated")


def perf_flags() -> list[str]:
    return [] if has_pmu() else ["--disable-mon-ipc", "--disable-mon-llc_miss"]


def monitor_rows(output: str, pid: int) -> list[dict[str, float]]:
    """pqos's text table: each row of the PID, column name -> value."""
    rows, header = [], []
    for line in output.splitlines():
        words = line.split()
        if words[:1] == ["PID"]:
            header = words
        elif words[:1] == [str(pid)] and header:
            rows.append({name: float(v) for name, v in zip(header[2:], words[2:])})
    return rows


def test_monitoring_by_pid_reads_the_pids_traffic(pqos, sleeper):
    # pqos -p makes a MON group for the task (mon_groups/pqos-*), reads its mon_data, and
    # removes it at the end: the task is back in its control group with that group's RMID.
    h = pqos()
    p = sleeper()
    assert h.run("-a", f"pid:1={p.pid}").returncode == 0
    h.emu.control.set_demand(p.pid, 1e9)  # 1 GB/s, 90 % of it local (the emulator's model)
    r = h.run(*perf_flags(), "-p", f"all:{p.pid}", "-t", "6", "-i", "10")
    assert r.returncode == 0, r.output
    assert "LLC[KB]" in r.stdout and "MBL[MB/s]" in r.stdout, r.output
    # pqos's first row spans its start; the rates are the mean of the rows after it. Remote is
    # total less local, each read at its own moment: a pqos starved between the two reads
    # moves the difference's bytes between one row and the next (one second read 26 MB/s
    # remote, its neighbour more), and over the rows together that cancels but at the ends.
    rows = monitor_rows(r.stdout, p.pid)[1:]
    assert len(rows) >= 4, r.stdout
    llc_kb = rows[-1]["LLC[KB]"]
    mbl, mbr = (sum(row[name] for row in rows) / len(rows) for name in ("MBL[MB/s]", "MBR[MB/s]"))
    # pqos's MB is 2**20 bytes; local 0.9 GB/s, remote 0.1 GB/s
    assert 0.9e9 / 2**20 * 0.8 < mbl < 0.9e9 / 2**20 * 1.2, r.stdout
    assert 0.1e9 / 2**20 * 0.5 < mbr < 0.1e9 / 2**20 * 1.5, r.stdout
    assert llc_kb > 0
    assert os.listdir(os.path.join(h.emu.root, "COS1", "mon_groups")) == []
    assert h.read("COS1/tasks").split() == [str(p.pid)]
    cos1_rmid = h.emu.control.task(p.pid)["rmid"]
    other = sleeper()
    h.run("-a", f"pid:1={other.pid}")
    assert h.emu.control.task(other.pid)["rmid"] == cos1_rmid


def test_monitoring_with_perf_events(pqos, sleeper):
    if not has_pmu():
        pytest.skip(NO_PMU)
    h = pqos()
    p = sleeper()
    r = h.run("-p", f"all:{p.pid}", "-t", "1", "-i", "10")
    assert r.returncode == 0 and "IPC" in r.stdout, r.output


def test_monitoring_by_core_cleans_up_its_groups(pqos):
    # pqos -m monitors CPUs through MON groups that own them (cpus_mon_write); at the end
    # it removes them and the CPUs are their control group's alone again.
    h = pqos()
    cores = ",".join(str(c) for c in host_cpus())
    r = h.run(*perf_flags(), "-m", f"all:{cores}", "-t", "1", "-i", "10")
    assert r.returncode == 0 and "MBL[MB/s]" in r.stdout, r.output
    assert os.listdir(os.path.join(h.emu.root, "mon_groups")) == []
    assert cpus_list(h) == set(host_cpus())
