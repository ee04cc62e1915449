"""bench.daemon_cost's host estimate: noded's resctrl sampler over a tmpfs copy of the mount
reads what it reads on the mount (the goal's verdict rests on it)."""

import os

import pytest

from bench.bare_tick import mbm_files
from bench.daemon_cost import mirror_resctrl, sampler_cpu_on
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

    took, read, sample = sampler_cpu_on(mirror, rc.caps, reps=3)
    assert took > 0
    assert set(sample.job_bps) == {"noded-job-a", "noded-job-b", "noded-job-c"}
    assert None not in sample.node_bps.values()  # every counter found and read
    # what it reads: the 3 job groups' and the 2 control groups' counters on every domain
    domains = os.listdir(os.path.join(emu.root, "mon_data"))
    assert len(read) == len(set(read)) == (3 + 2) * len(domains) and all(os.path.isfile(f) for f in read)
    assert not any("someone-elses" in f for f in read)
