"""Run the emulator as a child process: mount, wait until ready, unmount."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from nodesim.parentdeath import die_with_parent
from nodesim.resctrl_emulator.control import EmulatorControl


class EmulatorStartError(RuntimeError):
    pass


class MountedEmulator:
    """A mounted resctrl emulator in a child process, with its control client.

    ``with MountedEmulator("intel") as emu: emu.root, emu.control, emu.mounts_file``

    ``topology``: "profile" (the default here) gives the profile's fixed L3 domains, the
    same on every machine, which tests and the simulated node are written against;
    "host" gives this machine's (what a tool that reads sysfs and CPUID, such as pqos,
    expects); None leaves the choice to the emulator (host where sysfs names an L3 id).
    """

    def __init__(self, profile: str = "intel", *, workdir: str | None = None,
                 extra_args: list[str] | None = None, start_timeout: float = 20.0,
                 topology: str | None = "profile"):
        self.profile = profile
        self.topology = topology
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="resctrl-emu-")
        self.root = os.path.join(self.workdir, "resctrl")
        self.control_path = os.path.join(self.workdir, "control.sock")
        self.mounts_file = os.path.join(self.workdir, "mounts")
        self.extra_args = extra_args or []
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.control: EmulatorControl | None = None

    def start(self) -> "MountedEmulator":
        os.makedirs(self.root, exist_ok=True)
        self._stderr = open(os.path.join(self.workdir, "emulator.log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nodesim.resctrl_emulator", self.root, "--profile", self.profile,
             "--control", self.control_path, "--mounts-file", self.mounts_file,
             *(["--topology", self.topology] if self.topology else []), *self.extra_args],
            stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr,
            # Its own session: a terminal's Ctrl-C (SIGINT to the foreground process group)
            # reaches only its parent, which stops it in order (stop()), never mid-teardown.
            start_new_session=True,
            preexec_fn=die_with_parent,  # SIGTERM: it unmounts, so no mount outlives its user
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EmulatorStartError(f"emulator exited with {self.proc.returncode}: {self.log()}")
            if os.path.exists(self.control_path) and os.path.ismount(self.root):
                try:
                    self.control = EmulatorControl(self.control_path)
                    self.control.ping()
                    return self
                except OSError:
                    pass
            time.sleep(0.02)  # polling a condition with a deadline
        self.stop()
        raise EmulatorStartError(f"emulator not mounted within {self.start_timeout}s: {self.log()}")

    def log(self) -> str:
        try:
            with open(os.path.join(self.workdir, "emulator.log"), errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if os.path.ismount(self.root):
            subprocess.run(["fusermount3", "-u", "-z", self.root], check=False)
        if self.proc is not None:
            self._stderr.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "MountedEmulator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
