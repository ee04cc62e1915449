"""The suite beside another noded (issue #24, item 5): a test that needs the host-wide
lock learns at once which noded holds it, by its pid, and skips saying so, instead of
failing its daemon's start after a long wait."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from support.host import noded_lock_holder, skip_if_another_noded

HOLDER = """
import sys
from noded.stores.lockfile import HostLock
lock = HostLock.for_filesystems(sys.argv[1:]).acquire()  # as a noded on that subtree holds it
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_noded_on_a_subtree_keeps_out_a_test_on_the_whole_hierarchy_and_is_named(v1_cpuset):
    base, mkcg = v1_cpuset
    mkcg("jobs")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, base], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        t0 = time.monotonic()
        held = noded_lock_holder(os.path.dirname(base))  # what the Slurm tests' noded watches
        assert time.monotonic() - t0 < 1.0  # asked, not waited for
        pids = re.search(r"another noded \(pid ([0-9, ]+)\) holds", held or "")
        assert pids and str(holder.pid) in pids.group(1).split(", "), held
        with pytest.raises(pytest.skip.Exception, match=f"needs the host-wide noded lock: another noded \\(pid "):
            skip_if_another_noded(f"noded run: {held}\n")
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert noded_lock_holder(base) is None  # its own subtree is free again


def test_output_without_a_lock_refusal_does_not_skip():
    skip_if_another_noded("noded run: state_dir: the state directory /x is owned by uid 65534\n")
