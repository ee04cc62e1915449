"""The README and docs/ are accurate line by line: every shell command they give is either
run here, as written, against the demo's daemon, or named with the test that runs it; the
demo facts the README states are the demo's files; its PromQL is run by
tests/integration/test_monitoring.py. (tests/test_docs.py checks the names they use: links, config
keys, commands, metrics.)"""

import ast
import os
import re
import signal
import subprocess
import sys

import pytest
import yaml

from support.waiting import ended, read_until, wait_for
from support.paths import REPO_ROOT

ROOT = REPO_ROOT
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
BIN = os.path.dirname(sys.executable)

#: How each documented command is run: "here" (by test_the_readmes_commands_work_against_the_demo,
#: as written), or the tests that run it, or why no test here can (systemd is not booted on
#: a test machine; what the command relies on is tested offline instead).
HERE = "here"
COVERAGE: list[tuple[str, tuple[str, ...]]] = [
    (r"make demo", ("tests/system/test_cli_habits.py::test_the_demos_documented_facts_are_its_files",
                    "tests/system/test_cli_habits.py::test_ctrl_c_on_the_demo_stops_it_cleanly")),
    (r"make test", ("SELF: .ci/run runs it",)),
    (r"make install", ("tests/integration/test_install.py::test_make_install_stages_everything_the_unit_refers_to_and_uninstall_removes_it",)),
    (r"make verify-unit", ("tests/integration/test_install.py::test_the_unit_verifies_without_a_warning_and_its_exposure_is_at_most_3",)),
    (r"make uninstall", ("tests/integration/test_install.py::test_make_install_stages_everything_the_unit_refers_to_and_uninstall_removes_it",)),
    (r"make bench", ("bench/tests/unit/test_bench_report.py",)),
    (r"make install-remote-scrape PROM_NET=\S+",
     ("tests/integration/test_install.py::test_make_install_remote_scrape_writes_the_network_given",)),
    (r"noded check-config /etc/noded/noded\.yaml", (HERE,)),  # the installed default config
    (r"noded check-config \S+", ("tests/system/test_cli_habits.py::test_check_config_reports_every_error_in_the_file",)),
    (r"noded run --config \S+", ("tests/system/test_lifecycle.py", "tests/system/test_journal.py::test_sighup_is_reloading_then_"
                                                         "ready_whether_applied_or_refused")),
    (r"noded run --config … --dry-run", ("tests/integration/test_readme.py::test_dry_run_from_the_command_line_changes_nothing",
                                         "tests/system/test_metrics_and_cli.py::test_dry_run_decides_and_logs_each_write_once_"
                                         "but_writes_nothing")),
    (r"noded run --sim SCENARIO \[--config …\]", (HERE,)),
    (r"noded calibrate", ("tests/system/test_calibration.py::test_noded_calibrate_measures_and_writes_what_noded_reads",)),
    (r"systemctl (enable --now|restart) noded",
     ("SYSTEMD: the unit is verified by tests/integration/test_install.py::test_the_unit_verifies_without_a_warning_and_its_"
      "exposure_is_at_most_3; its start (READY, STATUS) by tests/system/test_lifecycle.py",)),
    (r"journalctl -u noded .*",
     ("SYSTEMD: the fields it filters on are sent by "
      "tests/system/test_journal.py::test_a_change_goes_to_the_journal_with_its_fields",)),
    (r"promtool check rules \S+", ("tests/integration/test_monitoring.py::test_promtool_checks_the_rules",)),
    (r"promtool test rules \S+", ("tests/integration/test_monitoring.py::test_promtool_unit_tests_of_the_rules_pass",)),
    (r"promtool check config \S+",
     ("tests/integration/test_monitoring.py::test_the_scrape_example_is_a_valid_prometheus_config_with_the_rules",)),
    (r"python3 monitoring/grafana/build\.py", ("tests/integration/test_monitoring.py::test_the_dashboards_are_what_their_generator_writes",)),
    (r"python -m nodesim\.resctrl_emulator .*", ("tests/fuse/test_emulator_fidelity.py",)),
    (r"nodectl throttle \S+ --cores \d+",
     ("tests/system/test_cli_habits.py::test_cores_become_the_level_that_leaves_at_most_that_many",)),  # the demo has MBA
    (r"nodectl size \S+ --(cores \d+ --reason .*|stop|reprobe)",  # the demo has right-sizing off
     ("tests/system/test_rightsize_visible.py::test_nodectl_size_pins_stops_and_reprobes_through_the_admin_socket",)),
    (r"nodectl cap \S+ (\S+ --ttl \S+ --reason \S+|--release)",  # the demo's hog is throttled by levels
     ("tests/system/test_caps.py::test_nodectl_cap_holds_a_cpu_job_out_of_the_levels_and_releases_it",
      "tests/system/test_caps_system.py::test_nodectl_cap_holds_a_job_of_a_running_noded_and_its_stop_leaves_nothing")),
    (r"nodectl admit --job \S+ --model \S+ --batch-size \d+",  # the demo has co-location off
     ("tests/system/test_admission.py::test_admission_on_the_simulated_node_under_mps",)),
    (r"nodectl model fit",
     ("tests/system/test_admission.py::test_observed_speedups_become_records_and_a_fitted_model",
      "tests/system/test_admission_faults.py::test_a_model_fitted_before_a_restart_decides_after_it")),
    (r"nodectl .*", (HERE,)),
    # no cluster here: what `apply -k` applies is the render, validated offline
    (r"kubectl (kustomize|apply -k) integrations/kubernetes/(base|overlays/cgroup-v1)",
     ("tests/integration/test_kubernetes.py::test_the_base_renders_to_what_noded_needs_and_validates_offline",)),
]


