"""MPS off the happy path (issue #11, item 9): a control binary that hangs, a daemon
that is SIGSTOPped, defaults across a restart, and a stop that is bounded whatever
MPS does. Each test ends with nothing left: no process serving the test's pipe
directory, no zombie child, no pipe directory, compute modes back."""

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from types import MappingProxyType

import pynvml
import pytest

from support.waiting import wait_for
from mps.computemodes import ComputeModes
from mps.control import MpsControl
from mps.supervisor import MpsSupervisor
from support.mps import STANDIN, control_log, end_serving, gone, not_left_serving, processes_serving, zombie_children
from noded.colocation.admission import ColocationRule
from noded.colocation.profiles import JobProfile
from noded.colocation.service import Colocation
from noded.samplers.sample import Sample
from noded.samplers.nvml import GpuSample

#: The daemon's loop runs every tick_s (1 s by default, 100 ms at the fastest); the
#: co-location part of a tick must never be a wait on MPS. Generous for a loaded host,
#: and far below any MPS deadline (a hung start waited 10 s per attempt before).
TICK_BUDGET_S = 0.5
#: close() of the service: the brief's bound, whatever MPS does.
CLOSE_BUDGET_S = 1.0


@pytest.fixture
def gpus(sim_gpus):
    return sim_gpus


@pytest.fixture
def service(tmp_path, gpus):
    """Factory: a co-location service supervising the stand-in with quick health checks."""
    made = []
    zombies_before = set(zombie_children())

    def make(faults="", *, ready_timeout=10.0, health_timeout_s=3.0, unhealthy_after=2, **control_kw):
        control = MpsControl(STANDIN, str(tmp_path / "pipe"), str(tmp_path / "log"), gpus=[gpus[1].uuid],
                             compute_modes=ComputeModes([gpus[1].uuid]), ready_timeout=ready_timeout,
                             extra_env={"NODED_MPS_STANDIN": faults}, **control_kw)
        sup = MpsSupervisor(control, health_interval_s=0.1, health_timeout_s=health_timeout_s,
                            unhealthy_after=unhealthy_after, backoff_s=(0.0, 0.2))
        s = Colocation(ColocationRule(), {}, mps=sup, clock=time.monotonic)
        made.append(s)
        return s

    yield make
    with ExitStack() as closes:  # every close runs, whatever one of them raises; nothing left serving
        closes.callback(lambda: not_left_serving(str(tmp_path / "pipe")))
        for s in reversed(made):
            closes.callback(s.close)
    for s in made:
        left_behind(s, gpus)
    assert set(zombie_children()) <= zombies_before, "an MPS child was never reaped"


def left_behind(s, gpus):
    control = s.mps.control
    assert processes_serving(control.pipe_dir) == [], "a process serving the pipe directory survived close()"
    assert not os.path.exists(control.pipe_dir)
    assert gpus.compute_mode(1) == pynvml.NVML_COMPUTEMODE_DEFAULT


def sample():
    gpu = GpuSample(0, "GPU-a", "A100", 0, 0, 0, 1, 0)
    return Sample(0.0, MappingProxyType({}), (gpu,), True, None, (), MappingProxyType({}), (), ())


def timed(fn, *args):
    t0 = time.monotonic()
    out = fn(*args)
    return time.monotonic() - t0, out


def close_timed(s):
    took, _ = timed(s.close)
    assert took < CLOSE_BUDGET_S, f"close() took {took:.2f}s"
    return took


PROFILE = JobProfile("m", 8, 10e6, 5e6, 1e6, "test")


def test_a_start_that_hangs_holds_neither_the_tick_nor_the_stop(service, gpus):
    s = service("hang-start").start()
    # The hung control binary is running: the supervisor is inside its start.
    wait_for(lambda: processes_serving(s.mps.pipe_dir), timeout=10, what="the hung `-d` to run")
    assert s.mps_state == "starting"
    took, _ = timed(s.tick, sample())
    assert took < TICK_BUDGET_S, f"a tick waited {took:.2f}s on MPS"
    d = s.admit("j", sample(), model="m", batch_size=8, profile=PROFILE)
    assert not d.admit and d.reason == "MPS is not running (starting)"
    close_timed(s)  # kills the hung `-d` (and reaps it) instead of waiting out its 10 s


