"""The emulator behaves like the kernel's resctrl, seen the way an admin sees it:
through plain shell commands on the mounted filesystem. Each test is also a record
of a kernel behaviour noded relies on (the kernel's Documentation/filesystems/resctrl.rst
and fs/resctrl/)."""

import errno
import os
import subprocess

import pytest

from support.waiting import wait_for
from resctrl.cpulist import format_cpu_list
from nodesim.resctrl_emulator import MountedEmulator

pytestmark = pytest.mark.fuse  # its mounts: one per profile and options, reset between tests (conftest.py)


def sh(cmd: str, cwd: str) -> tuple[int, str, str]:
    p = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


def ok(cmd: str, cwd: str) -> str:
    rc, out, err = sh(cmd, cwd)
    assert rc == 0, f"{cmd!r} failed: {err}"
    return out


def fails(cmd: str, cwd: str, strerror: str, status: str | None = None) -> None:
    rc, _out, err = sh(cmd, cwd)
    assert rc != 0, f"{cmd!r} succeeded, expected {strerror}"
    assert strerror in err, err
    if status is not None:
        assert ok("cat info/last_cmd_status", cwd).strip() == status


# ---------------------------------------------------------------- layout


def test_info_files_intel(emulator):
    r = emulator("intel").root
    assert ok("ls info", r).split() == ["L3", "L3_MON", "MB", "last_cmd_status"]
    assert ok("cat info/MB/min_bandwidth info/MB/bandwidth_gran info/MB/delay_linear "
              "info/MB/thread_throttle_mode", r).split() == ["10", "10", "1", "max"]
    assert ok("cat info/L3_MON/mon_features", r).split() == [
        "llc_occupancy", "mbm_total_bytes", "mbm_local_bytes"]
    assert ok("cat info/last_cmd_status", r) == "ok\n"


def test_info_files_amd_have_no_thread_throttle_mode(emulator):
    r = emulator("amd").root
    assert ok("cat info/MB/min_bandwidth info/MB/bandwidth_gran", r).split() == ["0", "1"]
    assert not os.path.exists(f"{r}/info/MB/thread_throttle_mode")
    assert ok("cat schemata", r).splitlines()[-1] == "MB:0=2048;1=2048;2=2048;3=2048"


def test_group_files_by_type(emulator):
    r = emulator("intel").root
    ok("mkdir g && mkdir g/mon_groups/m", r)
    assert sorted(ok("ls g", r).split()) == sorted(
        ["cpus", "cpus_list", "mode", "mon_data", "mon_groups", "schemata", "size", "tasks"])
    assert sorted(ok("ls g/mon_groups/m", r).split()) == ["cpus", "cpus_list", "mon_data", "tasks"]
    assert ok("ls g/mon_data", r).split() == ["mon_L3_00", "mon_L3_01"]
    assert sorted(ok("ls g/mon_data/mon_L3_00", r).split()) == [
        "llc_occupancy", "mbm_local_bytes", "mbm_total_bytes"]
    assert ok("cat g/mode", r) == "shareable\n"
    ok("echo 'L3:0=3' > g/schemata", r)  # 2 of 11 ways of a 33 MiB cache
    assert ok("cat g/size", r).splitlines() == ["L3:0=6291456;1=34603008", "MB:0=100;1=100"]


def test_cdp_names_are_right_aligned_and_domain_ids_have_gaps(emulator):
    r = emulator("intel-cdp").root
    assert ok("cat schemata", r).splitlines() == [
        "L3CODE:0=7ff;2=7ff", "L3DATA:0=7ff;2=7ff", "    MB:0=100;2=100"]
    assert ok("ls mon_data", r).split() == ["mon_L3_00", "mon_L3_02"]
    fails("echo 'L3:0=f' > schemata", r, "Invalid argument", "Unknown or unsupported resource name 'L3'")


def test_legacy_kernels_pad_values(emulator):
    r = emulator("intel", "--legacy-format").root
    ok("mkdir g && echo 'MB:1=50' > g/schemata", r)
    assert ok("cat g/schemata", r).splitlines() == ["L3:0=7ff;1=7ff", "MB:0=100;1= 50"]


def test_mba_mbps_groups_start_unlimited(emulator):
    r = emulator("intel-mbps").root
    ok("mkdir g", r)
    assert ok("cat g/schemata", r).splitlines()[-1] == "MB:0=4294967295;1=4294967295"
    ok("echo 'MB:0=1024;1=5' > g/schemata", r)  # any u32 is accepted in MBps mode
    assert ok("cat g/schemata", r).splitlines()[-1] == "MB:0=1024;1=5"
    assert ok("cat g/mba_MBps_event", r) == "mbm_local_bytes\n"
    # bw_validate's kstrtou32: past U32_MAX is no value at all (it was taken modulo 2**32)
    fails("echo 'MB:0=4294967296' > g/schemata", r, "Invalid argument", "Invalid MB value 4294967296")
    assert ok("cat g/schemata", r).splitlines()[-1] == "MB:0=1024;1=5"


