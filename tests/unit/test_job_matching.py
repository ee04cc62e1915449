"""A source's scan matches its patterns against a listing only when that listing was redone:
the matches of an unchanged directory are kept with its listing, never in its place."""

from __future__ import annotations

import os

from noded.jobs.cgroups import CgroupScanner, CgroupSource


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def tree(root, *dirs):
    (root / "cgroup.controllers").write_text("cpuset\n")  # a v2 layout, as cgroup_version tells
    for d in dirs:
        os.makedirs(root / d, exist_ok=True)


def test_matches_follow_each_listing_as_it_changes_under_two_patterns_sharing_a_directory(tmp_path):
    tree(tmp_path, "a/job_1", "a/task_1", "a/other", "b/job_2")
    clock = Clock()
    scanner = CgroupScanner(CgroupSource.create("cgroup", str(tmp_path), ["*/job_*", "*/task_*"]), 10.0, clock)
    first = scanner.scan()
    assert sorted(first.values()) == [str(tmp_path / d) for d in ("a/job_1", "a/task_1", "b/job_2")]
    assert scanner.scan() == first  # nothing changed: the same jobs
    os.mkdir(tmp_path / "a" / "job_3")  # a's link count moves: its listing is redone, and matched
    os.rmdir(tmp_path / "b" / "job_2")
    assert sorted(scanner.scan().values()) == [str(tmp_path / d) for d in ("a/job_1", "a/job_3", "a/task_1")]
    os.rename(tmp_path / "a" / "task_1", tmp_path / "a" / "task_9")  # the count stays: seen at the relisting
    clock.t = 11.0
    assert sorted(scanner.scan().values()) == [str(tmp_path / d) for d in ("a/job_1", "a/job_3", "a/task_9")]


def test_a_source_root_that_cannot_be_looked_at_is_that_error_not_no_directory(tmp_path):
    # Before: os.path.isdir answered False for any error, and the scan said "job source root
    # is not a directory" (ENOENT) for a root behind a loop (or shut: EACCES, as noded's unit
    # runs): the operator was sent looking for a missing directory. The kernel's error now.
    import errno

    import pytest

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for root in (str(tmp_path / "loop" / "slurm"), str(tmp_path / "absent")):
        source = CgroupSource.create("cgroup", root, ["job_*"])
        for scan in (source.scan, CgroupScanner(source, 10.0, lambda: 0.0).scan):
            with pytest.raises(OSError) as e:
                scan()
            assert e.value.errno == (errno.ELOOP if "loop" in root else errno.ENOENT), e.value
