"""/proc/PID/cgroup parsed as bytes by the kernel's grammar (issue #22, item 1): split on
'\\n' only, each hierarchy exactly once, a forged record refused, never taken as real.

The files here are laid out in a proc directory of the test's own on tmpfs (the reader
takes its proc root as a parameter), and the fuzz tests render the file as the kernel's
``proc_cgroup_show`` does, over cgroup names from the kernel's whole alphabet."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from support.examples import examples

from noded.jobs.cgroups import CgroupSource, read_process_cgroups
from noded.jobs.discovery import JobDiscovery
from noded.jobs.proccgroup import (AmbiguousProcCgroup, ProcCgroupError, ProcCgroups, parse_hierarchies,
                                   parse_proc_cgroup)

#: the hierarchies of a hybrid host as the kernel lists them (this machine's, in its order)
HOST = (b"9:name=systemd", b"8:pids", b"7:blkio", b"6:freezer", b"5:devices", b"4:memory", b"3:cpuset",
        b"2:cpuacct", b"1:cpu", b"0:")
PREFIXES = frozenset(h + b":" for h in HOST)


def render(paths: dict[bytes, bytes]) -> bytes:
    """/proc/PID/cgroup as the kernel writes it: each hierarchy's record, the path raw."""
    return b"".join(h + b":" + paths.get(h, b"/") + b"\n" for h in HOST)


@pytest.fixture
def fake_proc(tmp_path):
    """A proc root of the test's own: ``put(pid, data)`` writes PID/cgroup; noded's own
    (self) is in the root cgroup of every hierarchy."""
    root = tmp_path / "proc"

    def put(pid, data: bytes):
        os.makedirs(root / str(pid), exist_ok=True)
        (root / str(pid) / "cgroup").write_bytes(data)

    put("self", render({}))
    return str(root), put


def test_a_carriage_return_in_a_v2_name_does_not_forge_the_cpuset_record(fake_proc):
    # the case: the cpuset hierarchy's own record says '/', and a tenant's v2 cgroup
    # name carries "\r3:cpuset:/rt-v/victim"; splitlines() took the second for cpuset's
    proc, put = fake_proc
    put(4242, render({}).replace(b"0::/\n", b"0::/u/x\r3:cpuset:/rt-v/victim\n"))
    cgroups = read_process_cgroups(proc, 4242)
    assert cgroups["cpuset"] == "/"
    assert cgroups[""] == "/u/x\r3:cpuset:/rt-v/victim"


@pytest.mark.parametrize("separator", [b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\x85",
                                       "\u2028".encode(), "\u2029".encode()])
def test_no_line_end_but_newline_splits_a_record(fake_proc, separator):
    proc, put = fake_proc
    put(1, render({b"3:cpuset": b"/u/x" + separator + b"3:cpuset:/rt-v/victim"}))
    assert read_process_cgroups(proc, 1)["cpuset"] == os.fsdecode(b"/u/x" + separator + b"3:cpuset:/rt-v/victim")


def test_a_name_without_a_colon_after_a_line_end_character_is_read_not_raised(fake_proc):
    proc, put = fake_proc
    put(1, render({b"0:": b"/u/x\ry"}))
    assert read_process_cgroups(proc, 1)[""] == "/u/x\ry"


def test_a_name_holding_a_newline_continues_its_path(fake_proc):
    # kernels before 5.2 made such names (later ones refuse '\n' at mkdir: EINVAL)
    proc, put = fake_proc
    put(1, render({b"3:cpuset": b"/u/a\nb\n\nc:d"}))
    assert read_process_cgroups(proc, 1)["cpuset"] == "/u/a\nb\n\nc:d"


def test_a_forged_record_after_a_newline_is_refused_and_the_process_is_no_jobs(fake_proc):
    proc, put = fake_proc
    put(1, render({b"0:": b"/u/x\n3:cpuset:/rt-v/victim"}))
    with pytest.raises(AmbiguousProcCgroup, match="hierarchy '3:cpuset' appears twice"):
        read_process_cgroups(proc, 1)
    src = CgroupSource("cgroup", "/sys/fs/cgroup/cpuset/rt-v", ("*",), 1)
    discovery = JobDiscovery([src], proc=proc)
    assert discovery.job_of_new_process(1, {}) is None
    assert discovery.unattributed == 1  # noded_process_events_unattributed_total


def test_a_record_of_a_hierarchy_the_kernel_lacks_is_part_of_a_name(fake_proc):
    # "99:bogus:/" after a newline cannot shorten the path before it to another job's
    proc, put = fake_proc
    put(1, render({b"3:cpuset": b"/rt-v/victim\n99:bogus:/x"}))
    assert read_process_cgroups(proc, 1)["cpuset"] == "/rt-v/victim\n99:bogus:/x"


def test_a_hierarchy_mounted_since_the_list_was_read_is_taken_after_reading_it_again(fake_proc):
    proc, put = fake_proc
    put(1, render({}))
    before = read_process_cgroups(proc, 1)  # the list is read now
    with_net = render({}) + b"10:net_cls:/\n"
    put("self", with_net)
    put(2, with_net.replace(b"3:cpuset:/\n", b"3:cpuset:/a\n"))
    assert read_process_cgroups(proc, 2) == {**before, "cpuset": "/a", "net_cls": "/"}
    put(3, render({}))  # and once gone, a file without it is read again too
    put("self", render({}))
    assert read_process_cgroups(proc, 3)["cpuset"] == "/"


