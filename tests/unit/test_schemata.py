"""Schemata parsing and formatting are pure; properties hold for any values."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resctrl.schemata import (
    MbFlavour,
    MbLimits,
    SchemataParseError,
    changed_values,
    format_schemata,
    normalize_mb,
    parse_schemata,
)

domains = st.lists(st.integers(0, 255), min_size=1, max_size=6, unique=True)
cache_names = st.sampled_from(["L3", "L2", "L3CODE", "L3DATA"])


@st.composite
def schematas(draw):
    names = draw(st.lists(cache_names, unique=True, max_size=3))
    ids = draw(domains)
    out = {n: {d: draw(st.integers(1, (1 << 20) - 1)) for d in ids} for n in names}
    if draw(st.booleans()):
        out["MB"] = {d: draw(st.integers(0, 0xFFFFFFFF)) for d in ids}
    return out


@given(schematas(), st.booleans())
def test_format_then_parse_round_trips(s, align):
    assert parse_schemata(format_schemata(s, align=align)) == {k: v for k, v in s.items() if v}


@given(schematas())
def test_parse_accepts_kernel_padding(s):
    # Pre-2025 kernels pad MB values to width 3 and masks with zeros.
    lines = []
    for res, vals in s.items():
        fmt = "{}={:>3}" if res == "MB" else "{}={:08x}"
        lines.append(f"{res:>6}:" + ";".join(fmt.format(d, v) for d, v in vals.items()))
    assert parse_schemata("\n".join(lines) + "\n") == s


def test_parse_known_kernel_outputs():
    assert parse_schemata("L3CODE:0=7ff;2=7ff\nL3DATA:0=7ff;2=7ff\n    MB:0=100;2= 50\n") == {
        "L3CODE": {0: 0x7FF, 2: 0x7FF}, "L3DATA": {0: 0x7FF, 2: 0x7FF}, "MB": {0: 100, 2: 50}}


@pytest.mark.parametrize("text,where", [
    ("MB0=100\n", "missing 'RESOURCE:'"),
    ("MB:0=100;0=90\n", "domain 0 appears twice"),
    ("MB:x=100\n", "bad domain entry"),
    ("MB:0=zz\n", "bad value 'zz'"),
    ("MB:0=1\nMB:1=2\n", "resource MB appears twice"),
])
def test_parse_errors_name_the_line(text, where):
    with pytest.raises(SchemataParseError) as e:
        parse_schemata(text)
    assert where in str(e.value) and "line" in str(e.value)


@given(schematas(), schematas())
def test_changed_values_is_exactly_the_difference(current, desired):
    diff = changed_values(current, desired)
    for res, vals in diff.items():
        for d, v in vals.items():
            assert desired[res][d] == v and current.get(res, {}).get(d) != v
    # Applying the diff over current gives desired wherever desired speaks.
    merged = {r: dict(v) for r, v in current.items()}
    for res, vals in diff.items():
        merged.setdefault(res, {}).update(vals)
    for res, vals in desired.items():
        for d, v in vals.items():
            assert merged[res][d] == v


def test_changed_values_of_equal_is_empty():
    s = {"MB": {0: 50, 1: 100}}
    assert changed_values(s, s) == {} and format_schemata({}) == ""


INTEL = MbLimits(MbFlavour.PERCENT, 10, 10, 100)
AMD = MbLimits(MbFlavour.AMD_UNITS, 0, 1, 2048)
MBPS = MbLimits(MbFlavour.MBPS, 0, 1, 0xFFFFFFFF)


@given(st.integers(-10**6, 10**6))
def test_normalize_intel_is_in_range_on_the_grid_and_never_below_request(v):
    n = normalize_mb(v, INTEL)
    assert 10 <= n <= 100 and n % 10 == 0
    assert n >= min(max(v, 10), 100)
    assert normalize_mb(n, INTEL) == n  # idempotent: what the kernel reads back


@given(st.integers(-10**6, 10**10))
def test_normalize_amd_and_mbps_clamp(v):
    assert normalize_mb(v, AMD) == max(0, min(v, 2048))
    assert normalize_mb(v, MBPS) == max(0, min(v, 0xFFFFFFFF))


def test_normalize_intel_rounds_up():
    assert [normalize_mb(v, INTEL) for v in (5, 11, 20, 29, 100, 150)] == [10, 20, 20, 30, 100, 100]
