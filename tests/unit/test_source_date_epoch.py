"""SOURCE_DATE_EPOCH as reproducible-builds.org's specification reads it (noded.util.buildinfo,
which packaging/stage.py and the man pages' date use): unset or empty, no fixed time; ASCII
digits, that many seconds; anything else a clear error naming the variable and its value."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from noded.commands import clidoc
from noded.util.buildinfo import SOURCE_DATE_EPOCH_MAX, source_date_epoch


def test_unset_or_empty_is_no_fixed_time():
    assert source_date_epoch({}) is None
    assert source_date_epoch({"SOURCE_DATE_EPOCH": ""}) is None  # before (stage.py): int('') raised


@given(st.integers(0, SOURCE_DATE_EPOCH_MAX))
def test_digits_are_that_many_seconds(n):
    assert source_date_epoch({"SOURCE_DATE_EPOCH": str(n)}) == n


@given(st.text(min_size=1))
def test_anything_else_is_an_error_naming_the_variable_and_its_value(text):
    digits = text.isascii() and text.isdigit() and int(text) <= SOURCE_DATE_EPOCH_MAX
    if digits:
        assert source_date_epoch({"SOURCE_DATE_EPOCH": text}) == int(text)
        return
    with pytest.raises(ValueError) as e:
        source_date_epoch({"SOURCE_DATE_EPOCH": text})
    assert str(e.value).startswith(f"SOURCE_DATE_EPOCH={text!r} is not a time")


@pytest.mark.parametrize("bad", ["1.5", "-1", " 12", "1_000", "١٢", str(SOURCE_DATE_EPOCH_MAX + 1)])
def test_what_int_would_take_or_turn_into_a_crash_is_refused(bad):
    with pytest.raises(ValueError, match="SOURCE_DATE_EPOCH="):
        source_date_epoch({"SOURCE_DATE_EPOCH": bad})


def test_the_man_pages_date_is_the_epochs_and_a_malformed_one_writes_nothing(monkeypatch, tmp_path, capsys):
    noded = clidoc.programs()[0]
    for value, date in (("", "2026-11-26"), ("1700000000", "2023-11-14")):
        monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
        assert f'"{date}"' in clidoc.man_page(noded).splitlines()[0]
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "abc")  # before: int('abc')'s traceback
    assert clidoc.main([str(tmp_path / "out")]) == 2
    assert "clidoc: SOURCE_DATE_EPOCH='abc' is not a time" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
