"""The README and docs/ name only what exists: every relative link resolves (file and
anchor), every config key is one noded reads, every `noded`/`nodectl` command and option is
one their parsers take, every metric, recording rule and alert is one noded exports or
monitoring/ ships; and docs/metrics.md names every one of them. Each checker is also run
on a stale name, so a check that stopped seeing anything would fail too."""

import dataclasses
import functools
import importlib.util
import inspect
import os
import re
import typing

import pytest
import yaml

from noded.admin.nodectl import build_parser as nodectl_parser
from noded.commands.cli import build_parser as noded_parser
from noded.commands.clidoc import program
from noded.config import Config
from noded.loop.metrics import make_registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/TIER/ up
DOCS = os.path.join(ROOT, "docs")
README = os.path.join(ROOT, "README.md")
RULES = os.path.join(ROOT, "monitoring", "prometheus", "noded-rules.yml")
GOLDEN = os.path.join(ROOT, "tests", "golden", "metrics.txt")
RESULTS = [os.path.join(ROOT, "bench", "RESULTS.md"), os.path.join(ROOT, "bench", "RESULTS-history.md")]


def doc_files() -> list[str]:
    return [README] + sorted(os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


# -- markdown: fences, code spans, headings, links --------------------------------------

FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```", re.M | re.S)


def fences(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block."""
    return FENCE.findall(text)


def prose(text: str) -> str:
    """The text outside fenced blocks."""
    return FENCE.sub("", text)


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, anything but
    letters, digits, '_', '-' and spaces dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(read(path)).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def link_problems(path: str, text: str) -> list[str]:
    """Each relative link of ``text`` (a file at ``path``) whose file or anchor is missing."""
    problems = []
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", prose(text)):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(dest):
            problems.append(f"{rel(path)}: link {target!r}: no file {rel(dest)}")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            problems.append(f"{rel(path)}: link {target!r}: no heading with anchor #{anchor} in {rel(dest)}")
    return problems


# -- config keys --------------------------------------------------------------------------


def _section_type(tp):
    """The dataclass a field holds (itself, or the items of a tuple of them), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    args = [a for a in typing.get_args(tp) if a is not Ellipsis]
    if typing.get_origin(tp) is tuple and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def config_keys(cls=Config, prefix: str = "") -> dict[str, type | None]:
    """Every key of noded's config, dotted (list items as ``sources[]``): the dataclass a
    key holds, or None for a leaf."""
    out: dict[str, type | None] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        section = _section_type(tp)
        item = "[]" if section is not None and not dataclasses.is_dataclass(tp) else ""
        key = f"{prefix}{f.name}"
        out[key] = section
        if section is not None:
            out.update(config_keys(section, f"{key}{item}."))
    return out


KEYS = config_keys()
SECTIONS = {k.rsplit(".", 1)[-1].removesuffix("[]") for k, v in KEYS.items() if v is not None}
TOP_SECTIONS = {k for k, v in KEYS.items() if v is not None and "." not in k}
DOTTED = re.compile(r"(?<![\w./-])[a-z_]+(?:\[[^\]]*\])?(?:\.[a-z_A-Z]+(?:\[[^\]]*\])?)+")
#: what a dotted name ends with when it is a file, not a key (`rightsize.json`, `contention.yaml`)
FILE_SUFFIXES = {"yaml", "yml", "json", "txt", "md", "py", "conf", "sock", "service", "mount", "so"}
#: cgroup interface files (`memory.high`), whose controller shares a name with a config section
CGROUP_FILES = {"memory", "cpuset", "cgroup"}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _is_python(name: str) -> bool:
    """A module, or a name in one (`nodesim.resctrl_emulator.MountedEmulator`)."""
    segments = name.split(".")
    return any(_is_module(".".join(segments[:n])) for n in range(2, len(segments) + 1))


def key_problem(key: str) -> str | None:
    """Why a dotted name that starts with a config section is not a config key (None: it is,
    or it is not meant as one: a Python module such as ``nodesim.resctrl_emulator``)."""
    normal = re.sub(r"\[[^\]]*\]", "[]", key)
    first = normal.split(".", 1)[0].removesuffix("[]")
    if first not in SECTIONS or normal.rsplit(".", 1)[-1] in FILE_SUFFIXES or _is_python(key):
        return None
    if first in CGROUP_FILES and first not in TOP_SECTIONS:
        return None
    if first in TOP_SECTIONS:
        ok = normal in KEYS
    else:  # a nested section named alone (mps.multi_user): the end of some key
        ok = any(k == normal or k.endswith("." + normal) for k in KEYS)
    return None if ok else f"config key {key!r} is not one noded reads (config/noded.yaml, noded/config.py)"


def yaml_key_problems(data, cls=Config, prefix: str = "") -> list[str]:
    """The keys of a YAML example that the config does not have."""
    problems = []
    if isinstance(data, list):
        for item in data:
            problems += yaml_key_problems(item, cls, prefix)
        return problems
    if not isinstance(data, dict):
        return problems
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k, v in data.items():
        if k not in names:
            problems.append(f"config key {prefix}{k!r} in a YAML example is not one noded reads")
            continue
        section = _section_type(hints[k])
        if section is not None:
            problems += yaml_key_problems(v, section, f"{prefix}{k}.")
    return problems


def config_problems(text: str) -> list[str]:
    problems = []
    for span in code_spans(text):
        for key in DOTTED.findall(span.split(":", 1)[0] if ": " in span else span):
            problems.append(key_problem(key))
    for lang, body in fences(text):
        if lang == "yaml":
            problems += yaml_key_problems(yaml.safe_load(body))
    return [p for p in problems if p]


# -- noded and nodectl commands -----------------------------------------------------------

PROGRAMS = {p.prog: p for p in (program(noded_parser()), program(nodectl_parser()))}
#: global options that take a value (their value is not the subcommand)
VALUED = {"--socket", "--timeout"}


def command_texts(text: str) -> list[str]:
    """Command lines: each line of the sh blocks (comments dropped) and each code span."""
    out = []
    for lang, body in fences(text):
        if lang == "sh":
            out += [re.sub(r"(^|\s)#.*$", "", line).strip() for line in body.splitlines()]
    out += code_spans(text)
    return [c for c in out if c]


def invocations(command: str) -> list[tuple[str, list[str]]]:
    """(noded or nodectl, the words after it) for each call in a command line: the first
    word of each part between `|`, `&&`, `;` or ` -- `, or after `python -m`."""
    out = []
    for part in re.split(r"\s*(?:\|\|?|&&|;|\s--\s)\s*", command):
        words = part.split()
        if words[:1] and os.path.basename(words[0]).endswith("python") and words[1:3] in (["-m", "noded"],):
            words = words[2:]
        if words and os.path.basename(words[0]) in PROGRAMS:
            out.append((os.path.basename(words[0]), words[1:]))
    return out


def command_problem(prog: str, words: list[str]) -> str | None:
    p = PROGRAMS[prog]
    global_flags = {f for o in p.options for f in o.flags} | {"--socket", "--json", "--timeout"}
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in VALUED else 1
    if i >= len(words):
        bad = [w for w in words if w.startswith("-") and w.split("=")[0] not in global_flags]
        return f"{prog}: no option {bad[0]}" if bad else None
    name = words[i]
    if not re.fullmatch(r"[a-z][a-z-]*", name):
        return None  # a placeholder (`nodectl …`), not a subcommand
    commands = {c.name: c for c in p.commands}
    if name not in commands:
        return f"{prog} {name}: no such command (the parser has: {', '.join(sorted(commands))})"
    flags = global_flags | {f for o in commands[name].options for f in o.flags}
    for w in words[i + 1:]:
        m = re.match(r"(--?[a-z][a-z-]*)", w)
        if m and w.startswith("-") and m.group(1) not in flags:
            return f"{prog} {name}: no option {m.group(1)}"
    return None


def command_problems(text: str) -> list[str]:
    problems = [command_problem(prog, words) for c in command_texts(text) for prog, words in invocations(c)]
    return [p for p in problems if p]


# -- metrics, recording rules, alerts -----------------------------------------------------


@functools.cache
def exporter_source() -> str:
    """The source of every module of noded's package (metric families are made in the
    exporter and may be made beside it), wherever the package's modules live."""
    package = os.path.dirname(inspect.getsourcefile(make_registry))
    while os.path.exists(os.path.join(os.path.dirname(package), "__init__.py")):
        package = os.path.dirname(package)
    texts = []
    for dirpath, _, files in os.walk(package):
        texts += [read(os.path.join(dirpath, f)) for f in sorted(files) if f.endswith(".py")]
    return "\n".join(texts)


@functools.cache
def exported_families() -> frozenset[str]:
    """The families noded exports, as a reader names them: from the exporter's own source
    (a counter with _total, info with _info, a histogram by its base name) and the golden
    exposition (client_python's process_* series)."""
    source = exporter_source()
    out = set()
    for kind, name in re.findall(r"(\w*)MetricFamily\(\s*\"(noded_\w+)\"", source):
        out.add({"Counter": f"{name}_total", "Info": f"{name}_info"}.get(kind, name))
    out |= set(re.findall(r"_histogram\(\s*\"(noded_\w+)\"", source))
    for line in read(GOLDEN).splitlines():
        m = re.match(r"# TYPE (\w+) (\w+)", line)
        if m:
            out.add(m.group(1))
    return frozenset(out)


@functools.cache
def histogram_families() -> frozenset[str]:
    return frozenset(re.findall(r"_histogram\(\s*\"(noded_\w+)\"", exporter_source()))


@functools.cache
def rules() -> tuple[frozenset[str], frozenset[str]]:
    groups = yaml.safe_load(read(RULES))["groups"]
    records = frozenset(r["record"] for g in groups for r in g["rules"] if "record" in r)
    alerts = frozenset(r["alert"] for g in groups for r in g["rules"] if "alert" in r)
    return records, alerts


@functools.cache
def known_series() -> frozenset[str]:
    names = exported_families()
    names |= {f"{h}{suffix}" for h in histogram_families() for suffix in ("_bucket", "_sum", "_count")}
    return names | rules()[0]


METRIC = re.compile(r"(?<![\w:/.-])(noded_[a-z0-9_]+|noded:[a-z0-9_]+:[a-z0-9_:]+)(\*?)")
ALERT = re.compile(r"\bNoded[A-Z][A-Za-z]+\b")


def metric_problems(text: str) -> list[str]:
    known = known_series()
    alerts = rules()[1]
    problems = [f"metric {m + star!r} is neither exported by noded nor recorded by monitoring/"
                for m, star in sorted(set(METRIC.findall(text)))
                if not (any(k.startswith(m) for k in known) if star else m in known)]
    problems += [f"alert {a!r} is not in {rel(RULES)}" for a in sorted(set(ALERT.findall(text))) if a not in alerts]
    return problems


# -- the tests ----------------------------------------------------------------------------


def all_problems(check) -> list[str]:
    return [f"{rel(path)}: {p}" for path in doc_files() for p in check(read(path))]


def test_the_readme_is_one_short_page_with_the_two_set_up_commands_on_its_first_screen():
    text = read(README)
    assert len(text.splitlines()) <= 150, "README.md: keep it to 150 lines; the rest belongs in docs/"
    first_screen = "\n".join(text.splitlines()[:60])
    assert "make demo" in first_screen and "make test" in first_screen
    assert "issue #" not in text.lower(), "README.md: the status of issues belongs in docs/development.md"


def test_the_operator_guide_is_in_the_order_the_work_comes():
    headings = re.findall(r"^## (.*)$", prose(read(os.path.join(DOCS, "operator-guide.md"))), re.M)
    assert headings == ["Install", "Configure", "See decisions", "Override", "Upgrade", "Uninstall"], headings


@pytest.mark.parametrize("path", [README, *RESULTS] + [os.path.join(DOCS, f) for f in sorted(os.listdir(DOCS))
                                                       if f.endswith(".md")], ids=rel)
def test_every_relative_link_resolves_to_a_file_and_heading(path):
    problems = link_problems(path, read(path))
    assert not problems, "\n".join(problems)


def test_every_config_key_named_is_one_noded_reads():
    problems = all_problems(config_problems)
    assert not problems, "\n".join(problems)


def test_every_noded_and_nodectl_command_named_is_in_their_parsers():
    problems = all_problems(command_problems)
    assert not problems, "\n".join(problems)


def test_every_metric_rule_and_alert_named_exists():
    problems = all_problems(metric_problems)
    assert not problems, "\n".join(problems)


def test_the_metrics_reference_names_every_series_rule_and_alert():
    text = read(os.path.join(DOCS, "metrics.md"))
    named = {m for m, _ in METRIC.findall(text)} | set(re.findall(r"\bprocess_[a-z_]+\b", text))
    records, alerts = rules()
    missing = sorted((exported_families() | records) - named)
    assert not missing, f"docs/metrics.md does not name: {missing} (add each with its labels and meaning)"
    missing_alerts = sorted(alerts - set(ALERT.findall(text)))
    assert not missing_alerts, f"docs/metrics.md does not name the alerts {missing_alerts}"
    for alert in alerts:  # each links its runbook section
        assert f"(runbook.md#{alert.lower()})" in text, f"docs/metrics.md: {alert} without its runbook link"


# -- the checkers see a stale name ---------------------------------------------------------


def test_each_checker_reports_a_stale_name():
    here = os.path.join(DOCS, "operator-guide.md")
    assert link_problems(here, "see [there](nowhere.md)")
    assert link_problems(here, "see [there](metrics.md#no-such-heading)")
    assert not link_problems(here, "see [there](metrics.md#alerts) and [the runbook](runbook.md#nodeddown)")
    assert config_problems("set `contention.hold_seconds` to 5")
    assert config_problems("set `mps.multiuser`")
    assert config_problems("`rightsize.memory.cache_gib`")
    assert config_problems("```yaml\njobs:\n  sources:\n    - {kind: slurm, rot: /sys/fs/cgroup}\n```\n")
    assert config_problems("`rightsize.memory.MountedEmulator`")
    assert not config_problems("`contention.hold_s`, `jobs.sources[i].cap_gbps`, `mps.multi_user`, "
                               "`nodesim.resctrl_emulator.MountedEmulator`, "
                               "`nodesim.resctrl_emulator`, `metrics.port: 0`, `rightsize.json`, `memory.high`, "
                               "`sys-fs-resctrl.mount`")
    assert command_problems("`nodectl frobnicate slurm:1`")
    assert command_problems("```sh\nnodectl throttle slurm:1 --levl 3\n```\n")
    assert command_problems("`noded run --configure x`")
    assert not command_problems("`nodectl --socket /x jobs`, `python -m noded run --sim s --config c`, "
                                "`kubectl -n noded exec ds/noded -- nodectl jobs`, `nodectl …`")
    assert metric_problems("`noded_job_throttle_levels`")
    assert metric_problems("noded:jobs_throttled:total")
    assert metric_problems("the alert NodedOnFire")
    assert metric_problems("`noded_rightsize_probe_*`")
    assert not metric_problems("`noded_tick_duration_seconds_bucket`, noded:jobs_throttled:count, NodedDown, "
                               "`noded_rightsize_*`")
