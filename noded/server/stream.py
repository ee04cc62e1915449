"""A bounded server for one listening stream socket (Unix or TCP).

Any local user can connect to the metrics port and the report socket, so nothing a
client does may grow what the daemon holds or stall it:

* one thread per endpoint, a selector over non-blocking sockets; no thread per
  connection, whatever the number of clients;
* each connection gets one deadline for the whole request and its reply (a byte
  every few seconds does not keep it alive), and a request-size limit;
* a cap on open connections per endpoint and per peer (a Unix peer is its uid from
  SO_PEERCRED, a TCP peer its address); when one is reached the oldest connection of
  the peer holding the most is dropped to make room for the newcomer;
* a peer over its budget (``Protocol.hold``: the report socket's rate per uid) has
  its connection held unread for as long as its budget says, then answered with
  ``Protocol.dropped``: its request is never read nor parsed, and a client that sends
  back to back is paced to its budget instead of costing a core;
* accept errors (EMFILE, ENFILE, ENOBUFS, ...) are logged, rate-limited, and retried
  with backoff: the accept loop never ends on an error; accepting is paced, so a
  connection storm cannot spin a core the control loop shares the GIL with;
* ``stop()`` stops accepting, lets a request being handled write its answer, closes
  every client socket and joins the thread within a bound;
* a request whose client closed its connection before the request was read (it gave
  up: nodectl's deadline passed while noded was stopped or busy) is dropped, not
  carried out, and counted: its client told its user there was no answer, so nothing
  may happen on it. A client that only shut its sending side down still waits, and is
  answered.

A request is handled on the endpoint's thread, in full, by its ``Protocol``: the
handlers read the daemon's last result and never touch hardware, so they are quick.
"""

from __future__ import annotations

import errno
import heapq
import logging
import select
import selectors
import socket
import struct
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

from noded.util.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")  # pid, uid, gid

#: accept() errors that say this process or the host is short of a resource: wait before
#: trying again (the listener stays readable, so retrying at once would spin).
_SHORT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: accept() errors that concern only the one connection being accepted: go on at once.
_ONE_CONNECTION = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ECONNRESET, errno.ETIMEDOUT,
                   errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.ENOPROTOOPT, errno.EOPNOTSUPP}


class ListenError(Exception):
    """The endpoint could not be opened (an address in use, not an address of this host).
    ``address_wrong``: the address is at fault (not this host's), not the port."""

    def __init__(self, message: str, *, address_wrong: bool = False):
        super().__init__(message)
        self.address_wrong = address_wrong


@dataclass(frozen=True)
class Limits:
    #: the whole request and its reply must be done within this many seconds
    deadline_s: float = 5.0
    #: a request larger than this is answered with the protocol's "too large" reply
    max_request_bytes: int = 64 * 1024
    #: open connections on this endpoint at most
    max_connections: int = 64
    #: open connections of one peer (uid or address) at most
    max_per_peer: int = 16
    #: accept() calls per wake-up at most, and the pause after a full batch: the most
    #: connections a storm can make this endpoint accept is accept_batch / accept_pause_s
    #: (no more than max_per_peer: a burst from one peer is read between two batches,
    #: before its own later connections could push it out)
    accept_batch: int = 16
    accept_pause_s: float = 0.002
    #: the listen backlog: room for a burst of nodectl calls while the thread is busy, and
    #: for a flood's connects, so that a prompt client's connect waits its turn (a few
    #: hundred ms at worst at the accept rate above) instead of failing with EAGAIN
    #: (Unix) or losing its SYN for a 1 s retransmit (TCP). The kernel caps it at
    #: net.core.somaxconn; pending connections cost kernel memory, not descriptors.
    backlog: int = socket.SOMAXCONN
    #: bounds of the wait before accept() is tried again after a resource error
    backoff_min_s: float = 0.01
    backoff_max_s: float = 1.0

    def __post_init__(self):
        if not (self.deadline_s > 0 and self.max_request_bytes > 0 and 0 < self.max_per_peer <= self.max_connections
                and 0 < self.accept_batch <= self.max_per_peer and self.accept_pause_s >= 0 and self.backlog > 0
                and 0 < self.backoff_min_s <= self.backoff_max_s):
            raise ValueError(f"inconsistent server limits: {self}")


@dataclass(frozen=True)
class Peer:
    """Who is on the other end. ``key`` is what the per-peer cap counts by."""
    key: str
    pid: int | None = None
    uid: int | None = None
    gid: int | None = None
    address: tuple | None = None


