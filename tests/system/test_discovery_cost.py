"""What discovery costs grows with the jobs noded acts on, not with the cgroups users make
(issue #22, item 3): a user who may write under a job source's root made 10 000 empty
cgroups and every tick read each one's cgroup.procs.

Reads are counted on the files themselves: the layout is on a tmpfs mounted with
strictatime, where every read of a file sets its access time, and each cgroup.procs
starts the discovery with an access time of 0.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from noded.jobs import CgroupSource, JobDiscovery
from noded.jobs.cgroups import CgroupScanner
from noded.jobs.polling import DEFAULT_MAX_POLLED

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts a tmpfs, chowns directories")

#: the tenant's empty cgroups: several budgets' worth
FLOOD = 4 * DEFAULT_MAX_POLLED
TENANT_UID, VICTIM_UID = 4242, 4343


@pytest.fixture
def counted_tree(tmp_path):
    """A v2-like source root on a strictatime tmpfs: ``u/`` holds a tenant's FLOOD empty
    cgroups (owned by TENANT_UID). Returns (root, make(name, pids, uid), reads())."""
    root = tmp_path / "cg"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,strictatime,mode=0755", "tmpfs", str(root)], check=True)
    try:
        (root / "cgroup.controllers").write_text("cpuset\n")  # v2, as cgroup_version tells
        (root / "u").mkdir()

        def make(name, pids=(), uid=TENANT_UID):
            d = root / "u" / name
            d.mkdir()
            (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
            os.chown(d, uid, uid)
            return d

        for i in range(FLOOD):
            make(f"empty{i:05d}")

        def procs_files():
            return [root / "u" / n / "cgroup.procs" for n in os.listdir(root / "u")]

        def reads():
            """The cgroup.procs read since the last call, by directory name."""
            read = []
            for f in procs_files():
                st = os.stat(f)
                if st.st_atime_ns != 0:
                    read.append(f.parent.name)
                    os.utime(f, ns=(0, st.st_mtime_ns))
            return read

        reads()
        yield str(root), make, reads
    finally:
        subprocess.run(["umount", "-l", str(root)], check=True)


def test_a_users_thousands_of_empty_cgroups_cost_a_bounded_number_of_reads_per_tick(counted_tree):
    root, make, reads = counted_tree
    discovery = JobDiscovery([CgroupSource.create("cgroup", root, ["u/*"])])
    for _ in range(3):
        discovery.discover()
        assert len(reads()) <= DEFAULT_MAX_POLLED


def test_another_users_job_is_found_at_once_and_every_directory_in_turn(counted_tree):
    root, make, reads = counted_tree
    make("victim", pids=[os.getpid()], uid=VICTIM_UID)
    discovery = JobDiscovery([CgroupSource.create("cgroup", root, ["u/*"])])
    jobs = discovery.discover()
    # one user's thousands of directories do not push another user's job a tick back
    assert "cgroup:u/victim" in jobs
    assert discovery.cost[0].capped and discovery.cost[0].dirs == FLOOD + 1
    seen = set(reads())
    for _ in range(FLOOD // (DEFAULT_MAX_POLLED // 2)):
        jobs = discovery.discover()
        assert "cgroup:u/victim" in jobs  # a job with processes is read every tick
        read = reads()
        assert "victim" in read and len(read) <= DEFAULT_MAX_POLLED
        seen.update(read)
    assert len(seen) == FLOOD + 1, "every directory is read in turn: a process put in any is found"


def test_a_process_placed_by_its_exec_has_its_directory_read_next(counted_tree, tmp_path):
    root, make, reads = counted_tree
    discovery = JobDiscovery([CgroupSource.create("cgroup", root, ["u/*"])], proc=str(tmp_path / "proc"))
    discovery.discover()
    reads()
    late = FLOOD - 1  # read last in the first turn: not soon without the exec
    d = root + f"/u/empty{late:05d}"
    with open(f"{d}/cgroup.procs", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.utime(f"{d}/cgroup.procs", ns=(0, 0))
    # the exec event's view of the process: its /proc/PID/cgroup names the directory
    pid_dir = tmp_path / "proc" / "777"
    pid_dir.mkdir(parents=True)
    (pid_dir / "cgroup").write_text(f"0::/u/empty{late:05d}\n")
    (tmp_path / "proc" / "self").mkdir()  # the hierarchies the kernel has: noded's own file says
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/\n")
    job = discovery.job_of_new_process(777, {})
    assert job is not None and job.id == f"cgroup:u/empty{late:05d}"
    jobs = discovery.discover()
    assert f"cgroup:u/empty{late:05d}" in jobs
    assert f"empty{late:05d}" in reads()


def test_a_source_under_its_budget_reads_every_directory_every_tick(tmp_path):
    root = tmp_path / "cg"
    (root / "u").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("")
    for i in range(20):
        (root / "u" / f"j{i}").mkdir()
        (root / "u" / f"j{i}" / "cgroup.procs").write_text("")
    discovery = JobDiscovery([CgroupSource.create("cgroup", str(root), ["u/*"])], max_polled=20)
    assert discovery.discover() == {}
    (root / "u" / "j7" / "cgroup.procs").write_text(f"{os.getpid()}\n")
    assert set(discovery.discover()) == {"cgroup:u/j7"}  # found at the next tick, as before
    assert not discovery.cost[0].capped and discovery.cost[0].polled == 20


def test_listings_follow_the_kernels_link_count_and_are_redone_at_their_period(v1_cpuset):
    """On this host's real cgroup v1 hierarchy: a directory is listed again when a cgroup
    is made or removed in it (its link count moves; its mtime does not), and a create and
    a remove between two scans, which keep the count, are found at the forced re-listing."""
    base, mkcg = v1_cpuset
    u = mkcg("u")
    try:
        _listings_follow_the_link_count(base, u)
    finally:
        for name in os.listdir(u):
            if os.path.isdir(f"{u}/{name}"):
                os.rmdir(f"{u}/{name}")


def _listings_follow_the_link_count(base, u):
    for i in range(5):
        os.mkdir(f"{u}/job{i}")
    now = [0.0]
    scanner = CgroupScanner(CgroupSource.create("cgroup", base, ["u/*"], version=1), relist_s=10.0,
                            clock=lambda: now[0])
    assert len(scanner.scan()) == 5
    before = os.stat(u)
    assert scanner.scan() and scanner.listings.listed == 0  # unchanged: not listed again
    os.mkdir(f"{u}/job5")
    assert os.stat(u).st_mtime_ns == before.st_mtime_ns  # kernfs: the count moves, not the time
    assert "cgroup:u/job5" in scanner.scan() and scanner.listings.listed == 1
    os.rmdir(f"{u}/job0")
    os.mkdir(f"{u}/job6")  # one made, one removed: the same count
    found = scanner.scan()
    assert "cgroup:u/job0" in found and scanner.listings.listed == 0  # not seen yet ...
    now[0] += 10.0
    found = scanner.scan()
    assert "cgroup:u/job0" not in found and "cgroup:u/job6" in found  # ... at the period


def test_a_job_with_thousands_of_cgroups_below_it_costs_a_bounded_walk_and_is_partly_read(counted_tree):
    """The same flood one level down: whoever owns a delegated job subtree makes cgroups
    inside it. Its walk stops at the budget; the job is what the part read holds, said."""
    root, make, reads = counted_tree
    deep = make("deep", pids=[os.getpid()], uid=VICTIM_UID)
    discovery = JobDiscovery([CgroupSource.create("cgroup", root, ["u/*"])])
    before = discovery.discover()["cgroup:u/deep"]
    below = []
    for i in range(4 * DEFAULT_MAX_POLLED):
        d = deep / f"sub{i:05d}"
        d.mkdir()
        (d / "cgroup.procs").write_text("")
        os.utime(d / "cgroup.procs", ns=(0, 0))
        below.append(d / "cgroup.procs")
    jobs = discovery.discover()
    read_below = [f for f in below if os.stat(f).st_atime_ns != 0]
    assert len(read_below) <= DEFAULT_MAX_POLLED
    assert jobs["cgroup:u/deep"] is before  # its own cgroup's process, read: the same job, not lost
    assert "more than" in discovery.partial["cgroup:u/deep"] and discovery.unreadable == {}
