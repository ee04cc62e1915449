"""One JSON object per line on stdout, for the workloads a scenario reads."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Callable


def emit(obj: dict) -> bool:
    """Print ``obj`` as a line; False once the reader has gone (a closed pipe), after which
    stdout is pointed at /dev/null so the interpreter's final flush stays quiet."""
    try:
        print(json.dumps(obj), flush=True)
        return True
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False


def stop_on_signals(stop: threading.Event) -> threading.Event:
    """SIGTERM and SIGINT set ``stop`` (a workload ends its run cleanly); returns it."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def reporter(as_json: bool, stop: threading.Event, progress: Callable[[dict], str]) -> Callable[[dict], None]:
    """Each line of a workload's run: a JSON line (a reader gone stops the run, as SIGTERM
    would), or ``progress(line)`` rewritten in place on stderr."""
    def report(line: dict) -> None:
        if as_json:
            if not emit(line):
                stop.set()
        else:
            print(f"\r{progress(line)}  ", end="", file=sys.stderr, flush=True)
    return report
