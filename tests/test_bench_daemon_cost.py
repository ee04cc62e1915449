"""bench.daemon_cost's host estimate: noded's resctrl sampler over a tmpfs copy of the mount
reads what it reads on the mount (the goal's verdict rests on it)."""

import os

import pytest

from bench.bare_tick import mbm_files
from bench.daemon_cost import MirrorSampler, mirror_resctrl
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
    # what it read (observed): the 3 job groups' and the 2 control groups' counters on every
    # domain, each once, none of the foreign group's
    domains = os.listdir(os.path.join(emu.root, "mon_data"))
    read = on_mirror.files
    assert len(read) == len(set(read)) == (3 + 2) * len(domains) and all(os.path.isfile(f) for f in read)
    assert not any("someone-elses" in f for f in read)
    assert all(f.startswith(mirror + "/") for f in read)  # the copy's, never the mount's


def test_host_counter_reads_times_every_counter_against_kernfs_files(emulator, open_resctrl, tmp_path, capsys):
    from bench import host_counter_reads

    emu = emulator("intel")
    open_resctrl(emu).root_group().create_mon_group("noded-job-a")
    out = tmp_path / "reads.json"
    assert host_counter_reads.main(["--resctrl", emu.root, "--passes", "2", "--json", str(out),
                                    "--kernfs", str(tmp_path / "nothing-*"), "--kernfs", "/proc/self/stat"]) == 0
    import json

    result = json.loads(out.read_text())
    assert result["files"] == len(mbm_files(emu.root)) == 2 * len(os.listdir(os.path.join(emu.root, "mon_data")))
    assert result["kernfs_example"] == "/proc/self/stat"  # the first pattern that matched
    assert all(v > 0 for v in result["per_read_us"].values())
    assert "ms of its CPU" in capsys.readouterr().out


def test_host_counter_reads_says_what_is_missing_without_monitoring(tmp_path):
    from bench import host_counter_reads

    with pytest.raises(SystemExit, match=f"{tmp_path} has no mon_data: no resctrl with memory-bandwidth monitoring"):
        host_counter_reads.main(["--resctrl", str(tmp_path)])
