"""No budget per tenant for what tenants send (issue #22, item 4): an exec storm cost noded a
/proc read per exec anywhere on the host, and one job process sending reports back to back
was served each one. Now each uid has a budget of execs placed at once and of reports, and
each job one of reports: what is over it is dropped and counted, and another user's execs
and reports still get through. Budgets are given a clock that stands still, so what they
let through is exact; no timing is asserted (bench/tenant_floods.py measures the cost).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from types import SimpleNamespace

import pytest

from support.waiting import wait_for
from noded.admin.server import AdminServer, ReportBudget
from noded.loop.control import ControlState
from noded.jobs import CgroupSource, JobDiscovery, ProcessEvents

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs the flood as another user")
NOBODY, OTHER = 65534, 65533
#: the flooder's interpreter: one another user may run (the test's venv may be root's alone)
SYSTEM_PYTHON = "/usr/bin/python3"
STILL = lambda: 0.0  # noqa: E731  a budget's clock that never moves: nothing refills


def as_user(uid, then=None):
    def become():
        if then is not None:
            then()
        os.setgid(uid)
        os.setgroups([])
        os.setuid(uid)
    return become


# ---------------------------------------------------------------- the exec storm
@AS_ROOT
def test_an_exec_storm_is_held_to_its_users_budget_and_discovery_still_places_the_job(v1_cpuset):
    base, mkcg = v1_cpuset
    job_dir = mkcg("job_storm")
    discovery = JobDiscovery([CgroupSource.create("cgroup", base, ["job_*"], version=1)])
    handled = []
    events = ProcessEvents(lambda pid: handled.append(pid), per_uid=5, clock=STILL)
    if not events.start():
        pytest.skip(f"no process events here: {events.unavailable}")
    procs = []
    try:
        storm = subprocess.Popen(["sh", "-c", "for i in $(seq 100); do sleep 60 & done; wait"],
                                 preexec_fn=as_user(NOBODY), start_new_session=True)
        procs.append(storm)
        wait_for(lambda: events.dropped >= 90, timeout=30, what="the storm's execs to be dropped")
        # the storm spent nobody's budget, and no more was looked up than it
        storm_pids = {p for p in handled if _owner(p) == NOBODY}
        assert len(storm_pids) <= 5
        # another user's exec is still placed at once
        other = subprocess.Popen(["sleep", "60"], preexec_fn=as_user(OTHER))
        procs.append(other)
        wait_for(lambda: other.pid in handled, timeout=10, what="another user's exec to be handled")
        # a job process of the storming user, exec'd in its job's cgroup: over the budget
        # at its exec, found by the next discovery (the source of truth)
        dropped_before = events.dropped
        job = subprocess.Popen(["sleep", "60"], preexec_fn=as_user(NOBODY, then=lambda: _join(job_dir)))
        procs.append(job)
        wait_for(lambda: events.dropped > dropped_before, timeout=10, what="the job's exec to be dropped")
        assert job.pid not in handled
        jobs = discovery.discover()
        assert job.pid in jobs["cgroup:job_storm"].pids
    finally:
        events.stop()
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL) if p is procs[0] else p.kill()
            except ProcessLookupError:
                pass
            p.wait()


def _owner(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return None


def _join(cgroup_dir):
    with open(f"{cgroup_dir}/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))


# ---------------------------------------------------------------- the report flood
FLOODER = r"""
import json, socket, sys
path, job, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.stdin.readline()  # once its pid is in the job
request = json.dumps({"version": 1, "command": "report", "args": {"job": job, "iteration_s": 0.1}}).encode() + b"\n"
replies = {}
for _ in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(request)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    s.close()
    r = json.loads(reply)
    key = "ok" if r["ok"] else r["error"].split(":")[0]
    replies[key] = replies.get(key, 0) + 1
print(json.dumps(replies), flush=True)
"""


@pytest.fixture
def report_socket():
    """serve(jobs, budget) -> a report socket over a last tick holding ``jobs`` (job id ->
    a set of pids, which the test may add to), whose reports go to a right-sizing service
    that records the job of each."""
    made = []

    def serve(jobs, budget):
        rundir = tempfile.mkdtemp(prefix="noded-floods-")
        os.chmod(rundir, 0o755)  # as /run/noded: others reach the 0666 socket
        taken = []
        last = SimpleNamespace(sample=SimpleNamespace(jobs={j: SimpleNamespace(pids=p) for j, p in jobs.items()}))
        rightsize = SimpleNamespace(report=lambda job, s: taken.append(job) or {"taken": True})
        daemon = SimpleNamespace(control=ControlState(None), last=last,
                                 parts=SimpleNamespace(colocation=None, rightsize=rightsize))
        server = AdminServer(os.path.join(rundir, "report.sock"), daemon, group=None, reports_only=True,
                             budget=budget).start()
        made.append((server, rundir))
        return SimpleNamespace(path=server.path, server=server, taken=taken)

    yield serve
    for server, rundir in made:
        server.stop()
        shutil.rmtree(rundir, ignore_errors=True)


def report(path, job):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(json.dumps({"version": 1, "command": "report",
                              "args": {"job": job, "iteration_s": 0.5}}).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


@AS_ROOT
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"{SYSTEM_PYTHON} (any user may run it) is missing")
def test_a_job_reporting_back_to_back_is_held_to_its_budget_and_another_users_reports_arrive(report_socket):
    # nobody's flooder is a job of its own ("flood"); this process is in job "other" (root's).
    jobs = {"flood": set(), "other": {os.getpid()}}
    budget = ReportBudget(per_uid=20, per_job=5, clock=STILL)
    sock = report_socket(jobs, budget)
    flooder = subprocess.Popen([SYSTEM_PYTHON, "-c", FLOODER, sock.path, "flood", "60"], preexec_fn=as_user(NOBODY),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        jobs["flood"].add(flooder.pid)
        flooder.stdin.write("go\n")
        flooder.stdin.close()
        wait_for(lambda: budget.dropped["uid"] >= 10, timeout=30, what="the flood to go over its budget")
        # meanwhile another user's job reports, and is taken
        assert [report(sock.path, "other")["ok"] for _ in range(3)] == [True] * 3
        replies = json.loads(flooder.stdout.read())  # its last line, at its end (each request has a deadline)
    finally:
        flooder.kill()
        flooder.wait()
    # 20 read (nobody's budget), of which 5 taken (the job's); 40 answered unread
    assert replies == {"ok": 5, "dropped": 15, "dropped unread": 40}, replies
    assert budget.dropped == {"uid": 40, "job": 15}
    assert sock.taken.count("flood") == 5 and sock.taken.count("other") == 3
    assert sock.server.server.stats.dropped == 40
