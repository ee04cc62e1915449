"""Shares of one CLOSID (issue #27, item 4): a capped job the kernel has no CLOSID for is
held in a group it shares, said once, and moved to its own group once a CLOSID is free."""

import logging

import pytest

from noded.admin.commands import _cap_why
from noded.loop.overrides import Override, OverrideStore
from noded.util.journal import CHANGES

pytestmark = pytest.mark.fuse

THREE_HOGS = ("  - {at: 0, start: {id: a, cpu: hog}}\n"
              "  - {at: 0, start: {id: b, cpu: hog}}\n"
              "  - {at: 0, start: {id: c, cpu: hog}}\n")


class WallClock:
    def __call__(self):
        import time
        return time.time()


def bandwidth(r, job):
    js = r.sample.jobs.get(f"sim:{job}")
    return js.bandwidth_bps if js is not None and js.bandwidth_bps is not None else None


def scrape_text(h):
    from prometheus_client import generate_latest

    from noded.loop.metrics import make_registry

    return generate_latest(make_registry(h.daemon)).decode()


def said(caplog, action, job):
    return [rec for rec in caplog.records if rec.name == CHANGES and getattr(rec, "noded_action", None) == action
            and getattr(rec, "noded_job", None) == f"sim:{job}"]


def test_a_capped_job_without_a_closid_shares_a_held_group_then_gets_its_own(tmp_path, caplog):
    from support.eliminator import Harness

    caplog.set_level(logging.INFO)
    # the root and two groups: a and b take them, c has none of its own
    h = Harness(tmp_path, THREE_HOGS, profile="intel-few-closids", peak=1000, gpus=1)
    try:
        clock = WallClock()
        h.daemon.control.overrides = store = OverrideStore(h.config.state_dir, clock)
        h.until(lambda r: sum(bandwidth(x, "c") is not None and bandwidth(x, "c") > 0 for x in h.results) >= 3, 15,
                "the hogs running")
        # the node is quiet (nothing capped yet), so each job's rate is its mean since its
        # last read, every resctrl.quiet_read_every ticks: past two such rounds none of
        # them reaches back to the hogs' start (a mean over it read a free rate too low,
        # and so a cap for c below what MBA can hold, under a loaded suite)
        for _ in range(2 * h.config.resctrl.quiet_read_every):
            h.tick()
        free = sorted(bandwidth(x, "c") for x in h.results[-3:])[1]
        caps = {"a": 0.8 * free, "b": 0.8 * free, "c": 0.6 * free}  # the sum reachable with MBA alone
        for job in ("a", "b"):
            store.set(Override(f"sim:{job}", 0, 0, "test", clock(), None, caps[job]))
        h.until(lambda r: all(r.caps.get(f"sim:{j}") is not None and r.caps[f"sim:{j}"].mode == "noded"
                              for j in ("a", "b")), 5, "a and b each steered in its own group")
        store.set(Override("sim:c", 0, 0, "test", clock(), None, caps["c"]))
        h.until(lambda r: r.caps.get("sim:c") is not None, 5, "c capped")
        for _ in range(16):
            h.tick()
        # never unlimited: the group's sum is steered to the strictest cap (c's), so c is under its own
        held = [bandwidth(x, "c") for x in h.results[-6:]]
        assert max(held) <= caps["c"] * 1.05, (held, caps["c"])
        both = [bandwidth(x, "a") + bandwidth(x, "c") for x in h.results[-6:]]
        assert sum(both) / len(both) <= caps["c"] * 1.05, (both, caps["c"])
        r = h.results[-1]
        c = r.caps["sim:c"]
        # a and b have the same cap: the fewest sharers, then the name, pick a's group
        host = h.daemon.parts.throttle.cap_name("sim:a")
        assert c.shared_group == host and c.shared_with == ("sim:a",) and c.mode is None
        assert r.caps["sim:a"].steered_for == ("sim:c",)
        assert "shares CLOSID" in _cap_why(c) and "until a CLOSID is free" in _cap_why(c)
        assert 'noded_job_cap_shared_closid{job_id="sim:c"} 1.0' in scrape_text(h)
        # said once, not every tick; no failed move every tick
        assert len(said(caplog, "cap-shared", "c")) == 1
        assert not said(caplog, "apply-failed", "c")
        # a CLOSID frees: b's cap ends, its group goes, and c moves to a group of its own
        store.clear("sim:b", 0)
        r = h.until(lambda r: r.caps["sim:c"].shared_group is None and r.caps["sim:c"].mode == "noded", 5,
                    "c in its own group")
        rc = h.rc()
        assert h.daemon.parts.throttle.cap_name("sim:c") in [g.name for g in rc.list_ctrl_groups()]
        assert r.caps["sim:a"].steered_for == ()
        assert len(said(caplog, "cap-unshared", "c")) == 1
        for _ in range(12):
            h.tick()
        held = [bandwidth(x, "c") for x in h.results[-4:]]
        assert sum(held) / len(held) <= caps["c"] * 1.05, held
        assert h.daemon.parts.caps.holders["sim:c"].cap == caps["c"]  # its own holder, steering to its own cap
        h.daemon.shutdown()  # nothing of noded's left behind
        assert not [g.name for g in h.rc().list_ctrl_groups() if g.name.startswith(h.rc().prefix)]
        assert not h.daemon.parts.caps.holders
    finally:
        h.stop()


