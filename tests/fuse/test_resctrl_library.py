"""The resctrl library against the mounted emulator, for every hardware profile."""

import os
import subprocess
import sys
import time

import pytest

from support.waiting import wait_for
from resctrl import (
    ForeignGroupError,
    MbFlavour,
    NotMountedError,
    OutOfClosidsError,
    OutOfRmidsError,
    Resctrl,
    RmidsInLimboError,
    SchemataError,
    TaskMoveError,
    UnsupportedError,
)
from resctrl.mbm import BandwidthMeter

pytestmark = pytest.mark.fuse


@pytest.mark.parametrize("profile,flavour,domains,cdp,max_ctrl", [
    ("intel", MbFlavour.PERCENT, (0, 1), False, 7),
    ("intel-mbps", MbFlavour.MBPS, (0, 1), False, 7),
    ("intel-cdp", MbFlavour.PERCENT, (0, 2), True, 7),
    ("amd", MbFlavour.AMD_UNITS, (0, 1, 2, 3), False, 15),
    ("no-mba", None, (0, 1), False, 0),
])
def test_capabilities(emulator, open_resctrl, profile, flavour, domains, cdp, max_ctrl):
    caps = open_resctrl(emulator(profile)).caps
    assert (caps.mb.limits.flavour if caps.mb else None) == flavour
    assert caps.domains == domains and caps.cdp == cdp and caps.max_ctrl_groups == max_ctrl
    assert caps.mon.num_rmids == 128 and "mbm_total_bytes" in caps.mon.features
    if profile == "intel-cdp":
        assert caps.resources == ("L3CODE", "L3DATA", "MB")
    if profile == "amd":
        assert caps.mb.thread_throttle_mode is None and caps.mb.limits.max_bandwidth == 2048


