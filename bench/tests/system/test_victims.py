"""The victim workloads: they make samples, report each second in JSON, stop cleanly."""

import json
import signal
import subprocess
import sys

import pytest

from bench.victims import VICTIMS, make_victim


@pytest.mark.parametrize("name", VICTIMS)
def test_each_victim_makes_batches_and_counts_their_bytes(name):
    victim = make_victim(name)
    samples, moved = victim.step()
    assert samples > 0 and moved > samples  # bytes per sample, not per batch


def test_an_unknown_victim_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown victim 'resnet'; one of"):
        make_victim("resnet")


@pytest.mark.parametrize("name", VICTIMS)
def test_json_reports_each_second_then_a_summary(name):
    p = subprocess.run([sys.executable, "-m", "bench.victims", name, "--json", "--duration", "2.2"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert lines[0] == {"ready": name}
    reports = lines[1:-1]
    assert [round(r["t"]) for r in reports] == [1, 2]
    assert all(set(r) == {"t", "samples_per_s", "approx_gbps"} and r["samples_per_s"] > 0 for r in reports)
    summary = lines[-1]["summary"]
    assert summary["victim"] == name and summary["samples"] > 0 and summary["seconds"] >= 2.2


def test_sigterm_stops_a_victim_with_a_summary():
    p = subprocess.Popen([sys.executable, "-m", "bench.victims", "decode", "--json"], stdout=subprocess.PIPE, text=True)
    assert json.loads(p.stdout.readline()) == {"ready": "decode"}
    assert "samples_per_s" in p.stdout.readline()
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and json.loads(out.splitlines()[-1])["summary"]["samples"] > 0
