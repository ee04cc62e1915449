"""check-config refuses what `noded run` refuses at start, by the same code (issue #22, item 7).

Seen before: check-config passed six configs that run then refused or crashed on (a
metrics port in use, an address not this host's, a state_dir inside the resctrl mount,
which also left a ``noded-state`` control group behind, a calibration with peak null, a
co-location model nested 50 000 deep, a RecursionError traceback at start, co-location
on a host with no NVML library). Both now call noded.commands.hostcheck.start_check; each problem
is a FILE:LINE: KEY: REASON line naming what is wrong. Beside them: an empty noded.yaml
on SIGHUP was taken for every default (tick, caps and the peak reset), and
``noded_state_writable`` stayed 1 for seconds while writes failed.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import json
import os
import signal
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from support.sockets import NotifySocket
from noded.colocation.outcomes import MODEL_FILE, ModelError, Outcomes, read_model
from noded.config import EmptyConfig, load_config
from noded.loop.metrics import make_registry
from noded.stores.securedir import StateWriteError
from support.in_process import noded_in_process
from support.system import popen_noded

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: a TEST-NET-1 address (RFC 5737): never one of this host's
NOT_HERE = "192.0.2.1"


def noded(*args: str, env=None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "noded", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


def write_config(tmp_path, **keys):
    """A config with ``keys`` (YAML text each), state and runtime directories in ``tmp_path``."""
    lines = {"state_dir": f"{tmp_path}/state", "runtime_dir": f"{tmp_path}/run", "nvml": "false",
             "metrics": "{address: 127.0.0.1, port: 0}", **keys}
    path = tmp_path / "c.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return path


def line_of(path, key: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(f"{key}:"))


def refused_alike(cfg, key: str, reason: str, env=None) -> None:
    """check-config names the file, the line, the key and the reason; run refuses with the same reason."""
    # in this process where the test's own environment is the one to check in (support.in_process)
    check = noded("check-config", str(cfg), env=env) if env is not None else noded_in_process("check-config", str(cfg))
    out = check.stdout + check.stderr
    assert check.returncode == 1 and "Traceback" not in out, out
    assert f"{cfg}:{line_of(cfg, key.split('.')[0])}: {key}: {reason}" in check.stderr, out
    start = noded("run", "--config", str(cfg), env=env)
    out = start.stdout + start.stderr
    assert start.returncode == 1 and "Traceback" not in out, out
    assert f"{key}: {reason}" in start.stderr, out


@contextlib.contextmanager
def running_noded(tmp_path, cfg):
    """``noded run`` on ``cfg`` under a notify socket, ready (``run.p``, ``run.notify``);
    stopped at the end, its stderr then in ``run.err``."""
    notify = NotifySocket(tmp_path / "notify")
    p = popen_noded(["run", "--config", str(cfg)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True, env={**os.environ, "NOTIFY_SOCKET": notify.path})
    run = SimpleNamespace(p=p, notify=notify, err="")
    try:
        notify.ready()
        yield run
    finally:
        p.terminate()
        _, run.err = p.communicate(timeout=30)
        notify.close()


def without_nvml_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}


def with_standin_nvml_env() -> dict[str, str]:
    from nodesim.nvml_lib import library_dir

    return {**without_nvml_env(), "LD_LIBRARY_PATH": library_dir("current")}


# ------------------------------------------------------------ the six


def test_a_metrics_port_in_use_is_refused_by_check_config(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        cfg = write_config(tmp_path, metrics=f"{{address: 127.0.0.1, port: {port}}}")
        refused_alike(cfg, "metrics.port", f"metrics: port {port} on 127.0.0.1 is already in use")
    finally:
        taken.close()


def test_an_address_not_of_this_host_is_refused_by_check_config(tmp_path):
    cfg = write_config(tmp_path, metrics=f"{{address: {NOT_HERE}, port: 0}}")
    refused_alike(cfg, "metrics.address", f"metrics: {NOT_HERE} is not an address of this host")


@pytest.mark.fuse
def test_a_state_dir_inside_the_resctrl_mount_is_refused_and_makes_no_group(tmp_path, emulator):
    emu = emulator("intel")
    where = f"{emu.root}/noded-state"
    cfg = write_config(tmp_path, state_dir=where, resctrl=f"{{root: {emu.root}, mounts: {emu.mounts_file}}}")
    refused_alike(cfg, "state_dir", f"the state directory {where} is inside the resctrl mount {emu.root} "
                                    "(resctrl.root)")
    assert not os.path.exists(where)  # before: run made it, a control group, and left it


def test_a_calibration_with_peak_null_is_refused_by_check_config(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "calibration.json").write_text(json.dumps(
        {"peak_gbps_per_domain": None, "domains": 2, "measured_at": "2026-11-26T09:00:00Z", "command": "x"}))
    cfg = write_config(tmp_path, peak_gbps_per_domain="null")
    refused_alike(cfg, "peak_gbps_per_domain", f"null, so the calibration is read, and it cannot be used: "
                                               f"{state}/calibration.json: peak_gbps_per_domain must be a positive "
                                               "number, got None")


def test_a_model_nested_deep_is_a_named_error_never_a_recursion_error(tmp_path):
    """Before: RecursionError at start (a traceback). Now run starts deciding by the ΣC
    rule (it did so for any other unusable model), and check-config warns, naming the file."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / MODEL_FILE).write_text("[" * 50_000)
    with pytest.raises(ModelError, match=f"{state}/{MODEL_FILE}: not a usable co-location model: nested 50000 deep"):
        Outcomes(str(state)).load_model()
    cfg = write_config(tmp_path, colocation="{enabled: true}")
    check = noded("check-config", str(cfg), env=with_standin_nvml_env())
    out = check.stdout + check.stderr
    assert check.returncode == 0 and "Traceback" not in out, out
    assert (f"{cfg}:{line_of(cfg, 'state_dir')}: state_dir: warning: {state}/{MODEL_FILE}: not a usable "
            "co-location model: nested 50000 deep") in check.stderr, out


def test_a_records_line_nested_deep_is_skipped_not_a_recursion_error(tmp_path):
    from noded.colocation.outcomes import RECORDS_FILE

    record = {"jobs": ["a", "b"], "sum_c": 1.0, "sum_m": 1.0, "n_jobs": 2, "sum_batch": 64.0, "delta": 1.2}
    (tmp_path / RECORDS_FILE).write_text("[" * 50_000 + "\n" + json.dumps(record) + "\n")
    assert [r.delta for r in Outcomes(str(tmp_path)).records()] == [1.2]


@given(st.binary(max_size=2048))
@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_bytes_as_a_model_are_a_model_or_a_model_error(tmp_path, data):
    path = tmp_path / MODEL_FILE
    path.write_bytes(data)
    try:
        model = read_model(str(path))
    except ModelError as e:
        assert str(e).startswith(f"{path}: ")
    else:
        assert model is None or isinstance(model, dict)


def test_any_nesting_of_a_model_is_a_model_error(tmp_path):
    for opener, closer in (("[", "]"), ('{"a":', "}")):
        for depth in (9, 999, 5000, 10_000):  # up to the size limit (64 KiB)
            path = tmp_path / MODEL_FILE
            path.write_text(opener * depth + "1" + closer * depth)
            with pytest.raises(ModelError, match=f"nested {depth} deep"):
                read_model(str(path))


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this host has an NVML library")
def test_colocation_without_an_nvml_library_is_refused_by_check_config(tmp_path):
    cfg = write_config(tmp_path, colocation="{enabled: true}")
    refused_alike(cfg, "colocation.enabled", "co-location needs NVML, and its library libnvidia-ml.so.1 could not "
                                             "be loaded (LD_LIBRARY_PATH unset; the loader's cache",
                  env=without_nvml_env())
    ok = noded("check-config", str(cfg), env=with_standin_nvml_env())
    assert ok.returncode == 0, ok.stdout + ok.stderr


# ------------------------------------------------------------ reload, and the state directory


def test_an_empty_file_is_refused_on_reload_and_the_running_config_kept(tmp_path, emulator):
    emu = emulator("intel")
    cfg = write_config(tmp_path, tick_s="0.1", peak_gbps_per_domain="30",
                       resctrl=f"{{root: {emu.root}, mounts: {emu.mounts_file}}}")
    with running_noded(tmp_path, cfg) as run:
        cfg.write_text("")  # truncated: an editor's save cut short, a full disk
        run.p.send_signal(signal.SIGHUP)
        run.notify.until("RELOADING", "1")
        status = run.notify.until("READY", "1")
        assert status.get("STATUS", "").startswith("config reload refused"), status
        assert run.p.poll() is None
    assert run.p.returncode == 0, run.err
    assert f"config reload refused, keeping the running config: {cfg}: (file): no keys" in run.err, run.err
    assert "config reloaded" not in run.err, run.err
    with pytest.raises(EmptyConfig):
        load_config(str(cfg), empty_ok=False)
    assert load_config(str(cfg)).tick_s == 1.0  # at start, an empty file is the defaults (with a warning)


@pytest.mark.fuse
def test_a_failed_state_write_shows_as_unwritable_at_the_next_tick(tmp_path, tmpfs):
    """Before: noded_state_writable stayed 1 until the next probe (every 10 s)."""
    from support.eliminator import NLP_AND_HOG, Harness

    state = tmpfs(name="state")
    h = Harness(tmp_path, NLP_AND_HOG, profile="no-mba")
    try:
        assert h.tick().state_unwritable is None
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        with pytest.raises(StateWriteError, match="Read-only file system"):
            h.built.state.write_json("written-by-some-part.json", {})  # any writer's, through the state directory
        r = h.tick()
        assert r.state_unwritable and "Read-only file system" in r.state_unwritable
        assert "noded_state_writable 0.0" in generate_latest(make_registry(h.daemon)).decode()
        subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
        h.until(lambda r: r.state_unwritable is None, 10, "writable again (probed each second while it fails)")
    finally:
        h.stop()


def test_check_config_beside_the_noded_running_it_is_not_refused_for_its_own_listeners(tmp_path, emulator):
    """The running noded's port and admin socket are its own: checking its config before a
    reload passes; the same port for another runtime directory is refused."""
    emu = emulator("intel")
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    cfg = write_config(tmp_path, metrics=f"{{address: 127.0.0.1, port: {port}}}",
                       resctrl=f"{{root: {emu.root}, mounts: {emu.mounts_file}}}")
    with running_noded(tmp_path, cfg) as run:
        check = noded_in_process("check-config", str(cfg))
        assert check.returncode == 0 and check.stdout == f"{cfg}: ok\n", check.stdout + check.stderr
        other = tmp_path / "other.yaml"
        other.write_text(cfg.read_text().replace(f"{tmp_path}/run", f"{tmp_path}/run2"))
        check = noded_in_process("check-config", str(other))
        assert check.returncode == 1 and f"metrics.port: metrics: port {port} on 127.0.0.1 is already in use" \
            in check.stderr, check.stdout + check.stderr
    assert run.p.returncode == 0, run.err


def test_a_reload_refuses_what_check_config_refuses_and_changes_nothing(tmp_path, emulator):
    """Before: a reload read the file only as YAML and schema, not as `noded run` and
    check-config check it against the host, so a config they refuse (here a job source
    whose root is no directory) was half applied: 'config reloaded', the new tick taken,
    the source left as it was."""
    emu = emulator("intel")
    cfg = write_config(tmp_path, tick_s="0.1", peak_gbps_per_domain="30",
                       resctrl=f"{{root: {emu.root}, mounts: {emu.mounts_file}}}")
    with running_noded(tmp_path, cfg) as run:
        bad = cfg.read_text().replace("tick_s: 0.1", "tick_s: 0.2") + \
            f"jobs: {{sources: [{{kind: cgroup, root: {tmp_path}/no-such-tree, patterns: ['*']}}]}}\n"
        cfg.write_text(bad)
        check = noded_in_process("check-config", str(cfg))
        assert check.returncode == 1 and f"jobs.sources[0].root: {tmp_path}/no-such-tree is not a directory" \
            in check.stderr, check.stdout + check.stderr
        run.p.send_signal(signal.SIGHUP)
        run.notify.until("RELOADING", "1")
        status = run.notify.until("READY", "1")
        assert status.get("STATUS", "").startswith("config reload refused"), status
        reply = json.loads(subprocess.run([sys.executable, "-m", "noded.admin.nodectl", "--socket",
                                           f"{tmp_path}/run/noded.sock", "--json", "status"],
                                          capture_output=True, text=True, timeout=30, cwd=REPO).stdout)
        assert reply["tick_s"] == 0.1, reply
    assert run.p.returncode == 0, run.err
    assert (f"config reload refused, keeping the running config: {cfg}:{line_of(cfg, 'jobs')}: jobs.sources[0].root: "
            f"{tmp_path}/no-such-tree is not a directory") in run.err, run.err
    assert "config reloaded" not in run.err, run.err


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory on a read-only filesystem (as all but the unit's writable paths are
    under ProtectSystem=strict)."""
    where = tmp_path / "ro"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(where)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield where
    subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize("key", ["state_dir", "runtime_dir"])
def test_a_directory_noded_cannot_make_on_a_read_only_filesystem_is_refused_by_check_config_too(tmp_path, key,
                                                                                                read_only_dir):
    """check-config said 'ok' to a state_dir (or runtime_dir) to be made on a read-only
    filesystem, and noded run then refused it ('Read-only file system')."""
    cfg = write_config(tmp_path, **{key: f"{read_only_dir}/noded"})
    check = noded("check-config", str(cfg))
    assert check.returncode == 1, check.stdout + check.stderr
    assert (f"{cfg}:{line_of(cfg, key)}: {key}: ") in check.stderr
    assert f"cannot create {read_only_dir}/noded: {read_only_dir} is on a read-only filesystem" in check.stderr
    start = noded("run", "--config", str(cfg))
    assert start.returncode == 1 and f"cannot create {read_only_dir}/noded" in start.stderr, start.stderr


def test_a_source_root_that_cannot_be_looked_at_is_said_with_its_error_not_as_no_directory(tmp_path):
    # Before: os.path.isdir answered False for any error, and check-config said "is not a
    # directory" of a root it could not look at (shut to noded: EACCES; here a symlink loop,
    # which the kernel answers ELOOP to for root too): the operator looked for a missing one.
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    cfg = write_config(tmp_path, jobs=f"{{sources: [{{kind: cgroup, root: {tmp_path}/loop/slurm, patterns: ['*']}}]}}")
    check = noded_in_process("check-config", str(cfg))
    assert check.returncode == 1, check.stdout + check.stderr
    assert f"jobs.sources[0].root: {tmp_path}/loop/slurm: Too many levels of symbolic links" in check.stderr, \
        check.stderr
