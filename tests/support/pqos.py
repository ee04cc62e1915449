"""Run Intel's pqos (intel-cmt-cat, the OS interface: ``pqos -I``) against a resctrl emulator.

pqos looks for the kernel's resctrl where the kernel keeps it: ``resctrl`` in
/proc/filesystems, the filesystem at /sys/fs/resctrl, the RDT flags in /proc/cpuinfo. Each
command here runs in a mount namespace of its own (``unshare --mount``, private
propagation) in which those three say so: a tmpfs over /sys/fs with the emulator's mount
bound at /sys/fs/resctrl, and /proc/filesystems and /proc/cpuinfo bound over by copies that
add what the emulated kernel would show. pqos's lock file (/var/lock/libpqos) is on a tmpfs
of the namespace too. The namespace ends with the command: nothing outside it changes but
the emulator's own state, which is what the tests read back.

What cannot be made up this way is what pqos learns from CPUID (vendor, cache geometry,
topology), so the emulator must answer with this machine's L3 domains (``--topology host``)
and a profile of this machine's vendor (``host_profile``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from nodesim.resctrl_emulator import MountedEmulator
from nodesim.resctrl_emulator.topology import has_l3_ids

PQOS = shutil.which("pqos") or shutil.which("pqos", path="/usr/sbin:/sbin")


def _why_pqos_cannot_run() -> str | None:
    if not PQOS:
        return "pqos (Debian package intel-cmt-cat) is not installed; `make test` installs it"
    if os.geteuid() != 0:
        return "running pqos against the emulator needs root (a mount namespace and bind mounts)"
    if not shutil.which("unshare"):
        return "unshare (util-linux) is missing"
    if not has_l3_ids():
        return ("sysfs names no L3 cache id (/sys/devices/system/cpu/cpu*/cache/index3/id): "
                "the emulator cannot show the domains pqos reads from this machine")
    return None


PQOS_MISSING = _why_pqos_cannot_run()

# The /proc/cpuinfo flags the kernel shows for RDT (arch/x86/include/asm/cpufeatures.h):
# pqos -I reads "cqm" to allow monitoring and "cdp_l3" to offer CDP.
RDT_MON_FLAGS = ("cqm", "cqm_llc", "cqm_occup_llc", "cqm_mbm_total", "cqm_mbm_local")
RDT_ALLOC_FLAGS = ("rdt_a", "cat_l3", "mba")

# Mount the namespace's view, then become pqos. "$1".. are the harness's paths, then pqos's args.
_NAMESPACE_SCRIPT = r"""
set -e
emulator=$1 filesystems=$2 cpuinfo=$3; shift 3
mount -t tmpfs -o size=64k,mode=0755 noded-pqos-sysfs /sys/fs
mkdir /sys/fs/resctrl
mount --bind "$emulator" /sys/fs/resctrl
mount --bind "$filesystems" /proc/filesystems
mount --bind "$cpuinfo" /proc/cpuinfo
mount -t tmpfs -o size=64k,mode=1777 noded-pqos-lock /run/lock
exec "$@"
"""


def host_vendor() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("vendor_id"):
                return "amd" if "AuthenticAMD" in line else "intel"
    return "intel"


def host_profile() -> str:
    """The emulator profile whose vendor is this machine's (pqos reads the vendor from CPUID)."""
    return host_vendor()


@dataclass
class PqosResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class PqosHarness:
    """pqos commands against one mounted emulator, each in its own mount namespace."""

    def __init__(self, emu: MountedEmulator, workdir: str):
        self.emu = emu
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.filesystems = os.path.join(workdir, "filesystems")
        self.cpuinfo = os.path.join(workdir, "cpuinfo")
        with open("/proc/filesystems") as f:
            known = f.read()
        with open(self.filesystems, "w") as f:
            f.write(known if "\tresctrl\n" in known else known + "nodev\tresctrl\n")
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines(keepends=True)
        added = " " + " ".join(RDT_ALLOC_FLAGS + RDT_MON_FLAGS)
        with open(self.cpuinfo, "w") as f:
            f.writelines(line.rstrip("\n") + added + "\n" if line.startswith("flags") else line for line in lines)

    def run(self, *args: str, timeout: float = 60.0) -> PqosResult:
        """``pqos -I ARGS`` in a fresh namespace; its exit status and output."""
        return self.command(PQOS, "-I", *args, timeout=timeout)

    def command(self, *argv: str, timeout: float = 60.0) -> PqosResult:
        """Any command (pqos, rdtset, a shell) in a fresh namespace that shows the emulator."""
        p = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _NAMESPACE_SCRIPT, "pqos-namespace",
             self.emu.root, self.filesystems, self.cpuinfo, *argv],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        return PqosResult(p.returncode, p.stdout, p.stderr)

    def read(self, rel: str) -> str:
        """A file of the emulator, read from outside any namespace."""
        with open(os.path.join(self.emu.root, rel)) as f:
            return f.read()
