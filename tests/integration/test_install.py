"""Installing noded on a host (issue #12): what `make install` puts there and what the unit
refers to, the unit as systemd loads it (`systemd/verify`, `make verify-unit`), the
remote-scrape drop-in, the commands a host gets, and the licence."""

import importlib.metadata
import os
import re
import shutil
import subprocess
import tomllib

import pytest
from support.paths import REPO_ROOT

REPO = REPO_ROOT
UNIT = os.path.join(REPO, "systemd", "noded.service")
DROP_IN = os.path.join(REPO, "systemd", "remote-scrape.conf")
VERIFY = os.path.join(REPO, "systemd", "verify")
PLACEHOLDER_NET = "192.0.2.0/24"  # the drop-in's documentation network (RFC 5737)
needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze is not installed (Debian: systemd)")


def unit_settings(*paths: str) -> dict[tuple[str, str], list[str]]:
    """(section, key) -> values, for a unit and its drop-ins in order, as systemd merges
    list settings: each assignment adds, an empty one clears what came before."""
    merged: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        section = None
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1]
                    continue
                key, sep, value = line.partition("=")
                assert sep and section, f"{path}: not a unit file line: {line!r}"
                values = merged.setdefault((section, key.strip()), [])
                if value.strip():
                    values.append(value.strip())
                else:
                    values.clear()
    return merged


def referenced_paths(settings) -> list[str]:
    """Every file the unit names: its documentation, each command it runs and each
    absolute path among their arguments (the config)."""
    paths = [url.removeprefix("file://") for v in settings.get(("Unit", "Documentation"), [])
             for url in v.split() if url.startswith("file://")]
    for (section, key), values in settings.items():
        if section == "Service" and key.startswith("Exec"):
            for value in values:
                argv = value.lstrip("-@:+!").split()
                paths += [a for a in argv if a.startswith("/")]
    return paths


def exposure(output: str) -> float:
    m = re.search(r"Overall exposure level for noded\.service: (\d+\.\d+)", output)
    assert m, output
    return float(m.group(1))


def test_the_unit_names_its_documentation_commands_and_config():
    paths = referenced_paths(unit_settings(UNIT))
    assert "/usr/local/share/doc/noded/README.md" in paths
    assert {"/usr/local/bin/noded", "/etc/noded/noded.yaml", "/bin/kill"} <= set(paths)


@needs_systemd_analyze
def test_the_unit_verifies_without_a_warning_and_its_exposure_is_at_most_3():
    # as the README gives it: the unit alone, then with the remote-scrape drop-in
    p = subprocess.run(["make", "-s", "verify-unit"], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert p.returncode == 0 and p.stderr == "", p.stdout + p.stderr
    assert "noded.service verifies\n" in p.stdout and "verifies (with" in p.stdout
    levels = [float(x) for x in re.findall(r"Overall exposure level for noded\.service: (\d+\.\d+)", p.stdout)]
    assert len(levels) == 2 and max(levels) <= 3.0, p.stdout
    text = open(UNIT).read()
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "ExecReload=/bin/kill -HUP $MAINPID",
                 "RuntimeDirectory=noded", "StateDirectory=noded", "ConfigurationDirectory=noded"):
        assert line in text