def test_a_restart_that_hangs_is_killed_at_its_deadline_and_retried(service, gpus, caplog):
    caplog.set_level(logging.WARNING, logger="mps.supervisor")
    s = service(ready_timeout=1.0).start()
    wait_for(lambda: s.mps_state == "ok", timeout=15, what="MPS up")
    first = s.mps.control.pid()
    s.mps.control.extra_env["NODED_MPS_STANDIN"] = "hang-start"  # every restart now hangs in `-d`
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: s.mps.failures >= 1 and "did not return within 1s" in (s.mps.last_error or ""), timeout=15,
             what="the hung restart to be given up at its deadline")
    # counted for the metrics (noded_actuator_errors_total{actuator="mps"}): a restart, a start that failed
    assert s.view().mps_restarts >= 1 and s.view().mps_start_failures >= 1
    for _ in range(5):  # the loop keeps its rate meanwhile
        took, _ = timed(s.tick, sample())
        assert took < TICK_BUDGET_S, f"a tick waited {took:.2f}s on MPS"
    s.mps.control.extra_env["NODED_MPS_STANDIN"] = ""
    wait_for(lambda: s.mps_state == "ok", timeout=20, what="MPS back once `-d` works again")
    assert gone(first) and processes_serving(s.mps.pipe_dir) == [s.mps.control.pid()]
    # the log says when it went (restarting, start_failed) and, once, when it answered again
    # (issue #26: a lasting state NodedMpsDown sees is logged on entry and exit)
    said = [r.getMessage() for r in caplog.records if r.name == "mps.supervisor"]
    assert any(m.startswith("mps=restarting") for m in said), said
    assert [m for m in said if m.startswith("mps=up again")] == [f"mps=up again pid={s.mps.control.pid()} (since noded "
                                                                  f"started: {s.mps.restarts} restarts, "
                                                                  f"{s.mps.start_failures} failed starts)"], said
    close_timed(s)


def test_a_stopped_daemon_is_unhealthy_and_replaced_with_its_servers_gone(service):
    s = service(health_timeout_s=0.5).start()
    wait_for(lambda: s.mps_state == "ok", timeout=15, what="MPS up")
    control = s.mps.control
    control.command("start_server -uid 0")
    daemon, server = control.pid(), int(control.command("get_server_list"))
    os.kill(daemon, signal.SIGSTOP)  # its pid lives on; no command is answered
    try:
        wait_for(lambda: s.mps_state == "unresponsive", timeout=10, what="the first unanswered health check")
        d = s.admit("j", sample(), model="m", batch_size=8, profile=PROFILE)
        assert not d.admit and "MPS is not running (unresponsive: control daemon does not answer" in d.reason
        took, _ = timed(s.tick, sample())
        assert took < TICK_BUDGET_S
        wait_for(lambda: s.mps.restarts == 1 and s.mps_state == "ok", timeout=20, what="a replacement daemon")
    finally:
        if not gone(daemon):
            os.kill(daemon, signal.SIGCONT)
    assert gone(daemon) and gone(server), "the stopped daemon or its server survived"
    assert control.pid() != daemon and control.command("get_server_list") == ""
    close_timed(s)


