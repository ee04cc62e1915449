"""`nodectl cap` against noded as a host runs it (a process of its own, `noded run`) on the
simulated node (issue #27, item 2): the cap goes through the admin socket, the job moves to
a control group of its own, the metrics say so, and a clean stop leaves no group of noded's."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml
from support.system import noded_groups, running_daemon, running_node, scrape

from support.waiting import wait_for

pytestmark = pytest.mark.fuse


def nodectl(sock: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from noded.admin.nodectl import main; sys.exit(main())",
                           "--socket", sock, *argv], capture_output=True, text=True, timeout=30)


def test_nodectl_cap_holds_a_job_of_a_running_noded_and_its_stop_leaves_nothing(tmp_path):
    with running_node(tmp_path) as env:
        with open(env["NODED_SIM_CONFIG"]) as f:
            sock = os.path.join(yaml.safe_load(f)["runtime_dir"], "noded.sock")
        with running_daemon(env) as url:
            hog = wait_for(lambda: re.search(r'noded_job_memory_bandwidth_bytes_per_second{job_id="([^"]*hog[^"]*)"',
                                             scrape(url)), timeout=60, what="the hog seen").group(1)
            p = nodectl(sock, "cap", hog, "3GB/s", "--ttl", "15m", "--reason", "system test")
            assert p.returncode == 0 and f"{hog} is capped at 3 GB/s" in p.stdout, p.stderr
            wait_for(lambda: re.search(rf'noded_job_bandwidth_cap_bytes_per_second{{job_id="{re.escape(hog)}",'
                                       r'source="override"} 3e\+09', scrape(url)), timeout=15, what="the cap exported")
            wait_for(lambda: any(g.startswith("noded-cap-job-") for g in noded_groups(env["NODED_SIM_RESCTRL"])),
                     timeout=15, what="the hog's cap group")
            p = nodectl(sock, "explain", hog)
            assert "capped at 3 GB/s (override" in p.stdout, p.stdout + p.stderr
            p = nodectl(sock, "cap", hog, "3 gb/s")
            assert p.returncode == 2 and "unknown unit 'gb/s'" in p.stderr
        assert noded_groups(env["NODED_SIM_RESCTRL"]) == []  # the clean stop removed the cap group too
