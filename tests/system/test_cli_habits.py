"""The habits of `noded` and `nodectl` (issue #12): options before or after the command,
--json everywhere, a closed pipe ends a command quietly, --version, every option's help
with its default; overrides refused for jobs and levels noded does not have, and said
in words; `explain` says why a held job is still held; check-config reports every
error; Ctrl-C on the demo stops it cleanly."""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from types import MappingProxyType

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from support.admin import nodectl_run
from support.clocks import WallClock
from support.in_process import noded_in_process
from support.waiting import ended, read_until, stop_reading, wait_for
from noded.admin import answertext, nodectl
from noded.admin.request import DEFAULT_TIMEOUT_S
from noded.admin.commands import KNOWN_SHOWN, AdminCommands
from noded.loop.overrides import OverrideStore
from noded.admin.protocol import RequestError
from noded.util.cliopts import EXIT_BROKEN_PIPE
from noded.config import Config, ConfigError, ContentionConfig, parse_config
from noded.loop.control import ControlState
from noded.loop.daemon import TickResult
from noded.jobs.model import JobMeta
from noded.policy.contention import OVERRIDE, Action, Decision, PolicyState, Throttle, decide, held_because
from noded.samplers.sample import CPU, GPU, JobSample, Sample
from support.paths import REPO_ROOT

GB = 1e9
ROOT = REPO_ROOT

# ------------------------------------------------------------------ the parsers

#: every nodectl command, with the arguments it needs
COMMANDS = {"status": [], "jobs": [], "throttle": ["sim:hog", "--level", "2"], "release": ["sim:hog"],
            "exempt": ["sim:hog"], "pause": [], "resume": [], "explain": ["sim:hog"],
            "admit": ["--job", "slurm:1", "--model", "ResNet-50", "--batch-size", "64"], "model": ["fit"],
            "top": [], "size": ["sim:a", "--cores", "2"], "label": ["slurm:1", "model=BiDAF"],
            "forget": ["slurm:1"], "cap": ["sim:hog", "6GB/s", "--ttl", "15m"]}
GLOBAL = ["--json", "--socket", "/x/noded.sock", "--timeout", "3s"]


def test_every_command_is_covered_here():
    parser = nodectl.build_parser()
    assert set(subcommands(parser)) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_global_options_go_before_or_after_every_command(command):
    parse = nodectl.build_parser().parse_args
    before = parse([*GLOBAL, command, *COMMANDS[command]])
    after = parse([command, *COMMANDS[command], *GLOBAL])
    assert vars(before) == vars(after)
    assert (after.json, after.socket, after.timeout) == (True, "/x/noded.sock", 3.0)
    # Given twice, the one after the command wins; not given, the default stands.
    assert parse(["--socket", "/a", command, *COMMANDS[command], "--socket", "/b"]).socket == "/b"
    plain = parse([command, *COMMANDS[command]])
    assert (plain.json, plain.timeout) == (False, DEFAULT_TIMEOUT_S)


def subcommands(parser):
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


class Parsed(Exception):
    pass


def noded_parser(monkeypatch):
    """noded's parser as noded.commands.cli builds it: caught at parse_args."""
    from noded.commands import cli

    def catch(self, args=None, namespace=None):
        raise Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    with pytest.raises(Parsed) as e:
        cli.main(["run"])
    return e.value.args[0]


def test_every_option_of_every_command_has_help_that_says_its_default(monkeypatch):
    parsers = {"nodectl": nodectl.build_parser(), "noded": noded_parser(monkeypatch)}
    for name, top in parsers.items():
        for command, parser in [("", top), *subcommands(top).items()]:
            formatter = parser._get_formatter()
            for action in parser._actions:
                if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                    continue
                where = f"{name} {command} {action.option_strings or action.dest}"
                assert action.help, f"{where}: no help"
                shown = action.default not in (None, False, "") or action.default == argparse.SUPPRESS
                if action.option_strings and shown and not action.required:
                    assert "default" in formatter._get_help_string(action), f"{where}: the default is not said"
            assert "--version" in parser.format_help()


@pytest.mark.parametrize("argv", [["noded", "--version"], ["noded", "run", "--version"],
                                  ["nodectl", "--version"], ["nodectl", "jobs", "--version"]])
