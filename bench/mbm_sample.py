"""Cost of one MBM sample of 64 groups x 2 domains through the library, against a
bare loop that opens and reads the same counter files.

    python -m bench.mbm_sample [--groups 64] [--repeat 30] [--json bench/out/mbm_sample.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from resctrl import Resctrl
from nodesim.resctrl_emulator import MountedEmulator
from resctrl.info import read_domains
from resctrl.mbm import MBM_LOCAL, MBM_TOTAL, MbmReader


def bare_read(paths: list[str]) -> list[bytes]:
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(f.read())
    return out


def timed(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--profile", default="intel")
    ap.add_argument("--json", default="bench/out/mbm_sample.json")
    args = ap.parse_args(argv)
    with MountedEmulator(args.profile, extra_args=["--num-rmids", str(args.groups + 2)]) as emu:
        rc = Resctrl.open(emu.root, mounts=emu.mounts_file)
        groups = [rc.root_group().create_mon_group(f"noded-bench-{i:03d}") for i in range(args.groups)]
        paths = [os.path.join(g.path, "mon_data", f"mon_L3_{d:02d}", ev)
                 for g in groups for d in rc.caps.domains for ev in (MBM_TOTAL, MBM_LOCAL)]
        reader = MbmReader()
        lib_open = lambda: [g.read_mbm() for g in groups]

        def lib_kept():
            # What a sampler does each tick: list the domains once, then pread kept descriptors.
            domains = read_domains(rc.root, True)
            return [reader.read(g.path, domains) for g in groups]

        lib_open(), lib_kept(), bare_read(paths)  # warm up
        rows = {"library read_mbm": timed(lib_open, args.repeat),
                "library MbmReader": timed(lib_kept, args.repeat),
                "bare open+read loop": timed(lambda: bare_read(paths), args.repeat)}
        reader.close()
        rc.remove_orphans()
    med = {k: statistics.median(v) for k, v in rows.items()}
    ratio = med["library read_mbm"] / med["bare open+read loop"]
    ratio_kept = med["library MbmReader"] / med["bare open+read loop"]
    print(f"MBM sample: {args.groups} groups x {len(rc.caps.domains)} domains x 2 events = {len(paths)} files "
          f"(emulator profile {args.profile}, {args.repeat} runs, median)")
    print(f"  {'method':<22} {'median ms':>10} {'p90 ms':>8} {'per file us':>12}")
    for k, v in rows.items():
        p90 = sorted(v)[int(0.9 * (len(v) - 1))]
        print(f"  {k:<22} {med[k] * 1e3:10.2f} {p90 * 1e3:8.2f} {med[k] / len(paths) * 1e6:12.1f}")
    print(f"  ratio library read_mbm / bare: {ratio:.2f}x;  MbmReader / bare: {ratio_kept:.2f}x")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "mbm_sample", "groups": args.groups, "domains": len(rc.caps.domains),
                   "files": len(paths), "repeat": args.repeat, "profile": args.profile,
                   "median_s": med, "ratio_library_over_bare": ratio, "ratio_reader_over_bare": ratio_kept,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, f, indent=2)
    print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
