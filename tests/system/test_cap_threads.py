"""A capped job's busy threads read from the kernel, not assumed (issue #27, item 3): its
cap group's tasks, each thread's run state in /proc (a tenant names its threads anything),
no more than the CPUs they may run on; and the holder steers on the curve of that count."""

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.waiting import wait_for
from noded.capping.holder import CapHolder
from noded.capping.threads import BusyThreads, parse_tasks, run_state

GB = 1e9
REAL = sorted(os.sched_getaffinity(0))

# A job of ``spinning`` threads that run without pause (hashing releases the GIL: each is
# runnable or running all the time) and three that sleep, at the lowest priority.
JOB = """
import hashlib, os, sys, threading
os.nice(19)
data = b"x" * (1 << 20)
def spin():
    while True:
        hashlib.sha256(data).digest()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=spin, daemon=True).start()
for _ in range(3):
    threading.Thread(target=threading.Event().wait, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


@pytest.fixture
def job():
    procs = []

    def start(spinning):
        p = subprocess.Popen([sys.executable, "-c", JOB, str(spinning)], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline() == "ready\n"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


@given(st.binary(max_size=300))
def test_any_bytes_are_a_state_or_none(raw):
    state = run_state(raw)
    assert state is None or (len(state) == 1 and state.isalpha())


@given(st.binary(max_size=15).filter(lambda b: b"\0" not in b and b"\n" not in b))
def test_a_thread_named_anything_has_its_own_state_read(comm):
    stat = b"4242 (" + comm + b") S 1 4242 4242 0 -1 4194560 120 0 0 0 3 1 0 0 20 0 1 0 5 1000 10\n"
    assert run_state(stat) == b"S"


def test_a_thread_named_like_a_running_one_is_not_counted_as_running():
    assert run_state(b"4242 (x) R 1 (y) S 1 4242 4242 0\n") == b"S"


@given(st.binary(max_size=200))
def test_any_tasks_file_gives_thread_ids_or_nothing(raw):
    assert all(isinstance(t, int) and t >= 0 for t in parse_tasks(raw))


def tasks_file(tmp_path, pid):
    path = tmp_path / "tasks"
    path.write_text("".join(f"{t}\n" for t in sorted(os.listdir(f"/proc/{pid}/task"), key=int)))
    return str(path)


@pytest.mark.skipif(len(REAL) < 2, reason="two threads running at once need two CPUs")
def test_the_busy_threads_of_a_job_are_those_that_run_not_those_that_sleep(tmp_path, job):
    p = job(2)
    busy = BusyThreads(tasks_file(tmp_path, p.pid))
    wait_for(lambda: busy() == 2, timeout=5, what="two busy threads of six")


def test_no_more_threads_are_busy_than_the_cpus_they_may_run_on(tmp_path, job):
    p = job(2)
    for tid in os.listdir(f"/proc/{p.pid}/task"):
        os.sched_setaffinity(int(tid), REAL[:1])  # fewer cores: one CPU for all of them
    busy = BusyThreads(tasks_file(tmp_path, p.pid))
    for _ in range(10):
        assert busy.now() <= 1
    assert busy() == 1


def test_a_large_job_is_read_in_turn_and_scaled(tmp_path, job):
    p = job(1)
    busy = BusyThreads(tasks_file(tmp_path, p.pid), max_tasks=2, affinity=lambda tid: frozenset(range(64)))
    seen = [busy.now() for _ in range(30)]
    assert max(seen) <= 6 and any(x > 0 for x in seen)  # six threads, two read each time, scaled by three


@pytest.mark.fuse
@pytest.mark.skipif(len(REAL) < 2, reason="two threads running at once need two CPUs")
def test_the_holder_steers_on_the_curve_of_the_threads_the_job_runs(emulator, open_resctrl, job):
    emu = emulator("intel-per-thread", "--peak-gbps", "1000")
    rc = open_resctrl(emu)
    p = job(2)
    emu.control.set_demand(p.pid, 2 * 14 * GB, domain=0, threads=2)
    holder = CapHolder(rc, "j4", [p.pid], 10 * GB).start()  # no count given: read from the kernel
    try:
        wait_for(lambda: holder.threads == 2 and 2 in holder.controller.curves, timeout=10,
                 what="the holder on the curve of two busy threads")
        assert 1 not in holder.controller.curves
    finally:
        holder.stop()
