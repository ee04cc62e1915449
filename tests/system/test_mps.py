"""The MPS manager's steps and its supervisor against the stand-in control binary.

The fault cases (hangs, SIGSTOP, stop under a wedged daemon) are in
tests/system/test_mps_faults.py.
"""

import contextlib
import os
import signal
import time
from contextlib import ExitStack

import pynvml
import pytest

from support.waiting import wait_for
from mps.computemodes import ComputeModes
from mps.control import MpsControl, MpsDefaults
from mps.errors import MpsError, MpsTimeout, MpsUnreachable
from mps.limits import max_clients_per_device
from mps.supervisor import MpsSupervisor
from support.mps import STANDIN, control_log, gone, not_left_serving, processes_serving
from noded.stores.originals import OriginalValues


@pytest.fixture
def gpus(sim_gpus):
    return sim_gpus


@pytest.fixture
def mps(tmp_path, gpus):
    made = []
    state = OriginalValues(str(tmp_path / "state"))  # one noded's state, whichever object starts MPS

    def make(faults="", **kw):
        kw.setdefault("compute_modes", ComputeModes([gpus[1].uuid]))
        kw.setdefault("recorder", state)
        m = MpsControl(STANDIN, str(tmp_path / "pipe"), str(tmp_path / "log"), gpus=[gpus[1].uuid],
                       command_timeout=5.0, ready_timeout=10.0, extra_env={"NODED_MPS_STANDIN": faults}, **kw)
        made.append(m)
        return m

    yield make
    # every stop runs, in the order made, whatever one of them raises; then nothing may
    # serve the pipe directory (killed here if it does, and the test fails)
    with ExitStack() as stops:
        stops.callback(lambda: not_left_serving(str(tmp_path / "pipe")))
        for m in reversed(made):
            stops.callback(m.stop)


def test_start_ready_commands_and_a_clean_stop(mps, gpus):
    m = mps(defaults=MpsDefaults(active_thread_percentage=50, pinned_mem_limits={0: "4096M"}))
    m.start()
    pid = m.pid()
    assert m.alive() and gpus.compute_mode(1) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert gpus.compute_mode(0) == pynvml.NVML_COMPUTEMODE_DEFAULT  # MPS serves only GPU 1
    with open(f"/proc/{pid}/environ", "rb") as f:
        assert f"CUDA_VISIBLE_DEVICES={gpus[1].uuid}".encode() in f.read().split(b"\0")
    # The defaults were set by start itself, before it returned.
    assert m.command("get_default_active_thread_percentage") == "50.0"
    assert m.command("get_default_device_pinned_mem_limit 0") == "4096M"
    m.command("start_server -uid 0")
    server = int(m.command("get_server_list"))
    m.set_server_limits(server, active_thread_percentage=25)
    assert m.command(f"get_active_thread_percentage {server}") == "25.0"
    log_text = control_log(m.log_dir)
    assert f"Control {pid}] Starting control daemon using socket {m.pipe_dir}/control" in log_text
    assert f"Starting new server {server} for user 0" in log_text
    m.stop()
    assert not m.alive() and not os.path.exists(m.pipe_dir) and processes_serving(m.pipe_dir) == []
    assert gpus.compute_mode(1) == pynvml.NVML_COMPUTEMODE_DEFAULT
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)
    m.stop()  # twice is fine


def test_no_daemon_is_unreachable(mps):
    m = mps()
    with pytest.raises(MpsUnreachable, match="Cannot find MPS control daemon process"):
        m.command("get_server_list")


def test_a_daemon_that_will_not_start_leaves_nothing_behind(mps, gpus):
    m = mps("no-start")
    with pytest.raises(MpsError, match="An error occurred while starting the MPS control daemon"):
        m.start()
    assert not os.path.exists(m.pipe_dir) and gpus.compute_mode(1) == pynvml.NVML_COMPUTEMODE_DEFAULT


def test_a_hung_command_times_out(mps):
    m = mps("hang=get_client_list")
    m.start()
    with pytest.raises(MpsTimeout, match="did not answer 'get_client_list 1' within 0.5s"):
        m.command("get_client_list 1", timeout=0.5)
    assert m.command("get_server_list") == ""  # the daemon itself still answers others


def test_health_names_what_is_wrong(mps):
    m = mps("fault-after=0.3")
    m.start()
    assert m.check(timeout=5.0) is None
    m.command("start_server -uid 0")
    server = int(m.command("get_server_list"))
    wait_for(lambda: "fatal exception" in control_log(m.log_dir), timeout=10, what="the injected server fault")
    problem = m.check(timeout=5.0)
    assert problem.kind == "fault" and "encountered a fatal exception" in problem.message
    assert m.check(timeout=5.0) is None  # a fault is reported once
    try:
        os.kill(m.pid(), signal.SIGKILL)
        wait_for(lambda: not m.alive(), timeout=10, what="the daemon to die")
        assert m.check(timeout=5.0).kind == "dead"
    finally:
        # the server outlives its SIGKILLed daemon, an orphan MpsControl.stop no longer finds
        # (it looks for the daemon's children): ended here, as this test made it
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


