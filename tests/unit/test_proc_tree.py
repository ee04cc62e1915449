"""A registered job's process tree (noded.jobs.proctree) over a /proc laid out under tmp_path
as the kernel writes it: each task's children file and each process's stat. The tree read
from the children files is the one the whole stat scan gives, whatever the shape, threads
included; past its bound, or where the kernel writes no children files, it says so and
discovery reads the whole scan as before (tests/system/test_jobs.py reads real trees)."""

import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.examples import examples
from noded.jobs.discovery import JobDiscovery
from noded.jobs.proctree import TreeOverBound, descendants, read_ppids, tree_of


def lay_out(proc: str, parents: dict[int, tuple[int, int]], threads: dict[int, int], children: bool = True) -> None:
    """``parents``: pid -> (parent pid, the parent's thread that forked it, 0 its first);
    ``threads``: pid -> its threads (tids pid, then pid * 100 + i)."""
    tids = {pid: [pid] + [pid * 100 + i for i in range(1, threads.get(pid, 1))] for pid in parents}
    listed: dict[tuple[int, int], list[int]] = {}
    for pid, (ppid, thread) in parents.items():
        if ppid in tids:
            listed.setdefault((ppid, tids[ppid][thread % len(tids[ppid])]), []).append(pid)
    for pid, (ppid, _) in parents.items():
        os.makedirs(f"{proc}/{pid}/task")
        with open(f"{proc}/{pid}/status", "w") as f:
            f.write(f"Name:\tx\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\nPid:\t{pid}\n")
        with open(f"{proc}/{pid}/stat", "w") as f:
            f.write(f"{pid} (a (b) c) S {ppid} {pid} {pid} 0 -1\n")  # a name with ')' and spaces, as a tenant may choose
        for tid in tids[pid]:
            os.mkdir(f"{proc}/{pid}/task/{tid}")
            if children:
                with open(f"{proc}/{pid}/task/{tid}/children", "w") as f:
                    f.write("".join(f"{c} " for c in listed.get((pid, tid), ())))


# pid 2 + i's parent is one of the pids before it, or 1 (init: outside every tree drawn)
forests = st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.tuples(*[st.tuples(st.integers(1, i + 1), st.integers(0, 3)) for i in range(n)]),
    st.lists(st.integers(1, 3), min_size=n, max_size=n)))


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(forest=forests, root=st.integers(1, 13))
def test_the_children_files_give_the_tree_the_whole_scan_gives(tmp_path, forest, root):
    drawn, nthreads = forest
    parents = {2 + i: p for i, p in enumerate(drawn)}
    threads = {2 + i: n for i, n in enumerate(nthreads)}
    with tempfile.TemporaryDirectory(dir=tmp_path) as proc:
        lay_out(proc, parents, threads)
        tree = tree_of(root, proc)
        assert tree.pids == descendants(root, read_ppids(proc))
        # what it read follows the tree's processes and threads, not the others
        assert tree.reads == 1 + sum(1 + threads[p] for p in tree.pids)  # its root's status, then the tree's


def test_past_its_bound_a_tree_says_so(tmp_path):
    proc = str(tmp_path / "proc")
    lay_out(proc, {2: (1, 0), 3: (2, 0), 4: (3, 0)}, {2: 1, 3: 1, 4: 1})
    assert tree_of(2, proc, most=7).pids == {2, 3, 4}
    with pytest.raises(TreeOverBound, match="more than 6 files") as e:
        tree_of(2, proc, most=6)
    assert e.value.reads == 6


def test_a_gone_root_is_no_tree(tmp_path):
    proc = str(tmp_path / "proc")
    lay_out(proc, {2: (1, 0)}, {})
    assert tree_of(9, proc) == (set(), 1)


def test_a_thread_s_id_is_no_tree(tmp_path):
    # /proc/TID of a thread that is not its process's first is there, unlisted, and lists
    # its process's tasks; the whole scan never listed it: no tree, the job ended
    proc = str(tmp_path / "proc")
    lay_out(proc, {2: (1, 0), 3: (2, 0)}, {2: 2})
    os.makedirs(f"{proc}/201/task/2")
    os.rename(f"{proc}/2/task/201", f"{proc}/201/task/201")
    with open(f"{proc}/201/status", "w") as f:
        f.write("Name:\tx\nTgid:\t2\nPid:\t201\n")
    assert tree_of(201, proc) == (set(), 1)
    assert descendants(201, read_ppids(proc)) == set()


def test_without_children_files_the_tree_is_read_from_the_whole_scan(tmp_path):
    # a kernel built without CONFIG_PROC_CHILDREN: tree_of says so, and discovery reads the
    # tree from every process's stat, as it always did
    proc = str(tmp_path / "proc")
    lay_out(proc, {2: (1, 0), 3: (2, 0), 4: (3, 0), 5: (1, 0)}, {}, children=False)
    with pytest.raises(TreeOverBound, match="CONFIG_PROC_CHILDREN"):
        tree_of(2, proc)
    d = JobDiscovery([], proc=proc)
    d.register(2, "tree")
    assert d.discover()["tree"].pids == {2, 3, 4}
    assert d.tree_reads == 3 + 4  # its root's status, listing and first children file, then 4 stats


def test_discovery_reads_each_registered_tree_from_its_children(tmp_path):
    proc = str(tmp_path / "proc")
    others = {10 + i: (1, 0) for i in range(200)}  # the host's other processes: never read
    lay_out(proc, {2: (1, 0), 3: (2, 1), 4: (3, 0), 5: (1, 0), **others}, {2: 2})
    d = JobDiscovery([], proc=proc)
    d.register(2, "a")
    d.register(5, "b")
    jobs = d.discover()
    assert (jobs["a"].pids, jobs["b"].pids) == ({2, 3, 4}, {5})
    assert d.tree_reads == 1 + (1 + 2) + (1 + 1) + (1 + 1) + 1 + (1 + 1)
