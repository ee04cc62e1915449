"""Startup and shutdown are transactions (issue #11, items 6 and 7): `noded run` as a
process: a second noded on the same resctrl mount or cgroups is refused whatever its
runtime directory, and a start that fails half-way leaves nothing behind."""

import os
import re
import socket
import subprocess

import pytest

from noded.jobs.discovery import JobDiscovery
from support.in_process import noded_in_process
from support.sockets import NotifySocket
from support.waiting import settled, wait_for
from support.system import popen_noded

pytestmark = pytest.mark.fuse


def config(tmp_path, name, **extra):
    lines = {"tick_s": "0.1", "state_dir": str(tmp_path / name / "state"), "runtime_dir": str(tmp_path / name / "run"),
             "metrics": "{address: 127.0.0.1, port: 0}", "nvml": "false"}
    lines.update(extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return path


def run(cfg, *extra, **kw):
    return popen_noded(["run", "--config", str(cfg), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def finish(p, timeout=30):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"noded did not exit within {timeout}s:\n{out}\n{err}") from None
    return p.returncode, out, err


def mon_groups(emu):
    return sorted(n for n in os.listdir(os.path.join(emu.root, "mon_groups")) if n.startswith("noded-"))


@pytest.fixture
def node(tmp_path, emulator, v1_cpuset, sleeper):
    """A resctrl mount and a cgroup tree with one job in it."""
    emu = emulator("intel")
    base, mkcg = v1_cpuset
    job = mkcg("job_1")
    p = sleeper()
    with open(f"{job}/cgroup.procs", "w") as f:
        f.write(str(p.pid))
    shared = {"resctrl": f"{{root: {emu.root}, mounts: {emu.mounts_file}}}",
              "jobs": f"{{sources: [{{kind: cgroup, root: {base}, patterns: [job_*]}}], process_events: false}}"}
    return emu, shared


def test_a_second_noded_with_another_runtime_dir_is_refused_and_touches_nothing(tmp_path, node):
    emu, shared = node
    first = run(config(tmp_path, "first", **shared))
    try:
        assert first.stdout.readline().startswith("noded: metrics at ")
        wait_for(lambda: mon_groups(emu), timeout=20, what="the first noded's group for the job")
        groups = mon_groups(emu)
        bind = tmp_path / "resctrl-again"
        bind.mkdir()
        subprocess.run(["mount", "--bind", emu.root, str(bind)], check=True)
        base = shared["jobs"].split("root: ")[1].split(",")[0]
        for name, extra in (("second", shared),  # the same resctrl mount and cgroups
                            ("third", {"jobs": shared["jobs"]}),  # the same cgroups only
                            ("fourth", {"resctrl": f"{{root: {bind}}}"}),  # resctrl through a bind mount
                            # another root in the same cgroup hierarchy
                            ("fifth", {"jobs": f"{{sources: [{{kind: cgroup, root: {os.path.dirname(base)}, "
                                               f"patterns: [none]}}], process_events: false}}"})):
            code, out, err = finish(run(config(tmp_path, name, **extra)))
            # the first among the holders named (another noded on the host, a `make demo`, may hold a
            # subtree of the same cgroup hierarchy too)
            holders = re.search(r"another noded \(pid ([0-9, ]+)\) holds", err)
            assert code == 1 and holders and str(first.pid) in holders.group(1).split(", "), err
            assert "Traceback" not in err, err
        assert mon_groups(emu) == groups and first.poll() is None
    finally:
        subprocess.run(["umount", str(tmp_path / "resctrl-again")], capture_output=True)
        first.terminate()
        code, out, err = finish(first)
    assert code == 0, err
    assert mon_groups(emu) == []


def test_a_port_in_use_fails_clearly_and_leaves_nothing(tmp_path, node):
    emu, shared = node
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        cfg = config(tmp_path, "busy", **shared, metrics=f"{{address: 127.0.0.1, port: {taken.getsockname()[1]}}}")
        code, out, err = finish(run(cfg))
        assert code == 1 and "Traceback" not in err, err
        assert f"noded run: metrics.port: metrics: port {taken.getsockname()[1]} on 127.0.0.1 is already in use" in err
        assert mon_groups(emu) == [] and os.listdir(emu.root + "/mon_groups") == []
        assert not os.path.exists(tmp_path / "busy" / "run" / "noded.pid")
    finally:
        taken.close()
    # Nothing is held either: the same config starts now.
    p = run(config(tmp_path, "busy", **shared))
    try:
        assert p.stdout.readline().startswith("noded: metrics at ")
    finally:
        p.terminate()
        assert finish(p)[0] == 0


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_signal_while_starting_never_kills_noded_half_started(tmp_path, node, sig):
    import signal

    emu, shared = node
    notify = NotifySocket(tmp_path / "notify")
    try:
        cfg = config(tmp_path, "n", **shared)
        if sig == "SIGHUP":
            settled(cfg)  # else the reload may be deferred past the stop below (the file just written)
        p = run(cfg, env={**os.environ, "NOTIFY_SOCKET": notify.path})
        notify.until("STATUS", "starting")  # the handlers are in place from here on
        p.send_signal(getattr(signal, sig))
        if sig == "SIGHUP":
            # Remembered, and a reload once the daemon exists; noded goes on.
            notify.until("READY", "1")
            assert p.poll() is None
            p.terminate()
        code, out, err = finish(p)
        assert code == 0, err
        assert "noded: stopped" in out or out == "", out
        if sig == "SIGHUP":
            assert "config reloaded" in err, err
        assert mon_groups(emu) == [] and not os.path.exists(tmp_path / "n" / "run" / "noded.pid")
    finally:
        notify.close()


def test_a_start_refused_with_co_location_on_leaves_no_mps_daemon(tmp_path, request):
    """The metrics port in use is refused by the start's check (hostcheck.start_check),
    before anything is made: MPS never starts here. A failure after MPS started is the
    next test's."""
    from support.mps import STANDIN, end_serving, processes_serving

    pipe_dir, log_dir = tmp_path / "mps", tmp_path / "mps-log"
    request.addfinalizer(lambda: end_serving(str(pipe_dir)))  # whatever happens below, nothing serves it after
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"metrics: {{port: {taken.getsockname()[1]}}}\n"
                       f"colocation: {{enabled: true, mps: {{control: {STANDIN}, pipe_dir: {pipe_dir}, "
                       f"log_dir: {log_dir}}}}}\n")
        p = popen_noded(["run", "--sim", "scenarios/demo.yaml", "--config",
                              str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        code, out, err = finish(p, timeout=60)
    finally:
        taken.close()
    assert code == 1 and "is already in use" in err and "Traceback" not in err, err
    assert processes_serving(str(pipe_dir)) == [] and not pipe_dir.exists()


class LabelsThatFailOnceMpsServes(JobDiscovery):
    """A job discovery whose registered labels' store fails when the wiring reads it to put
    the parts together, which is after co-location has started MPS: it waits for the MPS
    control daemon to serve ``pipe_dir``, then raises, as a part that fails late would."""

    def __init__(self, pipe_dir: str):
        super().__init__([])
        self._pipe_dir = pipe_dir

    @property
    def registered_labels(self):
        from support.mps import processes_serving

        if getattr(self, "_pipe_dir", None) is None:  # JobDiscovery.__init__ reading back what it set
            return self._labels
        wait_for(lambda: processes_serving(self._pipe_dir), timeout=30, what="MPS serving")
        raise OSError(5, "Input/output error (the registered labels' store)")

    @registered_labels.setter
    def registered_labels(self, value):
        self._labels = value


def test_a_build_that_fails_after_co_location_started_mps_stops_it(tmp_path, sim_gpus, request):
    """build_daemon started co-location (MPS, the GPUs in EXCLUSIVE_PROCESS) before the
    overrides' store and the parts, and nothing closed it when one of those raised: the
    Daemon whose shutdown `noded run` registers did not exist yet. Before: the MPS control
    daemon kept serving after the error, its GPUs left exclusive."""
    import pynvml

    from noded.commands.wiring import build_daemon
    from noded.config import ColocationConfig, Config, MpsConfig
    from support.mps import STANDIN, end_serving, processes_serving

    pipe_dir = str(tmp_path / "mps")
    request.addfinalizer(lambda: end_serving(pipe_dir))  # registered before MPS can start
    config = Config(state_dir=str(tmp_path / "state"), runtime_dir=str(tmp_path / "run"),
                    colocation=ColocationConfig(enabled=True, mps=MpsConfig(
                        control=STANDIN, pipe_dir=pipe_dir, log_dir=str(tmp_path / "mps-log"))))
    with pytest.raises(OSError, match="the registered labels' store"):
        build_daemon(config, discovery=LabelsThatFailOnceMpsServes(pipe_dir))
    assert processes_serving(pipe_dir) == [] and not os.path.exists(pipe_dir)
    assert [sim_gpus.compute_mode(i) for i in range(2)] == [pynvml.NVML_COMPUTEMODE_DEFAULT] * 2


@pytest.mark.parametrize("key, value, reason", [
    ("runtime_dir", "/etc/passwd", "not a directory"),
    ("state_dir", "NOBODYS/state", "owned by uid 65534"),
    ("jobs", "{sources: [{kind: cgroup, root: /tmp, patterns: [x]}]}", "is not in a cgroup hierarchy (it is on"),
])
def test_check_config_refuses_what_run_refuses_on_this_host(tmp_path, key, value, reason):
    nobodys = tmp_path / "nobodys"
    nobodys.mkdir()
    os.chown(nobodys, 65534, 65534)
    cfg = config(tmp_path, "c", **{key: value.replace("NOBODYS", str(nobodys))})
    check = noded_in_process("check-config", str(cfg))  # run's refusal below is the process of its own
    assert check.returncode == 1 and reason in check.stderr and "Traceback" not in check.stderr, check.stderr
    code, out, err = finish(run(cfg))
    assert code == 1 and reason in err and "Traceback" not in err, err
