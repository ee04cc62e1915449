"""noded's bandwidth sampler on the mounted emulator, where a control group's counter sums
its monitoring groups' as the kernel does, leaving out each whose read fails: while a job's
counter fails the node's bandwidth is unknown, never a total short of that job, and the
tick it reads again is no spike of its whole count."""

import time
from types import SimpleNamespace

from noded.samplers.bandwidth import BandwidthSampler

GB = 1e9


def test_a_job_whose_counter_fails_leaves_the_node_unknown_not_short_of_it(emulator, open_resctrl, sleeper):
    emu = emulator("intel")
    rc = open_resctrl(emu)
    root = rc.root_group()
    groups = {}
    for name, gbps in (("a", 2), ("b", 1)):
        p = sleeper()
        groups[name] = g = root.create_mon_group(f"noded-{name}")
        with open(f"{g.path}/tasks", "w") as f:
            f.write(f"{p.pid}\n")
        emu.control.set_demand(p.pid, gbps * GB, domain=0)
    sampler = BandwidthSampler(SimpleNamespace(created_at=lambda job: None))

    def tick():
        time.sleep(0.5)  # a measurement window, not a synchronisation
        s = sampler.sample(rc, 1, groups)
        return s.node_bps[0]

    for _ in range(3):
        node = tick()
    assert node is not None and 2 * GB < node < 4 * GB
    emu.control.set_counter_state("Error", group="/mon_groups/noded-a")
    failing = [tick() for _ in range(3)]
    emu.control.set_counter_state(None, group="/mon_groups/noded-a")
    back = [tick() for _ in range(3)]
    assert failing == [None] * 3, [v and v / GB for v in failing]  # never b's alone (1 GB/s)
    assert all(v is None or v < 4 * GB for v in back), [v and v / GB for v in back]  # never a's whole count
    assert back[-1] is not None and 2 * GB < back[-1] < 4 * GB
