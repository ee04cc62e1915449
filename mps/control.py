"""Managing NVIDIA's MPS control daemon (``nvidia-cuda-mps-control``), one step at a time.

Every step has a deadline and every child it runs is killed and reaped when the
deadline passes: a control binary that hangs costs a bounded wait, never a
stuck caller. Keeping the daemon up (health checks, restarts with backoff) is
``mps.supervisor``'s job, from its own thread; this module only does the steps.

Start: the GPUs MPS serves go to EXCLUSIVE_PROCESS compute mode first (their modes
recorded), then ``control -d`` with its own pipe and log directories (and
CUDA_VISIBLE_DEVICES by UUID). Ready means: the pid file names a live process that
is our daemon, and a command answers. Then the defaults this daemon must have are
set (they are lost with the daemon, so every start sets them, by this one path).

Health: the daemon lives, ``control.log`` shows no server fault since the last
check, and ``get_server_list`` answers within a short deadline (a SIGSTOPped or
wedged daemon keeps its pid but answers nothing).

Stop: ``quit`` with a short deadline, then SIGKILL of the servers and the daemon;
no process, pipe directory or compute mode change is left behind, also when
starting failed half-way.

The pipe directory is removed only where noded made it: a start makes it (recorded
first, with the compute modes' originals, so a start after a SIGKILL still knows it
is noded's) and refuses a path that exists and is not recorded as noded's, whatever
it is (an operator's directory, noded's state directory): its content is not noded's
to remove.

A process is only ever signalled when it is ours: our own child, or the pid in the
pid file whose environment names our pipe directory and whose command line is our
control binary, checked again by its start time just before the signal (a pid
file left by a crash may name a pid the kernel has given to someone else).

Servers whose control daemon died (SIGKILL, a crash): the daemon starts each server as
its child, and a server may outlive it (reparented to init; NVIDIA documents no server
exiting with its daemon, so noded takes none to), keeping its GPU, in EXCLUSIVE_PROCESS
mode, from the next daemon's servers. They are no longer any daemon's children, so every
kill of a daemon (stop, a restart's reset, a start after a crash) also looks for them,
where the pipe directory is noded's: the servers our daemon listed at its last health
check (``get_server_list``, every few seconds; the same pid and start time), and any
process of the server binary beside our control binary (``nvidia-cuda-mps-server``) in
noded's own cgroups (the daemon noded started, and its servers, inherit them) whose
environment names our pipe directory (a server inherits its daemon's). A server runs as
its client's user, whose environment noded's unit may not read (it keeps no
CAP_SYS_PTRACE): one of those the daemon never listed cannot be told from another MPS's
server in the same cgroup, and is said and left running.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from mps.deadline import call_within
from mps.errors import MpsError, MpsStopping, MpsTimeout, MpsUnreachable, NvmlTimeout
from mps.computemodes import COMPUTE_MODES_DEADLINE_S, ComputeModes, Recorder

log = logging.getLogger(__name__)


PID_FILE = "nvidia-cuda-mps-control.pid"
#: NVIDIA's server binary, beside its control binary (nvidia-cuda-mps-server(1))
SERVER = "nvidia-cuda-mps-server"
FAULT_MARK = "encountered a fatal exception"
#: control.log read per health check at most; a log growing faster is read on the next check
_LOG_READ_LIMIT = 1 << 20


#: a directory noded made (the MPS pipe directory), recorded before it is made
MADE_DIR = "made_dir:"


def made_dir_key(path: str) -> str:
    return f"{MADE_DIR}{path}"


def pipe_dir_problem(path: str, recorded: bool) -> str | None:
    """Why ``path`` cannot be MPS's pipe directory now (None: it can). One that does not
    exist noded makes; one that exists must be the directory an earlier run made
    (``recorded`` in its state, and a directory of noded's uid, not a link): any other
    is someone else's, and noded removes the pipe directory's content at every restart
    of MPS and the directory at stop."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot examine {path}: {e.strerror}"
    if recorded and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        return None
    what = "a directory" if stat.S_ISDIR(st.st_mode) else "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a file"
    return (f"{path} exists ({what}) and noded did not make it: MPS's pipe directory is emptied at each start and "
            "removed at stop, so it must be one noded makes; give a path that does not exist")


def server_name(control: str) -> str:
    """The server binary's name for a control binary: ``nvidia-cuda-mps-server`` beside
    ``nvidia-cuda-mps-control`` (a stand-in's ``…-control-standin``: ``…-server-standin``)."""
    base = os.path.basename(control)
    return base.replace("-mps-control", "-mps-server", 1) if "-mps-control" in base else SERVER


@dataclass(frozen=True)
class MpsDefaults:
    """What every server this daemon starts must have; set again after every restart."""

    active_thread_percentage: float | None = None
    pinned_mem_limits: dict[int, str] = field(default_factory=dict)  # device ordinal -> "4096M"

    def commands(self) -> list[str]:
        out = []
        if self.active_thread_percentage is not None:
            out.append(f"set_default_active_thread_percentage {self.active_thread_percentage:g}")
        for dev, value in sorted(self.pinned_mem_limits.items()):
            out.append(f"set_default_device_pinned_mem_limit {dev} {value}")
        return out


@dataclass(frozen=True)
class Problem:
    """What a health check found: ``dead`` or ``fault`` (restart now), ``silent`` (no
    answer in time: restart when it persists)."""

    kind: str
    message: str


class MpsControl:
    def __init__(self, control: str, pipe_dir: str, log_dir: str, *, gpus: list[str] | None = None,
                 compute_modes: ComputeModes | None = None, defaults: MpsDefaults | None = None,
                 command_timeout: float = 5.0, ready_timeout: float = 10.0, quit_timeout: float = 0.3,
                 kill_timeout: float = 0.5, extra_env: dict[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic, proc: str = "/proc", nvml_timeout: float = 20.0,
                 recorder: Recorder | None = None):
        self.control = control
        # where the pipe directory is recorded as made (noded's originals); without one,
        # only this object's memory knows, and a later object refuses the directory
        self.recorder = recorder
        self._made_here = False
        self.nvml_timeout = nvml_timeout  # NVML's calls at start (the compute modes): a hung driver fails the start
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.gpus = gpus
        self.compute_modes = compute_modes
        self.defaults = defaults or MpsDefaults()
        self.command_timeout = command_timeout
        self.ready_timeout = ready_timeout
        self.quit_timeout = quit_timeout
        self.kill_timeout = kill_timeout
        self.clock = clock
        self.proc = proc
        self.extra_env = dict(extra_env or {})
        self._log_offset = 0
        self._daemon: tuple[int, bytes] | None = None  # (pid, start time) of the daemon we started
        #: (pid -> start time) of the servers our daemon listed at its last answer to get_server_list
        self._servers: dict[int, bytes] = {}
        self._unsure_said: set[tuple[int, bytes]] = set()  # servers said to be of no telling whose, once each
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen] = set()  # in flight, killed by interrupt()
        self._interrupted = False

    # -- the environment NVIDIA's tools read
    def env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir,
               "CUDA_MPS_LOG_DIRECTORY": self.log_dir}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        env.update(self.extra_env)
        return env

    # -- which process is our daemon
    def _pid_file_pid(self) -> int | None:
        try:
            with open(os.path.join(self.pipe_dir, PID_FILE), "rb") as f:
                return int(f.read(32).strip())
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None

    def _start_time(self, pid: int) -> bytes | None:
        """The process's start time (field 22 of stat), None when it is gone or a zombie."""
        try:
            with open(f"{self.proc}/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return None
        return None if fields[0] == b"Z" else fields[19]

    def _is_control_daemon(self, pid: int) -> bool:
        """Its environment names our pipe directory and its command line is our binary."""
        try:
            with open(f"{self.proc}/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"{self.proc}/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return False
        base = os.path.basename(self.control).encode()
        return (f"CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir}".encode() in env
                and any(os.path.basename(a) == base for a in argv))

    def _identify(self) -> tuple[int, bytes] | None:
        """(pid, start time) of the live control daemon serving our pipe directory (none
        where the directory is not noded's: a daemon serving someone else's is theirs)."""
        if not self._pipe_dir_ours():
            return None
        pid = self._pid_file_pid()
        if pid is None or pid <= 1:
            return None
        if self._daemon is not None and self._daemon[0] == pid:
            started = self._start_time(pid)
            return self._daemon if started == self._daemon[1] else None
        started = self._start_time(pid)
        if started is None or not self._is_control_daemon(pid):
            return None
        return pid, started

    def pid(self) -> int | None:
        """The live control daemon's pid, or None."""
        ident = self._identify()
        return ident[0] if ident else None

    def alive(self) -> bool:
        return self._identify() is not None

    # -- children, each with a deadline
    def _run(self, argv: list[str], input_text: str, timeout: float, *, while_stopping: bool = False
             ) -> tuple[int, str, str]:
        """Run ``argv`` in its own process group; on timeout (or interrupt()) the group
        is SIGKILLed and the child reaped. Output goes to files, not pipes: a daemonised
        grandchild that keeps them open cannot hold us."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            with self._lock:
                if self._interrupted and not while_stopping:
                    raise MpsStopping(f"{' '.join(argv)}: MPS is being stopped")
                p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, env=self.env(),
                                     start_new_session=True)
                self._children.add(p)
            try:
                try:
                    p.stdin.write(input_text.encode())
                    p.stdin.close()
                except (BrokenPipeError, OSError):
                    pass  # it exited without reading: its status says why
                try:
                    rc = p.wait(timeout=max(0.0, timeout))
                except subprocess.TimeoutExpired:
                    self._kill_child(p)
                    raise MpsTimeout(f"{' '.join(argv)} did not finish within {timeout:g}s") from None
            finally:
                with self._lock:
                    self._children.discard(p)
            if rc < 0:
                if self._interrupted and not while_stopping:
                    raise MpsStopping(f"{' '.join(argv)}: killed, MPS is being stopped")
                raise MpsError(f"{' '.join(argv)} was killed by signal {-rc}")
            out.seek(0)
            err.seek(0)
            return rc, out.read(65536).decode(errors="replace"), err.read(65536).decode(errors="replace")

    def _kill_child(self, p: subprocess.Popen) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the group: a grandchild it forked goes too
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=self.kill_timeout)  # reaped: no zombie
        except subprocess.TimeoutExpired:
            log.error("mps child %d survived SIGKILL for %gs (uninterruptible sleep?)", p.pid, self.kill_timeout)

    def interrupt(self) -> None:
        """From any thread: kill what is in flight and start nothing more (stop() may still
        send its quit)."""
        with self._lock:
            self._interrupted = True
            children = list(self._children)
        for p in children:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # -- commands
    def command(self, line: str, timeout: float | None = None, *, while_stopping: bool = False) -> str:
        limit = self.command_timeout if timeout is None else timeout
        try:
            rc, out, err = self._run([self.control], line + "\n", limit, while_stopping=while_stopping)
        except MpsTimeout:
            raise MpsTimeout(f"MPS control daemon did not answer {line!r} within {limit:g}s") from None
        except OSError as e:
            raise MpsError(f"{self.control}: {e}") from None
        if rc == 1:
            raise MpsUnreachable(f"{line!r}: {err.strip() or 'no MPS control daemon answered'}")
        if rc != 0:
            raise MpsError(f"{line!r}: exit {rc}: {err.strip()}")
        return out.strip()

    def set_server_limits(self, server_pid: int, active_thread_percentage: float | None = None,
                          pinned_mem_limits: dict[int, str] | None = None) -> None:
        """Per-server limits; they apply to clients that connect afterwards."""
        if active_thread_percentage is not None:
            self.command(f"set_active_thread_percentage {server_pid} {active_thread_percentage:g}")
        for dev, value in sorted((pinned_mem_limits or {}).items()):
            self.command(f"set_device_pinned_mem_limit {server_pid} {dev} {value}")

    # -- lifecycle
    def start(self) -> None:
        """Compute modes, the daemon, ready, its defaults; all of it or nothing (raises MpsError)."""
        problem = pipe_dir_problem(self.pipe_dir, self._pipe_dir_ours())
        if problem:  # before anything: a daemon serving someone else's directory is not ours to stop
            raise MpsError(f"not starting MPS: {problem}")
        try:
            self._remove_leftover()
            self._make_pipe_dir()
            os.makedirs(self.log_dir, mode=0o755, exist_ok=True)
            if self.compute_modes is not None:
                call_within(self.nvml_timeout, "setting the GPUs' compute modes to EXCLUSIVE_PROCESS",
                            lambda _cancelled: self.compute_modes.set_exclusive())
            deadline = self.clock() + self.ready_timeout
            try:
                rc, _, err = self._run([self.control, "-d"], "", self.ready_timeout)
            except MpsTimeout:
                raise MpsTimeout(f"{self.control} -d did not return within {self.ready_timeout:g}s") from None
            if rc != 0:
                raise MpsError(f"{self.control} -d failed (exit {rc}): {err.strip()}")
            self._wait_ready(deadline)
            self._log_offset = self._log_size()
            for line in self.defaults.commands():
                self.command(line, timeout=max(0.5, min(self.command_timeout, deadline - self.clock())))
        except MpsStopping:
            raise  # stop() follows and cleans up; doing it here too would race with it
        except (MpsError, OSError) as e:
            self._teardown()
            raise e if isinstance(e, MpsError) else MpsError(f"starting MPS failed: {e}") from None
        log.info("mps=started pid=%s pipe_dir=%s gpus=%s defaults=%s", self.pid(), self.pipe_dir,
                 self.gpus or "all", self.defaults.commands())

    def _remove_leftover(self) -> None:
        """A daemon of ours from an earlier run (a crash) would make ``-d`` refuse to start,
        and servers an earlier daemon left hold their GPUs from the new one's."""
        ident = self._identify()
        if ident is not None and ident != self._daemon:
            log.warning("mps: killing control daemon %d left on %s by an earlier run", ident[0], self.pipe_dir)
            self._daemon = ident
        self.kill_daemon()  # and the servers a daemon of ours that died left
        self._empty_pipe_dir()  # its stale socket and pid file

    # -- the pipe directory: noded's own, made and removed only by it
    def _pipe_dir_ours(self) -> bool:
        if self._made_here:
            return True
        key = made_dir_key(self.pipe_dir)
        return self.recorder is not None and any(k == key for k, _ in self.recorder.items())

    def _make_pipe_dir(self) -> None:
        """The pipe directory, made here and recorded first: a start after a SIGKILL at any
        point knows it is noded's (a record with no directory is made again)."""
        if self.recorder is not None and not self._pipe_dir_ours():
            try:
                self.recorder.record(made_dir_key(self.pipe_dir), None)
            except Exception as e:  # the recorder's own error (noded's StateWriteError): make nothing
                raise MpsError(f"not making the MPS pipe directory {self.pipe_dir}: it could not be recorded as "
                               f"noded's: {e}") from None
        self._made_here = True
        os.makedirs(os.path.dirname(self.pipe_dir), mode=0o755, exist_ok=True)
        try:
            os.mkdir(self.pipe_dir, 0o755)
        except FileExistsError:
            problem = pipe_dir_problem(self.pipe_dir, True)  # ours, emptied above; or made by someone meanwhile
            if problem:
                raise MpsError(f"not starting MPS: {problem}") from None

    def _empty_pipe_dir(self) -> None:
        """Remove what is in the pipe directory, where it is noded's (never follows a link)."""
        if not self._pipe_dir_ours() or pipe_dir_problem(self.pipe_dir, True):
            return
        try:
            entries = list(os.scandir(self.pipe_dir))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                try:
                    os.unlink(entry.path)
                except FileNotFoundError:
                    pass

    def _remove_pipe_dir(self) -> None:
        """At stop: the pipe directory goes, and then its record; never one noded did not make."""
        if not self._pipe_dir_ours():
            return
        if pipe_dir_problem(self.pipe_dir, True) is None:
            self._empty_pipe_dir()
            try:
                os.rmdir(self.pipe_dir)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.error("mps: could not remove the pipe directory %s: %s", self.pipe_dir, e.strerror)
                return
        self._made_here = False
        if self.recorder is not None:
            try:
                self.recorder.forget(made_dir_key(self.pipe_dir))
            except Exception as e:  # kept: the next start finds no directory and makes it again
                log.warning("mps: pipe directory %s removed, but its record could not be: %s", self.pipe_dir, e)

    def _wait_ready(self, deadline: float) -> None:
        last: Exception | None = None
        while self.clock() < deadline:
            if self._interrupted:
                raise MpsStopping("MPS is being stopped")
            ident = self._identify()
            if ident is not None:
                try:
                    self.command("get_server_list", timeout=max(0.2, deadline - self.clock()))
                    self._daemon = ident
                    return
                except MpsStopping:
                    raise
                except MpsError as e:
                    last = e
            time.sleep(0.05)  # polling readiness against a deadline
        raise MpsTimeout(f"MPS control daemon not ready within {self.ready_timeout:g}s" + (f": {last}" if last else ""))

    def _log_size(self) -> int:
        try:
            return os.path.getsize(os.path.join(self.log_dir, "control.log"))
        except FileNotFoundError:
            return 0

    def _faults_since_check(self) -> list[str]:
        path = os.path.join(self.log_dir, "control.log")
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self._log_offset:
                    self._log_offset = 0  # rotated or truncated
                f.seek(self._log_offset)
                text = f.read(_LOG_READ_LIMIT)
        except FileNotFoundError:
            return []
        end = text.rfind(b"\n") + 1  # whole lines only; the rest next time
        self._log_offset += end
        return [line for line in text[:end].decode(errors="replace").splitlines() if FAULT_MARK in line]

    def check(self, timeout: float) -> Problem | None:
        """One health check, bounded by ``timeout``: None when healthy."""
        if self._identify() is None:
            return Problem("dead", "control daemon died")
        faults = self._faults_since_check()
        if faults:
            return Problem("fault", f"server fault: {faults[0]}")
        try:
            listed = self.command("get_server_list", timeout=timeout)
        except MpsStopping:
            raise
        except MpsError as e:
            return Problem("silent", f"control daemon does not answer: {e}")
        self._note_servers(listed)
        return None

    def _note_servers(self, listed: str) -> None:
        """The servers our daemon just listed (its answer to get_server_list), by pid and
        start time: should it die, these are the servers it leaves, whoever runs them."""
        seen = {}
        for word in listed.split()[:4096]:
            if word.isdigit() and (started := self._start_time(int(word))) is not None:
                seen[int(word)] = started
        self._servers = seen

    def _children_of(self, pid: int) -> list[tuple[int, bytes]]:
        """(pid, start time) of the live children of ``pid`` (its MPS servers)."""
        out = []
        try:
            entries = os.listdir(self.proc)
        except OSError:
            return out
        for name in entries:
            if not name.isdigit():
                continue
            try:
                with open(f"{self.proc}/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(fields[1]) == pid and fields[0] != b"Z":
                out.append((int(name), fields[19]))
        return out

    def _signal(self, ident: tuple[int, bytes], sig: int) -> None:
        if self._start_time(ident[0]) == ident[1]:  # still that process, not a pid reused since
            try:
                os.kill(ident[0], sig)
            except ProcessLookupError:
                pass

    def _read(self, pid: int | str, name: str, limit: int = 1 << 16) -> bytes:
        with open(f"{self.proc}/{pid}/{name}", "rb") as f:
            return f.read(limit)

    def orphaned_servers(self) -> list[tuple[int, bytes]]:
        """(pid, start time) of the MPS servers of ours left by a daemon that died (see the
        module's docstring); none where the pipe directory is not noded's. Ours are those
        our daemon last listed (the same pid and start time), and any other process of the
        server binary in noded's cgroups whose environment names our pipe directory; one
        whose environment noded may not read (another user's, without CAP_SYS_PTRACE),
        which the daemon never listed, cannot be told from another MPS's server in the
        same cgroup: it is said, once, and left running."""
        if not self._pipe_dir_ours():
            return []
        name = server_name(self.control).encode()
        mark = f"CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir}".encode()
        daemon = self._identify()
        parent = str(daemon[0]).encode() if daemon is not None else None  # its servers are not orphans
        try:
            own = self._read("self", "cgroup")
            entries = os.listdir(self.proc)
        except OSError as e:
            log.warning("mps: cannot look for servers left by a dead control daemon: %s", e)
            return []
        out, unsure = [], []
        for entry in entries:
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            pid = int(entry)
            try:
                fields = self._read(entry, "stat", 4096).rsplit(b")", 1)[1].split()
                if fields[0] == b"Z" or fields[1] == parent:
                    continue
                ident = (pid, fields[19])
                if self._servers.get(pid) == ident[1]:
                    out.append(ident)  # our daemon listed it: ours, whoever runs it
                    continue
                argv0 = self._read(entry, "cmdline", 4096).split(b"\0", 1)[0]
                if os.path.basename(argv0) != name or self._read(entry, "cgroup") != own:
                    continue
                try:
                    if mark in self._read(entry, "environ", 1 << 20).split(b"\0"):
                        out.append(ident)
                except PermissionError:
                    unsure.append(ident)
            except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
                continue  # gone meanwhile, or not to be told
        said, self._unsure_said = self._unsure_said, set(unsure)  # bounded by the servers there now
        for ident in unsure:
            if ident not in said:
                log.warning("mps: process %d is an MPS server in noded's cgroup that no daemon of noded's listed, and "
                            "its environment cannot be read (another user's): whether it serves %s cannot be told; "
                            "left running", ident[0], self.pipe_dir)
        return out

    def kill_daemon(self) -> None:
        """SIGKILL our daemon and its servers (they would outlive it), and the servers a
        daemon of ours that died left behind; bounded, and safe when the daemon is stopped
        or wedged: nothing here asks it anything."""
        ident = self._identify() or self._daemon
        servers: list[tuple[int, bytes]] = []
        if ident is not None:
            self._signal(ident, signal.SIGSTOP)  # it starts no server while we list them
            servers = self._children_of(ident[0])
        orphans = [s for s in self.orphaned_servers() if s not in servers]
        if orphans:
            log.warning("mps: killing server(s) %s left by a control daemon that died, on %s",
                        ", ".join(str(p) for p, _ in orphans), self.pipe_dir)
        servers += orphans
        for s in servers:
            self._signal(s, signal.SIGKILL)
        if ident is not None:
            self._signal(ident, signal.SIGKILL)
        waited = servers + ([ident] if ident is not None else [])
        deadline = self.clock() + self.kill_timeout
        while any(self._start_time(p[0]) == p[1] for p in waited) and self.clock() < deadline:
            time.sleep(0.005)  # SIGKILL is delivered asynchronously; wait for it, against a deadline
        if ident is not None and ident == self._daemon:
            self._daemon = None
        self._servers = {p: st for p, st in self._servers.items() if self._start_time(p) == st}

    def reset(self) -> None:
        """Between a failed daemon and its successor: kill it and its servers, clear its
        pipe directory; compute modes stay as MPS needs them."""
        self.kill_daemon()
        self._empty_pipe_dir()

    def stop(self, budget_s: float = 0.7, *, final: bool = True) -> None:
        """``quit`` within part of ``budget_s``, then SIGKILL whatever is left; leaves no
        process, pipe directory or compute mode change. Safe to call more than once.
        ``final``: no later start may set compute modes again (see ComputeModes)."""
        deadline = self.clock() + budget_s
        ident = self._identify()
        if ident is not None:
            servers = self._children_of(ident[0])
            try:
                self.command("quit", timeout=max(0.05, min(self.quit_timeout, deadline - self.clock())),
                             while_stopping=True)
            except MpsError as e:
                log.warning("mps quit failed (%s); killing pid %d", e, ident[0])
            else:
                while self._start_time(ident[0]) == ident[1] and self.clock() < deadline:
                    time.sleep(0.005)  # the daemon's own exit after its quit, against a deadline
            for s in servers:  # a quit cut short may leave servers behind
                self._signal(s, signal.SIGKILL)
        self._teardown(final=final)

    def _teardown(self, *, final: bool = False) -> None:
        self.kill_daemon()
        self._remove_pipe_dir()
        if self.compute_modes is not None:
            # NVML is the driver's: a hung driver must not hold the service's stop (its
            # unit kills it at 15 s, and every other release waits behind this). The
            # modes' records stay where they were not put back: the next start does it.
            # (A restore that returns late still puts them back and forgets their records.)
            try:
                call_within(COMPUTE_MODES_DEADLINE_S, "while putting back the GPUs' compute modes",
                            lambda _cancelled: self.compute_modes.restore(final=final))
            except NvmlTimeout as e:
                log.error("%s %s: left as they are, their records kept for the next start to restore", e,
                          sorted(self.compute_modes.uuids))
