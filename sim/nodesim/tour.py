"""A scripted tour of the resctrl library against the emulator (what `make demo` shows
until the daemon exists): two real processes, one a GPU job's input pipeline, one a
CPU bandwidth hog; measure them, throttle the hog with MBA, measure again, clean up."""

from __future__ import annotations

import subprocess
import sys
import time

from resctrl import BandwidthMeter, MonGroup, Resctrl, SchemataError
from nodesim.resctrl_emulator import MountedEmulator

GB = 1e9


def _say(text: str = "") -> None:
    print(text, flush=True)


def _measure(groups: dict[str, MonGroup], window: float) -> dict[str, float]:
    meters = {name: BandwidthMeter() for name in groups}
    for name, g in groups.items():
        meters[name].update(g.read_mbm(), time.monotonic())
    time.sleep(window)  # the measurement window
    out = {}
    for name, g in groups.items():
        rates = meters[name].update(g.read_mbm(), time.monotonic())
        out[name] = sum(r for r in rates.values() if r is not None)
    return out


def _table(rates: dict[str, float], peak: float) -> None:
    total = sum(rates.values())
    for name, r in rates.items():
        _say(f"    {name:<22} {r / GB:6.2f} GB/s")
    _say(f"    {'node (domain 0)':<22} {total / GB:6.2f} GB/s  = {100 * total / peak:.0f}% of the {peak / GB:.0f} GB/s peak")


def run_tour(profile: str = "intel", window: float = 1.0) -> int:
    peak = 20 * GB
    _say(f"noded tour: the resctrl library against the emulator (profile {profile!r})\n")
    with MountedEmulator(profile, extra_args=["--peak-gbps", str(peak / GB)]) as emu:
        with open(emu.mounts_file) as f:
            _say(f"1. mounted the emulator: {f.read().strip()}")
        rc = Resctrl.open(emu.root, mounts=emu.mounts_file)
        caps = rc.caps
        _say(f"2. capabilities from info/: resources {', '.join(caps.resources)}; L3 domains {list(caps.domains)}; "
             f"{caps.max_ctrl_groups} control groups; {caps.max_groups} monitoring groups; MBA "
             + (f"{caps.mb.limits.flavour.value} (min {caps.mb.limits.min_bandwidth}, "
                f"granularity {caps.mb.limits.bandwidth_gran})" if caps.mb else "absent"))
        job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        hog = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        created = []
        try:
            root = rc.root_group()
            job_group = root.create_mon_group("noded-job-bert")
            hog_group = root.create_mon_group("noded-job-cpu-hog")
            created += [job_group, hog_group]
            job_group.add_process(job.pid)
            hog_group.add_process(hog.pid)
            _say(f"3. created monitoring groups and moved real processes into them: "
                 f"{job_group.name} {job_group.read_tasks()}, {hog_group.name} {hog_group.read_tasks()}")
            emu.control.set_demand(job.pid, 6 * GB, domain=0)
            emu.control.set_demand(hog.pid, 18 * GB, domain=0)
            _say("4. the emulated hardware: the job's input pipeline wants 6 GB/s, the hog 18 GB/s, on domain 0."
                 " Measured through mon_data/ (mbm_total_bytes):")
            groups = {"job (BERT input)": job_group, "cpu hog": hog_group}
            _table(_measure(groups, window), peak)
            mba = rc.create_ctrl_group("noded-mba-30")
            created.insert(0, mba)
            written = mba.set_mb(30)
            hog_group = hog_group.move_to(mba)
            groups["cpu hog"] = hog_group
            _say(f"5. throttled the hog: made control group {mba.name}, wrote schemata {written}, "
                 f"moved {hog_group.name} under it. Measured again:")
            _table(_measure(groups, window), peak)
            try:
                mba.write_schemata({"MB": {0: 5}})
            except SchemataError as e:
                _say(f"6. a bad write is refused with the kernel's own words: {e.status!r}"
                     f" ({type(e).__name__}); schemata still {mba.read_schemata()['MB']}")
        finally:
            job.kill()
            hog.kill()
            job.wait()
            hog.wait()
            removed = rc.remove_orphans()
            _say(f"7. cleaned up: removed {len(removed)} groups noded owned; "
                 f"left: {[g.name for g in rc.owned_groups()] or 'none'}")
    _say("8. unmounted the emulator. Done.")
    return 0
