"""A control group's counters on the kernel model: the sum of its RMID's and its monitoring
groups', leaving out, silently, each RMID whose read fails where any read succeeded; the
failure's word only where none did (fs/resctrl/monitor.c, mon_event_count: "Discard error
if any of the monitor event reads succeeded"). noded's node rate rests on it
(noded.samplers.bandwidth: a total lacks a job whose counter fails)."""

import os

from nodesim.resctrl_emulator.kernel import ResctrlKernel
from nodesim.resctrl_emulator.profiles import PROFILES

TOTAL = ["mon_data", "mon_L3_00", "mbm_total_bytes"]


def test_a_control_groups_total_leaves_out_each_rmid_whose_read_fails():
    now = [100.0]
    kernel = ResctrlKernel(PROFILES["intel"], clock=lambda: now[0])
    kernel.mkdir(["g"])
    kernel.mkdir(["g", "mon_groups", "m"])
    for tasks in (["g", "tasks"], ["g", "mon_groups", "m", "tasks"]):  # a MON group takes its CTRL_MON's tasks
        kernel.write(tasks, f"{os.getpid()}\n".encode(), os.getpid(), 0)
    kernel.set_demand(os.getpid(), 5e9, domain=0)
    now[0] += 10  # the clock stands still from here: every count holds
    g, m = ["g", *TOTAL], ["g", "mon_groups", "m", *TOTAL]
    whole, child = int(kernel.read(g)), int(kernel.read(m))
    assert whole >= child > 0
    g_rmid, m_rmid = kernel.group_by_path("/g").rmid, kernel.group_by_path("/g/mon_groups/m").rmid

    kernel.faults[(m_rmid, None, None)] = "Error"  # the monitoring group's read fails
    assert kernel.read(m) == "Error\n"
    assert int(kernel.read(g)) == whole - child  # left out of its control group's, silently

    kernel.faults[(g_rmid, 0, None)] = "Unavailable"  # and the control group's own: none succeeds
    assert kernel.read(g) == "Error\n"  # the word of the last read that failed (its MON group's)

    del kernel.faults[(m_rmid, None, None)]
    assert int(kernel.read(g)) == child  # its own RMID's failure left out, silently
    del kernel.faults[(g_rmid, 0, None)]
    assert int(kernel.read(g)) == whole

    kernel.faults[(None, 0, None)] = "Unavailable"  # every RMID on the domain: the word
    assert kernel.read(g) == "Unavailable\n" and kernel.read(m) == "Unavailable\n"