# ---------------------------------------------------------------- mkdir / rmdir


def test_mkdir_rules(emulator):
    r = emulator("intel").root
    ok("mkdir ctrl", r)
    fails("mkdir ctrl/sub", r, "Operation not permitted")
    fails("mkdir info/x", r, "Operation not permitted")
    fails("mkdir ctrl/mon_groups/m/deeper", r, "No such file")
    ok("mkdir ctrl/mon_groups/m && mkdir mon_groups/rootmon", r)
    fails("mkdir ctrl/mon_groups/m/mon_groups", r, "Operation not permitted")
    fails("mkdir ctrl", r, "File exists")
    fails("mkdir $'bad\\nname'", r, "Invalid argument")


def test_rmdir_of_fixed_directories_is_refused(emulator):
    r = emulator("intel").root
    ok("mkdir g", r)
    for d in ("info", "mon_data", "mon_groups", "g/mon_groups", "g/mon_data", "g/mon_data/mon_L3_00"):
        fails(f"rmdir {d}", r, "Operation not permitted")
    ok("rmdir g", r)
    assert not os.path.exists(f"{r}/g")


def test_monitoring_only_host_has_no_control_groups(emulator):
    r = emulator("no-mba").root
    fails("mkdir g", r, "Operation not permitted")
    ok("mkdir mon_groups/m", r)
    assert "schemata" not in ok("ls", r).split()
    # show_rdt_tasks: is_closid_match needs allocation, so the default group lists no
    # task here; its MON groups list theirs (is_rmid_match)
    assert ok("cat tasks", r) == ""
    out = ok("echo 0 > mon_groups/m/tasks; echo $$; cat mon_groups/m/tasks", r).split()
    assert out[0] in out[1:]


def test_out_of_closids(emulator):
    r = emulator("intel", "--num-closids", "4").root
    ok("mkdir a b c", r)  # CLOSID 0 is the root's
    fails("mkdir d", r, "No space left on device", "Out of CLOSIDs")
    ok("rmdir b && mkdir d", r)  # freed ids come back


def test_out_of_rmids_and_limbo(emulator):
    r = emulator("intel", "--num-rmids", "4", "--limbo-ms", "600000").root
    ok("mkdir mon_groups/a mon_groups/b mon_groups/c", r)
    fails("mkdir mon_groups/d", r, "No space left on device", "Out of RMIDs")
    ok("rmdir mon_groups/a", r)
    # The freed RMID waits in limbo until its cache occupancy drains.
    fails("mkdir mon_groups/d", r, "Device or resource busy", "Out of RMIDs")


def test_limbo_rmids_return_after_draining(emulator):
    emu = emulator("intel", "--num-rmids", "2", "--limbo-ms", "600000")
    ok("mkdir mon_groups/a && rmdir mon_groups/a", emu.root)
    fails("mkdir mon_groups/b", emu.root, "Device or resource busy")
    emu.control.drain_limbo()
    ok("mkdir mon_groups/b", emu.root)


def test_ctrl_group_creation_needs_an_rmid_too(emulator):
    r = emulator("intel", "--num-rmids", "2", "--limbo-ms", "0").root
    ok("mkdir mon_groups/a", r)
    fails("mkdir g", r, "No space left on device", "Out of RMIDs")
    ok("rmdir mon_groups/a && mkdir g", r)  # the CLOSID was not leaked by the failure


# ---------------------------------------------------------------- schemata


def test_schemata_errors(emulator):
    r = emulator("intel").root
    ok("mkdir g", r)
    fails("printf 'MB:0=50' > g/schemata", r, "Invalid argument")  # no trailing newline
    fails("echo 'MB:0=5' > g/schemata", r, "Invalid argument", "MB value 5 out of range [10,100]")
    fails("echo 'MB:0=101' > g/schemata", r, "Invalid argument", "MB value 101 out of range [10,100]")
    fails("echo 'MB:0=abc' > g/schemata", r, "Invalid argument", "Invalid MB value abc")
    fails("echo 'MB:0=50;0=60' > g/schemata", r, "Invalid argument", "Duplicate domain 0")
    fails("echo 'XX:0=50' > g/schemata", r, "Invalid argument", "Unknown or unsupported resource name 'XX'")
    fails("echo 'MB0=50' > g/schemata", r, "Invalid argument", "Missing ':'")
    fails("echo 'MB:x=50' > g/schemata", r, "Invalid argument", "Missing '=' or non-numeric domain")
    fails("echo 'L3:0=f7' > g/schemata", r, "Invalid argument", "The mask f7 has non-consecutive 1-bits")
    # Quirk: an unknown domain id fails with no message.
    fails("echo 'MB:7=50' > g/schemata", r, "Invalid argument", "ok")
    assert ok("cat g/schemata", r).splitlines() == ["L3:0=7ff;1=7ff", "MB:0=100;1=100"]


