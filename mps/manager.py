"""Managing NVIDIA's MPS control daemon (``nvidia-cuda-mps-control``).

Start: the GPUs MPS serves go to EXCLUSIVE_PROCESS compute mode first (their
modes recorded), then ``control -d`` with its own pipe and log directories (and
CUDA_VISIBLE_DEVICES by UUID where MPS serves only some GPUs). Ready means: the
pid file exists, that process lives, and a command answers. Commands go to a
client invocation on stdin, with a timeout; exit status 1 means no daemon answered.

Health: a dead daemon, or a server in FAULT (``control.log``), is restarted with
backoff, and the defaults set by commands (lost with the daemon) are set again.
Stop: ``quit`` with a timeout, then force; no process, pipe directory or compute
mode change is left behind, also when starting failed half-way.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)

PID_FILE = "nvidia-cuda-mps-control.pid"
FAULT_MARK = "encountered a fatal exception"


def max_clients_per_device(compute_major: int) -> int:
    """MPS client limit per device: 48 from Volta (7.x) on, 16 before."""
    return 48 if compute_major >= 7 else 16


def client_limit(uuids: list[str]) -> int:
    """The MPS client limit that binds on these GPUs: the lowest of theirs."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return min(max_clients_per_device(pynvml.nvmlDeviceGetCudaComputeCapability(
            pynvml.nvmlDeviceGetHandleByUUID(u))[0]) for u in uuids)
    finally:
        pynvml.nvmlShutdown()


class MpsError(RuntimeError):
    pass


class MpsUnreachable(MpsError):
    """The client exited 1: no control daemon answered."""


class MpsTimeout(MpsError):
    """The control daemon did not answer in time."""


def all_gpu_uuids() -> list[str]:
    import pynvml

    pynvml.nvmlInit()
    try:
        return [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


class ComputeModes:
    """EXCLUSIVE_PROCESS on the GPUs MPS serves, and back, through NVML."""

    def __init__(self, uuids: list[str]):
        self.uuids = uuids
        self.original: dict[str, int] = {}

    def set_exclusive(self) -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
            try:
                for uuid in self.uuids:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                    mode = pynvml.nvmlDeviceGetComputeMode(handle)
                    self.original.setdefault(uuid, mode)
                    if mode != pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
                        pynvml.nvmlDeviceSetComputeMode(handle, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
            finally:
                pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            self.restore()
            raise MpsError(f"setting EXCLUSIVE_PROCESS compute mode failed: {e}") from None

    def restore(self) -> None:
        import pynvml

        if not self.original:
            return
        try:
            pynvml.nvmlInit()
            try:
                for uuid, mode in list(self.original.items()):
                    pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid), mode)
                    del self.original[uuid]
            finally:
                pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            log.error("restoring compute modes %s failed: %s", self.original, e)


@dataclass
class MpsDefaults:
    active_thread_percentage: float | None = None
    pinned_mem_limits: dict[int, str] = field(default_factory=dict)  # device index -> "4096M"


