"""Refresh bench/RESULTS.md: run each command it records, put its output in place.

A result in RESULTS.md is a marker line naming the command, then a fenced block:

    <!-- output of: python -m bench.daemon_cost -->
    ```
    ...what the command printed...
    ```

``python -m bench.report`` (what ``make bench`` runs) runs every marked command in
order (``python`` is this interpreter), replaces its block with what it printed on
stdout, and stamps the date, the machine and the Python version under the title. The
prose around each block is written by hand and says what the numbers mean; re-read it
when they move. ``--only TEXT`` runs just the commands containing TEXT.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys

MARKER = re.compile(r"^<!-- output of: (.+?) -->$")
STAMP = re.compile(r"^_Refreshed by `make bench`.*_$")


def blocks(lines: list[str]):
    """(marker index, block start, block end) for each marked block; end is the closing fence."""
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            raise ValueError(f"RESULTS.md:{i + 1}: a marker must be followed by a fenced block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"RESULTS.md:{i + 2}: the block is not closed")
        yield m.group(1), i + 1, end


def run(command: str) -> str:
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    print(f"bench.report: {command}", file=sys.stderr, flush=True)
    p = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench.report: `{command}` exited {p.returncode}; RESULTS.md left as it was")
    return p.stdout


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.machine())
    return f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}"


def refresh(text: str, only: str | None, runner=run, today: str | None = None) -> str:
    lines = text.split("\n")
    chosen = [(command, start, end) for command, start, end in blocks(lines) if only is None or only in command]
    outputs = [runner(command).rstrip("\n").split("\n") for command, _, _ in chosen]
    for (_, start, end), output in reversed(list(zip(chosen, outputs))):  # from the end: indices stay valid
        lines[start + 1:end] = output
    stamp = f"_Refreshed by `make bench` on {today or datetime.date.today().isoformat()}, {machine()}._"
    at = next((i for i, line in enumerate(lines) if STAMP.match(line)), None)
    if at is None:
        lines[1:1] = ["", stamp]  # under the title
    else:
        lines[at] = stamp
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="bench/RESULTS.md")
    ap.add_argument("--only", help="run only the commands containing this text")
    args = ap.parse_args(argv)
    with open(args.results) as f:
        text = f.read()
    new = refresh(text, args.only)
    tmp = f"{args.results}.tmp"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, args.results)
    print(f"bench.report: refreshed {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
