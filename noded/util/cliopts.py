"""What `noded` and `nodectl` do alike on the command line.

* Global options go before or after the subcommand (``nodectl status --json`` and
  ``nodectl --json status``): the same options are added to the top parser, with their
  defaults, and to every subparser, with ``SUPPRESS`` defaults, so a subparser sets only
  what was written after the subcommand and that wins.
* Every option's help says its default.
* ``--version`` on both commands: the package's version and the revision it was built
  from (noded.util.buildinfo), found only when asked for.
* A reader that goes away (``nodectl jobs | head``) ends the command quietly with
  ``EXIT_BROKEN_PIPE`` (141, as for a process killed by SIGPIPE), never a traceback.

Standard library only: ``noded run`` imports this before its signals are installed.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Callable

#: the exit status when stdout's reader went away: 128 + SIGPIPE, what a shell reports
#: for a command killed by SIGPIPE, so `set -o pipefail` sees the output was cut short
EXIT_BROKEN_PIPE = 141
#: the exit status after Ctrl-C (SIGINT) for a command that does not end on it by design
EXIT_INTERRUPTED = 130

DISTRIBUTION = "noded"


class HelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with "(default: …)" where it has a default worth saying and
    its help does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or not action.option_strings:
            return text
        if action.default in (None, argparse.SUPPRESS, False, "", ()):
            return text
        return f"{text} (default: %(default)s)"


class VersionAction(argparse._VersionAction):
    """``--version``: says noded.util.buildinfo's line and exits. The revision is looked up
    here, when asked for, not each time a parser is built (``noded run`` builds them too)."""

    def __init__(self, option_strings, prog: str, **kwargs):
        super().__init__(option_strings, **kwargs)
        self.prog = prog

    def __call__(self, parser, namespace, values, option_string=None):
        from noded.util.buildinfo import describe

        sys.stdout.write(describe(self.prog) + "\n")  # stdout, as argparse's own version action
        parser.exit()


AddOptions = Callable[[argparse.ArgumentParser, Callable[[object], object]], None]


def option_parents(prog: str, add: AddOptions) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """(parent for the top parser, parent for each subparser). ``add(parser, default)``
    adds the global options, each with ``default=default(value)``: the value itself on
    the top parser, SUPPRESS on the subparsers. Help texts must say their defaults
    (the subparsers' are SUPPRESS, which says nothing)."""
    parents = []
    for defaults in (lambda v: v, lambda v: argparse.SUPPRESS):
        p = argparse.ArgumentParser(add_help=False)
        p.add_argument("--version", action=functools.partial(VersionAction, prog=prog),
                       help="print the version and exit")
        add(p, defaults)
        parents.append(p)
    return parents[0], parents[1]


def broken_pipe() -> int:
    """stdout's reader went away: send what is still buffered for it to /dev/null (the
    interpreter flushes stdout on its way out, and that write would fail again), and
    return the exit status to end with."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # a stdout with no descriptor (replaced in-process): nothing is flushed to a pipe
    return EXIT_BROKEN_PIPE


def subparsers(parser: argparse.ArgumentParser, parent: argparse.ArgumentParser, **kw):
    """``parser.add_subparsers(**kw)`` whose every subparser, however it is added, has the
    global options of ``parent`` and the defaults-showing help."""

    def make(**parser_kw) -> argparse.ArgumentParser:
        parser_kw["parents"] = [parent, *parser_kw.get("parents", ())]
        parser_kw.setdefault("formatter_class", HelpFormatter)
        return argparse.ArgumentParser(**parser_kw)

    return parser.add_subparsers(parser_class=make, **kw)


def say(line: str, stream=None) -> bool:
    """Print a line for whoever reads noded's output. A reader that went away (``| head``)
    must not stop or break the daemon: its output goes to /dev/null from then on, and
    False tells the caller nobody reads any more."""
    stream = stream or sys.stdout
    if stream.fileno() in _READERS_GONE:
        return False
    try:
        print(line, file=stream, flush=True)
        return True
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())  # later writes and the flush at exit go nowhere
        finally:
            os.close(devnull)
        _READERS_GONE.add(stream.fileno())
        return False


_READERS_GONE: set[int] = set()  # descriptors whose reader went away (now /dev/null)