def test_schemata_is_all_or_nothing(emulator):
    r = emulator("intel").root
    ok("mkdir g", r)
    # coreutils echo writes both lines in one write() (bash's builtins write line by line).
    fails("/bin/echo -e 'L3:0=f\\nMB:0=5' > g/schemata", r, "Invalid argument")
    assert ok("cat g/schemata", r).splitlines() == ["L3:0=7ff;1=7ff", "MB:0=100;1=100"]
    ok("/bin/echo -e 'L3:0=f\\nMB:1=30' > g/schemata", r)
    assert ok("cat g/schemata", r).splitlines() == ["L3:0=f;1=7ff", "MB:0=100;1=30"]


def test_intel_mb_rounds_up_to_granularity(emulator):
    r = emulator("intel").root
    ok("mkdir g && echo 'MB:0=11;1=29' > g/schemata", r)
    assert ok("cat g/schemata", r).splitlines()[-1] == "MB:0=20;1=30"


def test_amd_mb_range(emulator):
    r = emulator("amd").root
    ok("mkdir g && echo 'MB:0=0;1=1' > g/schemata", r)
    fails("echo 'MB:0=2049' > g/schemata", r, "Invalid argument", "MB value 2049 out of range [0,2048]")
    assert ok("cat g/schemata", r).splitlines()[-1] == "MB:0=0;1=1;2=2048;3=2048"


# ---------------------------------------------------------------- tasks


def test_tasks_real_pids_only(emulator, sleeper):
    r = emulator("intel").root
    ok("mkdir g", r)
    fails("echo 999999 > g/tasks", r, "No such process", "No task 999999")
    p = sleeper()
    ok(f"echo {p.pid} > g/tasks", r)
    assert ok("cat g/tasks", r).split() == [str(p.pid)]
    assert str(p.pid) not in ok("cat tasks", r).split()


def test_one_task_per_write_on_older_kernels(emulator, sleeper):
    r = emulator("intel").root
    a, b = sleeper(), sleeper()
    ok("mkdir g", r)
    fails(f"echo {a.pid},{b.pid} > g/tasks", r, "Invalid argument")
    assert ok("cat g/tasks", r) == ""


def test_comma_lists_on_newer_kernels_stop_at_first_failure(emulator, sleeper):
    r = emulator("intel", "--tasks-write", "list").root
    a, b = sleeper(), sleeper()
    ok("mkdir g", r)
    fails(f"echo {a.pid},999999,{b.pid} > g/tasks", r, "No such process")
    assert ok("cat info/last_cmd_status", r).splitlines() == ["No task 999999", "Error while processing task 999999"]
    assert ok("cat g/tasks", r).split() == [str(a.pid)]


def test_pid_zero_is_the_writer(emulator):
    r = emulator("intel").root
    ok("mkdir g", r)
    out = ok("echo 0 > g/tasks; echo $$; cat g/tasks", r).split()
    assert out[0] in out[1:]


def test_children_inherit_the_group(emulator):
    r = emulator("intel").root
    ok("mkdir g", r)
    out = ok("echo 0 > g/tasks; sleep 5 & echo $!; cat g/tasks; kill %1", r).split()
    child = out[0]
    assert child in out[1:]


def test_mon_group_parent_rule(emulator, sleeper):
    r = emulator("intel").root
    p = sleeper()
    ok("mkdir a b && mkdir a/mon_groups/m", r)
    ok(f"echo {p.pid} > b/tasks", r)
    fails(f"echo {p.pid} > a/mon_groups/m/tasks", r, "Invalid argument",
          "Can't move task to different control group")
    ok(f"echo {p.pid} > a/tasks && echo {p.pid} > a/mon_groups/m/tasks", r)
    # A CTRL_MON group lists its MON groups' tasks too.
    assert ok("cat a/tasks", r).split() == [str(p.pid)]
    assert ok("cat a/mon_groups/m/tasks", r).split() == [str(p.pid)]


