"""What a cap holder owes its group, in bytes from its counters (noded.capping.account):
a shortfall made up within bounds, an overrun paid back whole. The holder's loop on a
starved host: tests/kernel/test_cap_starved_holder.py."""

import random

import pytest

from noded.capping.account import MAX_CREDIT_SHARE, ByteAccount

GB = 1e9
PERIOD_S = 0.1


def test_a_shortfall_is_made_up_only_to_half_a_period_and_only_while_held_back():
    account = ByteAccount(20 * GB, PERIOD_S)
    account.add(0.0, PERIOD_S, held_back=True)  # a whole period of nothing
    assert account.balance == pytest.approx(-MAX_CREDIT_SHARE * 20 * GB * PERIOD_S)
    account.add(0.0, PERIOD_S, held_back=False)  # at the top value: the job wanted no more
    assert account.balance == 0.0 and account.makeup_bps == 0.0


def test_a_shortfall_within_two_percent_or_in_a_stalled_period_is_not_owed():
    # a holder starved at random (beside stress-ng) stalls as often at the higher value,
    # where it goes over, as at the lower: making up the stalls would centre it on the cap
    # and leave no room for the ones over it
    account = ByteAccount(20 * GB, PERIOD_S)
    account.add(0.985 * 20 * GB * PERIOD_S, PERIOD_S, held_back=True)
    assert account.balance == 0.0
    account.add(16 * GB * 0.4, 0.4, held_back=True)  # 400 ms (a stall) at 16 GB/s
    assert account.balance == 0.0
    account.add(30 * GB * 0.1, 0.1, held_back=True)  # over: owed
    account.add(16 * GB * 0.4, 0.4, held_back=True)  # a stalled shortfall pays an overrun back, no further
    assert account.balance == 0.0


def test_an_overrun_is_paid_back_whole_and_a_new_cap_starts_a_new_account():
    account = ByteAccount(20 * GB, PERIOD_S)
    account.add(30 * GB * 0.3, 0.3, held_back=True)  # 300 ms at 30 GB/s: 3 GB over
    assert account.balance == pytest.approx(3 * GB)
    assert account.makeup_bps < 0
    account.set_cap(10 * GB)
    assert account.balance == 0.0


def test_the_seconds_between_read_middles_add_up_however_the_reads_were_starved():
    # each read somewhere in its span: the periods' bytes and seconds sum to the truth's,
    # off by the ends' spans only
    rng = random.Random(7)
    account = ByteAccount(20 * GB, PERIOD_S)
    t = 0.0
    reads = []
    for _ in range(200):
        span = rng.uniform(0.0, 0.08)
        reads.append((t, t + span))
        t += span + rng.uniform(0.0, 0.1)
    moved = 0.0
    for (a0, a1), (b0, b1) in zip(reads, reads[1:]):
        seconds = (b0 + b1) / 2 - (a0 + a1) / 2
        account.add(20 * GB * seconds, seconds, held_back=True)
        moved += seconds
    assert account.balance == pytest.approx(0.0, abs=1.0)
    assert moved == pytest.approx(sum(reads[-1]) / 2 - sum(reads[0]) / 2)
