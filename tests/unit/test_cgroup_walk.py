"""The walk of a job's subtree (noded.jobs.cgroupwalk) over trees laid out under tmp_path
(tmpfs and ext4 keep a directory's link count as cgroupfs does): every process while the tree is
within the bound, the first ``most`` cgroups breadth first past it, any depth, the
descriptors it holds bounded whatever the shape."""

import errno
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest

from support.cgtree import make_chain, remove_tree, write_at
from noded.jobs.cgroups import read_subtree_procs
from noded.jobs.cgroupwalk import WALK_FDS, walk_cgroups


def lay_out(top: str, parents: list[int]) -> dict[int, str]:
    """Cgroup ``i + 1``'s parent is ``parents[i]`` (0: the job's own, at ``top``); each holds
    one process, pid 1000 + its number. Returns number -> its path."""
    os.makedirs(top, exist_ok=True)
    paths = {0: top}
    for i, parent in enumerate(parents, 1):
        paths[i] = os.path.join(paths[parent], f"c{i}")
        os.mkdir(paths[i])
    for i, path in paths.items():
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(f"{1000 + i}\n")
    return paths


def depth(paths: dict[int, str], i: int) -> int:
    return paths[i].count("/") - paths[0].count("/")


trees = st.integers(0, 24).flatmap(
    lambda n: st.tuples(*[st.integers(0, i) for i in range(n)]).map(list))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parents=trees, most=st.integers(1, 28))
def test_the_walk_reads_every_process_within_the_bound_and_the_first_cgroups_breadth_first_past_it(
        tmp_path, parents, most):
    with tempfile.TemporaryDirectory(dir=tmp_path) as top:
        paths = lay_out(top, parents)
        got = read_subtree_procs(top, most)
        read = {pid - 1000 for pid in got.pids}
        n = len(paths)
        if n <= most:
            assert read == set(paths) and got.partial is None
            return
        assert len(read) == most and got.over_bound and f"more than {most} cgroups" in got.partial
        deepest = max(depth(paths, i) for i in read)
        # breadth first: every cgroup shallower than the deepest read was read, and each
        # cgroup read has its parent read
        assert all(i in read for i in paths if depth(paths, i) < deepest)
        assert all(i == 0 or parents[i - 1] in read for i in read)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parents=trees.filter(lambda p: len(p) > 0), data=st.data())
def test_a_part_that_cannot_be_read_hides_its_subtree_only_and_is_counted(tmp_path, parents, data):
    # a cgroup.procs that is a directory (EISDIR) stands in for a part shut to noded
    broken = data.draw(st.sets(st.integers(1, len(parents)), max_size=4))
    with tempfile.TemporaryDirectory(dir=tmp_path) as top:
        paths = lay_out(top, parents)
        for i in broken:
            procs = os.path.join(paths[i], "cgroup.procs")
            os.unlink(procs)
            os.mkdir(procs)

        def hidden(i):
            while i:
                if i in broken:
                    return True
                i = parents[i - 1]
            return False

        got = read_subtree_procs(top)
        assert {pid - 1000 for pid in got.pids} == {i for i in paths if not hidden(i)}
        # each broken cgroup not below another is one part said
        said = [i for i in broken if not hidden(parents[i - 1])]
        assert (got.partial is None) == (not said)
        if said:
            assert f"{len(said)} part(s) unreadable" in got.partial and not got.over_bound


def test_names_nested_past_path_max_are_read_to_the_bottom(tmp_path):
    # Before: ENAMETOOLONG ("File name too long") from the deepest cgroup.procs, the whole job unreadable.
    top = str(tmp_path / "job")
    os.mkdir(top)
    with open(os.path.join(top, "cgroup.procs"), "w") as f:
        f.write("7\n")
    names = ["n" * 250] * 20
    make_chain(top, names, lambda _p, fd, d: write_at(fd, "cgroup.procs", f"{100 + d}\n", create=True))
    assert len(top) + 251 * 20 > 4096
    got = read_subtree_procs(top)
    assert got.pids == {7} | {100 + d for d in range(1, 21)} and got.partial is None
    remove_tree(top)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_descriptors_a_walk_holds_are_bounded_however_deep_or_wide(tmp_path):
    # A 200-deep chain and 100 chains of 2 side by side: the walk holds at most WALK_FDS
    # directory descriptors (and one file's) at once, never one per cgroup.
    top = str(tmp_path / "job")
    os.mkdir(top)
    make_chain(top, [f"d{i}" for i in range(200)])
    for i in range(100):
        make_chain(top, [f"w{i}", "a"])
    before = open_fds()
    most_open = [0]
    visits = [0]

    def visit(dir_fd, base, node):
        visits[0] += 1
        if visits[0] % 5 == 0:  # /proc/self/fd listed at every fifth cgroup: the test's own cost
            most_open[0] = max(most_open[0], open_fds() - before)
        return True

    walk = walk_cgroups(top, visit, None)
    assert walk.read == 1 + 200 + 100 * 2 and walk.partial is None
    assert 0 < most_open[0] <= WALK_FDS + 2  # + the listing's own descriptor
    assert open_fds() == before  # every one closed
    remove_tree(top)


def test_a_part_that_cannot_be_read_is_passed_over_with_its_subtree_and_said(tmp_path):
    # tmpfs here, as root: a cgroup.procs that is a directory stands in for a part shut to
    # noded (EISDIR); tests/system/test_jobs.py shuts one for real (EACCES, the unit's capabilities)
    top = str(tmp_path / "job")
    paths = lay_out(top, [0, 0, 1, 3])  # 1 and 2 below the job, 3 below 1, 4 below 3
    os.unlink(os.path.join(paths[1], "cgroup.procs"))
    os.mkdir(os.path.join(paths[1], "cgroup.procs"))
    got = read_subtree_procs(top)
    assert got.pids == {1000, 1002} and not got.over_bound
    assert "Is a directory" in got.partial and paths[1] in got.partial
    assert got.errno == errno.EISDIR  # the first unreadable part's error, for whoever needs it


def test_the_job_s_own_cgroup_unreadable_is_an_error_and_gone_is_no_processes(tmp_path):
    top = str(tmp_path / "job")
    os.makedirs(os.path.join(top, "cgroup.procs"))
    with pytest.raises(IsADirectoryError):
        read_subtree_procs(top)
    assert read_subtree_procs(str(tmp_path / "gone")).pids == frozenset()


def test_a_node_s_path_is_built_without_recursion_and_its_message_is_short():
    from noded.jobs.cgroupwalk import Node

    node = Node(None, "/sys/fs/cgroup/job")
    for _ in range(5000):  # deeper than Python's recursion limit
        node = Node(node, "n" * 250)
    assert node.length == len("/sys/fs/cgroup/job") + 5000 * 251
    assert len(node.path) == node.length and node.path.startswith("/sys/fs/cgroup/job/nnn")
    assert node.short() == "/sys/fs/cgroup/job/…/" + "n" * 100
