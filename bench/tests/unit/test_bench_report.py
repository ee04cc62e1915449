"""bench.report: each marked block gets its command's output; others stay as they were."""

import pytest

from bench.report import refresh

TEXT = ("# Results\n\n<!-- output of: python -m bench.a -->\n```\nold a\n```\n\nprose\n\n"
        "<!-- output of: python -m bench.b -->\n```\nold b\nmore\n```\n")


def test_every_marked_block_takes_its_commands_output_and_the_stamp_goes_under_the_title():
    new = refresh(TEXT, None, runner=lambda command: f"{command} said\nthis\n", today="2026-11-22")
    assert "```\npython -m bench.a said\nthis\n```\n\nprose" in new
    assert "```\npython -m bench.b said\nthis\n```\n" in new
    assert new.split("\n")[2].startswith("_Refreshed by `make bench` on 2026-11-22")
    again = refresh(new, None, runner=lambda command: "x", today="2026-11-23")
    assert again.count("_Refreshed by") == 1 and "on 2026-11-23" in again


def test_only_runs_the_commands_it_names():
    ran = []
    new = refresh(TEXT, "bench.b", runner=lambda command: ran.append(command) or "B", today="d")
    assert ran == ["python -m bench.b"] and "```\nold a\n```" in new and "```\nB\n```" in new


def test_a_marker_without_a_block_is_an_error_with_its_line():
    with pytest.raises(ValueError, match="RESULTS.md:1: a marker must be followed by a fenced block"):
        refresh("<!-- output of: python -m x -->\ntext\n", None, runner=lambda c: "")
