"""The node peak: a number in the config wins; else the calibration in the state
directory (what `noded calibrate` measures and writes); else the default, said so."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.calibrating import calibrate_small
from noded.commands.wiring import with_node_peak
from noded.stores.calibration import Calibration, CalibrationError, read_calibration, write_calibration
from noded.config import DEFAULT_PEAK_GBPS, Config, parse_config
from test_lifecycle import cpu_only_config

CAL = Calibration(12.5, 1, "2026-11-22T05:00:00+00:00", "noded calibrate")


def test_the_calibration_is_used_when_the_config_leaves_the_peak_unset(tmp_path):
    write_calibration(str(tmp_path), CAL)
    config, note = with_node_peak(Config(state_dir=str(tmp_path)))
    assert config.peak_gbps_per_domain == 12.5 and config.peak_bytes_per_domain == 12.5e9
    assert "measured 2026-11-22T05:00:00+00:00 by `noded calibrate`" in note


def test_a_peak_in_the_config_wins_over_the_calibration(tmp_path):
    write_calibration(str(tmp_path), CAL)
    config, note = with_node_peak(parse_config(f"peak_gbps_per_domain: 30\nstate_dir: {tmp_path}\n"))
    assert config.peak_gbps_per_domain == 30 and "from the config" in note


def test_without_either_the_default_stands_and_the_note_says_how_to_measure(tmp_path):
    config, note = with_node_peak(Config(state_dir=str(tmp_path)))
    assert config.peak_gbps_per_domain == DEFAULT_PEAK_GBPS
    assert "a default" in note and "run `noded calibrate`" in note


@pytest.mark.parametrize("content, expected", [
    ("{not json", "not valid JSON"),
    ('{"peak_gbps_per_domain": 10}', "expected the keys"),
    (json.dumps({**CAL.__dict__, "peak_gbps_per_domain": -3}), "must be a positive number, got -3"),
    (json.dumps({**CAL.__dict__, "peak_gbps_per_domain": True}), "must be a positive number, got True"),
    (json.dumps({**CAL.__dict__, "peak_gbps_per_domain": float("inf")}), "must be a positive number, got inf"),
    (json.dumps({**CAL.__dict__, "domains": "2"}), "domains must be a positive integer, got 2"),
    (json.dumps({**CAL.__dict__, "command": ["make"]}), "command must be a string"),
    ("null", "expected a JSON object, found NoneType"),
])
def test_a_bad_calibration_file_is_an_error_naming_the_file(tmp_path, content, expected):
    (tmp_path / "calibration.json").write_text(content)
    with pytest.raises(CalibrationError, match=expected) as e:
        read_calibration(str(tmp_path))
    assert str(tmp_path / "calibration.json") in str(e.value)


@given(st.floats(0.01, 1e4, allow_nan=False), st.integers(1, 16), st.text(max_size=40))
def test_calibrations_round_trip(tmp_path_factory, peak, domains, command):
    d = str(tmp_path_factory.mktemp("cal"))
    cal = Calibration(peak, domains, "2026-11-22T05:00:00+00:00", command)
    write_calibration(d, cal)
    assert read_calibration(d) == cal


def test_noded_run_reports_the_calibrated_peak_and_refuses_a_bad_file(tmp_path):
    cfg = cpu_only_config(tmp_path)
    write_calibration(str(tmp_path / "state"), CAL)
    p = subprocess.run([sys.executable, "-m", "noded", "run", "--config", str(cfg), "--duration", "0.5"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "noded: node peak 12.5 GB/s per L3 domain (measured" in p.stdout
    (tmp_path / "state" / "calibration.json").write_text("[]")
    p = subprocess.run([sys.executable, "-m", "noded", "run", "--config", str(cfg), "--duration", "0.5"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "calibration.json: expected a JSON object" in p.stderr


def test_noded_calibrate_measures_and_writes_what_noded_reads(tmp_path):
    state = tmp_path / "state"  # made by the command, 0700
    p, cal = calibrate_small(["noded", "calibrate"], str(state))
    assert cal.command == f"noded calibrate --seconds 2 --size 32 --state-dir {state}"
    assert f"wrote {state}/calibration.json" in p.stdout and oct(state.stat().st_mode & 0o777) == "0o700"
    config, note = with_node_peak(Config(state_dir=str(state)))
    assert config.peak_gbps_per_domain == cal.peak_gbps_per_domain and f"by `{cal.command}`" in note


def test_noded_calibrate_says_the_absolute_state_dir_noded_must_name_for_a_relative_one(tmp_path):
    """`make bench` passes a relative --state-dir (bench/out/state): it is taken from the
    current directory, and the output names the absolute one (it said 'wrote
    rel/calibration.json', and noded's state_dir, which must be absolute, never reads that)."""
    p = subprocess.run([sys.executable, "-m", "noded", "calibrate", "--seconds", "2", "--size", "8",
                        "--state-dir", "out/state"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert p.returncode == 0, p.stderr
    state = tmp_path / "out" / "state"
    assert read_calibration(str(state)).command == "noded calibrate --seconds 2 --size 8 --state-dir out/state"
    assert f"wrote {state}/calibration.json\n" in p.stdout
    assert f"where its config's state_dir is {state} and its peak_gbps_per_domain unset" in p.stdout


def test_noded_calibrate_refuses_an_empty_state_dir(tmp_path):
    """'' taken from the current directory would be the current directory."""
    p = subprocess.run([sys.executable, "-m", "noded", "calibrate", "--state-dir", ""], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert p.returncode == 2 and "--state-dir is empty" in p.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["--seconds", "1"], "--seconds must be a finite number of at least 2"),
    (["--seconds", "nan"], "--seconds must be a finite number of at least 2"),
    (["--size", "0"], "--size must be at least 1 MiB"),
    (["--threads", "0"], "--threads must be at least 1"),
    # Before: started 100 000 threads on this 2-CPU box, and was still starting them at 30 s.
    (["--threads", "100000", "--size", "8", "--seconds", "2"], "--threads must be at most "),
])
def test_noded_calibrate_refuses_bad_arguments_by_name(tmp_path, args, message):
    p = subprocess.run([sys.executable, "-m", "noded", "calibrate", "--state-dir", str(tmp_path / "s"), *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and message in p.stderr and not (tmp_path / "s").exists()


def test_noded_calibrate_refuses_a_state_dir_it_may_not_use_before_measuring(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    p = subprocess.run([sys.executable, "-m", "noded", "calibrate", "--seconds", "2", "--size", "8",
                        "--state-dir", str(not_a_dir)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and f"state directory {not_a_dir}" in p.stderr and "not a directory" in p.stderr
    assert "triad on" not in p.stderr and "Traceback" not in p.stderr  # refused before measuring

