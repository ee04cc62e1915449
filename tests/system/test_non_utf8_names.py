"""A job cgroup named with bytes that are not UTF-8 (issue #22, item 2), under a separate
daemon (`noded run --config` beside `noded sim-node`): a user who may write a job
source's root makes one, with a process in it, before noded starts. noded must start,
tick, export the job (its id escaped), and still throttle a hog elsewhere; it used to
raise UnicodeEncodeError in every tick (ticks frozen, failures not even counted). The
tenant is an unprivileged user (uid 65534) given the source's root to write."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.system import CPUSET, daemon_process, noded_groups, running_node, scrape, stop, value
from test_safety_faults import mba_level, ticks, write_inputs

from support.waiting import wait_for

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(not os.path.isdir(CPUSET), reason="no v1 cpuset hierarchy")]

HOG_AND_BERT = ("  - {at: 0, start: {id: bert, model: BiDAF, gpu: 0}}\n"
                "  - {at: 0, start: {id: hog, cpu: hog}}\n")

#: not UTF-8 (lone continuation and invalid lead bytes), a C1 control, a line end that
#: str.splitlines takes, an escape sequence, quote and backslash: Prometheus', JSON's and
#: a terminal's specials all at once
HOSTILE = b"\xff\xfe\x80-\x85\x1b[31m\"\\\xe2\x80\xa8"


#: run as the tenant (uid 65534): a cgroup named argv[2] (bytes as latin-1) under the source
#: root argv[1] they may write, its CPUs and memory nodes the parent's, this process moved in,
#: then a sleeping process there
TENANT = r"""
import os, sys
path = os.path.join(os.fsencode(sys.argv[1]), sys.argv[2].encode("latin-1"))
os.mkdir(path)
for name in (b"cpuset.cpus", b"cpuset.mems"):
    with open(os.path.join(os.path.dirname(path), name), "rb") as src, open(os.path.join(path, name), "wb") as f:
        f.write(src.read())
with open(os.path.join(path, b"cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
print("ready", flush=True)
os.execvp("sleep", ["sleep", "300"])
"""
NOBODY = 65534


def tenant_cgroup(top: str, name: bytes) -> subprocess.Popen:
    """As the tenant, who may write the job source's root ``top`` (chowned to them while
    they make it), a cgroup named ``name`` holding a sleeping process of theirs."""
    os.chown(top, NOBODY, NOBODY)
    try:
        p = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                              sys.executable, "-c", TENANT, top, name.decode("latin-1")],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline() == "ready\n"
    finally:
        os.chown(top, 0, 0)
    return p


def test_a_non_utf8_job_cgroup_stops_no_tick_and_a_hog_elsewhere_is_still_throttled(tmp_path):
    scenario, base = write_inputs(tmp_path, "intel", HOG_AND_BERT, contention={"cpu_job_cap_gbps": 4.0})
    with running_node(tmp_path, scenario, base) as env:
        hostile = os.path.join(os.fsencode(env["NODED_SIM_CGROUP"]), HOSTILE)
        sleeper = tenant_cgroup(env["NODED_SIM_CGROUP"], HOSTILE)
        try:
            with daemon_process(env) as (daemon, url):
                wait_for(lambda: mba_level(env, "hog") >= 1, timeout=30, interval=0.05, what="the hog throttled")
                text = wait_for(lambda: t if ticks(t := scrape(url)) >= 20 else None, timeout=30, interval=0.05,
                                what="20 ticks")
                assert value(text, r"^noded_tick_failures_total ([0-9.]+)") == 0, text
                # the job is there (its group made: own), its id escaped where the exposition
                # must be UTF-8 (each byte that is not as \udcXX, as the logs show it)
                label = ("cgroup:" + os.fsdecode(HOSTILE)).encode("utf-8", "backslashreplace").decode()
                assert label == "cgroup:\\udcff\\udcfe\\udc80-\\udc85\x1b[31m\"\\\u2028"
                exposed = label.replace("\\", "\\\\").replace('"', '\\"')
                assert f'noded_job_monitoring{{job_id="{exposed}",mode="own"}} 1.0' in text, \
                    [line for line in text.split("\n") if "noded_job_monitoring" in line]
                _, err = stop(daemon)
                assert "UnicodeEncodeError" not in err and "Traceback" not in err, err[-3000:]
            assert noded_groups(env["NODED_SIM_RESCTRL"]) == []
        finally:
            sleeper.kill()
            sleeper.wait()
            wait_for(lambda: open(os.path.join(hostile, b"cgroup.procs")).read() == "", what="the cgroup emptied")
            os.rmdir(hostile)
