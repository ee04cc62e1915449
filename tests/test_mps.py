"""The MPS manager against the stand-in control binary, every failure mode."""

import os
import shutil
import sys
import time

import pynvml
import pytest

from mps.manager import ComputeModes, MpsControl, MpsDefaults, MpsError, MpsTimeout, MpsUnreachable, \
    max_clients_per_device
from noded.sim import fake_nvml as fake

STANDIN = os.path.join(os.path.dirname(sys.executable), "nvidia-cuda-mps-control-standin")


@pytest.fixture
def gpus():
    gpus = fake.make_gpus(2)
    fake.install(fake.FakeNvmlLib(gpus))
    yield gpus
    fake.install(None)


@pytest.fixture
def mps(tmp_path, gpus):
    made = []

    def make(faults="", **kw):
        m = MpsControl(STANDIN, str(tmp_path / "pipe"), str(tmp_path / "log"), gpus=[gpus[1].uuid],
                       compute_modes=ComputeModes([gpus[1].uuid]), command_timeout=2.0, ready_timeout=5.0,
                       stop_timeout=1.0, backoff_s=(0.0, 0.2), extra_env={"NODED_MPS_STANDIN": faults}, **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        m.stop()


def control_log(m):
    with open(os.path.join(m.log_dir, "control.log")) as f:
        return f.read()


def test_start_ready_commands_and_a_clean_stop(mps, gpus):
    m = mps()
    m.start()
    pid = m.pid()
    assert m.alive() and gpus[1].compute_mode == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert gpus[0].compute_mode == pynvml.NVML_COMPUTEMODE_DEFAULT  # MPS serves only GPU 1
    with open(f"/proc/{pid}/environ", "rb") as f:
        assert f"CUDA_VISIBLE_DEVICES={gpus[1].uuid}".encode() in f.read().split(b"\0")
    assert m.command("get_default_active_thread_percentage") == "100.0"
    m.set_defaults(MpsDefaults(active_thread_percentage=50, pinned_mem_limits={0: "4096M"}))
    m.command("start_server -uid 0")
    server = int(m.command("get_server_list"))
    m.set_server_limits(server, active_thread_percentage=25)
    assert m.command(f"get_active_thread_percentage {server}") == "25.0"
    log_text = control_log(m)
    assert f"Control {pid}] Starting control daemon using socket {m.pipe_dir}/control" in log_text
    assert f"Starting new server {server} for user 0" in log_text
    m.stop()
    assert not m.alive() and not os.path.exists(m.pipe_dir)
    assert gpus[1].compute_mode == pynvml.NVML_COMPUTEMODE_DEFAULT
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)


def test_no_daemon_is_unreachable(mps):
    m = mps()
    with pytest.raises(MpsUnreachable, match="Cannot find MPS control daemon process"):
        m.command("get_server_list")


def test_a_daemon_that_will_not_start_leaves_nothing_behind(mps, gpus):
    m = mps("no-start")
    with pytest.raises(MpsError, match="An error occurred while starting the MPS control daemon"):
        m.start()
    assert not os.path.exists(m.pipe_dir) and gpus[1].compute_mode == pynvml.NVML_COMPUTEMODE_DEFAULT


def test_a_hung_command_times_out_and_stop_still_cleans_up(mps):
    m = mps("hang=quit")
    m.start()
    with pytest.raises(MpsTimeout, match="did not answer 'quit' within 0.5s"):
        m.command("quit", timeout=0.5)
    t0 = time.monotonic()
    m.stop()  # quit hangs: forced after stop_timeout
    assert time.monotonic() - t0 < 5 and not m.alive() and not os.path.exists(m.pipe_dir)


def test_a_dead_daemon_is_restarted_with_its_defaults(mps):
    m = mps("die-after=0.5")
    m.start()
    m.set_defaults(MpsDefaults(active_thread_percentage=40))
    first = m.pid()
    deadline = time.monotonic() + 5
    while m.alive() and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for the injected crash
    m.extra_env["NODED_MPS_STANDIN"] = ""  # the next one stays up
    assert m.health() == "restarted" and m.pid() != first and m.restarts == 1
    assert m.command("get_default_active_thread_percentage") == "40.0"  # set again after the restart
    assert m.health() == "ok"


def test_a_server_in_fault_makes_a_restart(mps):
    m = mps("fault-after=0.3")
    m.start()
    m.command("start_server -uid 0")
    deadline = time.monotonic() + 5
    while "fatal exception" not in control_log(m) and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for the injected fault to be logged
    m.extra_env["NODED_MPS_STANDIN"] = ""
    assert m.health() == "restarted"
    assert m.command("get_server_list") == ""  # a fresh daemon, no faulted server


def test_restarts_back_off_while_starting_keeps_failing(mps):
    m = mps("die-after=0.2")
    m.start()
    deadline = time.monotonic() + 5
    while m.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    m.extra_env["NODED_MPS_STANDIN"] = "no-start"
    assert m.health() == "down"  # restart attempted at once, failed
    assert m.health() == "down"  # and not again before the backoff (0.2 s) is over
    m.extra_env["NODED_MPS_STANDIN"] = ""
    time.sleep(0.25)  # let the backoff pass
    assert m.health() == "restarted"


def test_client_limits_by_architecture(gpus):
    from mps.manager import client_limit

    assert max_clients_per_device(7) == 48 and max_clients_per_device(9) == 48 and max_clients_per_device(6) == 16
    assert client_limit([g.uuid for g in gpus]) == 48  # A100s (8.0)
    gpus[1].compute_capability = (6, 0)  # a Pascal GPU in the set binds
    assert client_limit([g.uuid for g in gpus]) == 16
