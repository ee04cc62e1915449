"""The node's measured peak memory bandwidth, kept in the state directory.

``noded calibrate`` (``noded.commands.calibrate``) measures it (all cores, STREAM triad) and
writes ``calibration.json`` next to noded's other state; noded takes it at start
and on reload when the config leaves ``peak_gbps_per_domain`` unset. A value in
the config always wins: an operator's number is never overridden by a file.

The file is read and written through the checked state directory (``SecureDir``).
Unlike noded's own records, a bad calibration is refused with its reason rather than
moved aside: it is an operator's measurement, like the config, and a silent default
would throttle by the wrong peak.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from noded.stores.securedir import ABSENT, DirectoryMissing, SecureDir, SecureDirError, StateFileError, StateReadError

FILE = "calibration.json"


class CalibrationError(ValueError):
    pass


@dataclass(frozen=True)
class Calibration:
    peak_gbps_per_domain: float
    domains: int  # L3 domains the measured total was divided over
    measured_at: str  # ISO 8601, UTC
    command: str  # what produced it, to run again


def calibration_path(state_dir: str) -> str:
    return os.path.join(state_dir, FILE)


def _state_path(state_dir: str | SecureDir) -> str:
    return state_dir.path if isinstance(state_dir, SecureDir) else state_dir


def read_calibration(state_dir: str | SecureDir) -> Calibration | None:
    """The calibration; None where there is none. Raises CalibrationError naming the file."""
    path = calibration_path(_state_path(state_dir))
    try:
        if isinstance(state_dir, SecureDir):
            data = state_dir.read_json(FILE)
        else:
            with SecureDir(state_dir, create=False) as d:
                data = d.read_json(FILE)
    except DirectoryMissing:
        return None
    except (SecureDirError, StateFileError, StateReadError) as e:
        raise CalibrationError(str(e)) from None
    if data is ABSENT:
        return None
    if not isinstance(data, dict):
        raise CalibrationError(f"{path}: expected a JSON object, found {type(data).__name__}")
    fields = {f.name for f in dataclasses.fields(Calibration)}
    if set(data) != fields:
        raise CalibrationError(f"{path}: expected the keys {sorted(fields)}, found {sorted(data)}")
    peak = data["peak_gbps_per_domain"]
    if isinstance(peak, bool) or not isinstance(peak, (int, float)) or not 0 < peak < math.inf:
        raise CalibrationError(f"{path}: peak_gbps_per_domain must be a positive number, got {peak!r}")
    domains = data["domains"]
    if type(domains) is not int or domains < 1:
        raise CalibrationError(f"{path}: domains must be a positive integer, got {str(domains)[:40]}")
    for name in ("measured_at", "command"):
        if not isinstance(data[name], str):
            raise CalibrationError(f"{path}: {name} must be a string")
    return Calibration(float(peak), domains, data["measured_at"], data["command"])


def write_calibration(state_dir: str | SecureDir, calibration: Calibration) -> str:
    """Write the calibration durably; returns its path. Raises StateWriteError, or
    SecureDirError for a state directory another user could change."""
    if isinstance(state_dir, SecureDir):
        state_dir.write_json(FILE, dataclasses.asdict(calibration))
    else:
        with SecureDir(state_dir, mode=0o700) as d:
            d.write_json(FILE, dataclasses.asdict(calibration))
    return calibration_path(_state_path(state_dir))