def test_with_every_closid_a_levels_a_capped_job_is_held_at_the_lowest_value_then_takes_that_closid(
        tmp_path, caplog):
    from support.eliminator import Harness

    caplog.set_level(logging.INFO)
    h = Harness(tmp_path, THREE_HOGS, profile="intel-few-closids", peak=1000, gpus=1)
    try:
        clock = WallClock()
        h.daemon.control.overrides = store = OverrideStore(h.config.state_dir, clock)
        h.until(lambda r: sum(bandwidth(x, "c") is not None and bandwidth(x, "c") > 0 for x in h.results) >= 3, 15,
                "the hogs running")
        # the node is quiet (nothing capped yet), so each job's rate is its mean since its
        # last read, every resctrl.quiet_read_every ticks: past two such rounds none of
        # them reaches back to the hogs' start (a mean over it read a free rate too low,
        # and so a cap for c below what MBA can hold, under a loaded suite)
        for _ in range(2 * h.config.resctrl.quiet_read_every):
            h.tick()
        free = sorted(bandwidth(x, "c") for x in h.results[-3:])[1]
        # operators hold a at the deepest level and b at the second: both CLOSIDs are levels'
        store.set(Override("sim:a", 5, 0, "test", clock(), None))
        store.set(Override("sim:b", 2, 0, "test", clock(), None))
        h.until(lambda r: r.levels.get("sim:a") == 5 and r.levels.get("sim:b") == 2, 5, "a and b at their levels")
        cap = 0.6 * free
        store.set(Override("sim:c", 0, 0, "test", clock(), None, cap))
        h.until(lambda r: r.caps.get("sim:c") is not None, 5, "c capped")
        for _ in range(8):
            h.tick()
        # never unlimited: in the level group with the lowest value, held exactly as a is
        held = [bandwidth(x, "c") for x in h.results[-4:]]
        beside = [bandwidth(x, "a") for x in h.results[-4:]]
        assert max(held) <= cap * 1.05 and sum(held) <= 1.1 * sum(beside), (held, beside, cap)
        r = h.results[-1]
        c = r.caps["sim:c"]
        deepest = h.daemon.parts.throttle.ctrl_name(5)
        assert c.shared_group == deepest and c.shared_with == ("sim:a",)
        assert "shares CLOSID" in _cap_why(c) and "held at MB=10" in _cap_why(c)
        assert set(h.rc().ctrl_group(deepest).read_schemata()["MB"].values()) == {10}
        # a released: c is alone in the deepest level's group, whose CLOSID becomes its own (b still
        # holds the other: no CLOSID was free), made at the value c was held at, so no burst
        store.clear("sim:a", 0)
        r = h.until(lambda r: r.caps["sim:c"].shared_group is None and r.caps["sim:c"].mode == "noded", 5,
                    "c in its own group")
        names = [g.name for g in h.rc().list_ctrl_groups()]
        assert h.daemon.parts.throttle.cap_name("sim:c") in names and deepest not in names
        assert r.levels.get("sim:b") == 2 and "sim:a" not in r.levels
        taken = [rec.getMessage() for rec in said(caplog, "applied", "c") if "made its own" in rec.getMessage()]
        assert len(taken) == 1 and "MB=10 " in taken[0], taken
        assert len(said(caplog, "cap-shared", "c")) == 1 and len(said(caplog, "cap-unshared", "c")) == 1
        assert not said(caplog, "apply-failed", "c")
        h.daemon.shutdown()
        assert not [g.name for g in h.rc().list_ctrl_groups() if g.name.startswith(h.rc().prefix)]
    finally:
        h.stop()