def test_tasks_return_to_parent_on_rmdir(emulator, sleeper):
    r = emulator("intel").root
    p = sleeper()
    ok(f"mkdir a && mkdir a/mon_groups/m && echo {p.pid} > a/tasks && echo {p.pid} > a/mon_groups/m/tasks", r)
    ok("rmdir a/mon_groups/m", r)
    assert ok("cat a/tasks", r).split() == [str(p.pid)]
    ok("rmdir a", r)
    assert str(p.pid) in ok("cat tasks", r).split()


def test_no_permission_to_move_another_users_task(emulator, sleeper):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a command as another user")
    r = emulator("intel").root
    p = sleeper()
    ok("mkdir g && chmod 0777 g 2>/dev/null; true", r)
    rc, _out, err = sh(f"setpriv --reuid=65534 --regid=65534 --clear-groups bash -c 'echo {p.pid} > g/tasks'", r)
    # Regular users cannot even open the file (0644, root-owned), as on the kernel.
    assert rc != 0 and "Permission denied" in err


def test_exited_tasks_leave_the_list(emulator):
    r = emulator("intel").root
    ok("mkdir g", r)
    p = subprocess.Popen(["sleep", "300"])
    ok(f"echo {p.pid} > g/tasks", r)
    p.kill()
    p.wait()
    assert ok("cat g/tasks", r) == ""


def test_mon_group_rename_moves_it_between_control_groups(emulator, sleeper):
    r = emulator("intel").root
    p = sleeper()
    ok(f"mkdir a b && mkdir a/mon_groups/m && echo {p.pid} > a/tasks && echo {p.pid} > a/mon_groups/m/tasks", r)
    ok("mv a/mon_groups/m b/mon_groups/m", r)
    assert ok("cat b/tasks", r).split() == [str(p.pid)]
    assert ok("cat a/tasks", r) == ""
    fails("mv b a2", r, "Operation not permitted", "Source must be a MON group")


def test_mon_group_keeps_its_cpus_when_renamed_in_place_but_cannot_take_them_away(emulator):
    # rdtgroup_rename refuses only a move to another parent while the group monitors CPUs.
    r = emulator("intel").root
    ok("mkdir a b && mkdir a/mon_groups/m && echo 0-3 > a/cpus_list && echo 2 > a/mon_groups/m/cpus_list", r)
    ok("mv a/mon_groups/m a/mon_groups/n", r)
    assert ok("cat a/mon_groups/n/cpus_list", r) == "2\n"
    fails("mv a/mon_groups/n b/mon_groups/n", r, "Operation not permitted",
          "Cannot move a MON group that monitors CPUs")


def test_task_written_to_its_control_group_leaves_its_mon_group(emulator, sleeper):
    # __rdtgroup_move_task: into a CTRL_MON group the task takes the group's CLOSID and RMID.
    r = emulator("intel").root
    p = sleeper()
    ok(f"mkdir a && mkdir a/mon_groups/m && echo {p.pid} > a/tasks && echo {p.pid} > a/mon_groups/m/tasks", r)
    ok(f"echo {p.pid} > a/tasks", r)
    assert ok("cat a/mon_groups/m/tasks", r) == ""
    assert ok("cat a/tasks", r).split() == [str(p.pid)]
    ok(f"echo {p.pid} > a/mon_groups/m/tasks && echo {p.pid} > tasks", r)
    assert ok("cat a/tasks a/mon_groups/m/tasks", r) == ""


def test_comma_lists_parse_as_the_kernel_does(emulator, sleeper):
    # rdtgroup_tasks_write takes tokens until the rest is empty or a newline; kstrtoint(s, 0)
    # reads 0x.. as hex and a leading 0 as octal.
    r = emulator("intel", "--tasks-write", "list").root
    p = sleeper()
    ok("mkdir g h", r)
    ok(f"printf '{p.pid},\\n' > g/tasks", r)
    assert ok("cat g/tasks", r).split() == [str(p.pid)]
    ok("echo > g/tasks", r)  # nothing to move is no error
    ok(f"echo {p.pid:#x} > h/tasks", r)
    assert ok("cat h/tasks", r).split() == [str(p.pid)]
    ok(f"echo 0{p.pid:o} > g/tasks", r)
    assert ok("cat g/tasks", r).split() == [str(p.pid)]
    fails(f"echo {p.pid},,{p.pid} > h/tasks", r, "Invalid argument", "Task list parsing error pid")
    fails("echo 1_0 > h/tasks", r, "Invalid argument", "Task list parsing error pid 1_0")


# ---------------------------------------------------------------- cpus
# rdtgroup_cpus_write: a CPU is in exactly one CTRL_MON group (the default group has
# every CPU no other has) and in at most one MON group of that group.


def cpus(r, *groups):
    return [ok(f"cat {g}/cpus_list" if g else "cat cpus_list", r).strip() for g in groups]