@pytest.mark.parametrize("data,reason", [
    (b"", "newline"), (b"3:cpuset:/", "newline"), (b"x\n", "begin"), (b"\n", "begin"),
    (render({}).replace(b"3:cpuset:/\n", b""), "no record of hierarchy '3:cpuset'"),
    (render({b"3:cpuset": b"rt-v"}), "does not begin with '/'"),
    (render({}) + b"3:cpuset:/b\n", "appears twice"),
    (b"/" * (2 << 20) + b"\n", "larger than"),
], ids=lambda v: v if isinstance(v, str) else f"{len(v)}B")  # the 2 MiB case's bytes made a 4 MB test id
def test_what_is_not_the_kernels_grammar_is_refused_with_its_reason(fake_proc, data, reason):
    proc, put = fake_proc
    put(1, data)
    with pytest.raises(ProcCgroupError, match=reason) as e:
        read_process_cgroups(proc, 1)
    assert e.value.path == f"{proc}/1/cgroup"


def test_a_process_gone_is_no_jobs(fake_proc):
    proc, _ = fake_proc
    assert read_process_cgroups(proc, 999999) == {}


def test_the_hierarchies_come_from_pid_1_where_self_is_another_namespaces(tmp_path):
    os.makedirs(tmp_path / "1")
    (tmp_path / "1" / "cgroup").write_bytes(b"1:cpuset:/\n0::/init.scope\n")
    assert ProcCgroups(str(tmp_path)).hierarchies() == {b"1:cpuset:", b"0::"}


def test_names_decode_as_the_directory_listing_does(fake_proc):
    proc, put = fake_proc
    put(1, render({b"3:cpuset": b"/jobs/\xff\xfe-\xe2\x80\xa8"}))
    assert read_process_cgroups(proc, 1)["cpuset"] == "/jobs/" + os.fsdecode(b"\xff\xfe-\xe2\x80\xa8")


def test_the_real_file_of_this_process_parses():
    cgroups = read_process_cgroups("/proc", os.getpid())
    assert cgroups and all(p.startswith("/") for p in cgroups.values())


# --------------------------------------------------------------------------- fuzz
#: a cgroup name from the kernel's whole alphabet: any byte but '/' and NUL, 1..255 of them
NAME = st.binary(min_size=1, max_size=255).filter(lambda b: b"/" not in b and b"\0" not in b)
#: names weighted towards what a forger writes: line ends and record-shaped text
FORGING = st.lists(st.sampled_from([b"\n", b"\r", b"\x0b", "\u2028".encode(), b":", b"3:cpuset:", b"0::",
                                    b"99:bogus:", b"/", b"x", b"\xff"]), min_size=1, max_size=12).map(b"".join)
FORGED_NAME = FORGING.map(lambda b: b.replace(b"/", b"_") or b"x")
PATH = st.lists(st.one_of(NAME, FORGED_NAME), min_size=0, max_size=4).map(lambda parts: b"/" + b"/".join(parts))


def forges_a_record(path: bytes) -> bool:
    """Whether a path holds a line that begins as a hierarchy's record (refused: which of
    the two is the kernel's cannot be told)."""
    return any(any(line.startswith(p) for p in PREFIXES) for line in path.split(b"\n")[1:])


@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_arbitrary_bytes_raise_nothing_but_the_typed_error(data):
    for hierarchies in (PREFIXES, frozenset({b"0::"})):
        try:
            parsed = parse_proc_cgroup(data, hierarchies, "fuzz")
        except ProcCgroupError:
            continue
        assert {p[:-1].split(b":")[1] for p in hierarchies} >= {c.encode() for c in parsed.paths}
        assert all(p.startswith("/") for p in parsed.paths.values())
    try:
        parse_hierarchies(data, "fuzz")
    except ProcCgroupError:
        pass


@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(HOST), PATH, max_size=4), st.randoms(use_true_random=False))
def test_any_legal_name_maps_back_to_exactly_its_path_or_is_refused_when_it_forges(paths, random):
    order = list(HOST)
    random.shuffle(order)  # the kernel's order is its list of roots': nothing may depend on it
    data = b"".join(h + b":" + paths.get(h, b"/") + b"\n" for h in order)
    forged = any(forges_a_record(p) for p in paths.values())
    try:
        parsed = parse_proc_cgroup(data, PREFIXES, "fuzz")
    except AmbiguousProcCgroup:
        assert forged
        return
    # never a guess: what is read is exactly what the kernel holds, hierarchy by hierarchy
    for h in HOST:
        names = h.split(b":")[1]
        for controller in names.split(b",") if names else [b""]:
            assert parsed.paths[controller.decode()] == os.fsdecode(paths.get(h, b"/"))


@settings(max_examples=examples(200))
@given(NAME)
def test_a_name_that_forges_nothing_is_read_back_in_every_hierarchy(name):
    assume(not forges_a_record(b"/" + name))
    for h in HOST:
        data = render({h: b"/jobs/" + name})
        names = h.split(b":")[1]
        assert parse_proc_cgroup(data, PREFIXES, "fuzz").paths[names.decode() if names else ""] == \
            "/jobs/" + os.fsdecode(name)
