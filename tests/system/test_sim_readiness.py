"""`noded run --sim` waiting for its simulated node (issue #24, item 4): a node that exits
before READY=1 is told from one that is slow, and the error carries what the node said."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nodesim.launch import NotReady, StderrTail, not_ready_message, read_environment


def test_a_node_that_exits_first_is_not_reported_as_slow():
    node = subprocess.Popen([sys.executable, "-c", "import sys; print('A=1'); sys.stderr.write('boom\\n'); sys.exit(3)"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr = StderrTail(node.stderr)
    with pytest.raises(NotReady) as e:
        read_environment(node.stdout, timeout=60)
    assert str(e.value) == "the simulated node exited before it was ready"
    assert not_ready_message(e.value, node, stderr) == (
        "the simulated node exited before it was ready (exit status 3); its last words:\nboom")


def test_a_node_still_silent_at_the_deadline_is_slow_and_stopped():
    node = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr = StderrTail(node.stderr)
    with pytest.raises(NotReady) as e:
        read_environment(node.stdout, timeout=0.2)
    assert str(e.value) == "the simulated node was not ready within 0.2 s"
    said = not_ready_message(e.value, node, stderr)
    assert said.startswith("the simulated node was not ready within 0.2 s (still running: stopped)")
    assert node.poll() is not None
    node.stdin.close()


def test_only_the_last_lines_are_kept_until_released(capfd):
    r, w = os.pipe()
    with os.fdopen(w, "w") as out:
        out.writelines(f"line {i}\n" for i in range(50))
    tail = StderrTail(os.fdopen(r), keep=3)
    assert tail.tail() == "line 47\nline 48\nline 49"
    tail.release()
    assert capfd.readouterr().err == "line 47\nline 48\nline 49\n"