def documents() -> list[str]:
    """The README, then each page of docs/."""
    return [README] + sorted(os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))


def process_state(pid: int) -> str:
    """What the kernel says of a process that does not end: its state, its signal masks
    (blocked, ignored, caught) and where it waits."""
    try:
        status = dict(line.split(":\t", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":\t" in line)
        wchan = open(f"/proc/{pid}/wchan").read()
        syscall = open(f"/proc/{pid}/syscall").read().strip()
    except OSError as e:
        return f"(unreadable: {e})"
    return " ".join(f"{k}={status.get(k, '?').strip()}" for k in ("State", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd")) + \
        f" wchan={wchan} syscall={syscall}"


def sh_commands() -> list[str]:
    """Each command of the ```sh blocks of the README and docs/ (comments and continuation
    lines dropped)."""
    blocks = []
    for path in documents():
        with open(path) as f:
            blocks += re.findall(r"^```sh\n(.*?)^```", f.read(), re.M | re.S)
    out = []
    for block in blocks:
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                out.append(command)
    return out


def coverage(command: str) -> tuple[str, ...]:
    for pattern, how in COVERAGE:
        if re.fullmatch(pattern, command):
            return how
    raise AssertionError(f"documented command {command!r}: no test runs it (add it to COVERAGE with the test)")


def test_every_documented_command_is_run_by_a_test():
    commands = sh_commands()
    assert "make demo" in commands and "make test" in commands and len(commands) > 40
    for command in commands:
        for how in coverage(command):
            if how == HERE or how.startswith(("SELF:", "SYSTEMD:")):
                continue
            path, _, name = how.partition("::")
            assert os.path.exists(os.path.join(ROOT, path)), f"{command!r}: {path} does not exist"
            if name:
                with open(os.path.join(ROOT, path)) as f:
                    tree = ast.parse(f.read())
                names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
                assert name in names, f"{command!r}: no test {name} in {path}"


def test_the_readmes_demo_facts_are_the_demos_files():
    with open(README) as f:
        text = f.read()
    with open(os.path.join(ROOT, "Makefile")) as f:
        demo = re.search(r"^demo:.*\n\t\$\(PY\) (.*)$", f.read(), re.M).group(1)
    assert f"`.venv/bin/python {demo}`" in text
    with open(os.path.join(ROOT, "scenarios/demo-config.yaml")) as f:
        config = yaml.safe_load(f)
    with open(os.path.join(ROOT, "scenarios/contention.yaml")) as f:
        scenario = yaml.safe_load(f)
    assert f"`tick_s: {config['tick_s']}`" in text
    assert f"`hold_s: {config['contention']['hold_s']}`" in text and f"`settle_s: {config['contention']['settle_s']}`" in text
    assert f"`metrics.port: {config['metrics']['port']}`" in text
    assert f"stops by itself after {scenario['duration_s']} s" in text
    starts = {e["start"]["id"]: e["at"] for e in scenario["events"] if "start" in e}
    calms = {e["set"]["id"]: e["at"] for e in scenario["events"] if "set" in e}
    assert f"at {starts['hog']} s a CPU bandwidth hog" in text and f"calms down at {calms['hog']} s" in text
    for sim_id in starts:
        assert f"`cgroup:{sim_id}`" in text


def _section_commands(marker: str) -> list[str]:
    return [c for c in sh_commands() if coverage(c) == (HERE,) and marker in c]


@pytest.mark.slow
@pytest.mark.fuse
def test_the_readmes_commands_work_against_the_demo(tmp_path):
    """The demo started as `make demo` starts it; then every documented command marked "here",
    as written, but for the placeholders: the demo's socket for the README's, and the
    demo's jobs for the Slurm ids of the host examples."""
    # and held past its scenario's 40 s: on a loaded machine the commands took longer, and
    # the demo had ended under them ("no admin socket ... is noded running?", 2026-11-27)
    demo_argv = ["-m", "noded", "run", "--sim", "scenarios/contention.yaml", "--config", "scenarios/demo-config.yaml",
                 "--duration", "10m"]
    p = subprocess.Popen([sys.executable, *demo_argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT, start_new_session=True)
    try:
        line = read_until(p.stdout, "noded: admin socket at ", "the admin socket's path", timeout=60)
        socket = line.split("noded: admin socket at ", 1)[1].split()[0]
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "NODED_SOCKET": socket}

        def run(command: str, **kw) -> subprocess.CompletedProcess:
            command = (command.replace("/tmp/noded-sim-node-XXXX/run/noded.sock", socket)
                       .replace("slurm:4242", "cgroup:hog").replace("slurm:77", "cgroup:resnet"))
            return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30,
                                  cwd=ROOT, **kw)

        wait_for(lambda: "cgroup:hog" in run("nodectl jobs").stdout, timeout=30, what="the hog known to noded")
        done = []
        for command in sh_commands():
            if coverage(command) != (HERE,):
                continue
            if command.startswith("noded run --sim"):
                continue  # this very daemon
            if command == "nodectl top":
                top = subprocess.Popen(["bash", "-c", "exec nodectl top"], env=env, stdout=subprocess.PIPE, text=True)
                read_until(top.stdout, "cgroup:hog", "a view of the jobs", timeout=30)
                top.send_signal(signal.SIGINT)  # Ctrl-C is how one leaves top
                try:
                    assert top.wait(timeout=30) == 0
                except subprocess.TimeoutExpired:  # seen once under load (2026-11-27): say where it was
                    raise AssertionError(f"nodectl top still running 30 s after Ctrl-C: {process_state(top.pid)}") from None
                finally:
                    if top.poll() is None:
                        top.kill()
                done.append(command)
                continue
            if command.startswith("noded check-config /etc/noded/noded.yaml"):
                command = command.replace("/etc/noded/noded.yaml", "config/noded.yaml")  # what make install puts there
            r = run(command)
            assert r.returncode == 0, f"documented command {command!r}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
            done.append(command)
        assert {"nodectl status", "nodectl jobs", "nodectl resume", "nodectl top"} <= set(done)
        assert len([c for c in done if "--socket /tmp/noded-sim-node-XXXX" in c]) >= 4  # the demo's own block
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
    finally:
        ended(p)


@pytest.mark.fuse
def test_dry_run_from_the_command_line_changes_nothing():
    p = subprocess.run([sys.executable, "-m", "noded", "run", "--sim", "scenarios/contention.yaml", "--config",
                        "scenarios/demo-config.yaml", "--dry-run", "--duration", "9"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert re.search(r"dry-run job=cgroup:hog level=0->1 throttle=mba: would write mkdir noded-mba-1", p.stderr), p.stderr
    assert not re.search(r"\b(applied|group-removed|restored) job=", p.stderr), p.stderr
