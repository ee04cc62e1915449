"""Pure parsers for /proc/mounts and MBM counter files, and the rate arithmetic."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resctrl.errors import NotMountedError
from resctrl.mbm import BandwidthMeter, CounterReading, parse_counter, rate_between
from resctrl.mounts import find_resctrl_mount, parse_mounts


def escape(field: str) -> str:
    # What the kernel's mangle() does for /proc/mounts.
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in field)


@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1))
def test_mount_target_escapes_round_trip(path):
    line = f"resctrl {escape(path)} resctrl rw,relatime,cdp 0 0\n"
    (m,) = parse_mounts(line)
    assert m.target == path and m.fstype == "resctrl" and m.cdp and not m.mba_mbps


def test_find_resctrl_mount(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\nresctrl /sys/fs/resctrl resctrl rw,relatime,mba_MBps 0 0\n")
    m = find_resctrl_mount(str(mounts))
    assert m.target == "/sys/fs/resctrl" and m.mba_mbps
    with pytest.raises(NotMountedError, match="no resctrl filesystem mounted at /elsewhere"):
        find_resctrl_mount(str(mounts), "/elsewhere")


@given(st.integers(0, 2**64 - 1))
def test_counter_values_parse(v):
    assert parse_counter(f"{v}\n") == CounterReading(v)


@pytest.mark.parametrize("word", ["Unavailable", "Error", "Unassigned"])
def test_counter_states_parse(word):
    r = parse_counter(word + "\n")
    assert r.value is None and r.state == word and not r.ok


def test_counter_garbage_is_an_error():
    with pytest.raises(ValueError, match="unexpected MBM counter content"):
        parse_counter("-5\n")


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.floats(0, 1e6), st.floats(-1e3, 1e3))
def test_rate_is_never_negative_or_absurd(a, b, t0, dt):
    r = rate_between(a, t0, b, t0 + dt, max_rate=1e12)
    if r is not None:
        assert 0 <= r <= 1e12
        assert b >= a and dt > 0


@given(st.lists(st.one_of(st.integers(0, 2**50), st.none()), min_size=2, max_size=30))
def test_meter_never_yields_negative_rates(values):
    meter = BandwidthMeter()
    for i, v in enumerate(values):
        sample = {0: {"mbm_total_bytes": CounterReading(v, "ok" if v is not None else "Unavailable")}}
        rates = meter.update(sample, float(i))
        assert rates[0] is None or rates[0] >= 0


def test_meter_handles_reset_unavailable_and_domains_leaving():
    m = BandwidthMeter()
    s = lambda **d: {int(k[1:]): {"mbm_total_bytes": CounterReading(v, "ok" if v is not None else "Error")}
                     for k, v in d.items()}
    assert m.update(s(d0=1000, d1=0), 0.0) == {0: None, 1: None}  # first sight: no rate yet
    assert m.update(s(d0=3000, d1=500), 1.0) == {0: 2000.0, 1: 500.0}
    assert m.update(s(d0=100, d1=None), 2.0) == {0: None, 1: None}  # reset; error
    assert m.update(s(d0=1100, d1=900), 3.0) == {0: 1000.0, 1: None}  # d1 re-baselines
    assert m.update(s(d0=2100), 4.0) == {0: 1000.0}  # domain 1 went away
    assert m.update(s(d0=2100, d1=5000), 5.0) == {0: 0.0, 1: None}  # and came back


def test_meter_rejects_implausible_jumps():
    m = BandwidthMeter(max_rate=1e9)
    m.update({0: {"mbm_total_bytes": CounterReading(0)}}, 0.0)
    assert m.update({0: {"mbm_total_bytes": CounterReading(10**12)}}, 1.0) == {0: None}