def test_version_on_both_commands(argv):
    module = "noded" if argv[0] == "noded" else "noded.admin.nodectl"
    p = subprocess.run([sys.executable, "-m", module, *argv[1:]], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.startswith(f"{argv[0]} {version('noded')} (revision ") and p.stderr == "", p


# ------------------------------------------------------- a daemon's last tick, by hand


def job(jid, kind=CPU, bw=1 * GB, util=None):
    return JobSample(jid, "registered", frozenset({1}), JobMeta(), kind, ("GPU-0",) if kind == GPU else (), util, bw,
                     "own")


def tick_result(jobs, levels=None, *, kind="mba", original_cpus=None, decision=None, jobs_known=True,
                config=None):
    levels = levels or {}
    sample = Sample(10.0, MappingProxyType({j.id: j for j in jobs}), (), True, None, (0,),
                    MappingProxyType({0: 5 * GB}), (), (), jobs_known)
    decision = decision or Decision(MappingProxyType(levels), (), False, 0.5, (), "")
    return TickResult(3, 10.0, sample, decision, (), MappingProxyType({}), kind, MappingProxyType(levels),
                      config=config or Config(peak_gbps_per_domain=10),
                      original_cpus=MappingProxyType(original_cpus or {}))


def commands(tmp_path, result):
    clock = WallClock()
    control = ControlState(OverrideStore(str(tmp_path / "state"), clock))
    return AdminCommands(control, lambda: result, wall_clock=clock)


@pytest.fixture
def served(admin_socket):
    """An admin socket served as noded serves it, over a last tick set by the test."""
    return admin_socket(tick_result([job("sim:hog", bw=7 * GB), job("sim:bert", GPU, 0.5 * GB, 40.0)],
                                    {"sim:hog": 2}))


ctl = nodectl_run


# ------------------------------------------------------------------ output


def test_every_command_honours_json_written_after_it(served, capsys):
    for argv in (["status"], ["jobs"], ["explain", "sim:hog"], ["pause"], ["resume"], ["release", "sim:hog"],
                 ["throttle", "sim:hog", "--level", "1"], ["exempt", "sim:hog"]):
        code, out, err = ctl(served.path, *argv, "--json", capsys=capsys)
        assert code == 0 and err == "", (argv, err)
        json.loads(out)


def test_top_json_prints_one_document_a_refresh_and_no_control_codes(served, capsys):
    code, out, err = ctl(served.path, "top", "--json", "--iterations", "3", "--interval", "0.01", capsys=capsys)
    assert code == 0 and err == "" and "\x1b" not in out
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) == 3 and all(d["jobs"][1]["job"] == "sim:hog" for d in docs)


def test_top_ends_on_ctrl_c_even_where_sigint_came_in_ignored(served):
    # A launcher that ignores SIGINT for its children (a script's system(); seen once in the
    # suite's own worker) hands it on ignored, and Python leaves it so: top then outlived
    # every Ctrl-C. A live view's way out must work wherever it was started.
    top = subprocess.Popen(["env", "--ignore-signal=INT", sys.executable, "-m", "noded.admin.nodectl", "--socket",
                            served.path, "top", "--interval", "0.05"], stdout=subprocess.PIPE, text=True)
    try:
        read_until(top.stdout, "sim:hog", "a view of the jobs", timeout=30)
        top.send_signal(signal.SIGINT)
        assert top.wait(timeout=30) == 0
    finally:
        ended(top)
        stop_reading(top.stdout)


