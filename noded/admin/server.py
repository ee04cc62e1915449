"""The admin socket: a Unix stream socket in the runtime directory, mode 0660,
owned by root and the admin group. Every peer is checked with SO_PEERCRED (root,
or a member of the admin group) and refused otherwise; each connection has a
timeout and a request-size limit, so garbage or a silent client can neither
crash nor hang the daemon."""

from __future__ import annotations

import grp
import logging
import math
import os
import socket
import struct
import threading
import time
from typing import Any, Callable

from ..daemon import Daemon
from .overrides import Override, OverrideStore
from .protocol import MAX_REQUEST_BYTES, RequestError, parse_request, reply_error, reply_ok

log = logging.getLogger(__name__)
_UCRED = struct.Struct("3i")  # pid, uid, gid


def peer_groups(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except (FileNotFoundError, ProcessLookupError):
        pass
    return set()


class AdminServer:
    def __init__(self, path: str, daemon: Daemon, store: OverrideStore | None, *, group: str | None,
                 timeout_s: float = 5.0, wall_clock: Callable[[], float] = time.time,
                 reports_only: bool = False):
        # reports_only: the socket training jobs use (mode 0666): it takes only `report`,
        # and only from a process of the job reported on.
        self.reports_only = reports_only
        self.path = path
        self.daemon = daemon
        self.store = store
        self.timeout_s = timeout_s
        self.wall_clock = wall_clock
        self.gid: int | None = None
        if group:
            try:
                self.gid = grp.getgrnam(group).gr_gid
            except KeyError:
                log.warning("admin group %r does not exist: only root may use %s", group, path)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._handlers: set[threading.Thread] = set()
        self._stop = threading.Event()

    def start(self) -> "AdminServer":
        if os.path.exists(self.path):
            os.unlink(self.path)  # a stale socket: the instance lock says no noded owns it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        if self.reports_only:
            os.chmod(self.path, 0o666)
        elif self.gid is not None:
            os.chown(self.path, 0 if os.geteuid() == 0 else -1, self.gid)
            os.chmod(self.path, 0o660)
        sock.listen(16)
        sock.settimeout(0.2)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept, name="noded-admin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting; let requests in flight get their answers."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        for t in list(self._handlers):
            t.join(timeout=self.timeout_s)
        if self._sock:
            self._sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), name="noded-admin-conn", daemon=True)
            self._handlers.add(t)
            t.start()

    def authorised(self, pid: int, uid: int, gid: int) -> bool:
        if uid == 0:
            return True
        return self.gid is not None and (gid == self.gid or self.gid in peer_groups(pid))

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(self.timeout_s)
                pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
                if not self.reports_only and not self.authorised(pid, uid, gid):
                    log.warning("admin: refused uid=%d gid=%d pid=%d", uid, gid, pid)
                    conn.sendall(reply_error(f"permission denied: uid {uid} is neither root nor in the admin group"))
                    return
                line = self._read_line(conn)
                if line is None:
                    conn.sendall(reply_error(f"request larger than {MAX_REQUEST_BYTES} bytes"))
                    return
                try:
                    command, args = parse_request(line)
                    if self.reports_only and command != "report":
                        raise RequestError(f"this socket takes only 'report'; {command!r} goes to the admin socket")
                    if self.reports_only and not self.authorised(pid, uid, gid):
                        self._check_reporter(args["job"], pid)
                    result = self.dispatch(command, args, uid)
                except RequestError as e:
                    conn.sendall(reply_error(str(e)))
                    return
                conn.sendall(reply_ok(result))
        except (TimeoutError, OSError) as e:
            log.info("admin: connection dropped: %s", e)
        except Exception:  # a bug must cost one request, not the daemon
            log.exception("admin: request failed")
        finally:
            self._handlers.discard(threading.current_thread())

    def _check_reporter(self, job: str, pid: int) -> None:
        last = self.daemon.last
        if last is None or job not in last.sample.jobs or pid not in last.sample.jobs[job].pids:
            raise RequestError(f"process {pid} is not part of job {job!r}: a job reports only for itself")

    def _read_line(self, conn: socket.socket) -> bytes | None:
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > MAX_REQUEST_BYTES + 1:
                return None
        return buf.split(b"\n", 1)[0]

    # ---------------------------------------------------------------- commands
    def dispatch(self, command: str, args: dict[str, Any], uid: int) -> Any:
        d = self.daemon
        if command == "status":
            return self.status()
        if command == "jobs":
            return self.status()["jobs"]
        if command == "explain":
            return self.explain(args["job"])
        if command == "pause":
            d.paused = args.get("reason") or f"paused by uid {uid}"
            log.warning("eliminator=paused uid=%d reason=%r", uid, d.paused)
            return {"paused": d.paused}
        if command == "resume":
            d.paused = None
            log.warning("eliminator=resumed uid=%d", uid)
            return {"paused": None}
        if command == "admit":
            return self.admit(args, uid)
        if command in ("report", "model_fit"):
            service = d.colocation
            if service is None:
                raise RequestError("co-location is not enabled on this node (colocation.enabled)")
            try:
                if command == "model_fit":
                    log.warning("colocation model fit requested by uid %d", uid)
                    return service.fit()
                return service.report(args["job"], args["iteration_s"], d.last.sample if d.last else None)
            except ValueError as e:
                raise RequestError(str(e)) from None
        if command == "release":
            cleared = self.store.clear(args["job"], uid)
            return {"job": args["job"], "override_cleared": cleared}
        now = self.wall_clock()
        ttl = args.get("ttl_s")
        level = 0 if command == "exempt" else args.get("level") or self._level_for_cores(args["job"], args["cores"])
        override = Override(args["job"], level, uid, args.get("reason", ""), now, now + ttl if ttl else None)
        self.store.set(override)
        return self._override_json(override)

    def admit(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        from ..colocation.profiles import JobProfile

        service = self.daemon.colocation
        if service is None:
            raise RequestError("co-location is not enabled on this node (colocation.enabled)")
        p = args.get("profile")
        profile = None if p is None else JobProfile(args["model"], args["batch_size"], float(p["c"]), float(p["m"]),
                                                    float(p["window_us"]), f"{p['source']} (sent by uid {uid})")
        last = self.daemon.last
        d = service.admit(args["job"], last.sample if last else None, model=args["model"],
                          batch_size=args["batch_size"], profile=profile, gpu=args.get("gpu", "auto"),
                          uid=args.get("uid"))
        return {"admit": d.admit, "job": d.job, "gpu_uuid": d.gpu_uuid, "gpu_index": d.gpu_index,
                "predicted_speedup": d.predicted_speedup, "reason": d.reason, "env": d.env,
                "sources": list(d.sources), "sum_c_after": d.sum_c_after, "n_jobs_after": d.n_jobs_after}

    def _level_for_cores(self, job: str, cores: int) -> int:
        throttle = self.daemon.throttle
        last = self.daemon.last
        if throttle is None or throttle.kind != "cores":
            raise RequestError(f"this host throttles with {throttle.kind if throttle else 'nothing'}: use --level")
        if last is None or job not in last.sample.jobs:
            raise RequestError(f"no such job {job!r}")
        n = len(throttle.original_cpus(last.sample.jobs[job]))
        if not n:
            raise RequestError(f"no CPUs known for job {job!r}")
        # The halving level that leaves at most `cores` CPUs.
        return max(1, math.ceil(math.log2(n / cores))) if cores < n else 1

    def _override_json(self, o: Override) -> dict[str, Any]:
        return {"job": o.job, "kind": o.kind, "level": o.level, "set_by_uid": o.set_by_uid, "reason": o.reason,
                "expires_in_s": None if o.expires is None else max(0.0, o.expires - self.wall_clock())}

    def status(self) -> dict[str, Any]:
        d = self.daemon
        r = d.last
        overrides = self.store.active()
        out: dict[str, Any] = {
            "paused": d.paused, "ticks": d.ticks, "tick_s": d.config.tick_s,
            "throttle_method": d.throttle.kind if d.throttle else None,
            "threshold": d.config.contention.threshold, "release_threshold": d.config.contention.release_threshold,
            "peak_bytes_per_s_per_domain": d.config.peak_bytes_per_domain,
            "overrides": [self._override_json(o) for o in overrides.values()],
        }
        if r is None:
            return {**out, "node": None, "gpus": [], "jobs": [], "missing": []}
        s = r.sample
        out["node"] = {"share_of_peak": r.decision.node_share, "bandwidth_bytes_per_s": dict(s.node_bandwidth_bps),
                       "contention": r.decision.triggered, "note": r.decision.note}
        out["gpus"] = [{"gpu": g.index, "uuid": g.uuid, "util": g.util_gpu, "error": g.error} for g in s.gpus]
        out["jobs"] = [{"job": j.id, "kind": j.kind, "bandwidth_bytes_per_s": j.bandwidth_bps, "gpu_util": j.gpu_util,
                        "level": r.levels.get(j.id, 0), "override": j.id in overrides, "exempt": j.meta.exempt,
                        "monitoring": j.monitoring} for j in sorted(s.jobs.values(), key=lambda j: j.id)]
        out["missing"] = list(s.missing)
        return out

    def explain(self, job: str) -> dict[str, Any]:
        d = self.daemon
        r = d.last
        if r is None or job not in r.sample.jobs:
            raise RequestError(f"no such job {job!r}")
        js = r.sample.jobs[job]
        why: list[str] = []
        if js.kind == "gpu":
            why.append("a GPU job: never throttled")
        if js.meta.exempt:
            why.append("marked exempt in its labels")
        o = self.store.active().get(job)
        if o is not None:
            why.append(f"operator override ({o.kind}, level {o.level}) by uid {o.set_by_uid}: {o.reason or 'no reason'}")
        if d.paused:
            why.append(f"the eliminator is paused: {d.paused}")
        if r.decision.note:
            why.append(r.decision.note)
        now = r.t
        return {
            "job": job, "kind": js.kind, "level": r.levels.get(job, 0), "bandwidth_bytes_per_s": js.bandwidth_bps,
            "gpu_util": js.gpu_util, "baseline": d.state.baselines.get(job),
            "node_share_of_peak": r.decision.node_share, "threshold": d.config.contention.threshold,
            "slowed_gpu_jobs": list(r.decision.slowed), "why": why,
            "decisions": [{"seconds_ago": round(now - t, 1), "action": a.kind, "from": a.from_level,
                           "to": a.to_level, "cause": a.cause, "reason": a.reason}
                          for t, a in d.history.get(job, ())],
        }