def test_default_group_takes_cpus_back_from_other_groups(emulator):
    r = emulator("intel").root  # 16 CPUs
    ok("mkdir a && mkdir a/mon_groups/m && echo 0-3 > a/cpus_list && echo 2-3 > a/mon_groups/m/cpus_list", r)
    assert cpus(r, "", "a", "a/mon_groups/m") == ["4-15", "0-3", "2-3"]
    ok("echo 3-15 > cpus_list", r)  # takes CPU 3 from a and from a's MON group
    assert cpus(r, "", "a", "a/mon_groups/m") == ["3-15", "0-2", "2"]
    ok("echo ffff > cpus", r)
    assert cpus(r, "", "a", "a/mon_groups/m") == ["0-15", "", ""]
    fails("echo 1-15 > cpus_list", r, "Invalid argument", "Can't drop CPUs from default group")


def test_control_group_takes_cpus_from_another_and_its_mon_groups(emulator):
    r = emulator("intel").root
    ok("mkdir a b && mkdir a/mon_groups/m && mkdir mon_groups/rm", r)
    ok("echo 0-3 > a/cpus_list && echo 1-2 > a/mon_groups/m/cpus_list && echo 8-9 > mon_groups/rm/cpus_list", r)
    ok("echo 2,9 > b/cpus_list", r)
    assert cpus(r, "", "mon_groups/rm", "a", "a/mon_groups/m", "b") == ["4-8,10-15", "8", "0-1,3", "1", "2,9"]
    ok("echo 9 > b/cpus_list", r)  # CPU 2 dropped: back to the default group
    assert cpus(r, "", "b") == ["2,4-8,10-15", "9"]


def test_control_group_cpus_write_clears_its_mon_groups(emulator):
    # cpus_ctrl_write: "Clear child mon group masks since there is a new parent mask".
    r = emulator("intel").root
    ok("mkdir a && mkdir a/mon_groups/m && echo 0-3 > a/cpus_list && echo 2 > a/mon_groups/m/cpus_list", r)
    ok("echo 0-5 > a/cpus_list", r)
    assert cpus(r, "a", "a/mon_groups/m") == ["0-5", ""]
    ok("echo 2 > a/mon_groups/m/cpus_list && echo 0-5 > a/cpus_list", r)  # the same mask again
    assert cpus(r, "a/mon_groups/m") == [""]


def test_mon_group_cpus_come_from_its_parent_and_leave_its_siblings(emulator):
    r = emulator("intel").root
    ok("mkdir a && mkdir a/mon_groups/m a/mon_groups/n && echo 0-3 > a/cpus_list", r)
    fails("echo 3-4 > a/mon_groups/m/cpus_list", r, "Invalid argument",
          "Can only add CPUs to mongroup that belong to parent")
    ok("echo 1-2 > a/mon_groups/m/cpus_list && echo 2-3 > a/mon_groups/n/cpus_list", r)
    assert cpus(r, "a", "a/mon_groups/m", "a/mon_groups/n") == ["0-3", "1", "2-3"]
    ok("echo 3 > a/mon_groups/n/cpus_list", r)  # CPU 2 dropped: its parent's again, which never lost it
    assert cpus(r, "", "a", "a/mon_groups/n") == ["4-15", "0-3", "3"]


def test_cpus_past_the_last_cpu_are_a_bad_mask(emulator):
    r = emulator("intel").root
    fails("echo 0-16 > cpus_list", r, "Invalid argument", "Bad CPU list/mask")
    fails("echo 1ffff > cpus", r, "Invalid argument", "Bad CPU list/mask")
    assert ok("cat cpus", r) == "ffff\n"


def test_amd_accepts_sparse_cache_masks(emulator):
    # The kernel sets arch_has_sparse_bitmasks on AMD: cbm_validate lets gaps through,
    # and min_cbm_bits (0 on AMD) counts only the first run of ones.
    r = emulator("amd").root
    assert ok("cat info/L3/sparse_masks", r) == "1\n"
    ok("mkdir g && echo 'L3:0=f0f;1=1' > g/schemata", r)
    assert ok("cat g/schemata", r).splitlines()[0] == "L3:0=f0f;1=1;2=ffff;3=ffff"
    intel = emulator("intel").root
    assert ok("cat info/L3/sparse_masks", intel) == "0\n"
    fails("mkdir g && echo 'L3:0=707' > g/schemata", intel, "Invalid argument",
          "The mask 707 has non-consecutive 1-bits")


