"""For training scripts: tell noded how long an iteration took.

    from noded.colocation.client import report_iteration
    report_iteration(seconds)        # job id from $NODED_JOB (set by `nodectl admit`)

It never raises and never blocks for long: a training job must not fail or stall
because noded is away. Returns whether noded took the report.
"""

from __future__ import annotations

import json
import os

from noded.server.client import request_line

DEFAULT_SOCKET = "/run/noded/report.sock"


def report_iteration(seconds: float, job: str | None = None, socket_path: str | None = None,
                     timeout: float = 0.5) -> bool:
    job = job or os.environ.get("NODED_JOB")
    path = socket_path or os.environ.get("NODED_REPORT_SOCKET", DEFAULT_SOCKET)
    if not job:
        return False
    message = json.dumps({"version": 1, "command": "report", "args": {"job": job, "iteration_s": seconds}})
    try:
        reply = request_line(path, message.encode() + b"\n", timeout, 64 * 1024, peer_uid=0)  # noded runs as root
        return bool(json.loads(reply).get("ok"))
    except (OSError, ValueError, AttributeError):
        return False