def _command(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


@pytest.mark.parametrize("then", ["restart", "close"])
def test_servers_left_by_a_sigkilled_daemon_are_stopped(service, then):
    # The control daemon SIGKILLed (the OOM killer, an operator): its server lives on,
    # reparented to init, holding its GPU in EXCLUSIVE_PROCESS mode. Before: only the
    # daemon's children were killed, so the supervisor's restart and the service's close
    # left it running (the fixture's teardown found it serving the pipe directory). Now
    # each kill of a daemon also stops the servers of ours a dead daemon left.
    s = service().start()
    wait_for(lambda: s.mps_state == "ok", timeout=15, what="MPS up")
    control = s.mps.control
    control.command("start_server -uid 0")
    daemon, server = control.pid(), int(control.command("get_server_list"))
    wait_for(lambda: _command(server).startswith(b"nvidia-cuda-mps-server-standin\0"), timeout=5,
             what="the server running under its daemon")
    os.kill(daemon, signal.SIGKILL)
    wait_for(lambda: gone(daemon), timeout=5, what="the daemon gone")
    assert not gone(server)  # the daemon's death does not end it
    if then == "restart":
        wait_for(lambda: s.mps.restarts == 1 and s.mps_state == "ok", timeout=20, what="a replacement daemon")
        assert gone(server), "a server left by the killed daemon survived its replacement's start"
        assert control.command("get_server_list") == ""
        close_timed(s)
    else:
        close_timed(s)
        assert gone(server), "a server left by the killed daemon survived close()"


AS_THE_UNIT = """
import json, logging, os, signal, sys, time
from mps.control import MpsControl
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
standin, pipe, logs = sys.argv[1:]


def until(what, cond):
    deadline = time.monotonic() + 10
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for " + what)
        time.sleep(0.01)  # polling a condition, against a deadline


def running(pid, name=b"nvidia-cuda-mps-server-standin"):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().startswith(name + b"\\0")
    except FileNotFoundError:
        return False


c = MpsControl(standin, pipe, logs)
c.start()
c.command("start_server -uid 65534")  # as its client's user, as NVIDIA's servers run
listed = int(c.command("get_server_list"))
until("the first server", lambda: running(listed))
assert c.check(2.0) is None  # a health check: the daemon lists it
c.command("start_server -uid 65534")  # one more after the last check
later = next(int(p) for p in c.command("get_server_list").split() if int(p) != listed)
until("the second server", lambda: running(later))
try:
    open(f"/proc/{listed}/environ", "rb").read()
    readable = True
except PermissionError:
    readable = False
daemon = c.pid()
os.kill(daemon, signal.SIGKILL)


def exited(pid):  # a zombie or reaped: a process still exiting (its cmdline already empty) has its children yet
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


until("the daemon gone", lambda: exited(daemon))
c.stop()
print(json.dumps({"listed": listed, "later": later, "readable": readable,
                  "listed_running": running(listed), "later_running": running(later)}))
"""


def test_a_server_of_another_user_left_by_a_sigkilled_daemon_is_stopped_as_the_unit_runs_noded(tmp_path):
    # As noded's unit runs it (no CAP_SYS_PTRACE, nor CAP_DAC_*: setpriv drops them) a
    # server running as its client's user (65534 here) has an environment noded may not
    # read. The one the daemon listed at its last health check is stopped with it all
    # the same (by its pid and start time); one it never listed cannot be told from
    # another MPS's server in the same cgroup, and is said and left running (killed
    # here by the test). Before: both survived the stop.
    pipe = str(tmp_path / "pipe")
    try:
        got = subprocess.run(["setpriv", "--inh-caps=-all",
                              "--bounding-set=-sys_ptrace,-dac_override,-dac_read_search",
                              sys.executable, "-c", AS_THE_UNIT, STANDIN, pipe, str(tmp_path / "log")],
                             capture_output=True, text=True, timeout=60)
        assert got.returncode == 0, got.stderr
        out = json.loads(got.stdout)
        assert not out["readable"]  # as on a real host: another user's environment
        assert not out["listed_running"], "the server the daemon listed survived the stop"
        assert out["later_running"] and f"process {out['later']} is an MPS server" in got.stderr
    finally:
        end_serving(pipe)


@pytest.mark.parametrize("wedge", ["sigstop", "quit-hangs"])
def test_close_is_bounded_whatever_the_daemon_does(service, wedge):
    s = service("hang=quit" if wedge == "quit-hangs" else "").start()
    wait_for(lambda: s.mps_state == "ok", timeout=15, what="MPS up")
    s.mps.control.command("start_server -uid 0")
    if wedge == "sigstop":
        os.kill(s.mps.control.pid(), signal.SIGSTOP)
    close_timed(s)
    assert s.mps_state == "stopped"
    s.close()  # twice is fine


def test_the_service_closes_at_any_point(service, gpus):
    never_started = service()
    close_timed(never_started)
    close_timed(service().start())  # at once: MPS is still starting
    # A failure in the step after MPS came up (here: raised inside `with`) stops it.
    with pytest.raises(RuntimeError, match="the next start step failed"):
        with service().start() as s:
            wait_for(lambda: s.mps_state == "ok", timeout=15, what="MPS up")
            assert gpus.compute_mode(1) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
            raise RuntimeError("the next start step failed")
    assert s.mps_state == "stopped"


def test_one_slow_answer_is_not_a_restart(service):
    # A loaded host may miss one deadline; only unhealthy_after misses in a row restart
    # MPS (a restart costs every GPU job its MPS server).
    s = service(health_timeout_s=0.5, unhealthy_after=1000).start()
    wait_for(lambda: s.mps_state == "ok", timeout=15, what="MPS up")
    daemon = s.mps.control.pid()
    os.kill(daemon, signal.SIGSTOP)
    wait_for(lambda: s.mps_state == "unresponsive", timeout=10, what="an unanswered check")
    os.kill(daemon, signal.SIGCONT)
    wait_for(lambda: s.mps_state == "ok", timeout=10, what="answers again")
    assert s.mps.restarts == 0 and s.mps.control.pid() == daemon
    close_timed(s)


@pytest.mark.fuse
def test_the_daemon_sets_its_mps_defaults_at_start_and_after_every_restart(tmp_path):
    """Through the daemon's own path (noded.colocation.setup.build_colocation, as noded
    run builds it), asserted from the stand-in's control.log: the product derives the
    defaults from config and sets them on every daemon it starts."""
    from support.eliminator import Harness

    from noded.colocation.setup import build_colocation
    from noded.config import ColocationConfig, MpsConfig

    h = Harness(tmp_path, "  []", gpus=1)
    s = None
    try:
        log_dir = str(tmp_path / "mpslog")
        config = dataclasses.replace(h.config, runtime_dir=str(tmp_path / "run"), colocation=ColocationConfig(
            enabled=True, max_jobs_per_gpu=4, mps=MpsConfig(control=STANDIN, log_dir=log_dir)))
        s = build_colocation(config, h.daemon.clock)  # MPS started, or nothing left if it raised
        h.rebuild(colocation=s)
        wait_for(lambda: s.mps_state == "ok", timeout=30, what="MPS up")
        expected = f"Cmd:set_default_device_pinned_mem_limit 0 {h.sim.gpus[0].memory_total // 4 >> 20}M"
        first = s.mps.control.pid()
        assert f"Control {first}] {expected}" in control_log(log_dir)
        os.kill(first, signal.SIGKILL)  # a crash
        r = h.tick()
        assert r.durations["act"] < TICK_BUDGET_S  # the tick goes on without waiting for MPS
        wait_for(lambda: s.mps.restarts == 1 and s.mps_state == "ok", timeout=30, what="the restart")
        second = s.mps.control.pid()
        assert second != first and f"Control {second}] {expected}" in control_log(log_dir)
        took, _ = timed(s.close)
        assert took < CLOSE_BUDGET_S and processes_serving(s.mps.pipe_dir) == []
        assert h.sim.gpus.compute_mode(0) == pynvml.NVML_COMPUTEMODE_DEFAULT
    finally:
        if s is not None:
            s.close()  # whatever failed above (closed already where it got that far: twice is safe)
        h.stop()


def test_compute_modes_are_recorded_before_they_change_and_restored_after_a_crash(tmp_path, gpus):
    from noded.stores.originals import OriginalValues

    originals = OriginalValues(str(tmp_path / "state"))
    modes = ComputeModes([gpus[1].uuid], originals)
    modes.set_exclusive()
    assert gpus.compute_mode(1) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert OriginalValues(str(tmp_path / "state")).get(f"compute_mode:{gpus[1].uuid}") == \
        pynvml.NVML_COMPUTEMODE_DEFAULT  # durable before the change
    # SIGKILL: restore() never runs. The next start puts the GPU back from the record.
    again = OriginalValues(str(tmp_path / "state"))
    assert ComputeModes.restore_recorded(again) == [f"{gpus[1].uuid} compute mode <- 0"]
    assert gpus.compute_mode(1) == pynvml.NVML_COMPUTEMODE_DEFAULT and again.items() == []


def test_a_compute_mode_that_cannot_be_recorded_is_not_changed(tmp_path, gpus):
    class Unwritable:
        def record(self, key, value):
            raise OSError(30, "Read-only file system")

        def forget(self, key):
            pass

        def items(self):
            return []

    with pytest.raises(Exception, match="could not be recorded: .*Read-only file system"):
        ComputeModes([gpus[1].uuid], Unwritable()).set_exclusive()
    assert gpus.compute_mode(1) == pynvml.NVML_COMPUTEMODE_DEFAULT