def test_open_refuses_an_unmounted_root(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n")
    with pytest.raises(NotMountedError, match="no resctrl filesystem mounted at /nowhere"):
        Resctrl.open("/nowhere", mounts=str(mounts))


def test_groups_create_adopt_list_remove(emulator, open_resctrl):
    rc = open_resctrl(emulator("intel"))
    g = rc.create_ctrl_group("noded-a")
    m = g.create_mon_group("noded-job")
    assert rc.list_ctrl_groups() == [g] and g.list_mon_groups() == [m]
    again = Resctrl.open(rc.root, mounts=os.path.join(os.path.dirname(rc.root), "mounts"))
    assert again.ctrl_group("noded-a").mon_group("noded-job") == m
    assert rc.ensure_ctrl_group("noded-a") == g
    m.remove()
    g.remove()
    assert rc.list_ctrl_groups() == []


def test_foreign_groups_are_never_touched(emulator, open_resctrl):
    emu = emulator("intel")
    os.mkdir(f"{emu.root}/someone-else")
    rc = open_resctrl(emu)
    with pytest.raises(ForeignGroupError, match="lacks the owner prefix 'noded-'"):
        rc.create_ctrl_group("mine")
    foreign = rc.ctrl_group("someone-else")
    with pytest.raises(ForeignGroupError):
        foreign.remove()
    with pytest.raises(ForeignGroupError):
        foreign.set_mb(50)
    rc.create_ctrl_group("noded-x")
    assert rc.remove_orphans() == [f"{emu.root}/noded-x"]
    assert os.path.isdir(f"{emu.root}/someone-else")


def test_remove_orphans_after_a_crash_keeps_what_is_asked(emulator, open_resctrl):
    emu = emulator("intel")
    rc = open_resctrl(emu)
    a = rc.create_ctrl_group("noded-a")
    keep = a.create_mon_group("noded-keep")
    a.create_mon_group("noded-drop")
    rc.root_group().create_mon_group("noded-rootmon")
    rc.create_ctrl_group("noded-b")
    del rc  # the daemon died; a new one starts
    rc2 = open_resctrl(emu)
    removed = rc2.remove_orphans(keep=[keep.path])
    assert sorted(os.path.relpath(p, emu.root) for p in removed) == [
        "mon_groups/noded-rootmon", "noded-a/mon_groups/noded-drop", "noded-b"]
    assert [g.path for g in rc2.owned_groups()] == [keep.path, a.path]


def test_typed_errors_carry_the_kernel_status(emulator, open_resctrl):
    emu = emulator("intel", "--num-closids", "2", "--num-rmids", "4", "--limbo-ms", "600000")
    rc = open_resctrl(emu)
    g = rc.create_ctrl_group("noded-a")
    with pytest.raises(OutOfClosidsError) as e:
        rc.create_ctrl_group("noded-b")
    assert e.value.status == "Out of CLOSIDs" and not os.path.exists(f"{emu.root}/noded-b")
    m1 = g.create_mon_group("noded-m1")
    g.create_mon_group("noded-m2")
    with pytest.raises(OutOfRmidsError) as e:
        g.create_mon_group("noded-m3")
    assert e.value.status == "Out of RMIDs" and not isinstance(e.value, RmidsInLimboError)
    m1.remove()
    with pytest.raises(RmidsInLimboError):
        g.create_mon_group("noded-m3")
    with pytest.raises(SchemataError, match=r"MB value 5 out of range \[10,100\]"):
        g.write_schemata({"MB": {0: 5}})


def test_add_tasks_reports_vanished_and_refuses_cross_group_moves(emulator, open_resctrl, sleeper):
    rc = open_resctrl(emulator("intel"))
    a, b = rc.create_ctrl_group("noded-a"), rc.create_ctrl_group("noded-b")
    p = sleeper()
    dead = subprocess.Popen(["true"])
    dead.wait()
    r = a.add_tasks([p.pid, dead.pid])
    assert r.moved == [p.pid] and r.vanished == [dead.pid]
    with pytest.raises(TaskMoveError, match="Can't move task to different control group"):
        b.create_mon_group("noded-m").add_tasks([p.pid])


def test_add_process_moves_every_thread(emulator, open_resctrl):
    rc = open_resctrl(emulator("intel"))
    code = "import threading,time\nfor _ in range(3): threading.Thread(target=time.sleep, args=(300,), daemon=True).start()\nprint('up', flush=True)\ntime.sleep(300)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "up\n"
        tids = sorted(int(t) for t in os.listdir(f"/proc/{p.pid}/task"))
        assert len(tids) == 4
        g = rc.create_ctrl_group("noded-a")
        r = g.add_process(p.pid)
        assert sorted(r.moved) == tids and sorted(g.read_tasks()) == tids
    finally:
        p.kill()
        p.wait()


def test_add_process_of_a_gone_process(emulator, open_resctrl):
    rc = open_resctrl(emulator("intel"))
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert rc.create_ctrl_group("noded-a").add_process(dead.pid).vanished == [dead.pid]


@pytest.mark.parametrize("profile,request_,applied", [
    ("intel", 45, 50), ("intel", 3, 10), ("amd", 3000, 2048), ("amd", 17, 17), ("intel-mbps", 1024, 1024),
])
def test_set_mb_normalises_per_flavour(emulator, open_resctrl, profile, request_, applied):
    rc = open_resctrl(emulator(profile))
    g = rc.create_ctrl_group("noded-t")
    g.set_mb(request_)
    assert set(g.read_schemata()["MB"].values()) == {applied}
    assert g.set_mb(request_) == {}  # already there: nothing written


def test_write_schemata_writes_only_changes(emulator, open_resctrl):
    rc = open_resctrl(emulator("intel-cdp"))
    g = rc.create_ctrl_group("noded-t")
    written = g.write_schemata({"L3CODE": {0: 0x7FF, 2: 0xF}, "MB": {0: 100, 2: 40}})
    assert written == {"L3CODE": {2: 0xF}, "MB": {2: 40}}
    assert g.read_schemata() == {"L3CODE": {0: 0x7FF, 2: 0xF}, "L3DATA": {0: 0x7FF, 2: 0x7FF}, "MB": {0: 100, 2: 40}}


def test_monitoring_only_host(emulator, open_resctrl, sleeper):
    rc = open_resctrl(emulator("no-mba"))
    with pytest.raises(UnsupportedError, match="monitoring-only"):
        rc.create_ctrl_group("noded-a")
    m = rc.root_group().create_mon_group("noded-job")
    p = sleeper()
    assert m.add_tasks([p.pid]).moved == [p.pid]
    assert set(m.read_mbm()) == {0, 1}


def test_mbm_rates_follow_demand_and_throttle(emulator, open_resctrl, sleeper):
    emu = emulator("intel", "--peak-gbps", "20")
    rc = open_resctrl(emu)
    g = rc.create_ctrl_group("noded-t")
    m = g.create_mon_group("noded-job")
    p = sleeper()
    g.add_tasks([p.pid])
    m.add_tasks([p.pid])
    emu.control.set_demand(p.pid, 10e9, domain=0)
    meter = BandwidthMeter()

    def rate_after(delay):
        meter.update(m.read_mbm(), time.monotonic())
        time.sleep(delay)  # a measurement window, not synchronisation
        return meter.update(m.read_mbm(), time.monotonic())

    rates = rate_after(0.3)
    assert rates[0] == pytest.approx(10e9, rel=0.15) and rates[1] == 0
    g.set_mb(20)
    assert rate_after(0.3)[0] == pytest.approx(4e9, rel=0.15)


def test_mbm_faults_and_domains_going_away(emulator, open_resctrl, sleeper):
    emu = emulator("intel")
    rc = open_resctrl(emu)
    m = rc.root_group().create_mon_group("noded-job")
    emu.control.set_counter_state("Unavailable", group="/mon_groups/noded-job", domain=1)
    sample = m.read_mbm()
    assert sample[0]["mbm_total_bytes"].ok and sample[1]["mbm_total_bytes"].state == "Unavailable"
    emu.control.set_domain_online(0, False)
    assert set(m.read_mbm()) == {1}


def test_move_mon_group_between_control_groups(emulator, open_resctrl, sleeper):
    rc = open_resctrl(emulator("intel"))
    a, b = rc.create_ctrl_group("noded-a"), rc.create_ctrl_group("noded-b")
    m = a.create_mon_group("noded-job")
    p = sleeper()
    a.add_tasks([p.pid])
    m.add_tasks([p.pid])
    moved = m.move_to(b)
    assert moved.parent == b and b.read_tasks() == [p.pid] and a.read_tasks() == []


def test_lock_is_an_flock_on_the_root(emulator, open_resctrl):
    rc = open_resctrl(emulator("intel"))
    probe = ("import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDONLY|os.O_DIRECTORY)\n"
             "try: fcntl.flock(fd, fcntl.LOCK_EX|fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError: print('held')")
    check = lambda: subprocess.run([sys.executable, "-c", probe, rc.root], capture_output=True, text=True).stdout
    with rc.lock():
        with rc.lock():  # re-entrant within the process
            assert check() == "held\n"
    assert check() == "free\n"


def test_mbm_reader_keeps_descriptors_and_survives_removals(emulator, open_resctrl, sleeper):
    from resctrl.info import read_domains
    from resctrl.mbm import MbmReader

    emu = emulator("intel")
    rc = open_resctrl(emu)
    a = rc.root_group().create_mon_group("noded-a")
    b = rc.root_group().create_mon_group("noded-b")
    p = sleeper()
    a.add_tasks([p.pid])
    emu.control.set_demand(p.pid, 5e9)
    reader = MbmReader()
    first = reader.read(a.path, read_domains(rc.root, True))
    assert set(first) == {0, 1} and reader.open_files == 4
    wait_for(lambda: reader.read(a.path, (0,))[0]["mbm_total_bytes"].value > first[0]["mbm_total_bytes"].value,
             what="a kept descriptor to show a fresh value")
    reader.read(b.path, (0, 1))
    assert reader.open_files == 8
    emu.control.set_domain_online(1, False)
    assert set(reader.read(a.path, (0, 1))) == {0}  # the stale domain is left out
    assert reader.open_files == 6
    emu.control.set_domain_online(1, True)
    assert set(reader.read(a.path, read_domains(rc.root, True))) == {0, 1}
    b.remove()
    assert reader.read(b.path, (0, 1)) == {}
    reader.forget(a.path)
    assert reader.open_files == 0
    reader.close()


def test_tour_runs_and_leaves_nothing_behind():
    out = subprocess.run([sys.executable, "-m", "noded", "tour", "--window", "0.2"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "left: none" in out.stdout and "MB value 5 out of range [10,100]" in out.stdout
    mountpoint = out.stdout.split("mounted the emulator: resctrl ", 1)[1].split()[0]
    assert not os.path.ismount(mountpoint) and not os.path.exists(mountpoint)


def test_bad_names_and_task_ids_are_refused_before_any_write(emulator, open_resctrl):
    emu = emulator("intel")
    rc = open_resctrl(emu)
    for name in ("noded-a/b", "noded-\n", "..", ""):
        with pytest.raises(ValueError, match="invalid resctrl group name"):
            rc.create_ctrl_group(name)
    g = rc.create_ctrl_group("noded-a")
    with pytest.raises(ValueError, match=r"invalid task ids \[0, -3\]"):
        g.add_tasks([os.getpid(), 0, -3])
    assert g.read_tasks() == []  # nothing half-applied
    assert sorted(os.listdir(emu.root)) == sorted(
        ["info", "tasks", "cpus", "cpus_list", "schemata", "mode", "size", "mon_data", "mon_groups", "noded-a"])
