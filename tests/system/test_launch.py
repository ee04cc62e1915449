"""nodesim.launch, the one launcher of a simulated node and noded beside it (issue #25,
item 3): what a system test starts dies with the process that started it, as what the
benchmarks and `noded run --sim` start always did, so a killed test worker leaves no noded
behind holding the host-wide lock and the node's jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from support.system import CPUSET, REPO, running_node
from support.waiting import read_until, wait_for

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(not os.path.isdir(CPUSET), reason="no v1 cpuset hierarchy")]

#: a test worker: starts noded on the node as the system tests do, says its pid, waits
STARTER = """
import json, sys
from support.system import start_daemon
daemon, _ = start_daemon(json.loads(sys.argv[1]))
print(daemon.pid, flush=True)
sys.stdin.read()
"""


def gone(pid: int) -> bool:
    """No such process, or only its zombie (its new parent reaps it when it will)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_daemon_started_for_a_test_dies_with_the_killed_process_that_started_it(tmp_path):
    with running_node(tmp_path) as env:
        path = os.pathsep.join([os.path.join(REPO, "tests"), os.environ.get("PYTHONPATH", "")])
        starter = subprocess.Popen([sys.executable, "-c", STARTER, json.dumps(env)], cwd=REPO, text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env={**os.environ, "PYTHONPATH": path})
        daemon = None
        try:
            daemon = int(read_until(starter.stdout, "", "the daemon's pid from its starter", timeout=90))
            starter.kill()
            starter.wait()
            wait_for(lambda: gone(daemon), timeout=30, interval=0.1, what=f"noded (pid {daemon}) gone with its starter")
        finally:
            starter.kill()
            starter.wait()
            if daemon is not None and not gone(daemon):  # before the launcher: it lived on
                os.kill(daemon, signal.SIGKILL)
                wait_for(lambda: gone(daemon), timeout=30, what=f"noded (pid {daemon}) killed")
