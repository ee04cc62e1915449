"""The metrics endpoint: just enough HTTP/1.1 to answer Prometheus, on the bounded server.

``GET /metrics`` renders the registry with prometheus_client's own encoders (the
Accept header chooses text or OpenMetrics); ``GET /healthz`` is 200 while the control
loop is alive and 503 with the reason while it is stalled (noded.loop.health: what a
liveness probe asks, since a hung loop still serves /metrics); ``GET /`` is a page
linking to both; other paths are 404, other methods 405. Every answer closes the connection. Rendering
reads the collector, which reads the last tick's result: a scrape never touches
hardware.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable
from typing import Protocol as Interface

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from noded.server.stream import Limits, ListenError, Peer, Protocol, StreamServer, listen_tcp, tcp_peer

log = logging.getLogger(__name__)


class Health(Interface):
    """What /healthz asks (noded.loop.health.Liveness)."""

    def check(self) -> str | None: ...

    def describe(self) -> str: ...

_INDEX = (b"<html><head><title>noded</title></head><body><h1>noded</h1>"
          b"<p><a href=\"/metrics\">Metrics</a></p><p><a href=\"/healthz\">Health</a></p></body></html>\n")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


def http_response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", *,
                  head: bool = False, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    headers = [f"HTTP/1.1 {status} {_REASONS[status]}", f"Content-Type: {content_type}",
               f"Content-Length: {len(body)}", "Connection: close", *(f"{k}: {v}" for k, v in extra)]
    return ("\r\n".join(headers) + "\r\n\r\n").encode("latin-1") + (b"" if head else body)


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased


class HttpError(ValueError):
    pass


def parse_http_request(head: bytes) -> HttpRequest:
    """The request line and headers (everything before the blank line)."""
    lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        raise HttpError(f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(f"not a header line: {line[:80]!r}")
        headers[name.lower()] = value.strip()
    return HttpRequest(parts[0], parts[1].split("?", 1)[0], headers)


#: after a render of the metrics the endpoint rests this many times as long as the render
#: took (at most RENDER_REST_MAX_S) before it renders again: any local user may scrape, a
#: render of a thousand jobs is some 70 ms of Python holding the GIL the control loop needs,
#: and scrapes back to back would otherwise take it whole. Scrapes that arrive meanwhile
#: wait, and are answered together from one render made after each of them arrived.
RENDER_REST_FACTOR = 3.0
#: the longest rest, well within a scrape's deadline (Limits.deadline_s) and Prometheus's
RENDER_REST_MAX_S = 1.0


class MetricsHttp(Protocol):
    """``health``: why the loop is not alive, or None while it is (and ``describe`` then
    says so in words); without it /healthz is 404. Renders are paced (RENDER_REST_FACTOR)
    by ``clock`` (the server's)."""

    def __init__(self, registry: CollectorRegistry, health: Health | None = None, *,
                 clock: Callable[[], float] = time.monotonic):
        self.registry = registry
        self.health = health
        self.clock = clock
        self.renders = 0  # how many times the registry was rendered
        self._rest_until = 0.0
        self._batch: dict[str, bytes] | None = None  # content type -> its render, within a batch

    def paced(self, request: bytes) -> bool:
        """A scrape of /metrics (a render); /healthz and the rest are answered at once."""
        try:
            return parse_http_request(request).path == "/metrics"
        except HttpError:
            return False

    def resting_until(self) -> float:
        return self._rest_until

    def batch(self, on: bool) -> None:
        self._batch = {} if on else None

    def _render(self, accept: str) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        if self._batch is not None and content_type in self._batch:
            return self._batch[content_type], content_type  # rendered after this request arrived
        began = self.clock()
        try:
            body = encoder(self.registry)
        finally:
            self.renders += 1
            ended = self.clock()
            self._rest_until = ended + min(RENDER_REST_MAX_S, max(0.0, ended - began) * RENDER_REST_FACTOR)
        if self._batch is not None:
            self._batch[content_type] = body
        return body, content_type

    def framed(self, data: bytearray, new_from: int, eof: bool) -> bytes | None:
        start = max(0, new_from - 3)
        for end in (b"\r\n\r\n", b"\n\n"):
            at = data.find(end, start)
            if at >= 0:
                return bytes(data[:at])
        return bytes(data) if eof and data else None

    def respond(self, request: bytes, peer: Peer) -> bytes:
        try:
            req = parse_http_request(request)
        except HttpError as e:
            return http_response(400, f"{e}\n".encode())
        if req.path not in ("/", "/metrics", "/healthz") or (req.path == "/healthz" and self.health is None):
            return http_response(404, b"not found: try /metrics\n")
        if req.method not in ("GET", "HEAD"):
            return http_response(405, b"only GET and HEAD\n", extra=(("Allow", "GET, HEAD"),))
        head = req.method == "HEAD"
        if req.path == "/":
            return http_response(200, _INDEX, "text/html; charset=utf-8", head=head)
        if req.path == "/healthz":
            why = self.health.check()
            if why is not None:
                return http_response(503, f"{why}\n".encode(), head=head)
            return http_response(200, f"ok: {self.health.describe()}\n".encode(), head=head)
        try:
            body, content_type = self._render(req.headers.get("accept", ""))
        except Exception:
            log.exception("metrics: rendering failed")
            return http_response(500, b"rendering the metrics failed; see noded's log\n")
        return http_response(200, body, content_type, head=head)

    def too_large(self, limit: int) -> bytes:
        return http_response(431, f"request head larger than {limit} bytes\n".encode())

    def timed_out(self, deadline_s: float) -> bytes:
        return http_response(408, f"no complete request within {deadline_s:g}s\n".encode())

    def evicted(self, peer: Peer, held: int) -> bytes:
        return http_response(503, f"too many connections from {peer.key} ({held})\n".encode())


class MetricsServer:
    """The metrics endpoint, listening; ``url`` says where."""

    def __init__(self, registry: CollectorRegistry, address: str, port: int, limits: Limits,
                 health: Health | None = None):
        sock = listen_tcp(address, port, what="metrics")
        try:
            host, bound = sock.getsockname()[:2]
            self.port = bound
            self.url = f"http://{f'[{host}]' if ':' in host else host}:{bound}/metrics"
            self.server = StreamServer(sock, MetricsHttp(registry, health), name="metrics", limits=limits, peer_of=tcp_peer)
        except BaseException:
            sock.close()
            raise

    def start(self) -> "MetricsServer":
        try:
            self.server.start()
        except OSError as e:
            self.server.listener.close()
            raise ListenError(f"metrics: cannot listen on {self.url}: {e.strerror or e}") from None
        return self

    def stop(self) -> None:
        self.server.stop()

    shutdown = stop  # the name the runner (and http.server) use
