"""The fuse tier's mounts: one per profile and options for each module, reset between its
tests (the emulator's control op ``reset``: a fresh mount's state, the VFS told the groups
are gone; test_emulator_fidelity.py's test_reset_is_a_fresh_mount holds it to that). A
mount's start and stop are most of what a test here would cost on its own."""

import pytest

from nodesim.resctrl_emulator import MountedEmulator


def pytest_collection_modifyitems(config, items):
    # each module in one worker: its mounts are started once per worker that runs it
    for item in items:
        if item.path.parent.name == "fuse" and item.path.parent.parent.name == "tests":
            item.add_marker(pytest.mark.xdist_group(f"fuse-{item.path.stem}"))


@pytest.fixture(scope="module")
def mounts(tmp_path_factory):
    """mounts(profile, *extra_args) -> the module's one mount of that profile and those
    options (started at its first use), unmounted after the module."""
    started: dict[tuple[str, ...], MountedEmulator] = {}

    def mount(*profile_and_args: str) -> MountedEmulator:
        if profile_and_args not in started:
            workdir = tmp_path_factory.mktemp("emu")
            started[profile_and_args] = MountedEmulator(profile_and_args[0], workdir=str(workdir),
                                                        extra_args=list(profile_and_args[1:])).start()
        return started[profile_and_args]

    yield mount
    for emu in started.values():  # all told at once: each takes a while to unmount
        emu.proc.terminate()
    for emu in started.values():
        emu.stop()


@pytest.fixture
def emulator(mounts):
    """Factory: emulator(profile, *extra_args) -> the module's mount of that profile and those
    options, reset to how it came up (support.plugin's fixture, which starts one per call,
    is the one for the other tiers)."""

    def reset_mount(profile: str = "intel", *extra_args: str) -> MountedEmulator:
        emu = mounts(profile, *extra_args)
        emu.control.reset()
        return emu

    return reset_mount