def test_cpus_of_an_offline_domain_leave_every_group_and_return_to_the_default(emulator):
    # resctrl_offline_cpu clears the CPU from the group that has it and its MON groups;
    # resctrl_online_cpu gives it to the default group. Domain 1 is CPUs 8-15 here.
    emu = emulator("intel")
    r = emu.root
    ok("mkdir a && mkdir a/mon_groups/m && echo 6-9 > a/cpus_list && echo 7-8 > a/mon_groups/m/cpus_list", r)
    emu.control.set_domain_online(1, False)
    assert cpus(r, "", "a", "a/mon_groups/m") == ["0-5", "6-7", "7"]
    fails("echo 6-8 > a/cpus_list", r, "Invalid argument", "Can only assign online CPUs")
    assert ok("cat cpus", r) == "003f\n"  # the mask keeps its width: nr_cpu_ids does not change
    emu.control.set_domain_online(1, True)
    assert cpus(r, "", "a", "a/mon_groups/m") == ["0-5,8-15", "6-7", "7"]


# ---------------------------------------------------------------- topology


def fake_sysfs_cpu(root, l3_of_cpu: dict[int, int], online: str, size="16384K"):
    """A sysfs cpu directory: cpuN/cache/index{0,3} (L1d and the L3 with its id) per CPU."""
    for cpu, l3 in l3_of_cpu.items():
        for index, level, ident in (("index0", "1", str(cpu)), ("index3", "3", str(l3))):
            d = root / f"cpu{cpu}" / "cache" / index
            d.mkdir(parents=True)
            (d / "level").write_text(level + "\n")
            (d / "id").write_text(ident + "\n")
            (d / "size").write_text(size + "\n")
    (root / "online").write_text(online + "\n")
    return root


def test_host_topology_gives_the_domains_and_cpus_sysfs_names(emulator, tmp_path):
    # The kernel's L3 domain ids are the cache ids (cpuN/cache/index3/id); offline CPUs
    # (cpu5 here) belong to no domain and cannot be assigned.
    sysfs = fake_sysfs_cpu(tmp_path / "cpu", {0: 0, 1: 0, 2: 4, 3: 4, 4: 4, 5: 4}, online="0-4")
    r = emulator("intel", "--topology", "host", "--sysfs-cpu", str(sysfs)).root
    assert ok("ls mon_data", r).split() == ["mon_L3_00", "mon_L3_04"]
    assert ok("cat schemata", r).splitlines() == ["L3:0=7ff;4=7ff", "MB:0=100;4=100"]
    assert ok("cat cpus_list", r) == "0-4\n"
    ok("mkdir g && echo 'L3:0=1' > g/schemata", r)
    assert ok("cat g/size", r).splitlines()[0] == f"L3:0={(16 << 20) // 11};4={16 << 20}"
    fails("echo 5 > g/cpus_list", r, "Invalid argument", "Bad CPU list/mask")


def test_host_topology_is_the_default_where_sysfs_names_an_l3(tmp_path):
    from nodesim.resctrl_emulator.topology import has_l3_ids, read_host_topology

    with MountedEmulator("intel", workdir=str(tmp_path / "emu"), topology=None) as emu:
        domains = ok("ls mon_data", emu.root).split()
        online = ok("cat cpus_list", emu.root).strip()
    if not has_l3_ids():
        assert domains == ["mon_L3_00", "mon_L3_01"]  # the profile's
        return
    host = read_host_topology()
    assert domains == [f"mon_L3_{d:02d}" for d in host.domains]
    assert online == format_cpu_list(host.cpus)


def test_host_topology_that_sysfs_does_not_give_is_refused_before_mounting(tmp_path):
    import sys

    p = subprocess.run([sys.executable, "-m", "nodesim.resctrl_emulator", str(tmp_path), "--topology", "host",
                        "--sysfs-cpu", str(tmp_path / "nothing")], capture_output=True, text=True)
    assert p.returncode == 2 and f"--topology host: {tmp_path}/nothing" in p.stderr, p.stderr
    assert not os.path.ismount(tmp_path)
    sysfs = fake_sysfs_cpu(tmp_path / "cpu", {0: 0}, online="0-1")  # cpu1 has no cache directory
    p = subprocess.run([sys.executable, "-m", "nodesim.resctrl_emulator", str(tmp_path), "--topology", "host",
                        "--sysfs-cpu", str(sysfs)], capture_output=True, text=True)
    assert p.returncode == 2 and "cpu1/cache: no level 3 cache with an id" in p.stderr, p.stderr


# ---------------------------------------------------------------- mon_data


def read_int(path):
    with open(path) as f:
        return int(f.read())


