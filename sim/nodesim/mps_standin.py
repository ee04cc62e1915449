"""A stand-in for ``nvidia-cuda-mps-control``, for hosts without NVIDIA's MPS: part
of the simulated node, never imported by the product's ``mps`` package. It is no
installed command: ``write_launcher`` puts an executable for it where a simulated node
or a test needs one.

Like the real binary: ``-d`` starts the control daemon in the background (``-f`` in
the foreground); without a flag it is a client that reads commands from stdin,
one per line, prints the daemon's answers, and exits 1 when no daemon answers.
The daemon writes ``nvidia-cuda-mps-control.pid`` and its control socket into
``CUDA_MPS_PIPE_DIRECTORY`` and ``control.log`` lines in NVIDIA's format into
``CUDA_MPS_LOG_DIRECTORY``; servers are real child processes (``nvidia-cuda-mps-server-standin``,
as NVIDIA's are ``nvidia-cuda-mps-server``), which a daemon killed without a ``quit``
leaves running (NVIDIA documents no server exiting with its daemon: the stand-in makes
the harder case).

It can be told to fail through ``NODED_MPS_STANDIN`` (a comma list, read by the
daemon at start): ``no-start`` (refuse to start), ``hang-start`` (``-d`` never
returns, and starts nothing), ``die-after=S`` (exit without cleaning up after S
seconds), ``hang=COMMAND`` (never answer that command), ``fault-after=S`` (each server
goes to FAULT S seconds after it started, as a fatal client fault does). A SIGSTOPped daemon hangs
every client, as the real one does.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET = "control"
#: The launcher's name: apart from NVIDIA's binary, so it can never be taken for the real one.
LAUNCHER = "nvidia-cuda-mps-control-standin"
#: Its servers' command name, as NVIDIA's ``nvidia-cuda-mps-server`` beside its control binary.
SERVER = "nvidia-cuda-mps-server-standin"
#: Where ``nodesim`` imports from, for the launcher (noded runs the control binary with
#: a bare environment: no PYTHONPATH reaches it).
_IMPORT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dirs() -> tuple[str, str]:
    return (os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
            os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))


def _faults() -> dict[str, str]:
    out = {}
    for item in filter(None, os.environ.get("NODED_MPS_STANDIN", "").split(",")):
        key, _, value = item.partition("=")
        out[key.strip()] = value.strip()
    return out


class ControlDaemon:
    def __init__(self, pipe_dir: str, log_dir: str, faults: dict[str, str]):
        self.pipe_dir, self.log_dir, self.faults = pipe_dir, log_dir, faults
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.default_atp = 100.0
        self.default_mem: dict[str, str] = {}
        self.servers: dict[int, dict] = {}
        self.stop = threading.Event()

    def log(self, text: str) -> None:
        ts = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        with open(os.path.join(self.log_dir, "control.log"), "a") as f:
            f.write(f"[{ts} Control {self.pid}] {text}\n")

    def run(self) -> int:
        os.makedirs(self.pipe_dir, exist_ok=True)
        os.makedirs(self.log_dir, exist_ok=True)
        pid_path = os.path.join(self.pipe_dir, PID_FILE)
        sock_path = os.path.join(self.pipe_dir, SOCKET)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(sock_path):
            os.unlink(sock_path)
        sock.bind(sock_path)
        sock.listen(16)
        sock.settimeout(0.1)
        with open(pid_path, "w") as f:
            f.write(f"{self.pid}\n")
        self.log(f"Starting control daemon using socket {sock_path}")
        started = time.monotonic()
        die_after = float(self.faults["die-after"]) if "die-after" in self.faults else None
        fault_after = float(self.faults["fault-after"]) if "fault-after" in self.faults else None
        while not self.stop.is_set():
            elapsed = time.monotonic() - started
            if die_after is not None and elapsed >= die_after:
                os._exit(1)  # a crash: pid file and socket stay behind
            if fault_after is not None:
                with self.lock:
                    for spid, srv in self.servers.items():
                        if srv["status"] == "ACTIVE" and time.monotonic() - srv["started"] >= fault_after:
                            srv["status"] = "FAULT"
                            self.log(f"Server {spid} encountered a fatal exception. Shutting down")
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()
        for spid in list(self.servers):
            self.shutdown_server(spid)
        self.log("Exit")
        sock.close()
        for path in (sock_path, pid_path):
            if os.path.exists(path):
                os.unlink(path)
        return 0

    def serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            for raw in f:
                line = raw.decode(errors="replace").strip()
                if not line:
                    continue
                self.log(f"Cmd:{line}")
                if line.split()[0] == self.faults.get("hang"):
                    time.sleep(3600)
                answer = self.command(line)
                lines = answer.split("\n") if answer else []
                # the count first: an answer of several lines (get_server_list) reaches the client whole
                f.write("".join(f"{x}\n" for x in [str(len(lines))] + lines).encode())
                f.flush()
                if line.split()[0] == "quit":
                    self.stop.set()
                    return

    def shutdown_server(self, spid: int) -> None:
        srv = self.servers.pop(spid, None)
        if srv is not None:
            srv["proc"].kill()
            srv["proc"].wait()
            self.log(f"Server {spid} exited with status 0")

    def command(self, line: str) -> str:
        words = line.split()
        cmd, args = words[0], words[1:]
        with self.lock:
            if cmd == "get_server_list":
                return "\n".join(str(p) for p in self.servers)
            if cmd == "start_server" and len(args) == 2 and args[0] == "-uid" and args[1].isdigit():
                # a process of its own, named as NVIDIA's server is beside its control binary;
                # the daemon's child (its environment and cgroups), and it outlives the
                # daemon where that dies without a quit (reparented to init); run as the
                # client's user, as NVIDIA's servers are (the daemon runs as root)
                uid = int(args[1])
                proc = subprocess.Popen([SERVER, "infinity"], executable="sleep", start_new_session=True,
                                        user=uid if os.geteuid() == 0 and uid != os.geteuid() else None)
                self.servers[proc.pid] = {"proc": proc, "uid": int(args[1]), "status": "ACTIVE",
                                          "started": time.monotonic(),
                                          "atp": self.default_atp, "mem": dict(self.default_mem)}
                self.log(f"Starting new server {proc.pid} for user {args[1]}")
                return ""
            if cmd == "get_server_status" and len(args) == 1:
                srv = self.servers.get(int(args[0])) if args[0].isdigit() else None
                return srv["status"] if srv else f"Server {args[0]} not found"
            if cmd == "shutdown_server" and args and args[0].isdigit():
                self.shutdown_server(int(args[0]))
                return ""
            if cmd == "get_client_list" and len(args) == 1:
                return ""
            if cmd == "set_default_active_thread_percentage" and len(args) == 1:
                self.default_atp = float(args[0])
                return f"{self.default_atp:.1f}"
            if cmd == "get_default_active_thread_percentage" and not args:
                return f"{self.default_atp:.1f}"
            if cmd in ("set_active_thread_percentage", "get_active_thread_percentage") and args and args[0].isdigit():
                srv = self.servers.get(int(args[0]))
                if srv is None:
                    return f"Server {args[0]} not found"
                if cmd.startswith("set") and len(args) == 2:
                    srv["atp"] = float(args[1])
                return f"{srv['atp']:.1f}"
            if cmd == "set_default_device_pinned_mem_limit" and len(args) == 2:
                self.default_mem[args[0]] = args[1]
                return ""
            if cmd == "get_default_device_pinned_mem_limit" and len(args) == 1:
                return self.default_mem.get(args[0], "0M")
            if cmd == "set_device_pinned_mem_limit" and len(args) == 3 and args[0].isdigit():
                srv = self.servers.get(int(args[0]))
                if srv is None:
                    return f"Server {args[0]} not found"
                srv["mem"][args[1]] = args[2]
                return ""
            if cmd == "terminate_client" and len(args) == 2:
                return "0"
            if cmd == "ps":
                return "PID ID SERVER DEVICE NAMESPACE COMMAND"
            if cmd == "quit":
                return ""
        return f"Unknown command: {line}" if cmd not in {
            "start_server", "get_server_status", "shutdown_server", "set_active_thread_percentage",
            "get_active_thread_percentage", "set_device_pinned_mem_limit"} else f"Invalid arguments: {line}"


def client(pipe_dir: str) -> int:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.path.join(pipe_dir, SOCKET))
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    try:
        with s, s.makefile("rwb") as f:
            for line in sys.stdin:
                if not line.strip():
                    continue
                f.write(line.encode() if line.endswith("\n") else (line + "\n").encode())
                f.flush()
                count = f.readline()
                if not count.strip().isdigit():
                    return 1
                for _ in range(int(count)):
                    answer = f.readline()
                    if not answer:
                        return 1
                    print(answer.decode().rstrip("\n"), flush=True)
    except OSError:  # the daemon went away mid-answer (shutting down): as NVIDIA's client, a status, no trace
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    return 0


def already_running(pipe_dir: str) -> bool:
    """A live daemon holds the pid file (a dead one's zombie does not count)."""
    try:
        with open(os.path.join(pipe_dir, PID_FILE)) as f:
            pid = int(f.read())
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return False


def write_launcher(directory: str) -> str:
    """Write the stand-in's launcher, an executable ``nvidia-cuda-mps-control-standin``
    that runs ``main`` under this interpreter, into ``directory``; return its path (what
    a simulated node or a test gives noded as ``colocation.mps.control``).

    The stand-in is no installed command: a host never finds it on its PATH, only where
    a simulation put it. The launcher is a script named for the stand-in, so the control
    daemon's command line carries that name, as noded checks before it signals one.
    Written to a temporary name and renamed into place, so a concurrent exec never
    sees half of it.
    """
    if len(sys.executable) > 200 or any(c.isspace() for c in sys.executable):
        raise RuntimeError(f"the MPS stand-in's launcher cannot name this interpreter on its #! line "
                           f"(whitespace or over 200 characters): {sys.executable!r}")
    path = os.path.join(directory, LAUNCHER)
    text = (f"#!{sys.executable}\n"
            f"import sys\n"
            f"sys.path.insert(0, {_IMPORT_ROOT!r})\n"
            f"from nodesim.mps_standin import main\n"
            f"sys.exit(main())\n")
    partial = f"{path}.{os.getpid()}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(partial, 0o755)  # whatever the umask took away
        os.replace(partial, path)
    except BaseException:
        if os.path.lexists(partial):
            os.unlink(partial)
        raise
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pipe_dir, log_dir = _dirs()
    if not argv:
        return client(pipe_dir)
    if argv[0] not in ("-d", "-f"):
        print(f"Unknown option {argv[0]}", file=sys.stderr)
        return 1
    faults = _faults()
    if "hang-start" in faults:
        time.sleep(3600)  # the fault itself: a start that never returns
        return 1
    if "no-start" in faults:
        print("An error occurred while starting the MPS control daemon", file=sys.stderr)
        return 1
    if already_running(pipe_dir):
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    if argv[0] == "-f":
        return ControlDaemon(pipe_dir, log_dir, faults).run()
    if os.fork():
        return 0  # the real -d returns at once; readiness is the caller's to check
    os.setsid()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for fd in (0, 1, 2):
        os.dup2(os.open(os.devnull, os.O_RDWR), fd)
    os._exit(ControlDaemon(pipe_dir, log_dir, faults).run())


if __name__ == "__main__":
    sys.exit(main())
