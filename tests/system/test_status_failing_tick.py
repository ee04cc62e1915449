"""`nodectl status` says when ticks fail (issue #26, a gap found beside items 2 and 3):
before, only systemd's STATUS line did; status showed the last good tick's jobs (or "no
tick yet") as if the loop were deciding. Now it says how many ticks have failed in a row,
when the last did and why, in text and in --json, and once ticks complete again, when the
last one failed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from types import MappingProxyType

import pytest

from support.waiting import wait_for
from noded.loop.overrides import OverrideStore
from noded.admin.server import AdminServer
from noded.config import Config
from noded.loop.daemon import Daemon
from noded.loop.parts import Parts
from noded.samplers.sample import Sample
from noded.samplers import SamplerStatus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/TIER/ up


class TelemetryThatFailsUntilMended:
    """Each sample raises, as a driver's or a kernel's surprise would, until ``mend`` is set."""

    discovery = events = None  # no jobs' discovery behind it

    def __init__(self):
        self.mend = threading.Event()
        self.n = 0

    def sample(self, quiet=None):
        self.n += 1
        if not self.mend.is_set():
            raise OSError(5, "Input/output error", "/sys/fs/resctrl/mon_data/mon_L3_00/mbm_total_bytes")
        return Sample(float(self.n), MappingProxyType({}), (), False, "no NVML", (0,), MappingProxyType({0: 1e9}),
                      (), (SamplerStatus("jobs", True, 0.001),))

    def close(self):
        pass


@pytest.fixture
def failing_noded(tmp_path):
    telemetry = TelemetryThatFailsUntilMended()
    daemon = Daemon(Config(tick_s=0.05, state_dir=str(tmp_path / "state")),
                    Parts(telemetry, overrides=OverrideStore(str(tmp_path / "state"), time.time)))
    rundir = tempfile.mkdtemp(prefix="noded-status-")
    server = AdminServer(os.path.join(rundir, "noded.sock"), daemon, group="root", timeout_s=2).start()
    stop = threading.Event()
    loop = threading.Thread(target=daemon.run, args=(stop,))
    loop.start()
    yield daemon, telemetry, server.path
    stop.set()
    loop.join(timeout=10)
    server.stop()
    shutil.rmtree(rundir, ignore_errors=True)


def nodectl(socket: str, *argv: str) -> str:
    """The real command, in its own process, against the real socket."""
    p = subprocess.run([sys.executable, "-m", "noded.admin.nodectl", "--socket", socket, *argv],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0, p
    return p.stdout


def test_status_says_that_ticks_fail_how_many_in_a_row_when_and_why_and_when_they_recovered(failing_noded):
    daemon, telemetry, socket = failing_noded
    wait_for(lambda: daemon.failures_in_a_row >= 3 or None, timeout=20, what="three ticks failed in a row")

    text = nodectl(socket, "status")
    # before: "no tick yet" and nothing else, though the loop ran and failed every tick
    failing = [line for line in text.splitlines() if line.startswith("TICK FAILING: ")]
    assert len(failing) == 1, text
    assert "ticks in a row, the last " in failing[0] and " ago: OSError: [Errno 5] Input/output error" in failing[0]
    assert "nothing is decided or changed until a tick completes" in failing[0]
    assert text.index("TICK FAILING") < text.index("no tick yet")

    status = json.loads(nodectl(socket, "--json", "status"))
    failures = status["tick_failures"]
    assert failures["in_a_row"] >= 3 and failures["last"]["completed_before"] == 0
    assert failures["last"]["error"].startswith("OSError: [Errno 5] Input/output error")
    assert 0 <= failures["last"]["seconds_ago"] < 60 and failures["last"]["at"] > 1.6e9

    telemetry.mend.set()
    wait_for(lambda: (daemon.last is not None and daemon.failures_in_a_row == 0) or None, timeout=20,
             what="a tick completed after the failures")
    text = nodectl(socket, "status")
    assert "TICK FAILING" not in text
    recovered = [line for line in text.splitlines() if line.startswith("last failed tick ")]
    assert len(recovered) == 1 and recovered[0].endswith("; ticks complete since"), text
    status = json.loads(nodectl(socket, "--json", "status"))
    assert status["tick_failures"]["in_a_row"] == 0
    assert status["tick_failures"]["last"]["error"].startswith("OSError: [Errno 5]")


def test_a_noded_whose_ticks_never_failed_says_nothing_about_failures(tmp_path):
    telemetry = TelemetryThatFailsUntilMended()
    telemetry.mend.set()
    daemon = Daemon(Config(tick_s=0.05, state_dir=str(tmp_path / "state")),
                    Parts(telemetry, overrides=OverrideStore(str(tmp_path / "state"), time.time)))
    rundir = tempfile.mkdtemp(prefix="noded-status-")
    server = AdminServer(os.path.join(rundir, "noded.sock"), daemon, group="root", timeout_s=2).start()
    stop = threading.Event()
    loop = threading.Thread(target=daemon.run, args=(stop,))
    loop.start()
    try:
        wait_for(lambda: daemon.last, timeout=20, what="a tick completed")
        text = nodectl(server.path, "status")
        status = json.loads(nodectl(server.path, "--json", "status"))
    finally:
        stop.set()
        loop.join(timeout=10)
        server.stop()
        shutil.rmtree(rundir, ignore_errors=True)
    assert "TICK FAILING" not in text and "last failed tick" not in text
    assert status["tick_failures"] == {"in_a_row": 0, "last": None}
