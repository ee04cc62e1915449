"""python -m nodesim.resctrl_emulator MOUNTPOINT --profile PROFILE [--control SOCKET]"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

from nodesim.resctrl_emulator.control import ControlServer, serve_in_thread
from nodesim.resctrl_emulator.kernel import ResctrlKernel
from nodesim.resctrl_emulator.profiles import PROFILES
from nodesim.resctrl_emulator.topology import SYSFS_CPU, TopologyError, has_l3_ids, read_host_topology

log = logging.getLogger("nodesim.resctrl_emulator")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m nodesim.resctrl_emulator",
                                description="Mount a FUSE filesystem that behaves like the kernel's resctrl.")
    p.add_argument("mountpoint")
    p.add_argument("--profile", choices=sorted(PROFILES), default="intel")
    p.add_argument("--topology", choices=("host", "profile"),
                   help="L3 domains and their CPUs: 'host' reads this machine's "
                        "(SYSFS/cpuN/cache/index3/id), as tools like pqos expect; 'profile' takes the "
                        "profile's fixed ones (several domains, the same on every machine). "
                        "Default: 'host' where sysfs names an L3 id, else 'profile'")
    p.add_argument("--sysfs-cpu", default=SYSFS_CPU, metavar="SYSFS",
                   help=f"where to read the host's topology (default {SYSFS_CPU})")
    p.add_argument("--control", metavar="SOCKET", help="Unix socket for the control API")
    p.add_argument("--mounts-file", metavar="FILE",
                   help="write this mount's /proc/mounts line (as the kernel would show it) to FILE")
    p.add_argument("--proc", default="/proc", help="procfs root for task lookups")
    p.add_argument("--num-rmids", type=int, help="override info/L3_MON/num_rmids")
    p.add_argument("--num-closids", type=int, help="override num_closids of every resource")
    p.add_argument("--peak-gbps", type=float, help="per-domain peak bandwidth of the model (GB/s)")
    p.add_argument("--limbo-ms", type=float, default=1000.0,
                   help="how long a freed RMID stays in limbo (the kernel checks every 1000 ms)")
    p.add_argument("--tasks-write", choices=("single", "list"), default="single",
                   help="'single': one PID per write (kernels < 6.7); 'list': comma lists (6.7+)")
    p.add_argument("--legacy-format", action="store_true", help="pad schemata values as pre-2025 kernels do")
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(argv)
    for name in ("num_rmids", "num_closids"):
        v = getattr(args, name)
        if v is not None and v < 2:
            p.error(f"--{name.replace('_', '-')} must be at least 2, got {v}")
    if not os.path.isdir(args.mountpoint):
        p.error(f"mountpoint {args.mountpoint!r} is not a directory")
    if args.topology is None:
        args.topology = "host" if has_l3_ids(args.sysfs_cpu) else "profile"
    return args


def main(argv: list[str] | None = None) -> int:
    import mfusepy  # imported here so --help works where libfuse3 is missing

    from nodesim.resctrl_emulator.fuse_ops import ENTRY_TIMEOUT_S, ResctrlOperations

    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(name)s: %(message)s")
    profile = PROFILES[args.profile]
    changes: dict = {}
    if args.num_rmids is not None:
        changes["num_rmids"] = args.num_rmids
    if args.num_closids is not None:
        changes["num_closids_l3"] = changes["num_closids_mb"] = args.num_closids
    if args.peak_gbps is not None:
        changes["peak_bytes_per_s"] = args.peak_gbps * 1e9
    if args.legacy_format:
        changes["legacy_format"] = True
    profile = profile.replace(**changes)
    if args.topology == "host":
        try:
            host = read_host_topology(args.sysfs_cpu)
        except TopologyError as e:
            print(f"nodesim.resctrl_emulator: --topology host: {e}", file=sys.stderr)
            return 2
        profile = profile.on_topology(host.domains, host.l3_bytes)
    kernel = ResctrlKernel(profile, proc=args.proc, clock=time.monotonic,
                           limbo_s=args.limbo_ms / 1000.0, tasks_write=args.tasks_write)
    mountpoint = os.path.abspath(args.mountpoint)
    stop = threading.Event()
    servers: list[ControlServer] = []
    mounted = threading.Event()

    def on_mounted() -> None:
        mounted.set()
        if args.mounts_file:
            opts = ["rw", "relatime"] + (["cdp"] if profile.cdp else []) + (["mba_MBps"] if profile.mba_mbps else [])
            tmp = args.mounts_file + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"resctrl {mountpoint.replace(' ', chr(92) + '040')} resctrl {','.join(opts)} 0 0\n")
            os.replace(tmp, args.mounts_file)
        if args.control:
            server = ControlServer(args.control, kernel, invalidate=operations.invalidate)
            servers.append(server)
            serve_in_thread(server)
        threading.Thread(target=housekeeping, name="resctrl-emulator-tick", daemon=True).start()

    operations = ResctrlOperations(kernel, on_mounted)

    def housekeeping() -> None:
        # The kernel forgets exited tasks; do the same so reused ids start fresh.
        while not stop.wait(1.0):
            with kernel.lock:
                kernel.collect_dead_tasks()

    try:
        mfusepy.FUSE(operations, mountpoint, foreground=True, raw_fi=True,
                     allow_other=True, default_permissions=True, fsname="resctrl", subtype="resctrl",
                     attr_timeout=ENTRY_TIMEOUT_S, entry_timeout=ENTRY_TIMEOUT_S, negative_timeout=0, max_threads=16)
    except RuntimeError as e:
        # libfuse's fuse_main() returns non-zero when its loop ends by a signal, too;
        # a mount that came up and was then stopped is a clean exit.
        if not mounted.is_set():
            print(f"nodesim.resctrl_emulator: could not mount {mountpoint}: libfuse error {e}", file=sys.stderr)
            return 1
    finally:
        stop.set()
        for server in servers:
            server.shutdown()
            server.server_close()
        for path in (args.control, args.mounts_file):
            if path and os.path.exists(path):
                os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
