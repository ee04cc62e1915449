"""Liveness (issue #26, item 4): a control loop that stalls (a tick that never returns)
still serves /metrics from its last result; /healthz answers 503 with the reason, and
``noded_last_tick_timestamp_seconds`` stands still, until the loop moves again."""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from types import MappingProxyType

import pytest
from hypothesis import given, strategies as st

from support.waiting import wait_for
from noded.util.ages import format_age, parse_duration
from noded.commands.wiring import serve_metrics
from noded.config import Config
from noded.loop.daemon import Daemon
from noded.loop.parts import Parts
from noded.loop.health import MIN_STALE_S
from noded.samplers.sample import Sample
from noded.samplers import SamplerStatus
from support.metrics import parse


class StallableTelemetry:
    """An empty node; while ``go`` is clear, a sample blocks (a driver call that never
    returns), as a hung tick does."""

    discovery = events = None  # what the metrics read of telemetry: none here

    def __init__(self):
        self.go = threading.Event()
        self.go.set()
        self.n = 0

    def sample(self, quiet=None):
        self.go.wait()
        self.n += 1
        return Sample(float(self.n), MappingProxyType({}), (), False, "no NVML", (0,), MappingProxyType({0: 1e9}),
                      (), (SamplerStatus("jobs", True, 0.001),))

    def close(self):
        pass


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def last_tick(base: str) -> float | None:
    values, _ = parse(get(base + "/metrics")[1])
    return values.get(("noded_last_tick_timestamp_seconds", frozenset()))


#: how long a wait for the loop's thread to run a round may last: what the test proves is that it
#: does, not how soon (a starved thread takes seconds where an idle one takes 0.05)
LOOP_WAIT_S = 30


def test_healthz_fails_with_the_reason_while_the_loop_is_stalled_and_recovers_with_it():
    telemetry = StallableTelemetry()
    daemon = Daemon(Config(tick_s=0.05), Parts(telemetry))
    server, url = serve_metrics(daemon, "127.0.0.1", 0)
    base = url.rsplit("/", 1)[0]
    stop = threading.Event()
    loop = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    try:
        code, body = get(base + "/healthz")
        assert code == 503 and "has not started" in body
        loop.start()
        # 200 from the loop's start ("no round has ended yet"); the round's end is waited for
        wait_for(lambda: (r := get(base + "/healthz"))[0] == 200 and r[1].startswith(
            "ok: the control loop's last round ended"), timeout=LOOP_WAIT_S, what="healthz 200 once a round ended")
        first = wait_for(lambda: last_tick(base), timeout=LOOP_WAIT_S, what="noded_last_tick_timestamp_seconds")
        wait_for(lambda: last_tick(base) > first, timeout=LOOP_WAIT_S, what="the timestamp moving on")
        telemetry.go.clear()  # the next tick hangs
        code, body = wait_for(lambda: (r := get(base + "/healthz"))[0] == 503 and r, timeout=MIN_STALE_S + 10,
                              interval=0.1, what="healthz 503 while the loop hangs")
        assert "the control loop is stalled: its last round ended" in body and "ago, more than 5s" in body
        assert get(base + "/metrics")[0] == 200  # what the old probe asked: still served
        stalled = last_tick(base)
        assert last_tick(base) == stalled
        telemetry.go.set()
        wait_for(lambda: get(base + "/healthz")[0] == 200, timeout=LOOP_WAIT_S, what="healthz 200 once the loop moves again")
        assert last_tick(base) > stalled
    finally:
        stop.set()
        telemetry.go.set()
        if loop.is_alive():
            loop.join(timeout=10)
        server.shutdown()


@pytest.mark.parametrize("seconds, text", [(0.4, "0.4s"), (3, "3s"), (9.96, "10s"), (45, "45s"), (570, "9m30s"),
                                           (600, "10m"), (7500, "2h5m"), (3 * 86400 + 4 * 3600 + 5, "3d4h")])
def test_ages_print_as_kubectl_prints_them(seconds, text):
    assert format_age(seconds) == text


@given(st.integers(min_value=10, max_value=400 * 86400))
def test_a_printed_age_reads_back_as_a_duration_short_by_less_than_the_unit_it_drops(seconds):
    text = format_age(seconds)
    read = sum(parse_duration(n + u) for n, u in re.findall(r"(\d+)([smhd])", text))
    assert "".join(n + u for n, u in re.findall(r"(\d+)([smhd])", text)) == text
    dropped = {"s": 1, "m": 60, "h": 3600, "d": 86400}[text[-1]]  # 2h5m drops seconds; 3d4h drops minutes
    assert 0 <= seconds - read < dropped, (seconds, text)
