"""The process-events connector's datagrams, parsed by noded.jobs.procevents.exec_pids:
any bytes give a list of pids (never an error), and an exec event gives its tgid."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from noded.jobs.procevents import PROC_EVENT_EXEC, exec_pids
from noded.util.ratelimit import TokenBuckets

PROC_EVENT_FORK = 0x00000001
u32 = st.integers(0, 2**32 - 1)


def event(what: int, pid: int, tgid: int, cpu: int = 0, ts: int = 0) -> bytes:
    """One datagram as the kernel sends it: nlmsghdr, cn_msg, proc_event (exec's pid, tgid)."""
    body = struct.pack("=IIQII", what, cpu, ts, pid, tgid)
    cn = struct.pack("=IIIIHH", 1, 1, 0, 0, len(body), 0) + body
    return struct.pack("=IHHII", 16 + len(cn), 3, 0, 0, 0) + cn


@given(st.binary(max_size=512))
def test_any_bytes_give_pids_and_never_an_error(data):
    assert all(isinstance(p, int) and 0 <= p < 2**32 for p in exec_pids(data))


@given(u32, u32, u32, st.integers(0, 2**64 - 1))
def test_an_exec_event_gives_its_tgid_and_a_fork_none(pid, tgid, cpu, ts):
    assert exec_pids(event(PROC_EVENT_EXEC, pid, tgid, cpu, ts)) == [tgid]
    assert exec_pids(event(PROC_EVENT_FORK, pid, tgid, cpu, ts)) == []


@given(st.lists(st.tuples(st.sampled_from([PROC_EVENT_EXEC, PROC_EVENT_FORK]), u32), max_size=8),
       st.binary(max_size=40))
def test_messages_in_one_datagram_are_each_read_and_a_truncated_tail_skipped(events, tail):
    data = b"".join(event(what, 1, tgid) for what, tgid in events)
    assert exec_pids(data + tail[:15]) == [tgid for what, tgid in events if what == PROC_EVENT_EXEC]


def test_a_budget_gives_its_rate_at_once_then_refills_with_time():
    now = [0.0]
    buckets = TokenBuckets(3, lambda: now[0])
    assert [buckets.take("a") for _ in range(4)] == [True, True, True, False]
    assert buckets.take("b")  # each key its own
    assert abs(buckets.wait("a") - 1 / 3) < 1e-9
    now[0] += 1 / 3
    assert buckets.take("a") and not buckets.take("a")
