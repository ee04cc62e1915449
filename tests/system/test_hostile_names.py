"""Hostile cgroup names on the real cgroup v1 cpuset hierarchy (issue #22, items 1 and 2).

A tenant is given a subtree of their own (delegation: the directory chowned to them, as
systemd's Delegate= does), and from there, as an unprivileged user (uid 65534), names
cgroups as they like: the kernel's alphabet is any byte but '/' and NUL.

* Item 1: a cgroup whose name carries "\\r3:cpuset:/<another job's path>" (or "\\n..." where
  the kernel allows a newline in a name) must not make that tenant's process the other
  job's; a name with a line end but no ':' must not raise.
* The same class elsewhere: a mount point (any user may mount FUSE through fusermount) or
  a process's own name (prctl) that is not UTF-8 must not stop noded's start checks, its
  resctrl lookup or the admin socket's peer check; nodectl shows a non-UTF-8 job.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from support.admin import nodectl_run
from support.host import CPUSET
from support.waiting import wait_for
from noded.admin.server import peer_groups
from noded.commands.hostcheck import filesystem_type
from noded.jobs import CgroupSource, JobDiscovery
from noded.samplers.resctrl import ResctrlSession
from resctrl import NotMountedError
from resctrl.mounts import find_resctrl_mount

pytestmark = pytest.mark.skipif(not os.path.isdir(CPUSET), reason="no v1 cpuset hierarchy")

NOBODY = 65534

#: run as the tenant: make the cgroups (bytes, as given) nested under the delegated
#: directory, move this process into the deepest, then become a sleeping process there
TENANT = r"""
import json, os, sys
top = os.fsencode(sys.argv[1])
path = top
try:
    for part in json.loads(sys.argv[2]):
        path += b"/" + os.fsencode(part)
        os.mkdir(path)
except OSError as e:
    print(json.dumps({"refused": e.errno, "message": e.strerror}), flush=True)
    sys.exit(0)
