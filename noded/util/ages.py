"""Durations and ages in one syntax, everywhere noded prints or reads one.

Printed as kubectl prints ages (``9m30s``, ``2h5m``, ``3d4h``, ``45s``, ``0.4s`` under ten
seconds, where a tick's fraction matters); read as nodectl and ``noded run --duration``
read them: a number of seconds, or a number with a unit s, m, h or d (``90``, ``30s``,
``15m``, ``2h``, ``1d``).
"""

from __future__ import annotations

import math
import re

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")


class DurationError(ValueError):
    """Not a duration: the message names the text and the syntax."""


def parse_duration(text: str) -> float:
    """'90', '30s', '15m', '2h', '1d' -> seconds."""
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise DurationError(f"bad duration {text!r}: use e.g. 90, 30s, 15m, 2h, 1d")
    return float(m.group(1)) * _UNITS[m.group(2)]


def format_age(seconds: float) -> str:
    """An age or a duration as kubectl prints one: the two largest units (``9m30s``,
    ``2h5m``, ``3d4h``); under ten seconds with a tenth (``0.4s``, ``9.5s``), else whole."""
    if isinstance(seconds, float) and not math.isfinite(seconds):  # NaN, or an Infinity json read
        return "unknown"
    if seconds < 0:
        return "-" + format_age(-seconds)
    if seconds < 10:
        return f"{seconds:.1f}".rstrip("0").rstrip(".") + "s"
    s = int(seconds)
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    return f"{secs}s"
