"""The node's measured peak memory bandwidth, kept in the state directory.

``python -m bench.scenario calibrate`` measures it (all cores, STREAM triad) and
writes ``calibration.json`` next to noded's other state; noded takes it at start
and on reload when the config leaves ``peak_gbps_per_domain`` unset. A value in
the config always wins: an operator's number is never overridden by a file.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .config import DEFAULT_PEAK_GBPS, Config
from .state import read_json_object, write_json_atomically

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


def read_calibration(state_dir: str) -> Calibration | None:
    path = calibration_path(state_dir)
    try:
        data = read_json_object(path, "a calibration")
    except ValueError as e:
        raise CalibrationError(str(e)) from None
    if not data:
        return None
    fields = {f.name for f in dataclasses.fields(Calibration)}
    if set(data) != fields:
        raise CalibrationError(f"{path}: expected the keys {sorted(fields)}, found {sorted(data)}")
    peak = data["peak_gbps_per_domain"]
    if isinstance(peak, bool) or not isinstance(peak, (int, float)) or peak <= 0:
        raise CalibrationError(f"{path}: peak_gbps_per_domain must be a positive number, got {peak!r}")
    return Calibration(float(peak), int(data["domains"]), str(data["measured_at"]), str(data["command"]))


def write_calibration(state_dir: str, calibration: Calibration) -> str:
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = calibration_path(state_dir)
    write_json_atomically(path, dataclasses.asdict(calibration))
    return path


def with_node_peak(config: Config) -> tuple[Config, str]:
    """The config with its node peak settled, and where that peak came from."""
    if config.peak_gbps_per_domain is not None:
        return config, "from the config"
    cal = read_calibration(config.state_dir)
    if cal is None:
        return (dataclasses.replace(config, peak_gbps_per_domain=DEFAULT_PEAK_GBPS),
                f"a default: no peak_gbps_per_domain in the config and no {calibration_path(config.state_dir)}; "
                f"run `python -m bench.scenario calibrate`")
    return (dataclasses.replace(config, peak_gbps_per_domain=cal.peak_gbps_per_domain),
            f"measured {cal.measured_at} by `{cal.command}`, {calibration_path(config.state_dir)}")