def closed_pipe_run(argv, timeout=60):
    """argv's process with stdout a pipe nobody reads: its reader is gone before it starts."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(argv, stdout=w, stderr=subprocess.PIPE, text=True, timeout=timeout, cwd=ROOT)
    finally:
        os.close(w)


@pytest.mark.parametrize("argv", [["jobs"], ["--json", "jobs"], ["status", "--json"], ["explain", "sim:hog"],
                                  ["top", "--iterations", "2", "--interval", "0.01"]])
def test_a_reader_that_goes_away_ends_nodectl_quietly(served, argv):
    p = closed_pipe_run([sys.executable, "-m", "noded.admin.nodectl", "--socket", served.path, *argv])
    assert p.returncode == EXIT_BROKEN_PIPE and p.stderr == "", p.stderr


def test_a_reader_that_goes_away_ends_noded_quietly(tmp_path):
    good = tmp_path / "good.yaml"  # with a job source: a config without one is warned about
    good.write_text('tick_s: 0.5\njobs: {sources: [{kind: cgroup, root: /sys/fs/cgroup/cpuset, patterns: ["j/*"]}]}\n')
    p = closed_pipe_run([sys.executable, "-m", "noded", "check-config", str(good)])
    assert p.returncode == EXIT_BROKEN_PIPE and p.stderr == "", p.stderr
    # --help into a closed pipe: argparse drops what it cannot write; quiet, status 0.
    for module in ("noded", "noded.admin.nodectl"):
        p = closed_pipe_run([sys.executable, "-m", module, "--help"])
        assert p.returncode == 0 and p.stderr == "", p.stderr


# ------------------------------------------------------------------ overrides


def test_an_override_for_a_job_noded_does_not_know_is_refused_naming_the_known_ones(tmp_path):
    jobs = [job(f"slurm:{i}") for i in range(KNOWN_SHOWN + 2)]
    cmds = commands(tmp_path, tick_result(jobs))
    for command, args in (("throttle", {"job": "slurm:99", "level": 1}), ("exempt", {"job": "slurm:99"})):
        with pytest.raises(RequestError) as e:
            cmds.dispatch(command, args, 0)
        shown = sorted(j.id for j in jobs)[:KNOWN_SHOWN]
        assert str(e.value) == (f"no job 'slurm:99' at noded's last tick, and no override on it: the jobs are "
                                f"{', '.join(shown)} and 2 more (nodectl jobs lists them)")
    assert cmds.store.active() == {}  # nothing half-applied
    with pytest.raises(RequestError, match="has not sampled its jobs yet"):
        commands(tmp_path, None).dispatch("throttle", {"job": "slurm:1", "level": 1}, 0)
    with pytest.raises(RequestError, match="does not know its jobs now"):
        commands(tmp_path, tick_result([], jobs_known=False)).dispatch("exempt", {"job": "slurm:1"}, 0)


def test_a_job_with_an_override_stays_known_when_it_leaves_the_sample(tmp_path):
    cmds = commands(tmp_path, tick_result([job("slurm:1")]))
    cmds.dispatch("throttle", {"job": "slurm:1", "level": 2}, 0)
    cmds.last = lambda: tick_result([job("slurm:2")])  # slurm:1 is gone for now
    r = cmds.dispatch("throttle", {"job": "slurm:1", "level": 3, "ttl_s": 60}, 0)
    assert (r["level"], r["in_last_sample"], r["expires_in_s"]) == (3, False, 60)


@pytest.mark.parametrize("result, args, error", [
    # MBA: the levels of the running config's contention.mba_levels (5 by default)
    (tick_result([job("a")]), {"level": 6}, "level 6 is beyond this host's throttle: levels are 1 to 5 "
                                            "(contention.mba_levels: 80%, 60%, 40%, 20%, 10% of a job's bandwidth)"),
    (tick_result([job("a")], config=Config(contention=ContentionConfig(mba_levels=(0.5, 0.25)))), {"level": 3},
     "levels are 1 to 2"),
    # cores: halvings of the job's own CPUs, and never as many cores as it has
    (tick_result([job("a")], kind="cores", original_cpus={"a": 8}), {"level": 4},
     "levels are 1 to 3 (a has 8 CPUs, halved at each level)"),
    (tick_result([job("a")], kind="cores", original_cpus={"a": 8}), {"cores": 8},
     "job 'a' has 8 CPUs: cores must be from 1 to 7 to throttle it"),
    (tick_result([job("a")], kind="cores", original_cpus={"a": 1}), {"cores": 1}, "job 'a' has 1 CPU"),
    (tick_result([job("a")], kind="cores", original_cpus={"a": 1}), {"level": 1}, "job 'a' has 1 CPU"),
    (tick_result([job("a")], kind="mba"), {"cores": 2}, "this host throttles with mba: use --level"),
    (tick_result([job("a")], kind=None), {"level": 1}, "this host has no throttle"),
])
def test_a_level_the_throttle_does_not_have_is_refused(tmp_path, result, args, error):
    cmds = commands(tmp_path, result)
    with pytest.raises(RequestError) as e:
        cmds.dispatch("throttle", {"job": "a", **args}, 0)
    assert error in str(e.value)
    assert cmds.store.active() == {}


@pytest.mark.parametrize("cpus, cores, level", [(8, 7, 1), (8, 4, 1), (8, 3, 2), (8, 1, 3), (6, 1, 2), (2, 1, 1)])
def test_cores_become_the_level_that_leaves_at_most_that_many(tmp_path, cpus, cores, level):
    cmds = commands(tmp_path, tick_result([job("a")], kind="cores", original_cpus={"a": cpus}))
    assert cmds.dispatch("throttle", {"job": "a", "cores": cores}, 0)["level"] == level


def test_throttle_and_exempt_say_what_they_did_in_words(served, capsys):
    code, _, err = ctl(served.path, "throttle", "sim:nope", "--level", "1", capsys=capsys)
    assert code == 1 and err == ("nodectl: no job 'sim:nope' at noded's last tick, and no override on it: the jobs "
                                 "are sim:bert, sim:hog (nodectl jobs lists them)\n")
    code, _, err = ctl(served.path, "throttle", "sim:hog", "--level", "64", capsys=capsys)
    assert code == 1 and "levels are 1 to 5" in err
    code, out, _ = ctl(served.path, "throttle", "sim:hog", "--level", "3", "--reason", "runaway ETL", capsys=capsys)
    assert code == 0 and out == ("sim:hog is held at throttle level 3 of 5 until released (reason: runaway ETL); it "
                                 "was at level 2 and goes to level 3 next tick\n")
    code, out, _ = ctl(served.path, "exempt", "sim:hog", "--ttl", "30m", capsys=capsys)
    assert code == 0 and re.fullmatch(r"sim:hog is exempt from throttling until (\S+ )?(\d\d:){2}\d\d \(no reason "
                                      r"given\); it was at level 2 and will be released next tick\n", out), out
    code, out, _ = ctl(served.path, "exempt", "sim:bert", capsys=capsys)
    assert out == "sim:bert is exempt from throttling until released (no reason given); it is not throttled now\n"


# ------------------------------------------------------------------ explain

C = ContentionConfig(threshold=0.75, release_threshold=0.6, hold_s=10, settle_s=2, cpu_job_cap_gbps=4)
HELD = Throttle(2, "contention")


def held(**kw):
    values = dict(share=0.5, triggered=False, slowed=(), calm_since=0.0, last_step=0.0, missing_since=None, now=100.0,
                  config=C, bandwidth_bps=1 * GB, predicted_share=0.55, moved=[])
    values.update(kw)
    return held_because("hog", values.pop("throttle", HELD), **values)


@pytest.mark.parametrize("kw, expected", [
    ({"share": 0.9, "triggered": True, "slowed": ("sim:bert",)},
     "contention goes on: node bandwidth 90% of peak >= threshold 75% and GPU job(s) sim:bert below their baseline"),
    ({"share": 0.7}, "node bandwidth 70% of peak is not below the release threshold 60%"),
    ({"calm_since": 96.5}, "node below the release threshold 60% for 3.5s of the 10s it must stay there"),
    ({"last_step": 98.0}, "the last throttle step was 2s ago; a release waits contention.hold_s (10s) after any step"),
    ({"bandwidth_bps": 3 * GB}, "its own 3.0 GB/s is above half the per-job cap (contention.cpu_job_cap_gbps 4 GB/s)"),
    ({"predicted_share": 0.64}, "released one step, it would take the node to about 64% of peak, not below the "
                                "release threshold 60%"),
    ({"moved": [Action("other", 1, 0, "calm", "calm")]}, "other was released one step this tick"),
    ({"moved": [Action("hog", 3, 2, "calm", "calm")]}, "released one step this tick (3->2)"),
    ({"share": None, "missing_since": 90.0}, "node bandwidth unknown for 10s: nothing is released blind until "
                                              "contention.missing_release_s (30s)"),
    ({"throttle": Throttle(2, OVERRIDE)}, "an operator override holds it at this level"),
    ({}, "it meets every release condition"),
])
def test_held_because_names_the_unmet_release_condition_with_its_values(kw, expected):
    reasons = held(**kw)
    assert any(expected in r for r in reasons), reasons


def test_explain_of_a_held_job_says_why_it_is_still_held(tmp_path, capsys):
    # The policy's own decisions: the hog throttled in contention, then the node calms.
    jobs = lambda util, bw, node: (Sample(0, MappingProxyType({"nlp": js_("nlp", GPU, util, None),
                                                                "hog": js_("hog", CPU, None, bw)}), (), True, None,
                                          (0,), MappingProxyType({0: node * GB}), (), ()))
    state, d = PolicyState(), None
    for t, (util, bw, node) in enumerate([(80, 2, 4)] * 3 + [(40, 8, 9.5)] + [(80, 1, 4)] * 4):
        d, state = decide(jobs(util, bw * GB, node), state, C, 10 * GB, {"hog": 5, "nlp": 5}, float(t))
    assert d.levels == {"hog": 1}
    reasons = ["node below the release threshold 60% for 3s of the 10s it must stay there (contention.hold_s)",
               "the last throttle step was 4s ago; a release waits contention.hold_s (10s) after any step"]
    assert list(d.held["hog"]) == reasons
    result = tick_result([js_("hog", CPU, None, 1 * GB)], dict(d.levels), decision=d,
                         config=Config(peak_gbps_per_domain=10, contention=C))
    e = commands(tmp_path, result).explain("hog")
    assert e["held"] == reasons
    assert "held at level 1, not released because:\n" + "".join(f"  - {r}\n" for r in reasons) \
        in answertext.format_explain(e)


def js_(jid, kind, util, bw):
    return JobSample(jid, "registered", frozenset(), JobMeta(), kind, ("GPU-0",) if kind == GPU else (), util, bw,
                     "own")


def test_explain_of_a_job_left_alone_says_why(tmp_path):
    d = Decision(MappingProxyType({}), (), False, 0.5, (), "")
    e = commands(tmp_path, tick_result([job("a")], decision=d)).explain("a")
    assert e["held"] == [] and e["why"] == ["no contention: node bandwidth 50% of peak is below the threshold 75%"]


# ------------------------------------------------------------------ check-config

#: (a line of a config, the key its error names): each wrong on its own
BAD_LINES = [
    ("tick_s: 500", "tick_s"),
    ("nvml: maybe", "nvml"),
    ("bogus: 1", "bogus"),
    ("state_dir: relative/path", "state_dir"),
    ("peak_gbps_per_domain: -1", "peak_gbps_per_domain"),
    ("metrics: {port: 99999}", "metrics.port"),
    ("resctrl: {prefix: 'in fo'}", "resctrl.prefix"),
    ("admin: {timeout_s: 0}", "admin.timeout_s"),
    ("colocation: {max_jobs_per_gpu: 0}", "colocation.max_jobs_per_gpu"),
    ("jobs: {sources: [{kind: nope}]}", "jobs.sources[0].kind"),
]


def test_check_config_reports_every_error_in_the_file(tmp_path):
    f = tmp_path / "noded.yaml"
    f.write_text("tick_s: 500\ncontention:\n  threshold: 2\n  hold_s: soon\n  release_threshold: 0.5\n"
                 "metrics: {port: 99999, address: localhost}\nbogus: 1\n")
    p = subprocess.run([sys.executable, "-m", "noded", "check-config", str(f)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert p.returncode == 1 and p.stdout == ""
    lines = p.stderr.splitlines()
    assert [re.match(rf"{re.escape(str(f))}:(\d+): ([\w.]+): ", line).groups() for line in lines] == [
        ("1", "tick_s"), ("3", "contention.threshold"), ("4", "contention.hold_s"), ("6", "metrics.port"),
        ("6", "metrics.address"), ("7", "bogus")]
    # release_threshold 0.5 is not judged against a threshold that is itself wrong


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(BAD_LINES), min_size=1, max_size=len(BAD_LINES), unique_by=lambda b: b[1].split(".")[0]))
def test_every_bad_key_is_reported_whatever_else_is_wrong(bad):
    text = "".join(f"{line}\n" for line, _ in bad)
    with pytest.raises(ConfigError) as e:
        parse_config(text, "c.yaml")
    assert [(p.key, p.line) for p in e.value.problems] == [(key, i + 1) for i, (_, key) in enumerate(bad)]
    assert str(e.value).splitlines() == [f"c.yaml:{i + 1}: {p.key}: {p.reason}" for i, p in enumerate(e.value.problems)]


def test_a_config_right_in_every_key_but_one_relation_names_that_relation():
    with pytest.raises(ConfigError) as e:
        parse_config("contention:\n  threshold: 0.5\n  release_threshold: 0.6\n", "c.yaml")
    assert str(e.value) == ("c.yaml:3: contention.release_threshold: 0.6 must be below contention.threshold (0.5) "
                            "for hysteresis")


@pytest.mark.parametrize("text, line", [("tick_s: 0.5\ncontention:\n  threshold: [1\n", 4),
                                        ("tick_s: 0.5\n  bad: 1\n", 2), ('a: "x\n', 2)])
def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, text, line):
    f = tmp_path / "noded.yaml"
    f.write_text(text)
    # in this process (support.in_process): the check-config just above is the operator's process
    p = noded_in_process("check-config", str(f))
    assert p.returncode == 1 and p.stderr.startswith(f"{f}:{line}: (yaml): ") and p.stderr.count("\n") == 1, p.stderr


# ------------------------------------------------------------------ the demo

#: what the README says of `make demo` (see the test below)
DEMO = {"command": ".venv/bin/python -m noded run --sim scenarios/contention.yaml --config scenarios/demo-config.yaml",
        "tick_s": 0.5, "metrics_port": 0, "duration_s": 40}


def test_the_demos_documented_facts_are_its_files():
    with open(os.path.join(ROOT, "Makefile")) as f:
        make = f.read()
    assert re.search(r"^demo:.*\n\t\$\(PY\) (.*)$", make, re.M).group(1) == DEMO["command"].removeprefix(
        ".venv/bin/python ")
    with open(os.path.join(ROOT, "scenarios/demo-config.yaml")) as f:
        config = yaml.safe_load(f)
    with open(os.path.join(ROOT, "scenarios/contention.yaml")) as f:
        scenario = yaml.safe_load(f)
    assert (config["tick_s"], config["metrics"]["port"], scenario["duration_s"]) == (
        DEMO["tick_s"], DEMO["metrics_port"], DEMO["duration_s"])


def children(pid):
    """PIDs whose parent is ``pid`` (from /proc/*/stat)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def descendants(pid):
    """``pid``'s children, theirs, and so on."""
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


@pytest.mark.fuse
def test_ctrl_c_on_the_demo_stops_it_cleanly(tmp_path):
    # As a terminal runs it: its own process group, and Ctrl-C is SIGINT to the whole group.
    argv = DEMO["command"].split()
    p = subprocess.Popen([sys.executable, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT, start_new_session=True)
    try:
        read_until(p.stdout, "noded: metrics at http://127.0.0.1:", "the metrics URL first", timeout=60)
        read_until(p.stdout, "hog[cpu]", "the hog running", timeout=60)
        # the simulated node and the daemon are processes of their own, below the command
        (emulator,) = wait_for(lambda: [c for c in descendants(p.pid) if b"nodesim.resctrl_emulator" in cmdline(c)],
                               what="the emulator, below the simulated node")
        mount = cmdline(emulator)[cmdline(emulator).index(b"nodesim.resctrl_emulator") + 1].decode()
        below = [c for c in descendants(p.pid) if c != emulator]
        assert mounted(mount) and len(below) >= 4  # node, daemon and the jobs at least
        os.killpg(p.pid, signal.SIGINT)
        read_until(p.stdout, "noded: stopped; throttles released, groups removed.", "the daemon's last line",
                   timeout=60)
        read_until(p.stdout, "noded: simulated node torn down.", "the command's last line", timeout=60)
        p.wait(timeout=60)
        err = p.stderr.read()
    finally:
        ended(p)
        p.stderr.close()
        stop_reading(p.stdout)
    assert p.returncode == 0, err
    assert not re.search(r"Traceback|ERROR", err), err
    # The emulator lived until noded stopped it: nothing saw resctrl vanish, nothing went
    # wrong on the way out (a warning or worse, but the admin group missing on this host).
    assert "resctrl=gone" not in err, err
    assert not [line for line in err.splitlines() if re.match(r"<[0-4]>", line) and "admin group" not in line], err
    assert not mounted(mount)
    assert not [pid for pid in [emulator, *below] if os.path.exists(f"/proc/{pid}")]


@pytest.mark.fuse
def test_the_demo_into_a_reader_that_goes_away_stops_it_cleanly(tmp_path):
    # `make demo | head -3`: the reader leaves after the admin socket's line; noded sees
    # its output closed at the next line, and stops as on SIGTERM (no tick fails).
    import select

    argv = DEMO["command"].split()
    r, w = os.pipe()
    p = subprocess.Popen([sys.executable, *argv[1:]], stdout=w, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT, start_new_session=True)
    os.close(w)
    try:
        out, deadline = b"", time.monotonic() + 60
        while b"noded: admin socket at " not in out:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(r, 65536) if ready else b""
            assert chunk, f"no admin socket line in 60 s; output so far: {out!r}"
            out += chunk
        os.close(r)  # the reader goes away
        r = None
        p.wait(timeout=60)
        err = p.stderr.read()
    finally:
        if r is not None:
            os.close(r)
        ended(p)
    assert p.returncode == 0, err
    assert not re.search(r"Traceback|ERROR|tick failed", err), err
    assert not [line for line in err.splitlines() if re.match(r"<[0-4]>", line) and "admin group" not in line], err


# ------------------------------------------------------------------ one syntax for durations and ages (issue #26)


def test_explain_of_a_job_noded_does_not_know_lists_the_known_ones(served, capsys):
    code, _, err = ctl(served.path, "explain", "slurm:9999", capsys=capsys)
    assert code == 1 and err == ("nodectl: no job 'slurm:9999' at noded's last tick: the jobs are sim:bert, sim:hog "
                                 "(nodectl jobs lists them)\n")


def test_ages_in_explain_and_status_print_as_kubectl_prints_them():
    from noded.admin.answertext import format_explain, format_status

    e = {"job": "cgroup:hog", "kind": "cpu", "level": 1, "bandwidth_bytes_per_s": 16e9, "node_share_of_peak": 0.9,
         "threshold": 0.75, "slowed_gpu_jobs": [], "why": [], "decisions": [
             {"seconds_ago": 570.0, "action": "throttle", "from": 0, "to": 1, "cause": "contention", "reason": "r"}]}
    assert "9m30s ago  throttle 0->1 (contention): r" in format_explain(e)
    st = {"paused": None, "throttle_method": "mba", "tick_s": 1.0, "threshold": 0.75, "release_threshold": 0.6,
          "peak_bytes_per_s_per_domain": 1e10, "node": {"share_of_peak": 0.5, "bandwidth_bytes_per_s": {},
                                                         "contention": False, "note": ""},
          "gpus": [], "jobs": [], "missing": [], "overrides": [
              {"job": "cgroup:hog", "kind": "exempt", "level": 0, "set_by_uid": 0, "expires_in_s": 5400.0,
               "reason": ""}]}
    assert "cgroup:hog: exempt level 0 by uid 0, 1h30m left" in format_status(st)


def test_noded_run_duration_takes_nodectls_syntax_and_refuses_anything_else():
    from noded.commands.cli import _duration

    assert _duration("15m") == 900 and _duration("90") == 90 and _duration("0.5s") == 0.5
    p = subprocess.run([sys.executable, "-m", "noded", "run", "--duration", "15 minutes"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "bad duration '15 minutes': use e.g. 90, 30s, 15m, 2h, 1d" in p.stderr, p.stderr


def test_throttle_help_gives_the_demos_job_ids():
    p = subprocess.run([sys.executable, "-m", "noded.admin.nodectl", "throttle", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert "cgroup:hog" in p.stdout and "sim:hog" not in p.stdout, p.stdout


def test_release_of_a_job_without_an_override_names_the_jobs_that_have_one(served, capsys):
    assert ctl(served.path, "exempt", "sim:bert", capsys=capsys)[0] == 0
    code, out, _ = ctl(served.path, "release", "sim:nope", capsys=capsys)
    assert code == 0 and out == "sim:nope: had no override; overrides are on sim:bert\n"
    ctl(served.path, "release", "sim:bert", capsys=capsys)
    code, out, _ = ctl(served.path, "release", "sim:bert", capsys=capsys)
    assert out == "sim:bert: had no override; no job has one\n"


def test_sim_commands_on_a_host_without_the_simulated_node_say_what_to_install():
    """The simulated node is its own distribution: where it is not installed (a GPU host),
    `noded tour` (and sim, sim-node, run --sim) says so in one line and exits 2, no traceback."""
    code = ("import sys; sys.modules['nodesim'] = None\n"  # as if noded-sim were not installed
            "from noded.commands.cli import main; sys.exit(main(['tour']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert "noded-sim" in out.stderr and "Traceback" not in out.stderr, out.stderr
