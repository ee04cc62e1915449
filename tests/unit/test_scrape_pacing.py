"""What scrapes may cost noded (F2): any local user may scrape the metrics port, and a
render of a thousand jobs is some 70 ms of Python holding the GIL the control loop needs.
After each render the endpoint rests three times as long (at most a second) before the
next; scrapes arriving meanwhile wait and are answered together from one render made after
each of them arrived (the server's side: tests/system/test_hostile_clients.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from noded.server.metrics_http import RENDER_REST_FACTOR, RENDER_REST_MAX_S, MetricsHttp
from noded.server.stream import Peer

GET = b"GET /metrics HTTP/1.1\r\nHost: x"
OPENMETRICS = GET + b"\r\nAccept: application/openmetrics-text; version=1.0.0"
PEER = Peer("127.0.0.1")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class SlowCollections:
    """A collector whose collection takes ``seconds`` of the clock and says how many there were."""

    def __init__(self, clock: Clock, seconds: float):
        self.clock, self.seconds, self.n = clock, seconds, 0

    def collect(self):
        self.n += 1
        self.clock.now += self.seconds
        yield CounterMetricFamily("noded_test_collections", "collections so far", value=self.n)

    def describe(self):
        return []


def endpoint(render_s=0.07):
    clock = Clock()
    registry, counted = CollectorRegistry(), SlowCollections(clock, render_s)
    registry.register(counted)
    return MetricsHttp(registry, clock=clock), counted, clock


def test_a_render_is_followed_by_a_rest_three_times_as_long_at_most_a_second():
    http, counted, clock = endpoint(0.07)
    assert http.resting_until() == 0.0
    http.respond(GET, PEER)
    assert http.resting_until() == pytest.approx(clock.now + 0.07 * RENDER_REST_FACTOR)
    slow, _, slow_clock = endpoint(2.0)
    slow.respond(GET, PEER)
    assert slow.resting_until() == pytest.approx(slow_clock.now + RENDER_REST_MAX_S)


def test_scrapes_that_waited_together_are_answered_from_one_render_each_format_its_own():
    http, counted, clock = endpoint()
    http.batch(True)
    texts = {http.respond(GET, PEER) for _ in range(50)}
    oms = {http.respond(OPENMETRICS, PEER) for _ in range(50)}
    http.batch(False)
    assert counted.n == 2 and len(texts) == len(oms) == 1
    assert b"text/plain; version=0.0.4" in texts.pop() and b"# EOF" in oms.pop()
    # Outside a batch every scrape is a render of its own: nothing is served stale.
    assert b"noded_test_collections_total 3.0" in http.respond(GET, PEER)
    assert b"noded_test_collections_total 4.0" in http.respond(GET, PEER)


def test_only_scrapes_of_the_metrics_wait_out_a_rest():
    http, _, _ = endpoint()
    assert http.paced(GET) and http.paced(b"HEAD /metrics?x=1 HTTP/1.1")
    for request in (b"GET /healthz HTTP/1.1", b"GET / HTTP/1.1", b"GET /nope HTTP/1.1", b"\xff\x00garbage"):
        assert not http.paced(request), request