def test_stopped_while_a_job_shares_a_group_nothing_of_nodeds_is_left(tmp_path):
    from support.eliminator import Harness

    h = Harness(tmp_path, THREE_HOGS, profile="intel-few-closids", peak=1000, gpus=1)
    try:
        clock = WallClock()
        h.daemon.control.overrides = store = OverrideStore(h.config.state_dir, clock)
        h.until(lambda r: all(bandwidth(r, j) for j in "abc"), 15, "the hogs running")
        for job in "abc":
            store.set(Override(f"sim:{job}", 0, 0, "test", clock(), None, 12e9))
        h.until(lambda r: r.caps.get("sim:c") is not None and r.caps["sim:c"].shared_group is not None, 5,
                "c sharing a group")
        h.daemon.shutdown()
        rc = h.rc()
        assert not [g.name for g in rc.list_ctrl_groups() if g.name.startswith(rc.prefix)]
        assert not h.daemon.parts.caps.holders
    finally:
        h.stop()


def test_left_alone_in_a_cap_group_whose_cap_ended_a_job_takes_its_closid(tmp_path, caplog):
    import os

    from support.eliminator import Harness

    caplog.set_level(logging.INFO)
    h = Harness(tmp_path, THREE_HOGS, profile="intel-few-closids", peak=1000, gpus=1)
    try:
        rc = h.rc()
        other = os.path.join(rc.root, "other-tool")
        os.mkdir(other)  # another tool's group holds one of the two CLOSIDs
        clock = WallClock()
        h.daemon.control.overrides = store = OverrideStore(h.config.state_dir, clock)
        h.until(lambda r: sum(bandwidth(x, "c") is not None and bandwidth(x, "c") > 0 for x in h.results) >= 3, 15,
                "the hogs running")
        # the node is quiet (nothing capped yet), so each job's rate is its mean since its
        # last read, every resctrl.quiet_read_every ticks: past two such rounds none of
        # them reaches back to the hogs' start (a mean over it read a free rate too low,
        # and so a cap for c below what MBA can hold, under a loaded suite)
        for _ in range(2 * h.config.resctrl.quiet_read_every):
            h.tick()
        free = sorted(bandwidth(x, "c") for x in h.results[-3:])[1]
        cap = 0.6 * free
        store.set(Override("sim:a", 0, 0, "test", clock(), None, 0.8 * free))
        h.until(lambda r: r.caps.get("sim:a") is not None and r.caps["sim:a"].mode == "noded", 5, "a steered")
        store.set(Override("sim:c", 0, 0, "test", clock(), None, cap))
        h.until(lambda r: r.caps.get("sim:c") is not None and r.caps["sim:c"].shared_group is not None, 5,
                "c sharing a's group")
        store.clear("sim:a", 0)  # a's cap ends: c is alone in a's group, and its CLOSID becomes c's
        h.until(lambda r: "sim:a" not in r.caps and r.caps["sim:c"].shared_group is None
                and r.caps["sim:c"].mode == "noded", 5, "c steering a group of its own")
        names = [g.name for g in h.rc().list_ctrl_groups()]
        assert h.daemon.parts.throttle.cap_name("sim:c") in names and h.daemon.parts.throttle.cap_name("sim:a") not in names
        assert os.path.isdir(other)  # no CLOSID was free
        for _ in range(12):
            h.tick()
        held = [bandwidth(x, "c") for x in h.results[-4:]]
        assert sum(held) / len(held) <= cap * 1.05, (held, cap)
        assert h.daemon.parts.caps.holders["sim:c"].cap == cap  # its own holder, steering to its own cap
        free_a = [bandwidth(x, "a") for x in h.results[-4:]]
        assert min(free_a) > 0.9 * free, free_a  # a is no longer held with c
        assert len(said(caplog, "cap-shared", "c")) == 1 and len(said(caplog, "cap-unshared", "c")) == 1
        assert not said(caplog, "apply-failed", "c")
        h.daemon.shutdown()
        assert not [g.name for g in h.rc().list_ctrl_groups() if g.name.startswith(h.rc().prefix)]
    finally:
        h.stop()


