"""`noded run`'s own arguments: a duration beyond what a timer holds is refused at the
command line. Before: `noded run --duration 99999999999d` started noded, printed an
OverflowError traceback from the timer's thread, and ran on without its duration."""

import subprocess
import sys

import pytest

from noded.commands.cli import MAX_RUN_DURATION_S, _duration


@pytest.mark.parametrize("text", ["99999999999d", "400d", f"{MAX_RUN_DURATION_S + 1:.0f}"])
def test_a_duration_no_timer_holds_is_refused_naming_the_bound(tmp_path, text):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"state_dir: {tmp_path}/state\nruntime_dir: {tmp_path}/run\nnvml: false\n"
                   "metrics: {address: 127.0.0.1, port: 0}\n")
    p = subprocess.run([sys.executable, "-m", "noded", "run", "--config", str(cfg), "--duration", text],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert f"bad duration {text!r}: it must be more than 0 and at most 365d" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "run").exists()  # nothing started


def test_a_year_is_taken():
    assert _duration("365d") == MAX_RUN_DURATION_S