class MpsControl:
    def __init__(self, control: str, pipe_dir: str, log_dir: str, *, gpus: list[str] | None = None,
                 compute_modes: ComputeModes | None = None, command_timeout: float = 5.0,
                 ready_timeout: float = 10.0, stop_timeout: float = 5.0,
                 backoff_s: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 30.0),
                 extra_env: dict[str, str] | None = None, clock: Callable[[], float] = time.monotonic):
        self.control = control
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.gpus = gpus
        self.compute_modes = compute_modes
        self.command_timeout = command_timeout
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.backoff_s = backoff_s
        self.clock = clock
        self.extra_env = dict(extra_env or {})
        self.defaults = MpsDefaults()
        self.restarts = 0
        self._failures = 0
        self._next_restart = 0.0
        self._log_offset = 0

    # -- the environment NVIDIA's tools read
    def env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir,
               "CUDA_MPS_LOG_DIRECTORY": self.log_dir}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        env.update(self.extra_env)
        return env

    def pid(self) -> int | None:
        try:
            with open(os.path.join(self.pipe_dir, PID_FILE)) as f:
                return int(f.read().strip())
        except (FileNotFoundError, ValueError):
            return None

    def alive(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        try:  # a zombie is not alive
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    # -- commands
    def command(self, line: str, timeout: float | None = None) -> str:
        try:
            p = subprocess.run([self.control], input=line + "\n", capture_output=True, text=True, env=self.env(),
                               timeout=timeout or self.command_timeout)
        except subprocess.TimeoutExpired:
            raise MpsTimeout(f"MPS control daemon did not answer {line!r} within "
                             f"{timeout or self.command_timeout:g}s") from None
        if p.returncode == 1:
            raise MpsUnreachable(f"{line!r}: {p.stderr.strip() or 'no MPS control daemon answered'}")
        if p.returncode != 0:
            raise MpsError(f"{line!r}: exit {p.returncode}: {p.stderr.strip()}")
        return p.stdout.strip()

    def set_defaults(self, defaults: MpsDefaults) -> None:
        """Defaults for servers started later; kept to be set again after a restart."""
        self.defaults = defaults
        self._apply_defaults()

    def _apply_defaults(self) -> None:
        d = self.defaults
        if d.active_thread_percentage is not None:
            self.command(f"set_default_active_thread_percentage {d.active_thread_percentage:g}")
        for dev, value in sorted(d.pinned_mem_limits.items()):
            self.command(f"set_default_device_pinned_mem_limit {dev} {value}")

    def set_server_limits(self, server_pid: int, active_thread_percentage: float | None = None,
                          pinned_mem_limits: dict[int, str] | None = None) -> None:
        """Per-server limits; they apply to clients that connect afterwards."""
        if active_thread_percentage is not None:
            self.command(f"set_active_thread_percentage {server_pid} {active_thread_percentage:g}")
        for dev, value in sorted((pinned_mem_limits or {}).items()):
            self.command(f"set_device_pinned_mem_limit {server_pid} {dev} {value}")

    # -- lifecycle
    def start(self) -> None:
        os.makedirs(self.pipe_dir, mode=0o755, exist_ok=True)
        os.makedirs(self.log_dir, mode=0o755, exist_ok=True)
        try:
            if self.compute_modes is not None:
                self.compute_modes.set_exclusive()
            p = subprocess.run([self.control, "-d"], capture_output=True, text=True, env=self.env(),
                               timeout=self.ready_timeout)
            if p.returncode != 0:
                raise MpsError(f"{self.control} -d failed (exit {p.returncode}): {p.stderr.strip()}")
            self._wait_ready()
            self._log_offset = self._log_size()
            self._apply_defaults()
        except (MpsError, OSError, subprocess.TimeoutExpired) as e:
            self._teardown()
            raise e if isinstance(e, MpsError) else MpsError(f"starting MPS failed: {e}") from None
        log.info("mps=started pid=%s pipe_dir=%s gpus=%s", self.pid(), self.pipe_dir, self.gpus or "all")

    def _wait_ready(self) -> None:
        deadline = self.clock() + self.ready_timeout
        last: Exception | None = None
        while self.clock() < deadline:
            if self.alive():
                try:
                    self.command("get_default_active_thread_percentage", timeout=max(0.5, deadline - self.clock()))
                    return
                except MpsError as e:
                    last = e
            time.sleep(0.05)  # polling readiness against a deadline
        raise MpsError(f"MPS control daemon not ready within {self.ready_timeout:g}s" + (f": {last}" if last else ""))

    def _log_size(self) -> int:
        try:
            return os.path.getsize(os.path.join(self.log_dir, "control.log"))
        except FileNotFoundError:
            return 0

    def _faults_since_check(self) -> list[str]:
        path = os.path.join(self.log_dir, "control.log")
        try:
            with open(path) as f:
                f.seek(self._log_offset)
                text = f.read()
                self._log_offset = f.tell()
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if FAULT_MARK in line]

    def health(self) -> str:
        """Called every tick: "ok", "restarted", or "down" (waiting for the next restart)."""
        faults = self._faults_since_check() if self.alive() else []
        if self.alive() and not faults:
            self._failures = 0
            return "ok"
        now = self.clock()
        if now < self._next_restart:
            return "down"
        reason = f"server fault: {faults[0]}" if faults else "control daemon died"
        log.warning("mps=restarting reason=%r attempt=%d", reason, self._failures + 1)
        self._kill()
        try:
            self.start()
        except MpsError as e:
            delay = self.backoff_s[min(self._failures, len(self.backoff_s) - 1)]
            self._failures += 1
            self._next_restart = now + delay
            log.error("mps=restart_failed retry_in=%gs error=%s", delay, e)
            return "down"
        self._failures = 0
        self.restarts += 1
        return "restarted"

    def stop(self) -> None:
        """quit (with a timeout), then force; leaves no process, pipe dir or compute mode."""
        pid = self.pid()
        if pid is not None and self.alive():
            try:
                self.command("quit", timeout=self.stop_timeout)
            except MpsError as e:
                log.warning("mps quit failed (%s); killing pid %d", e, pid)
            deadline = self.clock() + self.stop_timeout
            while self.alive() and self.clock() < deadline:
                time.sleep(0.02)  # waiting for the daemon's own exit, against a deadline
        self._teardown()

    def _kill(self) -> None:
        pid = self.pid()
        if pid is None:
            return
        try:  # its servers first: they would outlive a killed daemon
            for spid in self.command("get_server_list", timeout=1.0).split():
                os.kill(int(spid), signal.SIGKILL)
        except (MpsError, ValueError, ProcessLookupError):
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = self.clock() + self.stop_timeout
        while self.alive() and self.clock() < deadline:
            time.sleep(0.01)  # SIGKILL is delivered asynchronously; wait for it, against a deadline

    def _teardown(self) -> None:
        self._kill()
        shutil.rmtree(self.pipe_dir, ignore_errors=True)
        if self.compute_modes is not None:
            self.compute_modes.restore()