def hung_up(sock: socket.socket) -> bool:
    """Whether the peer has closed its connection for good (POLLHUP: both directions shut,
    as its close does), not merely shut its sending side (POLLRDHUP alone: it still reads)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return any(events & select.POLLHUP for _fd, events in poller.poll(0))


def unix_peer(sock: socket.socket, _address) -> Peer:
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return Peer(f"uid {uid}", pid=pid, uid=uid, gid=gid)


def tcp_peer(_sock: socket.socket, address) -> Peer:
    return Peer(str(address[0]), address=tuple(address))


class Protocol:
    """What an endpoint says. Every method returns whole byte strings; the server does the I/O."""

    def refusal(self, peer: Peer) -> bytes | None:
        """The answer for a peer that may not ask anything, or None. A refused peer's
        request is still read (within the same limits) before it is answered: closing
        a socket the client is still writing to would cost the client the answer."""
        return None

    def framed(self, data: bytearray, new_from: int, eof: bool) -> bytes | None:
        """The complete request at the start of ``data``, or None while more is needed.
        ``data[new_from:]`` arrived since the last call (search only near it: a client
        sending a byte at a time must not cost a scan of everything each time);
        ``eof``: the client will send nothing more."""
        raise NotImplementedError

    def respond(self, request: bytes, peer: Peer) -> bytes:
        """The whole reply to a request. It must not raise: a failure is an error reply."""
        raise NotImplementedError

    def too_large(self, limit: int) -> bytes:
        raise NotImplementedError

    def timed_out(self, deadline_s: float) -> bytes:
        """Sent (if the socket takes it at once) to a client dropped at its deadline."""
        return b""

    def evicted(self, peer: Peer, held: int) -> bytes:
        """Sent (if the socket takes it at once) to a connection dropped to make room."""
        return b""

    def hold(self, peer: Peer) -> float:
        """Seconds to hold a new connection of ``peer`` unread, then answer it with
        ``dropped`` (0: serve it now). Asked once per connection, before anything is read."""
        return 0.0

    def dropped(self, peer: Peer) -> bytes:
        """The answer to a connection held for ``hold``'s seconds: its request was not read."""
        return b""

    def paced(self, request: bytes) -> bool:
        """Whether the answer to ``request`` is a costly one, paced by ``resting_until``
        (others are answered at once, rest or not)."""
        return False

    def resting_until(self) -> float:
        """The server's clock time before which no paced request is answered (0: answer
        now): a protocol whose answers are costly paces itself. A complete request waits,
        within its deadline; when the rest ends every waiting request is answered in one
        batch (``batch``), each having arrived before any of the batch's answers was made."""
        return 0.0

    def batch(self, on: bool) -> None:
        """Answers between ``batch(True)`` and ``batch(False)`` are to requests that all
        arrived before the first of them was made: one costly answer may serve them all."""


class _Conn:
    __slots__ = ("sock", "peer", "deadline", "inbuf", "out", "sent", "refusal", "unread", "draining", "request")

    def __init__(self, sock: socket.socket, peer: Peer, deadline: float):
        self.sock = sock
        self.peer = peer
        self.deadline = deadline
        self.inbuf = bytearray()
        self.out: memoryview | None = None  # the reply, once there is one
        self.sent = 0
        self.refusal: bytes | None = None
        self.unread = False  # reading stopped before the client was done sending (too large)
        self.draining = 0  # bytes read and discarded after the reply; counts once the reply is out
        self.request: bytes | None = None  # a complete request waiting for the protocol's rest to end


@dataclass
class Stats:
    accepted: int = 0
    served: int = 0
    timed_out: int = 0
    evicted: int = 0
    too_large: int = 0
    dropped: int = 0  # held unread and answered with Protocol.dropped (a peer over its budget)
    abandoned: int = 0  # complete requests not carried out: their client had hung up
    accept_errors: int = 0
    open: int = 0


_LISTENER = object()
_WAKE = object()