@needs_systemd_analyze
def test_verify_fails_on_a_warning_and_on_an_exposure_above_the_limit(tmp_path):
    bad = tmp_path / "bad.conf"
    bad.write_text("[Service]\nIPAddressAllow=not-a-network\n")
    p = subprocess.run([VERIFY, str(bad)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "bad.conf:2:" in p.stderr and "not-a-network" in p.stderr, p.stderr
    p = subprocess.run([VERIFY], capture_output=True, text=True, timeout=120, env={**os.environ, "EXPOSURE_MAX": "0.5"})
    assert p.returncode == 1 and "exposure above 0.5" in p.stderr, p.stdout + p.stderr
    p = subprocess.run([VERIFY, str(tmp_path / "missing.conf")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no such drop-in" in p.stderr


def test_the_unit_alone_allows_localhost_only_and_the_drop_in_adds_the_scrapers_network():
    alone = unit_settings(UNIT)
    assert alone[("Service", "IPAddressDeny")] == ["any"]
    assert alone[("Service", "IPAddressAllow")] == ["localhost"]
    merged = unit_settings(UNIT, DROP_IN)
    assert merged[("Service", "IPAddressDeny")] == ["any"]
    assert " ".join(merged[("Service", "IPAddressAllow")]).split() == ["localhost", PLACEHOLDER_NET]
    # The drop-in changes nothing else.
    assert {k: v for k, v in merged.items() if k != ("Service", "IPAddressAllow")} == \
        {k: v for k, v in alone.items() if k != ("Service", "IPAddressAllow")}


@needs_systemd_analyze
def test_make_install_remote_scrape_writes_the_network_given(tmp_path):
    stage = tmp_path / "stage"
    p = subprocess.run(["make", "-s", "install-remote-scrape", f"DESTDIR={stage}", "PROM_NET=10.20.0.0/24 fd00::/8"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    drop_in = stage / "etc/systemd/system/noded.service.d/remote-scrape.conf"
    assert oct(drop_in.stat().st_mode & 0o777) == "0o644"
    allow = unit_settings(UNIT, str(drop_in))[("Service", "IPAddressAllow")]
    assert " ".join(allow).split() == ["localhost", "10.20.0.0/24", "fd00::/8"]
    assert os.listdir(drop_in.parent) == ["remote-scrape.conf"]
    p = subprocess.run([VERIFY, str(drop_in)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == "" and exposure(p.stdout) <= 3.0, p.stdout + p.stderr


@pytest.mark.parametrize("prom_net, message", [
    (None, "name the scrapers' network"),
    ("10.20.0.1/24", "PROM_NET must be networks in CIDR"),
    ("10.0.0.0/8;true", "PROM_NET must be networks in CIDR"),
    ("prometheus.example", "PROM_NET must be networks in CIDR"),
])
def test_make_install_remote_scrape_refuses_anything_but_networks(tmp_path, prom_net, message):
    argv = ["make", "-s", "install-remote-scrape", f"DESTDIR={tmp_path}"]
    env = {k: v for k, v in os.environ.items() if k != "PROM_NET"}
    p = subprocess.run(argv + ([f"PROM_NET={prom_net}"] if prom_net is not None else []), capture_output=True,
                       text=True, timeout=60, cwd=REPO, env=env)
    assert p.returncode != 0 and message in p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "etc").exists()


def test_the_console_scripts_are_noded_and_nodectl_only():
    scripts = {e.name: e.value for e in importlib.metadata.distribution("noded").entry_points
               if e.group == "console_scripts"}
    assert scripts == {"noded": "noded.commands.cli:main", "nodectl": "noded.admin.nodectl:main"}
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"] == scripts  # the installed metadata is current


def test_the_mps_stand_in_is_found_through_a_launcher_not_on_path(tmp_path):
    from nodesim.mps_standin import LAUNCHER, write_launcher

    assert shutil.which(LAUNCHER) is None
    path = write_launcher(str(tmp_path))
    assert os.access(path, os.X_OK) and os.path.basename(path) == LAUNCHER
    p = subprocess.run([path], input="get_server_list\n", capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")})
    assert p.returncode == 1  # a client that finds no daemon, as the real binary exits


def test_the_licence_is_apache_2_0_throughout():
    text = open(os.path.join(REPO, "LICENSE")).read()
    assert text.lstrip().startswith("Apache License\n") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    if os.path.exists("/usr/share/common-licenses/Apache-2.0"):
        assert text == open("/usr/share/common-licenses/Apache-2.0").read()
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert importlib.metadata.metadata("noded")["License-Expression"] == "Apache-2.0"


def _in_stage(stage, path: str) -> str:
    """``path`` as the staged host has it, following links as they would resolve there."""
    for _ in range(10):
        staged = os.path.join(stage, path.lstrip("/"))
        if not os.path.islink(staged):
            return staged
        target = os.readlink(staged)
        path = target if target.startswith("/") else os.path.join(os.path.dirname(path), target)
    raise AssertionError(f"{path}: too many links")


@pytest.mark.slow
@pytest.mark.own_install
@pytest.mark.timeout(360)  # near two minutes alone on 2 cores; more beside the suite's other workers
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="make install uses the system Python")
def test_make_install_stages_everything_the_unit_refers_to_and_uninstall_removes_it(tmp_path):
    stage = tmp_path / "stage"
    p = subprocess.run(["make", "install", f"DESTDIR={stage}"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    staged_unit = stage / "etc/systemd/system/noded.service"
    assert staged_unit.read_text() == open(UNIT).read()
    # Every file the unit names is there: in the staged tree, or (/bin/kill) on any host.
    for path in referenced_paths(unit_settings(str(staged_unit))):
        staged = _in_stage(stage, path)
        assert os.path.exists(staged) or (path.startswith("/bin/") and os.path.exists(path)), \
            f"the unit names {path}, which make install did not put there"
        if path.startswith("/usr/local/bin/"):
            assert os.access(staged, os.X_OK), path
    doc = stage / "usr/local/share/doc/noded"
    assert sorted(os.listdir(doc)) == ["LICENSE", "README.md", "docs", "remote-scrape.conf", "slurm"]
    # the README's links into docs/ and the alerts' runbook_url (docs/runbook.md#...) resolve there
    assert sorted(os.listdir(doc / "docs")) == sorted(os.listdir(os.path.join(REPO, "docs")))
    # completion and man pages, made by the installed noded from its own parsers
    share = stage / "usr/local/share"
    for made in ("bash-completion/completions/noded", "bash-completion/completions/nodectl",
                 "zsh/site-functions/_noded", "zsh/site-functions/_nodectl", "man/man1/noded.1", "man/man1/nodectl.1"):
        assert (share / made).is_file(), made
    # Slurm's hooks, pointed at the installed Python, which has their module
    hooks = stage / "usr/local/lib/noded/slurm"
    assert sorted(os.listdir(hooks)) == ["epilog", "prolog", "task-prolog"]
    assert all(os.access(hooks / h, os.X_OK) for h in os.listdir(hooks))
    assert "/opt/noded/bin/python" in (hooks / "prolog").read_text()
    assert (stage / "etc/noded/slurm-hooks.conf").exists() and (doc / "slurm/README.md").exists()
    assert (doc / "LICENSE").read_text() == open(os.path.join(REPO, "LICENSE")).read()
    assert os.readlink(stage / "usr/local/bin/nodectl") == "/opt/noded/bin/nodectl"
    # The host gets noded and nodectl, and no MPS stand-in anywhere on a PATH.
    venv_bin = stage / "opt/noded/bin"
    assert not [n for n in os.listdir(venv_bin) if "standin" in n or "mps" in n]
    assert sorted(os.listdir(stage / "usr/local/bin")) == ["nodectl", "noded"]
    staged_python = str(venv_bin / "python")
    # what the installed noded runs with on a host: no developer's PYTHONPATH pointing at a checkout
    # (else the checkout's noded and bench would be the ones imported)
    host = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    scripts = subprocess.run([staged_python, "-c", "import importlib.metadata as m; print(sorted(e.name for e in "
                              "m.distribution('noded').entry_points if e.group == 'console_scripts'))"],
                             capture_output=True, text=True, timeout=60, check=True, env=host).stdout
    assert scripts == "['nodectl', 'noded']\n"
    check = subprocess.run([str(venv_bin / "noded"), "check-config", str(stage / "etc/noded/noded.yaml")],
                           capture_output=True, text=True, timeout=120, env=host)
    assert check.returncode == 0, check.stderr
    # Calibration is part of what is installed (no checkout, no bench package); on one thread,
    # its shortest run: what it measures is tests/system/test_calibration.py's
    cal = subprocess.run([str(venv_bin / "noded"), "calibrate", "--seconds", "2", "--size", "16", "--threads", "1",
                          "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=host)
    assert cal.returncode == 0 and (tmp_path / "state/calibration.json").exists(), cal.stderr
    assert subprocess.run([staged_python, "-c", "import bench"], capture_output=True, cwd=tmp_path,
                          env=host).returncode == 1
    assert subprocess.run([staged_python, "-c", "import noded.integrations.slurm"], cwd=tmp_path,
                          env=host).returncode == 0
    # An operator's config survives a reinstall: install's step for the config (install-config,
    # which put the commented default there above: "kept" was not said), run again on it;
    # a whole second install (6 core-seconds, its venv and pip again) would check no more.
    assert "make --no-print-directory install-config" in subprocess.run(
        ["make", "-n", "install", f"DESTDIR={stage}"], capture_output=True, text=True, timeout=60, check=True,
        cwd=REPO).stdout
    (stage / "etc/noded/noded.yaml").write_text("tick_s: 0.5\n")
    again = subprocess.run(["make", "install-config", f"DESTDIR={stage}"], capture_output=True, text=True,
                           timeout=60, check=True, cwd=REPO)
    assert (stage / "etc/noded/noded.yaml").read_text() == "tick_s: 0.5\n"
    # and the upgrade says so, with what to do about keys the new version added (issue #26)
    assert "kept /etc/noded/noded.yaml: keys new in this version take their defaults" in again.stdout, again.stdout
    assert "noded check-config /etc/noded/noded.yaml" in again.stdout
    assert "kept" not in p.stdout  # the first install had nothing to keep
    subprocess.run(["make", "-s", "install-remote-scrape", f"DESTDIR={stage}", "PROM_NET=10.20.0.0/24"],
                   capture_output=True, timeout=60, check=True, cwd=REPO)
    p = subprocess.run(["make", "uninstall", f"DESTDIR={stage}"], capture_output=True, text=True, timeout=120,
                       cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert not (stage / "opt/noded").exists() and not doc.exists() and not staged_unit.exists()
    assert not (stage / "usr/local/lib/noded").exists() and (stage / "etc/noded/slurm-hooks.conf").exists()
    assert not (stage / "etc/systemd/system/noded.service.d").exists()
    assert (stage / "etc/noded/noded.yaml").exists()


@pytest.mark.slow
@pytest.mark.own_install
@pytest.mark.timeout(360)
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="make install uses the system Python")
def test_make_install_elsewhere_points_the_unit_where_it_put_the_commands_config_and_docs(tmp_path):
    """`make install BINDIR=/usr/bin CONFDIR=... DOCDIR=...` (a careless operator's, or a
    distribution's, layout): the unit named /usr/local/bin/noded and /etc/noded/noded.yaml
    still, and systemd could not start noded (a command not there)."""
    stage = tmp_path / "stage"
    # install's files (install-files, its second half) around the commands its venv gives:
    # the venv, built and checked by the test above, is not built again here
    app = stage / "opt/noded/bin"
    app.mkdir(parents=True)
    for command in ("noded", "nodectl", "python"):
        (app / command).write_text("#!/bin/sh\n")
        (app / command).chmod(0o755)
    dirs = {"BINDIR": "/usr/bin", "CONFDIR": "/etc/noded-site", "DOCDIR": "/usr/share/doc/noded-site"}
    p = subprocess.run(["make", "install-files", f"DESTDIR={stage}", *(f"{k}={v}" for k, v in dirs.items())],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    settings = unit_settings(str(stage / "etc/systemd/system/noded.service"))
    assert settings[("Service", "ExecStart")] == ["/usr/bin/noded run --config /etc/noded-site/noded.yaml"]
    assert settings[("Service", "ExecStartPre")] == ["/usr/bin/noded check-config /etc/noded-site/noded.yaml"]
    for path in referenced_paths(settings):
        assert os.path.exists(_in_stage(stage, path)) or (path.startswith("/bin/") and os.path.exists(path)), \
            f"the unit names {path}, which make install did not put there"
    assert oct(os.stat(stage / "etc/systemd/system/noded.service").st_mode & 0o777) == "0o644"