def test_counters_grow_from_zero_in_scale_units_and_ctrl_counts_mon(emulator, sleeper):
    emu = emulator("intel")
    r = emu.root
    p = sleeper()
    ok(f"mkdir g && mkdir g/mon_groups/m && echo {p.pid} > g/tasks && echo {p.pid} > g/mon_groups/m/tasks", r)
    assert read_int(f"{r}/g/mon_data/mon_L3_00/mbm_total_bytes") == 0
    emu.control.set_demand(p.pid, 5e9, domain=0)
    first = wait_for(lambda: read_int(f"{r}/g/mon_data/mon_L3_00/mbm_total_bytes"), what="traffic")
    assert first % 40960 == 0
    wait_for(lambda: read_int(f"{r}/g/mon_data/mon_L3_00/mbm_total_bytes") > first, what="growth")
    m = read_int(f"{r}/g/mon_groups/m/mon_data/mon_L3_00/mbm_total_bytes")
    g = read_int(f"{r}/g/mon_data/mon_L3_00/mbm_total_bytes")
    assert g >= m > 0
    assert read_int(f"{r}/g/mon_data/mon_L3_01/mbm_total_bytes") == 0  # no demand on domain 1


def test_injected_counter_states_resets_and_offline_domains(emulator, sleeper):
    emu = emulator("intel")
    r = emu.root
    p = sleeper()
    ok(f"mkdir g && echo {p.pid} > g/tasks", r)
    emu.control.set_demand(p.pid, 5e9)
    emu.control.set_counter_state("Unavailable", group="/g", domain=0)
    assert ok("cat g/mon_data/mon_L3_00/mbm_total_bytes", r) == "Unavailable\n"
    emu.control.set_counter_state("Error", event="mbm_local_bytes")
    assert ok("cat g/mon_data/mon_L3_01/mbm_local_bytes", r) == "Error\n"
    emu.control.set_counter_state(None, group="/g", domain=0)
    emu.control.set_counter_state(None, event="mbm_local_bytes")
    before = wait_for(lambda: read_int(f"{r}/g/mon_data/mon_L3_00/mbm_total_bytes"), what="traffic")
    emu.control.reset_counters(group="/g")
    assert read_int(f"{r}/g/mon_data/mon_L3_00/mbm_total_bytes") < before
    counter = f"{r}/g/mon_data/mon_L3_01/mbm_total_bytes"
    os.stat(counter)  # in the kernel's caches now (entries and attributes live for seconds)
    emu.control.set_domain_online(1, False)
    assert ok("ls g/mon_data", r).split() == ["mon_L3_00"]
    # gone at once, as on kernfs: a stat from the cache would say it is still there
    for path in (counter, os.path.dirname(counter)):
        with pytest.raises(FileNotFoundError):
            os.stat(path)
    assert ok("cat g/schemata", r).splitlines() == ["L3:0=7ff", "MB:0=100"]
    emu.control.set_domain_online(1, True)
    assert ok("ls g/mon_data", r).split() == ["mon_L3_00", "mon_L3_01"]


def test_throttling_lowers_measured_bandwidth(emulator, sleeper):
    emu = emulator("intel", "--peak-gbps", "20")
    p = sleeper()
    ok(f"mkdir g && echo {p.pid} > g/tasks", emu.root)
    emu.control.set_demand(p.pid, 15e9, domain=0)
    assert emu.control.rates()["/g"][0] == pytest.approx(15e9)
    ok("echo 'MB:0=20' > g/schemata", emu.root)
    assert emu.control.rates()["/g"][0] == pytest.approx(4e9)  # 20 % of a 20 GB/s peak


def test_node_peak_is_shared_between_groups(emulator, sleeper):
    emu = emulator("intel", "--peak-gbps", "10")
    a, b = sleeper(), sleeper()
    ok(f"mkdir ga gb && echo {a.pid} > ga/tasks && echo {b.pid} > gb/tasks", emu.root)
    emu.control.set_demand(a.pid, 10e9, domain=0)
    emu.control.set_demand(b.pid, 10e9, domain=0)
    rates = emu.control.rates()
    assert rates["/ga"][0] == pytest.approx(5e9)
    assert rates["/gb"][0] == pytest.approx(5e9)


