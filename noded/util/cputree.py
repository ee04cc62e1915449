"""The arithmetic of CPU sets in a cgroup tree, pure: what a child gets when its parent's set
changes, a child kept inside its parent, and an order of writes the kernel accepts (a child's
CPUs always inside its parent's, never empty)."""

from __future__ import annotations

from typing import Any, Sequence

CpuSet = frozenset  # of CPU ids


def derived(own_original: CpuSet, parent_original: CpuSet, parent_value: CpuSet) -> CpuSet:
    """What a child (a cgroup below the job's, or a process of the job) gets when its
    parent gets ``parent_value``: the CPUs of its own original the parent still has, and
    whatever the parent got beyond its original; all of the parent's where that is none."""
    return ((own_original & parent_value) | (parent_value - parent_original)) or parent_value


def fitted(nodes: Sequence[Any], targets: Sequence[CpuSet]) -> list[CpuSet]:
    """``targets`` (parents first), each cgroup's kept inside its parent's: a value its
    owner chose beyond what the parent gets back (CPUs noded lent, taken back) keeps what
    the parent has of it (``derived``). ``nodes``: each with ``parent`` and ``original``."""
    out = list(targets)
    for i, n in enumerate(nodes):
        if n.parent is not None and not out[i] <= out[n.parent]:
            out[i] = derived(out[i], nodes[n.parent].original, out[n.parent])
    return out


def cpuset_steps(tree: Sequence[tuple[CpuSet, CpuSet, int | None]]) -> list[tuple[int, CpuSet]]:
    """The writes that take a cpuset tree from what it holds to its targets, each one valid
    (a child inside its parent, never empty) when made in order: (index, value).

    ``tree``: (now, target, index of the parent or None) per cgroup, parents first; every
    child's now inside its parent's now and its target inside its parent's target. First
    what shrinks, children first (to what it keeps of its target, and at least what its
    children keep); then what grows, parents first (to the union of that and its target);
    then, children first, each to its target."""
    n = len(tree)
    children: list[list[int]] = [[] for _ in range(n)]
    for i, (_now, _target, parent) in enumerate(tree):
        if parent is not None:
            children[parent].append(i)
    cur = [now for now, _t, _p in tree]
    steps: list[tuple[int, CpuSet]] = []
    for i in reversed(range(n)):
        keep = frozenset().union(cur[i] & tree[i][1], *(cur[c] for c in children[i])) or cur[i]
        if keep != cur[i]:
            steps.append((i, keep))
            cur[i] = keep
    for i in range(n):
        union = cur[i] | tree[i][1]
        if union != cur[i]:
            steps.append((i, union))
            cur[i] = union
    for i in reversed(range(n)):
        if cur[i] != tree[i][1]:
            steps.append((i, tree[i][1]))
            cur[i] = tree[i][1]
    return steps