def test_a_daemon_left_by_an_earlier_run_is_replaced(mps, tmp_path):
    first = mps()
    first.start()
    old = first.pid()
    second = mps()  # a new noded, same pipe directory: the first one's daemon is in the way
    second.start()
    assert second.pid() != old and gone(old) and processes_serving(second.pipe_dir) == [second.pid()]


def test_a_pid_file_naming_another_process_is_not_believed(mps, sleeper):
    m = mps()
    m.start()
    m.kill_daemon()  # a crash: the pipe directory, noded's, is left with a pid file
    stranger = sleeper()
    with open(os.path.join(m.pipe_dir, "nvidia-cuda-mps-control.pid"), "w") as f:
        f.write(f"{stranger.pid}\n")
    assert m.pid() is None and not m.alive()
    m.start()  # the stale pid file is cleared; the stranger is not touched
    assert m.alive() and stranger.poll() is None
    m.stop()
    assert stranger.poll() is None


def test_the_supervisor_restarts_a_dead_daemon_with_its_defaults(mps):
    m = mps("die-after=1", defaults=MpsDefaults(active_thread_percentage=40))
    with MpsSupervisor(m, health_interval_s=0.1, health_timeout_s=5.0, backoff_s=(0.0, 0.2)) as sup:
        wait_for(lambda: sup.state == "ok", timeout=15, what="MPS up")
        first = m.pid()
        m.extra_env["NODED_MPS_STANDIN"] = ""  # the next one stays up
        wait_for(lambda: sup.restarts == 1 and sup.state == "ok", timeout=20, what="a restart")
        assert m.pid() != first
        assert m.command("get_default_active_thread_percentage") == "40.0"  # set again by the same start
    assert sup.state == "stopped" and processes_serving(m.pipe_dir) == []


def test_restarts_back_off_while_starting_keeps_failing(mps):
    m = mps("no-start")
    with MpsSupervisor(m, health_interval_s=0.1, backoff_s=(0.3, 30.0)) as sup:
        wait_for(lambda: sup.failures >= 2, timeout=15, what="a second attempt, 0.3 s after the first")
        assert sup.state == "down" and "An error occurred while starting" in sup.last_error
        # The next attempt waits out the second backoff: no busy loop of attempts.
        wait_for(lambda: sup.next_start_at is not None, timeout=5, what="the backoff to be scheduled")
        assert sup.next_start_at - time.monotonic() > 20 and sup.failures == 2
    assert sup.state == "stopped" and processes_serving(m.pipe_dir) == []


def test_client_limits_by_architecture(gpus):
    from mps.limits import client_limit

    assert max_clients_per_device(7) == 48 and max_clients_per_device(9) == 48 and max_clients_per_device(6) == 16
    assert client_limit([g.uuid for g in gpus]) == 48  # A100s (8.0)
    gpus[1].compute_capability = (6, 0)  # a Pascal GPU in the set binds
    gpus.publish()
    assert client_limit([g.uuid for g in gpus]) == 16


def test_the_supervisor_restarts_after_a_server_fault(mps):
    # the fault 1.5 s after the server starts: the test's two commands come before it, even on a loaded machine
    # (at 0.2 s, a loaded run's get_server_list met the daemon shutting down)
    m = mps("fault-after=1.5")
    with MpsSupervisor(m, health_interval_s=0.1, health_timeout_s=5.0, backoff_s=(0.0, 0.2)) as sup:
        wait_for(lambda: sup.state == "ok", timeout=15, what="MPS up")
        m.command("start_server -uid 0")
        server = int(m.command("get_server_list"))
        wait_for(lambda: sup.restarts == 1 and sup.state == "ok", timeout=20, what="a restart after the fault")
        assert sup.last_restart_reason.startswith("server fault: ") and "fatal exception" in sup.last_restart_reason
        assert gone(server) and m.command("get_server_list") == ""  # a fresh daemon, no faulted server
    assert processes_serving(m.pipe_dir) == []


def test_the_product_mps_package_loads_no_simulation_code():
    import subprocess
    import sys

    code = ("import sys, mps.computemodes, mps.control, mps.errors, mps.limits, mps.supervisor\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'noded'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_call_within_hands_back_the_value_or_error_and_gives_up_on_a_hang_cancelling_it():
    import threading
    import time

    from mps.deadline import call_within
    from mps.errors import NvmlTimeout

    assert call_within(5, "answering", lambda cancelled: 42) == 42
    with pytest.raises(ZeroDivisionError):
        call_within(5, "dividing", lambda cancelled: 1 / 0)
    release, seen = threading.Event(), []

    def hung(cancelled):
        release.wait(10)
        seen.append(cancelled.is_set())  # what a late return sees: told nobody waits any more

    started = time.monotonic()
    with pytest.raises(NvmlTimeout, match="NVML did not answer within 0.1 s putting the modes back"):
        call_within(0.1, "putting the modes back", hung)
    assert time.monotonic() - started < 5
    release.set()
    from support.waiting import wait_for

    wait_for(lambda: seen, timeout=5, what="the hung call to return")
    assert seen == [True]
