"""The emulator's control socket: what the hardware would do that no file shows.

Tests and the simulated node use it to set how much memory bandwidth each task
demands, to inject counter faults, resets and domains going offline, to read
the bandwidth the model actually granted, and to reset the whole mount to how it came up. One JSON object per line each way.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
from typing import Any, Callable

from nodesim.resctrl_emulator.kernel import ResctrlKernel

EVENTS_STATES = ("Unavailable", "Error", "Unassigned")


class ControlError(RuntimeError):
    """The emulator refused a control request; the text is its reason."""


def _handle(kernel: ResctrlKernel, req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    with kernel.lock:
        if op == "ping":
            return {"profile": kernel.profile.name}
        if op == "set_demand":
            cpus = req.get("cpus")
            kernel.set_demand(int(req["pid"]), float(req["bytes_per_s"]),
                              int(req["domain"]) if req.get("domain") is not None else None,
                              threads=int(req.get("threads") or 1),
                              cpus=tuple(int(c) for c in cpus) if cpus is not None else None)
            return {}
        if op == "clear_demand":
            kernel.advance(kernel.clock())
            if req.get("pid") is None:
                kernel.demand.clear()
            else:
                kernel.demand.pop(int(req["pid"]), None)
            return {}
        if op == "set_peak":
            kernel.advance(kernel.clock())
            for d in [int(req["domain"])] if req.get("domain") is not None else kernel.profile.domains:
                kernel.peak[d] = float(req["bytes_per_s"])
            return {}
        if op == "set_counter_state":
            state = req.get("state")
            if state is not None and state not in EVENTS_STATES:
                raise ValueError(f"state must be one of {EVENTS_STATES} or null")
            rmid = kernel.group_by_path(req["group"]).rmid if req.get("group") is not None else None
            key = (rmid, req.get("domain"), req.get("event"))
            if state is None:
                kernel.faults.pop(key, None)
            else:
                kernel.faults[key] = state
            return {}
        if op == "reset_counters":
            rmid = kernel.group_by_path(req["group"]).rmid if req.get("group") is not None else None
            kernel.reset_counters(rmid, req.get("domain"))
            return {}
        if op == "set_domain_online":
            domain, online = int(req["domain"]), bool(req["online"])
            kernel.set_domain_online(domain, online)
            # what vanished behind the VFS: the caller drops it from the kernel's caches
            stale = [] if online else [f"{path.rstrip('/')}/mon_data/{DOMAIN_DIR.format(domain)}"
                                       for path, _ in _all_groups(kernel)]
            return {STALE: stale}
        if op == "reset":
            # what vanished behind the VFS: every group; dropped as a domain's directories are
            return {STALE: kernel.reset()}
        if op == "drain_limbo":
            kernel.drain_limbo_now()
            return {}
        if op == "rates":
            # Granted bytes/s per RMID and domain, by group path, as of now.
            kernel.advance(kernel.clock())
            out: dict[str, dict[str, float]] = {}
            for path, group in _all_groups(kernel):
                out[path] = {str(d): kernel.counters[(group.rmid, d)].rate if (group.rmid, d) in kernel.counters
                             else 0.0 for d in kernel.online}
            return {"rates": out}
        if op == "moved":
            # Bytes moved per domain since the mount, and the kernel's clock then: a caller's
            # average over any interval (NVML's utilisation is one over its sample period).
            now = kernel.clock()
            kernel.advance(now)
            return {"at": now, "moved": {str(d): b for d, b in kernel.moved.items()}}
        if op == "task":
            st = kernel.resolve_task(int(req["tid"]))
            return {"task": None if st is None else {"closid": st.closid, "rmid": st.rmid}}
    raise ValueError(f"unknown op {op!r}")


def _all_groups(kernel: ResctrlKernel):
    yield "/", kernel.root
    for m in kernel.root.mon.values():
        yield f"/mon_groups/{m.name}", m
    for g in kernel.groups.values():
        yield f"/{g.name}", g
        for m in g.mon.values():
            yield f"/{g.name}/mon_groups/{m.name}", m


#: a reply's paths that vanished behind the VFS (taken out before the reply is sent)
STALE = "_stale"
DOMAIN_DIR = "mon_L3_{:02d}"


class ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, kernel: ResctrlKernel,
                 invalidate: Callable[[list[str]], None] | None = None):
        self.kernel = kernel
        # Called outside the kernel's lock (a FUSE request may hold a directory's lock in
        # the kernel while its handler waits for ours).
        self.invalidate = invalidate
        if os.path.exists(path):
            os.unlink(path)
        super().__init__(path, _Handler)
        os.chmod(path, 0o600)


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            try:
                reply = {"ok": True, **_handle(self.server.kernel, json.loads(line))}  # type: ignore[attr-defined]
            except (ValueError, KeyError, TypeError) as e:
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            stale = reply.pop(STALE, None)
            if stale and self.server.invalidate is not None:  # type: ignore[attr-defined]
                self.server.invalidate(stale)  # type: ignore[attr-defined]
            self.wfile.write(json.dumps(reply).encode() + b"\n")


def serve_in_thread(server: ControlServer) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, name="resctrl-emulator-control", daemon=True)
    t.start()
    return t


class EmulatorControl:
    """Client for the control socket (one connection, one request at a time)."""

    def __init__(self, path: str, timeout: float = 10.0):
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._file = self._sock.makefile("rwb")
        self._lock = threading.Lock()

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def __enter__(self) -> "EmulatorControl":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, op: str, **args: Any) -> dict[str, Any]:
        with self._lock:
            self._file.write(json.dumps({"op": op, **args}).encode() + b"\n")
            self._file.flush()
            line = self._file.readline()
        if not line:
            raise ControlError("emulator closed the control socket")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise ControlError(reply["error"])
        return reply

    def ping(self) -> str:
        return self.request("ping")["profile"]

    def set_demand(self, pid: int, bytes_per_s: float, domain: int | None = None, *,
                   threads: int = 1, cpus: list[int] | None = None) -> None:
        """``pid`` moves ``bytes_per_s`` from now on, spread over ``threads`` busy threads
        (one on each of ``cpus`` where given: SMT siblings share a core's MBA setting)."""
        self.request("set_demand", pid=pid, bytes_per_s=bytes_per_s, domain=domain, threads=threads, cpus=cpus)

    def clear_demand(self, pid: int | None = None) -> None:
        self.request("clear_demand", pid=pid)

    def set_peak(self, bytes_per_s: float, domain: int | None = None) -> None:
        self.request("set_peak", bytes_per_s=bytes_per_s, domain=domain)

    def set_counter_state(self, state: str | None, group: str | None = None,
                          domain: int | None = None, event: str | None = None) -> None:
        self.request("set_counter_state", state=state, group=group, domain=domain, event=event)

    def reset_counters(self, group: str | None = None, domain: int | None = None) -> None:
        self.request("reset_counters", group=group, domain=domain)

    def set_domain_online(self, domain: int, online: bool) -> None:
        self.request("set_domain_online", domain=domain, online=online)

    def reset(self) -> None:
        """The mount back to what it was when it came up (its profile and options kept): no
        group but the default one, every domain online, no demand, fault or limbo; the VFS
        told that the groups are gone. One mount can then serve many tests."""
        self.request("reset")

    def drain_limbo(self) -> None:
        self.request("drain_limbo")

    def rates(self) -> dict[str, dict[int, float]]:
        raw = self.request("rates")["rates"]
        return {g: {int(d): r for d, r in v.items()} for g, v in raw.items()}

    def moved(self) -> tuple[float, dict[int, float]]:
        """The kernel's clock and the bytes moved on each domain since the mount."""
        reply = self.request("moved")
        return float(reply["at"]), {int(d): b for d, b in reply["moved"].items()}

    def task(self, tid: int) -> dict[str, int] | None:
        return self.request("task", tid=tid)["task"]
