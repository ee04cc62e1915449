"""The emulator's reset (the fuse tier's one mount per module rests on it), on the kernel
model alone: after any use, what every file reads is what a new kernel's reads, and the
paths of the groups that went are named for the VFS to forget."""

import os

from nodesim.resctrl_emulator.kernel import ResctrlKernel
from nodesim.resctrl_emulator.profiles import PROFILES


def files(kernel: ResctrlKernel, parts=()) -> dict[str, str | None]:
    """Every path of the kernel's tree, with a file's text (None for a directory), but the
    default group's tasks (every process of this host)."""
    seen: dict[str, str | None] = {"/".join(parts): None}
    for name in kernel.readdir(list(parts)):
        path = [*parts, name]
        if kernel.lookup(path).is_dir:
            seen.update(files(kernel, path))
        elif path != ["tasks"]:
            seen["/".join(path)] = kernel.read(path)
    return seen


def test_a_reset_kernel_reads_as_a_new_one_and_names_the_groups_that_went():
    now = [100.0]
    profile = PROFILES["intel"].replace(num_rmids=5)
    fresh = files(ResctrlKernel(profile, clock=lambda: now[0], limbo_s=600))
    kernel = ResctrlKernel(profile, clock=lambda: now[0], limbo_s=600)
    kernel.mkdir(["g"])
    kernel.mkdir(["g", "mon_groups", "m"])
    kernel.mkdir(["mon_groups", "rm"])
    kernel.rmdir(["mon_groups", "rm"])  # its RMID in limbo
    kernel.mkdir(["mon_groups", "kept"])
    kernel.write(["g", "schemata"], b"L3:0=f\nMB:1=30\n", os.getpid(), 0)
    kernel.write(["g", "tasks"], f"{os.getpid()}\n".encode(), os.getpid(), 0)
    kernel.set_demand(os.getpid(), 5e9, domain=0)
    kernel.faults[(None, None, "mbm_local_bytes")] = "Error"
    kernel.set_domain_online(1, False)
    now[0] += 10
    assert files(kernel) != fresh
    assert sorted(kernel.reset()) == ["/g", "/mon_groups/kept"]
    assert files(kernel) == fresh
    assert kernel.resolve_task(os.getpid()).closid == 0 and not kernel.demand and not kernel.limbo