class StreamServer:
    """Serves one listening socket (already bound) on one thread; see the module's doc."""

    def __init__(self, listener: socket.socket, protocol: Protocol, *, name: str, limits: Limits,
                 peer_of: Callable[[socket.socket, object], Peer], clock: Callable[[], float] = time.monotonic):
        self.listener = listener
        self.protocol = protocol
        self.name = name
        self.limits = limits
        self.peer_of = peer_of
        self.clock = clock
        self.stats = Stats()
        self._log = RateLimitedLog(log, clock=clock)
        # Every open connection in accept order, which is also deadline order (one
        # deadline_s for all): the front is the oldest and the first to expire.
        self._conns: OrderedDict[_Conn, None] = OrderedDict()
        self._by_peer: dict[str, OrderedDict[_Conn, None]] = {}
        self._held: list[tuple[float, int, _Conn]] = []  # (answer at, tie, connection): a heap
        self._waiting: deque[_Conn] = deque()  # complete requests, unanswered while the protocol rests
        self._stop = threading.Event()
        self._wake_r: socket.socket | None = None  # a socket pair that wakes the thread for stop()
        self._wake_w: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._thread: threading.Thread | None = None
        self._listening = False
        self._resume_at: float | None = None
        self._backoff = limits.backoff_min_s

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "StreamServer":
        try:
            self.listener.listen(self.limits.backlog)
            self.listener.setblocking(False)
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._sel = selectors.DefaultSelector()
            self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
            self._listen(True)
            self._thread = threading.Thread(target=self._run, name=f"noded-{self.name}", daemon=True)
            self._thread.start()
        except BaseException:
            for done in (self._sel, self._wake_r, self._wake_w):
                if done is not None:
                    done.close()
            self._thread = None
            raise
        return self

    def stop(self, timeout_s: float = 0.5) -> None:
        """Stop accepting, answer a request being handled, close every client; bounded by timeout_s."""
        self._stop.set()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                # Only a handler can hold the thread (clients cannot): leave it, it is a daemon thread.
                log.error("%s: the server thread did not stop within %.1fs", self.name, timeout_s)
                return
        else:
            self.listener.close()
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()

    def _poke(self) -> None:
        try:
            if self._wake_w is not None:
                self._wake_w.send(b"x")
        except OSError:
            pass  # full (a wake-up is already pending) or closed (stopped)

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._once()
                except Exception:  # a bug must cost a connection, never the endpoint
                    self._log.log(logging.ERROR, "bug", "%s: server loop error", self.name, exc_info=True)
                    self._stop.wait(0.05)
        finally:
            self._finish()

    def _once(self) -> None:
        now = self.clock()
        waits = []
        if self._conns:
            waits.append(next(iter(self._conns)).deadline - now)
        if self._resume_at is not None:
            waits.append(self._resume_at - now)
        if self._held:
            waits.append(self._held[0][0] - now)
        if self._waiting:
            waits.append(self.protocol.resting_until() - now)
        events = self._sel.select(max(0.0, min(waits)) if waits else None)
        # Clients first, new connections last: a request that has arrived is answered
        # before newcomers could push its connection out.
        events.sort(key=lambda event: event[0].data is _LISTENER)
        for key, mask in events:
            if key.data is _LISTENER:
                self._accept()
            elif key.data is _WAKE:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except BlockingIOError:
                    pass
            else:
                conn: _Conn = key.data
                if conn not in self._conns:
                    continue  # dropped earlier in this batch
                try:
                    if mask & selectors.EVENT_READ and conn.out is None:
                        self._read(conn)
                    elif mask & selectors.EVENT_WRITE and conn.out is not None:
                        self._write(conn)
                    elif mask & selectors.EVENT_READ and conn.out is not None:
                        self._drain(conn)
                except Exception:
                    self._log.log(logging.ERROR, "bug", "%s: error serving %s", self.name, conn.peer.key,
                                  exc_info=True)
                    self._close(conn)
        now = self.clock()
        self._answer_held(now)
        self._answer_waiting(now)
        while self._conns:
            conn = next(iter(self._conns))
            if conn.deadline > now:
                break
            self.stats.timed_out += 1
            self._log.log(logging.INFO, "deadline", "%s: dropped %s: no complete request and reply within %gs",
                          self.name, conn.peer.key, self.limits.deadline_s)
            self._close(conn, self.protocol.timed_out(self.limits.deadline_s) if conn.out is None else b"")
        if self._resume_at is not None and now >= self._resume_at:
            self._resume_at = None
            self._listen(True)

    def _listen(self, on: bool) -> None:
        if on and not self._listening:
            self._sel.register(self.listener, selectors.EVENT_READ, _LISTENER)
        elif not on and self._listening:
            self._sel.unregister(self.listener)
        self._listening = on

    def _accept(self) -> None:
        for _ in range(self.limits.accept_batch):
            try:
                sock, address = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                self.stats.accept_errors += 1
                if e.errno in _ONE_CONNECTION:
                    self._log.log(logging.INFO, f"accept{e.errno}", "%s: accept: %s", self.name, e)
                    continue
                # Short of descriptors or memory (or something unforeseen): the next
                # accept would fail the same way, so wait, longer each time.
                self._log.log(logging.WARNING, f"accept{e.errno}", "%s: accept failed: %s; retrying in %.2fs",
                              self.name, e, self._backoff)
                self._pause(self._backoff)
                self._backoff = min(self._backoff * 2, self.limits.backoff_max_s)
                return
            self._backoff = self.limits.backoff_min_s
            self._admit(sock, address)
        # A full batch: more are probably waiting. Leave them in the backlog a moment so a
        # storm of connections costs this thread a bounded share of the CPU (and the GIL).
        self._pause(self.limits.accept_pause_s)

    def _pause(self, seconds: float) -> None:
        self._listen(False)
        self._resume_at = self.clock() + seconds

    def _admit(self, sock: socket.socket, address) -> None:
        try:
            sock.setblocking(False)
            peer = self.peer_of(sock, address)
        except OSError as e:
            self._log.log(logging.INFO, "peer", "%s: dropped a connection whose peer is unknown: %s", self.name, e)
            sock.close()
            return
        self.stats.accepted += 1
        self._make_room(peer.key)
        conn = _Conn(sock, peer, self.clock() + self.limits.deadline_s)
        self._conns[conn] = None
        self._by_peer.setdefault(peer.key, OrderedDict())[conn] = None
        self.stats.open = len(self._conns)
        conn.refusal = self.protocol.refusal(peer)
        hold = self.protocol.hold(peer)
        if hold > 0:
            # not registered for reading: what it sends stays in the kernel, unread
            answer_at = self.clock() + min(hold, self.limits.deadline_s / 2)
            heapq.heappush(self._held, (answer_at, id(conn), conn))
            return
        self._sel.register(sock, selectors.EVENT_READ, conn)
        try:
            self._read(conn)  # a prompt client's request is usually here already: answer it now
        except Exception:
            self._log.log(logging.ERROR, "bug", "%s: error serving %s", self.name, peer.key, exc_info=True)
            self._close(conn)

    def _answer_held(self, now: float) -> None:
        while self._held and self._held[0][0] <= now:
            _, _, conn = heapq.heappop(self._held)
            if conn not in self._conns:
                continue  # evicted or past its deadline meanwhile
            self.stats.dropped += 1
            conn.unread = True  # half-close and wait for the client's end: no reset to cost it the answer
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            self._reply(conn, self.protocol.dropped(conn.peer))

    def _make_room(self, key: str) -> None:
        # Why drop the oldest connection of the biggest holder rather than refuse the
        # newcomer: refusing lets whoever filled the table first keep it, so a user
        # holding slow connections would lock out Prometheus's scrape and `nodectl
        # status` for as long as they like. Dropping the oldest of the peer that holds
        # the most means a flood only ever displaces the flooder's own connections (or,
        # among many peers, the one with the most), and a prompt client, which needs its
        # slot for milliseconds, is answered before it could become the oldest.
        mine = self._by_peer.get(key)
        if mine is not None and len(mine) >= self.limits.max_per_peer:
            victim_key = key
        elif len(self._conns) >= self.limits.max_connections:
            # The peer holding the most; among equals, the one with the oldest connection.
            most = max(len(held) for held in self._by_peer.values())
            victim_key = next(c.peer.key for c in self._conns if len(self._by_peer[c.peer.key]) == most)
        else:
            return
        held = self._by_peer[victim_key]
        victim = next(iter(held))
        self.stats.evicted += 1
        self._log.log(logging.WARNING, "evict", "%s: connection cap reached (%d open, at most %d per peer): "
                      "dropped the oldest connection of %s, which holds %d", self.name, len(self._conns),
                      self.limits.max_per_peer, victim_key, len(held))
        self._close(victim, self.protocol.evicted(victim.peer, len(held)) if victim.out is None else b"")

    def _read(self, conn: _Conn) -> None:
        room = self.limits.max_request_bytes + 1 - len(conn.inbuf)
        try:
            data = conn.sock.recv(min(65536, room))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        new_from = len(conn.inbuf)
        conn.inbuf += data
        request = self.protocol.framed(conn.inbuf, new_from, not data)
        if request is not None:
            if len(request) > self.limits.max_request_bytes:
                self.stats.too_large += 1
                self._reply(conn, self.protocol.too_large(self.limits.max_request_bytes))
            elif conn.refusal is not None:
                self._reply(conn, conn.refusal)
            elif hung_up(conn.sock):
                self.stats.abandoned += 1
                self._log.log(logging.WARNING, "abandoned", "%s: %s hung up before its request was read: "
                              "not carried out", self.name, conn.peer.key)
                self._close(conn)
            elif self.protocol.paced(request) and (self._waiting or self.protocol.resting_until() > self.clock()):
                conn.request = request
                self._sel.unregister(conn.sock)  # nothing more is read from it until it is answered
                self._waiting.append(conn)
            else:
                self._answer(conn, request)
        elif len(conn.inbuf) > self.limits.max_request_bytes:
            self.stats.too_large += 1
            conn.unread = True
            self._reply(conn, self.protocol.too_large(self.limits.max_request_bytes))
        elif not data:
            self._close(conn)  # the client went away before its request was complete

    def _answer(self, conn: _Conn, request: bytes) -> None:
        self._reply(conn, self.protocol.respond(request, conn.peer))
        self.stats.served += 1

    def _answer_waiting(self, now: float) -> None:
        """Once the protocol's rest is over: every request that waited for it, in one batch."""
        if not self._waiting or self.protocol.resting_until() > now:
            return
        waiting, self._waiting = self._waiting, deque()
        self.protocol.batch(True)
        try:
            for conn in waiting:
                if conn not in self._conns:
                    continue  # evicted or past its deadline meanwhile
                request, conn.request = conn.request, None
                if hung_up(conn.sock):
                    self.stats.abandoned += 1
                    self._close(conn)
                    continue
                self._sel.register(conn.sock, selectors.EVENT_READ, conn)
                try:
                    self._answer(conn, request)
                except Exception:  # a bug must cost a connection, never the batch
                    self._log.log(logging.ERROR, "bug", "%s: error serving %s", self.name, conn.peer.key,
                                  exc_info=True)
                    self._close(conn)
        finally:
            self.protocol.batch(False)

    def _reply(self, conn: _Conn, reply: bytes) -> None:
        conn.out = memoryview(reply)
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)  # most replies fit the socket's buffer: done without another wake-up

    def _write(self, conn: _Conn) -> None:
        try:
            conn.sent += conn.sock.send(conn.out[conn.sent:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if conn.sent >= len(conn.out):
            self._done_writing(conn)

    def _done_writing(self, conn: _Conn) -> None:
        # Half-close, and close for good once the client has stopped sending: closing a
        # socket with input left unread makes the kernel reset the connection, which can
        # cost the client the reply (a request over the size limit, extra bytes after
        # the request). A client that sent just its request is closed at once.
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        self._drain(conn)

    def _drain(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            if not conn.unread and not conn.draining:
                self._close(conn)
            return  # else wait for the client's EOF (within the same deadline)
        except OSError:
            self._close(conn)
            return
        conn.draining += len(data)
        if not data or conn.draining > 4 * self.limits.max_request_bytes:
            self._close(conn)

    def _close(self, conn: _Conn, parting: bytes = b"") -> None:
        """Forget a connection and close its socket; ``parting`` is sent only if the socket takes it at once."""
        self._conns.pop(conn, None)
        held = self._by_peer.get(conn.peer.key)
        if held is not None:
            held.pop(conn, None)
            if not held:
                del self._by_peer[conn.peer.key]
        self.stats.open = len(self._conns)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        if parting:
            try:
                conn.sock.send(parting)
            except OSError:
                pass
        conn.sock.close()

    def _finish(self) -> None:
        """On stop: no more accepting; replies already made get one chance to go out; all closed."""
        self._listen(False)
        self.listener.close()
        for conn in list(self._conns):
            if conn.out is not None and conn.sent < len(conn.out):
                try:
                    conn.sock.send(conn.out[conn.sent:])
                except OSError:
                    pass
            self._close(conn)
        self._sel.close()


def listen_tcp(address: str, port: int, *, what: str) -> socket.socket:
    """A bound (not yet listening) TCP socket; ListenError names ``what`` and the cause."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ListenError(f"{what}: {address!r} is not an address this host can listen on "
                          f"({getattr(e, 'strerror', None) or e})", address_wrong=True) from None
    except OverflowError:
        raise ListenError(f"{what}: port {port} is not a TCP port") from None
    family, type_, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, type_ | socket.SOCK_CLOEXEC, proto)
    try:
        # A restart must not wait out TIME_WAIT; a live listener still makes bind() fail.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ListenError(f"{what}: port {port} on {address} is already in use") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ListenError(f"{what}: {address} is not an address of this host", address_wrong=True) from None
        if e.errno == errno.EACCES:
            raise ListenError(f"{what}: not allowed to listen on port {port} of {address}") from None
        raise ListenError(f"{what}: cannot listen on {address} port {port}: {e.strerror or e}") from None
    return sock
