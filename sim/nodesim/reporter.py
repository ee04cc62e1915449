"""A simulated GPU job's process that reports its iteration times, as a training script does.

The simulated node runs this as the placeholder of a GPU job with ``reports: true``
(``python -m nodesim.reporter STATE_FILE MODEL SEED``, with ``NODED_JOB`` and
``NODED_REPORT_SOCKET`` in its environment). It is the job's own process, so noded's report
socket, which takes a report only from a process of the job it names, takes its reports.

Each iteration it reads the state the simulated node last wrote for it (``STATE_FILE``,
JSON: ``cores``, the simulated cores the job has now, and ``rate``, the share of its speed
that memory-bandwidth contention leaves it), draws one iteration time from the model's
core curve (``CoreCurve.iteration_time``, noise included) divided by ``rate``, spends that
long on the iteration (a wait: the simulated GPU does the work), then reports it with
``noded.colocation.client.report_iteration``, which never raises and never blocks for
long. It exits when its state file is gone after it had one (the simulated node stopped),
or on SIGTERM/SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading

from noded.colocation.client import report_iteration
from noded.rightsize.curves import MODEL_CURVES

#: how often a reporter looks again for a state file not written yet
POLL_S = 0.05


def read_state(path: str) -> tuple[float, float] | None:
    """(cores, rate) from the state file; None while there is none (or it is not one)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        cores, rate = float(data["cores"]), float(data["rate"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (cores, rate) if cores > 0 and rate > 0 else None


def write_state(path: str, cores: float, rate: float) -> None:
    """Replace the state file whole (a reporter never reads half of one)."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump({"cores": cores, "rate": rate}, f)
    os.replace(partial, path)


def iteration_time(model: str, cores: float, rate: float, rng: random.Random) -> float:
    """One iteration's time (s): the curve's noisy time at ``cores``, slowed by contention."""
    return MODEL_CURVES[model].iteration_time(cores, rng) / rate


def run(state_file: str, model: str, seed: str, wait=threading.Event().wait) -> int:
    rng = random.Random(seed)
    seen = False
    while True:
        state = read_state(state_file)
        if state is None:
            if seen and not os.path.exists(state_file):
                return 0  # the simulated node is gone
            wait(POLL_S)
            continue
        seen = True
        seconds = iteration_time(model, *state, rng)
        wait(seconds)
        report_iteration(seconds)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[1] not in MODEL_CURVES:
        print(f"usage: python -m nodesim.reporter STATE_FILE MODEL SEED (MODEL one of {sorted(MODEL_CURVES)})",
              file=sys.stderr)
        return 2
    return run(*args)


if __name__ == "__main__":
    sys.exit(main())
