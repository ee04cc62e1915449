"""A FUSE filesystem that behaves like the kernel's resctrl, for hosts without RDT.

Run it with ``python -m nodesim.resctrl_emulator MOUNTPOINT --profile PROFILE``; drive
its hardware side (bandwidth demand, faults) through ``EmulatorControl``.
``MountedEmulator`` starts one as a child process and waits until it is mounted.
"""

from nodesim.resctrl_emulator.control import ControlError, EmulatorControl
from nodesim.resctrl_emulator.process import EmulatorStartError, MountedEmulator
from nodesim.resctrl_emulator.profiles import PROFILES, Profile

__all__ = ["ControlError", "EmulatorControl", "EmulatorStartError", "MountedEmulator", "PROFILES", "Profile"]
