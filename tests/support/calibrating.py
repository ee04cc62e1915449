"""Running a calibration command the way an operator does, and reading back what it wrote."""

from __future__ import annotations

import subprocess
import sys

from noded.stores.calibration import Calibration, read_calibration


def calibrate_small(module_argv: list[str], state_dir: str) -> tuple[subprocess.CompletedProcess, Calibration]:
    """``python -m <module_argv> --seconds 2 --size 32 --state-dir STATE``: the process (it must
    have succeeded) and the calibration it wrote, which must name a peak and a domain."""
    p = subprocess.run([sys.executable, "-m", *module_argv, "--seconds", "2", "--size", "32",
                        "--state-dir", state_dir], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    cal = read_calibration(state_dir)
    assert cal.peak_gbps_per_domain > 0 and cal.domains >= 1
    return p, cal
