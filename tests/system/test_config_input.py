"""Config and every other YAML file noded reads are untrusted input (issue #11, item 5).

Each input below was seen to kill, hang or cripple noded before: a non-UTF-8 config
(a traceback from check-config, a dead daemon on SIGHUP), an alias bomb (check-config
hung, the loop frozen with memory growing), duplicate keys and .inf/.nan taken
silently, and values check-config passed that then crashed ``noded run`` (an empty
resctrl prefix, a job pattern outside its cgroup root, an empty state_dir, a host name
as the metrics address). Now each is an error naming the file, the line and the key,
from check-config and from ``noded run`` alike, and load_config raises nothing but
ConfigError whatever the file holds or is.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import typing

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from noded.util import yamlsafe
from noded.colocation.profiles import ProfileError, load_profiles
from noded.config import Config, ConfigError, load_config, parse_config, path_problem
from noded.jobs.cgroups import CgroupSource, check_pattern
from noded.jobs.discovery import LabelFile
from nodesim.scenario import ScenarioError, load_scenario, parse_scenario
from noded.util.yamlsafe import YamlError, parse_yaml, read_yaml_file
from support.in_process import noded_in_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATIENT = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

BILLION_LAUGHS = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    + ["tick_s: *i", ""])


def noded(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """``python -m noded ARGS`` to its end, stdout and stderr captured."""
    return subprocess.run([sys.executable, "-m", "noded", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, **kw)


def check_config(path) -> subprocess.CompletedProcess:
    """``noded check-config PATH`` in this process (support.in_process); this module's
    processes are the refusals by ``run``, the non-UTF-8 file's and those that must not block."""
    return noded_in_process("check-config", str(path))


def assert_refused(p: subprocess.CompletedProcess, *expected: str) -> None:
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "Traceback" not in out, out
    for e in expected:
        assert e in p.stderr, out