def test_where_other_tools_hold_every_closid_a_capped_job_is_said_unheld_once_then_held_once_one_is_free(
        tmp_path, caplog):
    import os

    from support.eliminator import Harness

    caplog.set_level(logging.INFO)
    h = Harness(tmp_path, THREE_HOGS, profile="intel-few-closids", peak=1000, gpus=1)
    try:
        rc = h.rc()
        others = [os.path.join(rc.root, f"other-tool-{i}") for i in (1, 2)]
        for path in others:
            os.mkdir(path)  # another tool's groups hold both CLOSIDs: noded has none to share
        clock = WallClock()
        h.daemon.control.overrides = store = OverrideStore(h.config.state_dir, clock)
        h.until(lambda r: sum(bandwidth(x, "c") is not None and bandwidth(x, "c") > 0 for x in h.results) >= 3, 15,
                "the hogs running")
        # the node is quiet (nothing capped yet), so each job's rate is its mean since its
        # last read, every resctrl.quiet_read_every ticks: past two such rounds none of
        # them reaches back to the hogs' start (a mean over it read a free rate too low,
        # and so a cap for c below what MBA can hold, under a loaded suite)
        for _ in range(2 * h.config.resctrl.quiet_read_every):
            h.tick()
        free = sorted(bandwidth(x, "c") for x in h.results[-3:])[1]
        store.set(Override("sim:c", 0, 0, "test", clock(), None, 0.6 * free))
        h.until(lambda r: r.caps.get("sim:c") is not None, 5, "c capped")
        for _ in range(8):
            h.tick()
        # said once, not a failed move every tick
        assert not said(caplog, "apply-failed", "c") and len(said(caplog, "cap-unheld", "c")) == 1
        assert h.results[-1].caps["sim:c"].shared_group == ""
        assert "NOT held" in _cap_why(h.results[-1].caps["sim:c"])
        assert 'noded_job_cap_shared_closid{job_id="sim:c"} 1.0' in scrape_text(h)
        os.rmdir(others[0])
        r = h.until(lambda r: r.caps["sim:c"].shared_group is None and r.caps["sim:c"].mode == "noded", 5,
                    "c in its own group")
        assert len(said(caplog, "cap-unshared", "c")) == 1
        assert h.daemon.parts.throttle.cap_name("sim:c") in [g.name for g in h.rc().list_ctrl_groups()]
        assert r.caps["sim:c"].shared_group is None
    finally:
        h.stop()


def test_a_capped_jobs_groups_left_under_names_before_2026_11_give_way_to_the_new_ones_and_none_is_left(tmp_path):
    # Noded before 2026-11 named groups with SHA-1's first 32 bits. A capped job's groups
    # left under those names (its stop's rmdir failed, and so did the start's orphan
    # removal) are no job's to this noded: the old monitoring group is read and removed,
    # the job goes to its cap group under the new name (its processes with it, from the
    # old one, in the first tick), the old cap group is removed once empty, and nothing of
    # noded's is left under an old name. Its first rate reads low (its new group counted
    # nothing yet), never a spike; then its own again.
    import hashlib
    import re

    from noded.samplers.mongroups import group_name
    from support.eliminator import Harness

    h = Harness(tmp_path, "  - {at: 0, start: {id: a, cpu: hog}}\n", profile="intel", peak=1000, gpus=1)
    try:
        h.sim.step()  # the hog started, not yet seen by noded
        job = "sim:a"
        pids = h.sim.discovery.discover()[job].pids
        rc = h.rc()
        old = f"job-{re.sub(r'[^A-Za-z0-9_.-]', '_', job)[:40]}-{hashlib.sha1(job.encode()).hexdigest()[:8]}"
        old_cap = rc.create_ctrl_group(f"{rc.prefix}cap-{old}")
        old_mon = old_cap.create_mon_group(f"{rc.prefix}{old}")
        for pid in sorted(pids):
            old_cap.add_process(pid)
            old_mon.add_process(pid)
        clock = WallClock()
        h.daemon.control.overrides = store = OverrideStore(h.config.state_dir, clock)
        store.set(Override(job, 0, 0, "test", clock(), None, 0.5e9))
        new_cap, new_mon = h.daemon.parts.throttle.cap_name(job), group_name(rc.prefix, job)
        assert new_cap != old_cap.name and new_mon != old_mon.name

        def settled(r):
            groups = {g.path.removeprefix(rc.root) for g in rc.owned_groups()}
            return r.caps.get(job) is not None and groups == {f"/{new_cap}", f"/{new_cap}/mon_groups/{new_mon}"}

        h.until(settled, 15, "a in its cap group under the new names, the old groups gone")
        owned = sorted(g.name for g in rc.owned_groups())
        assert old_cap.name not in owned and old_mon.name not in owned, owned
        with open(f"{rc.root}/{new_cap}/tasks") as f:
            assert pids <= {int(t) for t in f.read().split()}
        for _ in range(8):  # its processes counted in its own group again (they joined it)
            h.tick()
        rates = [bandwidth(x, "a") for x in h.results]
        assert rates[-1] is not None and rates[-1] > 0.1e9, rates
        assert all(r is None or r <= 1.1 * 16e9 for r in rates), rates  # a hog demands 16 GB/s: no spike
        h.daemon.shutdown()  # nothing of noded's left behind
        assert not [g.name for g in h.rc().owned_groups()]
    finally:
        h.stop()
