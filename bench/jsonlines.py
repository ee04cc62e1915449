"""One JSON object per line on stdout, for the workloads a scenario reads."""

from __future__ import annotations

import json
import os
import sys


def emit(obj: dict) -> bool:
    """Print ``obj`` as a line; False once the reader has gone (a closed pipe), after which
    stdout is pointed at /dev/null so the interpreter's final flush stays quiet."""
    try:
        print(json.dumps(obj), flush=True)
        return True
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False