def config_error(text: str | bytes, where: str = "c.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as e:
        parse_config(text, where)
    return e.value


# ------------------------------------------------------------ what was seen


def test_a_non_utf8_config_is_an_error_naming_the_line_not_a_traceback(tmp_path):
    f = tmp_path / "noded.yaml"
    f.write_bytes(b"tick_s: 0.5\nstate_dir: /var/lib/nod\xe9d\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(f))
    assert e.value.line == 2 and "not UTF-8" in e.value.reason and "0xe9" in e.value.reason
    # a process of its own: what its stderr makes of the file's odd bytes is what an operator sees
    assert_refused(noded("check-config", str(f)), f"{f}:2: ", "not UTF-8")


def test_an_alias_bomb_is_refused_at_once_by_check_config_and_load_config(tmp_path):
    f = tmp_path / "bomb.yaml"
    f.write_text(BILLION_LAUGHS)
    with pytest.raises(ConfigError) as e:
        load_config(str(f))
    assert e.value.line == 1 and "anchor &a refused" in e.value.reason
    # Before: check-config expanded 9**9 items until memory ran out. A subprocess with
    # a deadline, so a regression fails here instead of hanging the suite.
    assert_refused(noded("check-config", str(f), timeout=60), f"{f}:1: ", "anchors or aliases")


def test_aliases_alone_are_refused_too():
    assert "alias *x refused" in config_error("tick_s: *x\n").reason
    e = config_error("contention:\n  hold_s: 1\n  settle_s: &s 2\n")
    assert e.line == 3 and "anchor &s" in e.reason


def test_duplicate_keys_are_refused_naming_both_lines():
    e = config_error("tick_s: 1\nnvml: false\ntick_s: 0.5\n")
    assert (e.key, e.line) == ("tick_s", 3) and "first at line 1" in e.reason
    e = config_error("contention:\n  hold_s: 1\n  settle_s: 2\n  hold_s: 3\n")
    assert (e.key, e.line) == ("contention.hold_s", 4) and "first at line 2" in e.reason
    # One key to Python, two spellings in YAML: still a duplicate.
    with pytest.raises(YamlError, match="first at line 1"):
        parse_yaml("1: a\ntrue: b\n", "f")


@pytest.mark.parametrize("text, key", [
    ("contention: {hold_s: .inf}", "contention.hold_s"),
    ("peak_gbps_per_domain: .inf", "peak_gbps_per_domain"),
    ("peak_gbps_per_domain: .nan", "peak_gbps_per_domain"),
    ("contention: {missing_release_s: .Inf}", "contention.missing_release_s"),
    ("peak_gbps_per_domain: 1" + "0" * 400, "peak_gbps_per_domain"),  # an int no float holds
])
def test_seen_non_finite_numbers_are_refused(text, key):
    e = config_error(text)
    assert e.key == key and "not a finite number" in e.reason


def _float_keys(cls: type, prefix: str = "") -> list[str]:
    """Every key of the config whose value is a float (or a list of them)."""
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        key = f"{prefix}{f.name}"
        args = typing.get_args(tp)
        if dataclasses.is_dataclass(tp):
            out += _float_keys(tp, key + ".")
        elif tp is float or float in args or (typing.get_origin(tp) is tuple and args[0] is float):
            out.append(key)
    return out


def _nested(key: str, value: str) -> str:
    """``a.b.c`` and a YAML value -> a flow mapping setting that key."""
    text = value
    for part in reversed(key.split(".")):
        text = f"{{{part}: {text}}}"
    return text[1:-1] + "\n"


@pytest.mark.parametrize("key", _float_keys(Config))
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_no_float_key_takes_inf_or_nan(key, value):
    """No key means "forever": a new float key is covered here without a new test."""
    if key == "contention.mba_levels":
        value = f"[0.5, {value}]"
    e = config_error(_nested(key, value))
    assert e.key.startswith(key) and "not a finite number" in e.reason, e


@pytest.mark.parametrize("text, key, reason", [
    ("resctrl: {prefix: ''}", "resctrl.prefix", "at least one"),
    ("jobs:\n  sources:\n    - {kind: cgroup, patterns: [/etc/cron.d]}", "jobs.sources[0].patterns[0]",
     "must be relative"),
    ("jobs:\n  sources:\n    - {kind: cgroup, patterns: ['slurm/../../etc']}", "jobs.sources[0].patterns[0]", "'..'"),
    ("state_dir: ''", "state_dir", "empty"),
    ("metrics: {address: 999.1.1.1}", "metrics.address", "IP address literal"),
])
def test_what_crashed_noded_run_is_refused_by_check_config_and_by_run(tmp_path, text, key, reason):
    f = tmp_path / "noded.yaml"
    f.write_text("tick_s: 0.5\n" + text + "\n")
    e = config_error(f.read_text(), str(f))
    assert e.key == key and reason in e.reason and e.line and e.line >= 2
    assert_refused(check_config(f), f"{f}:{e.line}: {key}: ")
    # noded run reads the same way: the same error, exit 1, nothing started.
    assert_refused(noded("run", "--config", str(f), "--duration", "0.1"), f"{f}:{e.line}: {key}: ")


# ------------------------------------------------------------- every path


PATH_KEYS = ["state_dir", "runtime_dir", "resctrl.root", "resctrl.mounts", "jobs.labels", "admin.socket",
             "colocation.profiles", "colocation.mps.control", "colocation.mps.pipe_dir", "colocation.mps.log_dir"]


@pytest.mark.parametrize("key", PATH_KEYS + ["jobs.sources[0].root"])
@pytest.mark.parametrize("value, reason", [
    ("''", "empty"), ("var/lib/noded", "relative"), ("/var/lib/noded/", "write '/var/lib/noded'"),
    ("/var/lib/../noded", "write '/var/noded'"), ("//var/lib", "not normalised"), ("/var/./lib", "not normalised"),
    ('"/var/lib\\0noded"', "control character"), ('"/var/lib\\nnoded"', "control character"),
])
def test_every_path_key_must_be_absolute_and_normalised(key, value, reason):
    if key.startswith("jobs.sources"):
        text = f"jobs:\n  sources:\n    - {{kind: slurm, root: {value}}}\n"
    else:
        text = _nested(key, value)
    e = config_error(text)
    assert e.key == key and reason in e.reason, e


@pytest.mark.parametrize("key", ["jobs.labels", "admin.socket", "colocation.profiles", "colocation.mps.pipe_dir"])
def test_null_stays_allowed_where_it_was(key):
    parse_config(_nested(key, "null"))


def test_sockets_must_fit_a_unix_socket_path():
    long_dir = "/run/" + "n" * 100
    assert "107 bytes" in config_error(f"runtime_dir: {long_dir}\n").reason
    e = config_error(f"admin: {{socket: {long_dir}.sock}}\n")
    assert e.key == "admin.socket" and "107 bytes" in e.reason
    parse_config("runtime_dir: /run/" + "n" * 80 + "\n")  # noded.sock and report.sock still fit


@given(st.text(max_size=30))
def test_path_check_accepts_exactly_absolute_normalised_paths(path):
    ok = path_problem(path) is None
    assert ok == (path.startswith("/") and "/" + os.path.normpath(path).lstrip("/") == path
                  and all(ord(c) >= 0x20 and c != "\x7f" for c in path))


# ----------------------------------------------- prefix, patterns, address, …


@pytest.mark.parametrize("prefix, reason", [
    ("", "at least one"), ("a/b", "letters, digits"), ("noded ", "letters, digits"), ("x" * 33, "longer than 32"),
    (".noded", "start with '.'"), ("info", "claim resctrl's own info"), ("mon_", "mon_data, mon_groups"),
    ("c", "cpus, cpus_list, ctrl_hw_id"), ("noded-\n", "letters, digits"),
])
def test_the_resctrl_prefix_cannot_claim_what_noded_does_not_own(prefix, reason):
    e = config_error(f"resctrl: {{prefix: {json.dumps(prefix)}}}\n")
    assert e.key == "resctrl.prefix" and reason in e.reason, e


@pytest.mark.parametrize("prefix", ["noded-", "site_noded.", "N0", "x" * 32])
def test_good_prefixes_are_taken(prefix):
    assert parse_config(f"resctrl: {{prefix: {prefix}}}\n").resctrl.prefix == prefix


@given(st.lists(st.sampled_from(["a", "*", "/", ".", "..", "-", "\n", "[", "x", "_", " "]), max_size=10).map("".join))
def test_config_and_cgroup_source_never_disagree_on_a_pattern(pattern):
    text = "jobs:\n  sources:\n    - kind: cgroup\n      patterns: [" + json.dumps(pattern) + "]\n"
    try:
        parse_config(text)
        config_ok = True
    except ConfigError as e:
        assert e.key == "jobs.sources[0].patterns[0]" and e.line == 4
        config_ok = False
    try:
        CgroupSource.create("cgroup", "/sys/fs/cgroup", [pattern], version=1)
        source_ok = True
    except ValueError:
        source_ok = False
    assert config_ok == source_ok == (check_pattern(pattern) is None)


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0", "::1", "::", "10.1.2.3"])
def test_metrics_address_takes_ip_literals(address):
    assert parse_config(f"metrics: {{address: '{address}'}}\n").metrics.address == address


@pytest.mark.parametrize("address, why", [("255.255.255.255", "broadcast"), ("224.0.0.1", "multicast"),
                                          ("ff02::1", "multicast"), ("fe80::1", "link-local")])
def test_metrics_address_refuses_addresses_nothing_can_reach(address, why):
    e = config_error(f"metrics: {{address: '{address}'}}\n")
    assert e.key == "metrics.address" and why in e.reason


@pytest.mark.parametrize("address", ["999.1.1.1", "localhost", "", "1.2.3", "[::1]", "127.0.0.1:9464", "::1%"])
def test_metrics_address_refuses_what_is_not_an_ip_literal(address):
    e = config_error(f"metrics: {{address: '{address}'}}\n")
    assert e.key == "metrics.address" and "IP address literal" in e.reason


@pytest.mark.parametrize("text, key, bound", [
    ("contention: {hold_s: 3601}", "contention.hold_s", "at most 3600"),
    ("contention: {settle_s: 601}", "contention.settle_s", "at most 600"),
    ("contention: {missing_release_s: 1.0e+9}", "contention.missing_release_s", "at most 3600"),
    ("jobs: {rmid_retry_s: 1.0e+12}", "jobs.rmid_retry_s", "at most 3600"),
    ("peak_gbps_per_domain: 1.0e+300", "peak_gbps_per_domain", "at most 10000"),
    ("contention: {cpu_job_cap_gbps: 1.0e+300}", "contention.cpu_job_cap_gbps", "at most 10000"),
    ("admin: {timeout_s: 1.0e+9}", "admin.timeout_s", "at most 300"),
    ("tick_s: 3600", "tick_s", "at most 60"),
    ("contention: {mba_levels: [0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.08, 0.06, "
     "0.04, 0.02]}", "contention.mba_levels", "1 to 16"),
    ("contention: {mba_levels: [0.5, 0.5]}", "contention.mba_levels", "smaller than the one before"),
    ("colocation: {mps: {gpus: ['GPU-a,GPU-b']}}", "colocation.mps.gpus[0]", "GPU UUID"),
    ("colocation: {mps: {gpus: [GPU-a, GPU-a]}}", "colocation.mps.gpus", "listed twice"),
    ('admin: {group: "wheel\\0"}', "admin.group", "group name"),
    ("admin: {group: ''}", "admin.group", "group name"),
    ("tick_s: 1:30", "tick_s", "expected a number, got '1:30'"),
    ("peak_gbps_per_domain: 1.0e2", "peak_gbps_per_domain", "a sign in it (1.5e+9)"),
    ("peak_gbps_per_domain: 1e2", "peak_gbps_per_domain", "a sign in it (1.5e+9)"),
    ("rightsize: {sources: [slurm, slurm]}", "rightsize.sources", "listed twice"),
    ("rightsize: {sources: [pbs]}", "rightsize.sources[0]", "one of slurm, kubernetes, systemd, cgroup, registered"),
    ("rightsize: {lend_to: [slurm, 3]}", "rightsize.lend_to[1]", "expected a string"),
    ("rightsize: {method: oracle}", "rightsize.method", "one of top, coda, synergy"),
    ("rightsize: {noise_margin: 0}", "rightsize.noise_margin", "above 0 and at most 0.5"),
    ("rightsize: {tolerance: 0.9}", "rightsize.tolerance", "above 0 and at most 0.5"),
    ("rightsize: {max_window_s: 1.0e+9}", "rightsize.max_window_s", "at most 3600"),
    ("rightsize: {warmup_s: -1}", "rightsize.warmup_s", "at least 0"),
    ("rightsize: {reserve_per_gpu: 0}", "rightsize.reserve_per_gpu", "or null to size it from history"),
    ("rightsize: {reserve_per_gpu: 2.5}", "rightsize.reserve_per_gpu", "expected an integer"),
    ("rightsize: {tolerance: 0.05}", "rightsize.tolerance", "below rightsize.noise_margin (0.03)"),
    ("rightsize: {warmup_s: 30, max_window_s: 20}", "rightsize.warmup_s", "shorter than rightsize.max_window_s"),
])
def test_numbers_and_names_have_sane_bounds(text, key, bound):
    e = config_error(text + "\n")
    assert e.key == key and bound in e.reason, e


# --------------------------------------------------------- files of any kind


def test_every_rightsize_problem_is_reported_at_once():
    """check-config reports each bad key of the section, not the first one only; a relation
    is not checked against a default standing in for a bad key."""
    e = config_error("rightsize:\n  sources: [pbs]\n  method: x\n  noise_margin: 2\n  tolerance: 0.04\n"
                     "  warmup_s: 700\n")
    assert [(p.key, p.line) for p in e.problems] == [("rightsize.sources[0]", 2), ("rightsize.method", 3),
                                                     ("rightsize.noise_margin", 4), ("rightsize.warmup_s", 6)]
    config = parse_config("rightsize: {sources: [registered, slurm], lend_to: [slurm], method: synergy, "
                          "reserve_per_gpu: 3}\n")
    assert config.rightsize.enabled and config.rightsize.sources == ("registered", "slurm")
    assert not parse_config("").rightsize.enabled


def test_check_config_answers_for_any_kind_of_file_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: an open for reading without O_NONBLOCK would wait forever
    cases = {tmp_path / "missing.yaml": "No such file", tmp_path: "not a regular file (a directory)",
             "/dev/zero": "not a regular file (a character device)", fifo: "not a regular file (a FIFO)"}
    for path, reason in cases.items():
        with pytest.raises(ConfigError) as e:
            load_config(str(path))
        assert e.value.key == "(file)" and reason in e.value.reason
        assert_refused(noded("check-config", str(path), timeout=60), f"{path}: (file): {reason}")


def test_a_file_over_the_size_limit_is_refused_naming_the_limit(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text("# " + "x" * yamlsafe.MAX_BYTES + "\ntick_s: 1\n")
    with pytest.raises(ConfigError, match="1 MiB limit"):
        load_config(str(f))


@pytest.mark.parametrize("path, reason", [
    ("/proc/self/mem", "Input/output error"),  # opens as a regular file; the read fails
    ("/etc/passwd/noded.yaml", "Not a directory"),
])
def test_a_config_that_cannot_be_read_is_an_error_not_a_traceback(path, reason):
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert (e.value.key, e.value.reason) == ("(file)", reason)
    assert_refused(check_config(path), f"{path}: (file): {reason}")


@pytest.mark.parametrize("text, reason", [
    ("tick_s: !!python/object/apply:os.system [true]\n", "tag !!python/object/apply:os.system refused"),
    ("tick_s: !!binary aGk=\n", "tag !!binary refused"),
    ("tick_s: !!float 1\n", "tag !!float refused"),
    ("tick_s: !local 1\n", "tag !local refused"),
    ("--- {tick_s: 1}\n--- {tick_s: 2}\n", "single document"),
    ("? [a, b]\n: 1\n", "mapping key must be a plain scalar"),
    ("tick_s: 1\n\x00\n", "control character U+0000"),
    ("a: " + "[" * 100 + "]" * 100 + "\n", "nested more than 64 deep"),
])
def test_only_plain_yaml_is_read(text, reason):
    assert reason in config_error(text).reason


def test_size_and_node_bounds_answer_fast_whatever_the_megabyte_holds():
    """A megabyte of values, and a million-digit YAML 1.1 base-60 number, which took
    minutes to convert (now a string: noded never reads base 60)."""
    with pytest.raises(YamlError, match=f"more than {yamlsafe.MAX_NODES} values"):
        parse_yaml("[" + "0," * 500_000 + "0]", "f")
    doc = parse_yaml("x: 1" + ":1" * 400_000 + "\n", "f")
    assert isinstance(doc.data["x"], str)
    assert config_error("tick_s: 2024-01-01\n").reason == "expected a number, got '2024-01-01'"


# ---------------------------------------------------- the other YAML files


def _labels(tmp_path, text: str | bytes, mtime_ns: int):
    f = tmp_path / "labels.yaml"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    os.utime(f, ns=(mtime_ns, mtime_ns))  # a change LabelFile sees whatever the clock's grain
    return str(f)


def test_a_broken_labels_file_at_run_time_keeps_the_labels_read_before(tmp_path):
    path = _labels(tmp_path, "slurm:1: {exempt: true, category: NLP}\n", 1_000_000_000)
    labels = LabelFile(path)
    good = labels.refresh()
    assert good["slurm:1"].exempt and labels.error is None
    broken = {
        BILLION_LAUGHS: "anchor &a refused",
        "slurm:1: {exempt: true}\nslurm:1: {exempt: false}\n": "duplicate key: first at line 1",
        "slurm:1: {exempt: 'no'}\n": "exempt must be true or false",
        "slurm:1: {model: [a, b]}\n": "model must be a string",
        "slurm:1: {requested_cores: .inf}\n": "requested_cores must be an integer",
        "1: {exempt: true}\n": "job id 1 must be a string",
        b"slurm:1: {exempt: true}\n\xff": "not UTF-8",
    }
    for i, (text, reason) in enumerate(broken.items()):
        _labels(tmp_path, text, 2_000_000_000 + i * 1_000_000_000)
        assert labels.refresh() == good, text
        assert reason in labels.error, (text, labels.error)
        assert labels.error.startswith(f"{path}:"), labels.error
    _labels(tmp_path, "slurm:2: {priority: 3}\n", 20_000_000_000)
    assert set(labels.refresh()) == {"slurm:2"} and labels.error is None


def test_profiles_and_scenarios_use_the_same_loader(tmp_path):
    prof = tmp_path / "profiles.yaml"
    prof.write_text("ResNet-50:\n  64: &p {C: 1.0e7, M: 1.0e7, window_us: 1.0e6}\n  128: *p\n")
    with pytest.raises(ProfileError, match=f"{prof}:2: anchor &p refused"):
        load_profiles(str(prof))
    prof.write_text("ResNet-50:\n  64: {C: 1.0e7, M: 1.0e7, window_us: 1.0e6}\n  64: {C: 1, M: 1, window_us: 1}\n")
    with pytest.raises(ProfileError, match=f"{prof}:3: ResNet-50.64: duplicate key: first at line 2"):
        load_profiles(str(prof))
    with pytest.raises(ProfileError, match="not a regular file"):
        load_profiles("/dev/zero")
    with pytest.raises(ScenarioError, match="s.yaml:2: not valid YAML for a scenario: duration_s: duplicate key"):
        parse_scenario("duration_s: 5\nduration_s: 6\nevents: []\n", "s.yaml")
    with pytest.raises(ScenarioError, match="anchor"):
        parse_scenario(BILLION_LAUGHS, "s.yaml")
    with pytest.raises(ScenarioError, match="not a regular file"):
        load_scenario(str(tmp_path))
    with pytest.raises(ScenarioError, match="finite number"):
        parse_scenario("duration_s: .inf\nevents: []\n", "s.yaml")


def test_check_config_reads_the_profiles_noded_would_refuse_to_start_on(tmp_path):
    prof = tmp_path / "profiles.yaml"
    prof.write_text("ResNet-50: {64: {C: 1}}\n")
    f = tmp_path / "noded.yaml"
    f.write_text(f"tick_s: 1\ncolocation:\n  enabled: true\n  profiles: {prof}\n")
    assert_refused(check_config(f), f"{f}:4: colocation.profiles: ", "expected exactly the keys C, M, window_us")
    f.write_text(f"colocation: {{enabled: true, profiles: {tmp_path / 'none.yaml'}}}\n")
    assert_refused(check_config(f), f"{f}:1: colocation.profiles: ", "No such file")


# --------------------------------------------- what the daemon's process loads


@pytest.mark.parametrize("argv", [["check-config", "config/noded.yaml"], ["run", "--help"]])
def test_the_daemons_commands_load_no_emulator_or_simulation_code(argv):
    code = ("import runpy, sys\n"
            f"sys.argv = ['noded', *{argv!r}]\n"
            "try:\n    runpy.run_module('noded', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "import noded.commands.run, noded.commands.wiring\n"  # what `run` imports once it starts
            "print('MODULES', ' '.join(sorted(sys.modules)))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    lines = [line for line in p.stdout.splitlines() if line.startswith("MODULES ")]
    assert p.returncode == 0 and lines, p.stdout + p.stderr
    loaded = lines[0].split()[1:]
    assert "noded.config" in loaded
    assert [m for m in loaded if m.startswith(("nodesim.resctrl_emulator", "nodesim"))] == []


# ------------------------------------------------------------- properties


YAMLISH = st.lists(st.sampled_from([
    b"a", b"tick_s", b"contention", b"hold_s", b":", b" ", b"  ", b"\n", b"- ", b"[", b"]", b"{", b"}", b",", b"&x",
    b"*x", b"!!str", b"!!python/name:os.system", b"!x", b"'", b'"', b"#", b"? ", b"|", b">", b"1", b"0.5", b".inf",
    b".nan", b"\xff", b"\xc3", b"\x00", b"\t", b"---", b"...", b"<<", b"1:30", b"0b_", b"0x", b"%YAML 1.1\n", b"\\",
    b"9" * 5000, b"~", b"null", b"true", b"\xef\xbb\xbf", b"\r", b"\x85", b"\xe2\x80\xa8", b"=",
]), max_size=40).map(b"".join)


@PATIENT
@given(st.one_of(st.binary(max_size=400), YAMLISH))
@pytest.mark.parametrize("libyaml", [True, False])
def test_any_bytes_give_a_document_or_a_yaml_error(monkeypatch, libyaml, data):
    monkeypatch.setattr(yamlsafe, "_Loader", yamlsafe.loader_class(libyaml))
    try:
        doc = parse_yaml(data, "f")
    except YamlError as e:
        assert e.where == "f" and e.reason
        return
    assert doc.data is None or isinstance(doc.data, (dict, list, str, int, float, bool))


@PATIENT
@given(st.one_of(st.binary(max_size=400), YAMLISH))
def test_load_config_raises_nothing_but_config_error_for_any_bytes(tmp_path, data):
    f = tmp_path / "noded.yaml"
    f.write_bytes(data)
    try:
        config = load_config(str(f))
    except ConfigError as e:
        assert e.where == str(f)
        return
    assert isinstance(config, Config)



@pytest.mark.parametrize("number", ["0x" + "9" * 5000, "1" * 5000, "0o" + "7" * 5000, "- " + "9" * 400])
def test_a_number_too_large_to_print_is_a_config_error_naming_it(tmp_path, number):
    """Found by the property above in CI: a hex number of 5000 digits made the error message
    itself fail (Python prints no int past 4300 digits): a ValueError, not a ConfigError."""
    for text in (number, f"tick_s: {number}", f"metrics: {{port: {number}}}"):
        f = tmp_path / "noded.yaml"
        f.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_config(str(f))
        assert e.value.where == str(f)


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                    st.floats(allow_nan=False), st.text(max_size=20))
PLAIN = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=20)


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


@PATIENT
@given(st.dictionaries(st.text(max_size=8), PLAIN, max_size=6))
def test_plain_mappings_round_trip(value):
    text = yaml.dump(value, Dumper=_NoAliases)
    assert parse_yaml(text, "f").data == value


@PATIENT
@given(st.dictionaries(st.text(max_size=8), SCALARS, min_size=1, max_size=6), st.data())
def test_a_key_written_twice_is_always_refused_with_both_lines(entries, data):
    chunks = [yaml.dump({k: v}, Dumper=_NoAliases, width=math.inf) for k, v in entries.items()]
    keys = list(entries)
    i = data.draw(st.integers(0, len(keys) - 1), "duplicated")
    j = data.draw(st.integers(i + 1, len(chunks)), "written again before")
    again = yaml.dump({keys[i]: data.draw(SCALARS, "its new value")}, Dumper=_NoAliases, width=math.inf)
    chunks.insert(j, again)
    first = sum(c.count("\n") for c in chunks[:i]) + 1
    second = sum(c.count("\n") for c in chunks[:j]) + 1
    nested = data.draw(st.booleans(), "nested")
    text = "".join(chunks)
    if nested:  # the same, one level down
        text = "top:\n" + "".join("  " + line + "\n" for line in text.splitlines())
        first, second = first + 1, second + 1
    with pytest.raises(YamlError) as e:
        parse_yaml(text, "f")
    assert e.value.line == second and f"first at line {first}" in e.value.reason, text


KNOWN = {"tick_s", "peak_gbps_per_domain", "state_dir", "runtime_dir", "nvml", "resctrl.root", "resctrl.prefix",
         "jobs.labels", "jobs.rmid_retry_s", "contention.hold_s", "contention.threshold", "contention.mba_levels",
         "metrics.address", "metrics.port", "admin.group", "admin.socket", "colocation.mps.gpus",
         "rightsize.sources", "rightsize.noise_margin", "rightsize.tolerance", "rightsize.reserve_per_gpu"}
ANY_VALUE = st.one_of(SCALARS, st.floats(), st.sampled_from(["", "/", "/a/", "a/b", "/a//b", "127.0.0.1", "::1",
                                                              "noded-", "info", "GPU-1"]),
                      st.lists(st.one_of(st.floats(0, 1), st.text(max_size=5)), max_size=3))


@PATIENT
@given(st.dictionaries(st.sampled_from(sorted(KNOWN)), ANY_VALUE, max_size=6))
def test_a_config_that_loads_holds_every_invariant(settings_):
    tree: dict = {}
    for dotted, value in settings_.items():
        *parents, leaf = dotted.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    try:
        config = parse_config(yaml.dump(tree, Dumper=_NoAliases))
    except ConfigError:
        return

    def floats(obj):
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                yield from floats(getattr(obj, f.name))
        elif isinstance(obj, tuple):
            for x in obj:
                yield from floats(x)
        elif isinstance(obj, float):
            yield obj

    assert all(math.isfinite(x) for x in floats(config))
    for p in (config.state_dir, config.runtime_dir, config.resctrl.root, config.jobs.labels, config.admin.socket):
        assert path_problem(p) is None
    assert config.resctrl.prefix and not config.resctrl.prefix.startswith(".")
    assert len(config.admin_socket.encode()) <= 107
    assert config.rightsize.tolerance < config.rightsize.noise_margin


def test_the_yaml_loader_reads_a_real_file_with_lines(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("a:\n  b: 1\n  c:\n    - x\n    - {d: 2}\n")
    doc = read_yaml_file(str(f))
    assert doc.data == {"a": {"b": 1, "c": ["x", {"d": 2}]}}
    assert doc.lines["a.b"] == 2 and doc.lines["a.c[1].d"] == 5 and doc.line_of("a.c[1].e") == 5