def test_amd_and_mbps_throttle_in_their_own_units(emulator, sleeper):
    amd = emulator("amd")
    p = sleeper()
    ok(f"mkdir g && echo {p.pid} > g/tasks && echo 'MB:0=8' > g/schemata", amd.root)
    amd.control.set_demand(p.pid, 15e9, domain=0)
    assert amd.control.rates()["/g"][0] == pytest.approx(8 * 0.125e9)
    # Under mba_MBps the kernel's controller, not the hardware, meets the MiB/s target: the
    # write changes nothing at once, then the percentage falls one step a second (80 % is
    # the first to hold one thread below 15 GB/s), see tests/kernel/test_mba_fidelity.py.
    mbps = emulator("intel-mbps")
    ok(f"mkdir g && echo {p.pid} > g/tasks && echo 'MB:0=1024' > g/schemata", mbps.root)
    mbps.control.set_demand(p.pid, 15e9, domain=0)
    assert mbps.control.rates()["/g"][0] == pytest.approx(15e9)
    wait_for(lambda: mbps.control.rates()["/g"][0] < 14.5e9, timeout=10, what="the kernel's controller stepping down")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signals_unmount_cleanly(tmp_path, sig):
    import signal

    with MountedEmulator("intel", workdir=str(tmp_path / "emu")) as emu:  # its own: this ends it
        emu.proc.send_signal(getattr(signal, sig))
        assert emu.proc.wait(timeout=10) == 0
        assert not os.path.ismount(emu.root)
        assert not os.path.exists(emu.control_path) and not os.path.exists(emu.mounts_file)


def tree(root: str) -> dict[str, str | None]:
    """Every path under ``root`` (relative), with a file's text (None for a directory), but
    the default group's tasks (every process of the host, which come and go)."""
    seen: dict[str, str | None] = {}
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root)
        seen[rel] = None
        for name in files:
            if (rel, name) != (".", "tasks"):
                with open(os.path.join(top, name)) as f:
                    seen[os.path.join(rel, name)] = f.read()
    return seen


def test_reset_is_a_fresh_mount(emulator, sleeper, tmp_path):
    # What the module's one mount per options rests on: after a reset, what a test can see
    # is what a new mount would show, and the VFS has forgotten the groups that went.
    options = ("intel", "--num-rmids", "4", "--limbo-ms", "600000")  # test_out_of_rmids_and_limbo's
    with MountedEmulator(*options[:1], workdir=str(tmp_path / "fresh"), extra_args=list(options[1:])) as fresh:
        expected = tree(fresh.root)
    emu = emulator(*options)
    r, p = emu.root, sleeper()
    ok(f"mkdir g && mkdir g/mon_groups/m mon_groups/rm && echo {p.pid} > g/tasks", r)
    ok("echo 'L3:0=f\nMB:1=30' > g/schemata && echo 'MB:0=50' > schemata && echo 2-3 > g/cpus_list", r)
    ok("rmdir mon_groups/rm", r)  # its RMID in limbo for ten minutes
    fails("mkdir mon_groups/again", r, "Device or resource busy", "Out of RMIDs")
    emu.control.set_demand(p.pid, 5e9, domain=0)
    emu.control.set_counter_state("Error", event="mbm_local_bytes")
    emu.control.set_domain_online(1, False)
    stale = os.path.join(r, "g", "mon_groups", "m")
    os.stat(stale)  # in the VFS's caches now
    emu.control.reset()
    with pytest.raises(FileNotFoundError):
        os.stat(stale)
    assert tree(r) == expected
    assert str(p.pid) in ok("cat tasks", r).split()  # back in the default group
    assert emu.control.rates() == {"/": {0: 0.0, 1: 0.0}}
    ok("mkdir g && mkdir g/mon_groups/m", r)  # the names are free, the RMIDs too


def test_bad_arguments_are_refused_before_mounting(tmp_path):
    import sys

    run = lambda *a: subprocess.run([sys.executable, "-m", "nodesim.resctrl_emulator", *a], capture_output=True, text=True)
    p = run(str(tmp_path / "missing"))
    assert p.returncode == 2 and "is not a directory" in p.stderr
    p = run(str(tmp_path), "--num-rmids", "1")
    assert p.returncode == 2 and "--num-rmids must be at least 2, got 1" in p.stderr
    p = run(str(tmp_path), "--profile", "sparc")
    assert p.returncode == 2 and "invalid choice: 'sparc'" in p.stderr

def test_an_open_file_of_a_removed_group_reads_and_writes_enodev(emulator):
    # kernfs: a node removed while a file of it is open answers ENODEV (a reader racing a
    # group's removal must see that, not a generic EINVAL)
    emu = emulator("intel")
    os.mkdir(f"{emu.root}/g")
    reader = os.open(f"{emu.root}/g/tasks", os.O_RDONLY)
    writer = os.open(f"{emu.root}/g/tasks", os.O_WRONLY)
    try:
        os.rmdir(f"{emu.root}/g")
        with pytest.raises(OSError) as read:
            os.pread(reader, 4096, 0)
        with pytest.raises(OSError) as write:
            os.write(writer, f"{os.getpid()}\n".encode())
        assert read.value.errno == write.value.errno == errno.ENODEV
    finally:
        os.close(reader)
        os.close(writer)