with open(path + b"/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
print(json.dumps({"pid": os.getpid()}), flush=True)
os.execvp("sleep", ["sleep", "300"])
"""


def delegate(path: str, uid: int) -> None:
    """The subtree ``path`` is the user's: they may make cgroups in it and move their own
    processes into those (cgroup v1's rule); new cgroups take the parent's CPUs and memory
    nodes (clone_children), as the user may not write those of the hierarchy above."""
    with open(os.path.join(path, "cgroup.clone_children"), "w") as f:
        f.write("1")
    for name in ("", "cgroup.procs", "tasks"):
        os.chown(os.path.join(path, name), uid, uid)


def remove_tree(top: bytes) -> None:
    """Every cgroup below ``top`` (bytes: any name), deepest first, its processes killed."""
    for dirpath, dirnames, _ in os.walk(top, topdown=False):
        for name in dirnames:
            path = os.path.join(dirpath, name)
            with open(os.path.join(path, b"cgroup.procs")) as f:
                for pid in f.read().split():
                    try:
                        os.kill(int(pid), 9)
                    except ProcessLookupError:
                        pass
            wait_for(lambda: open(os.path.join(path, b"cgroup.procs")).read() == "", what="the cgroup to empty")
            os.rmdir(path)


@pytest.fixture
def tenant(v1_cpuset):
    """(victim's job source, make(names) -> the tenant's process's pid or the errno the
    kernel refused the mkdir with): a victim's job at <base>/jobs/victim, and a subtree
    delegated to uid 65534 at <base>/users/nobody."""
    base, mkcg = v1_cpuset
    victim = mkcg("jobs/victim")
    own = mkcg("users/nobody")
    delegate(own, NOBODY)
    procs = []

    def make(names: list[bytes]) -> int | tuple[int, str]:
        p = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                              sys.executable, "-c", TENANT, own, json.dumps([os.fsdecode(n) for n in names])],
                             stdout=subprocess.PIPE, text=True)
        procs.append(p)
        said = json.loads(p.stdout.readline())
        return said["pid"] if "pid" in said else (said["refused"], said["message"])

    yield CgroupSource.create("cgroup", os.path.join(base, "jobs"), ["*"]), victim, make
    for p in procs:
        p.kill()
        p.wait()
    remove_tree(os.fsencode(own))


def victim_forgery(victim: str, separator: bytes) -> list[bytes]:
    """The tenant's cgroups whose full path reads "...x<separator>3:cpuset:/<victim's path>"."""
    rel = os.path.relpath(victim, CPUSET)
    return [b"x" + separator + b"3:cpuset:"] + [os.fsencode(p) for p in rel.split("/")]


def test_a_name_carrying_another_jobs_cpuset_record_after_a_carriage_return_is_not_that_job(tenant):
    source, victim, make = tenant
    pid = make(victim_forgery(victim, b"\r"))
    with open(f"/proc/{pid}/cgroup", "rb") as f:
        shown = f.read()
    forged = b"\r3:cpuset:/" + os.fsencode(os.path.relpath(victim, CPUSET)) + b"\n"
    assert forged in shown, shown  # the kernel prints the name raw: the forgery is in place
    assert JobDiscovery([source]).job_of_new_process(pid, {}) is None
    # the victim's own process is still the victim's
    with open(os.path.join(victim, "cgroup.procs"), "w") as f:
        p = subprocess.Popen(["sleep", "300"])
        f.write(str(p.pid))
    try:
        job = JobDiscovery([source]).job_of_new_process(p.pid, {})
        assert job is not None and job.id == "cgroup:victim" and job.pids == {p.pid}
    finally:
        p.kill()
        p.wait()


def test_a_name_carrying_another_jobs_record_after_a_newline_is_refused_by_the_kernel_or_by_noded(tenant):
    # Linux 5.2 and later refuse '\n' in a cgroup's name (EINVAL at mkdir and rename:
    # "cgroup: reject cgroup names with '\n'"); an older kernel makes it, and noded must
    # then refuse the file (which record is the kernel's cannot be told)
    source, victim, make = tenant
    made = make(victim_forgery(victim, b"\n"))
    if isinstance(made, tuple):
        assert made[0] == errno.EINVAL, made
        return
    assert JobDiscovery([source]).job_of_new_process(made, {}) is None


@pytest.mark.parametrize("name", [b"x\ry", b"x\x0by", b"x\xe2\x80\xa8y", b"\x1c\x1d\x1e", b"\xff\xfe"])
def test_a_line_end_without_a_colon_in_a_tenants_name_is_read_not_raised(tenant, name):
    source, _, make = tenant
    pid = make([name])
    assert JobDiscovery([source]).job_of_new_process(pid, {}) is None


# ------------------------------------------------------------ the same class elsewhere

#: not UTF-8, with each byte /proc/mounts and mountinfo escape (space, newline, backslash)
ODD_MOUNT = os.fsdecode(b"m\xff\xfe \n\\x\r1")


def test_a_mount_at_a_non_utf8_path_stops_neither_the_start_checks_nor_the_resctrl_lookup(tmpfs, tmp_path):
    where = tmpfs(name=ODD_MOUNT)
    assert filesystem_type(str(where)) == "tmpfs"  # the mount point read back whole
    assert filesystem_type(str(where / "below")) == "tmpfs"
    assert filesystem_type(CPUSET) == "cgroup"
    with pytest.raises(NotMountedError):
        find_resctrl_mount("/proc/mounts", str(tmp_path / "resctrl"))
    session = ResctrlSession(str(where))  # mounted, but not resctrl: unavailable, said why
    assert session.refresh() is None and "no resctrl filesystem mounted" in session.unavailable


def test_the_admin_peer_check_reads_the_groups_of_a_process_named_with_any_bytes():
    name = b"\xff\xfe\x1b[2J"  # a process names itself (prctl PR_SET_NAME): not UTF-8
    script = ("import ctypes, sys; ctypes.CDLL(None).prctl(15, sys.argv[1].encode('latin-1'), 0, 0, 0); "
              "print('ready', flush=True); sys.stdin.read()")
    p = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--groups=4242,4343",
                          sys.executable, "-c", script, name.decode("latin-1")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        with open(f"/proc/{p.pid}/comm", "rb") as f:
            assert f.read() == name + b"\n"
        assert peer_groups(p.pid) == {4242, 4343}
    finally:
        p.kill()
        p.wait()


def test_nodectl_shows_a_job_whose_cgroup_name_is_not_utf8(admin_socket, capsys):
    from test_cli_habits import job, tick_result

    odd = "cgroup:" + os.fsdecode(b"\xff\xfe\x1b[2J\xe2\x80\xa8x")
    served = admin_socket(tick_result([job(odd, bw=7e9), job("slurm:1")], {odd: 2}))
    code, out, err = nodectl_run(served.path, "jobs", capsys=capsys)  # stdout: strict UTF-8
    assert code == 0, err
    assert "cgroup:\\udcff\\udcfe\\x1b[2J\\u2028x" in out and "\x1b" not in out
    code, out, err = nodectl_run(served.path, "throttle", odd, "--level", "1", capsys=capsys)
    assert code == 0, err
    assert out.startswith("cgroup:\\udcff\\udcfe\\x1b[2J\\u2028x is held at throttle level 1")
