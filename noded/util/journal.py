"""Logging for a systemd service: every change noded makes, in the journal, with fields.

Two ways out, chosen once by ``configure_logging``:

* Under journald (``$JOURNAL_STREAM`` names the device and inode of our stderr, as
  systemd documents it), each record is one datagram of the journal's native protocol,
  carrying MESSAGE, PRIORITY, SYSLOG_IDENTIFIER, CODE_FILE/CODE_LINE/CODE_FUNC, LOGGER
  and noded's own fields (NODED_JOB, NODED_LEVEL, NODED_CAUSE, NODED_ACTION, ... from a
  record's ``extra``), so ``journalctl -u noded NODED_JOB=slurm:42`` finds a job's story.
  When the journal cannot take a datagram (socket missing, too large, full), that record
  goes to stderr as a ``<N>`` line instead: the send never blocks and never raises.
* Otherwise one line per record on stderr: ``<N>``-prefixed (syslog priority N, which
  journald and syslog read) when stderr is not a terminal, plain on a terminal.

``log_change`` records a change noded makes to a job (throttle, release, a write, an
admission, an override): always emitted, whatever the verbosity, at NOTICE (syslog 5),
or at the severity given (a failed write is a WARNING).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from typing import Callable, Iterable, Mapping

#: the journal's native socket (systemd.journal-fields(7), "native protocol")
DEFAULT_SOCKET = "/run/systemd/journal/socket"
#: Python has no NOTICE level: this one sits between INFO and WARNING, as syslog's does
NOTICE = 25
#: the logger every change is recorded on (records from it bypass the verbosity)
CHANGES = "noded.changes"
IDENTIFIER = "noded"

_FIELD_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# What every LogRecord carries: anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


# What must not reach a log line or a terminal as it is: C0 and C1 controls (NUL ends a
# line for journald's stream reader, so "\0<0>..." would be a second line at priority 0;
# ESC starts a terminal's control sequence; CR overwrites a line), DEL, Unicode line and
# paragraph separators, and the bidirectional controls that reorder what is shown. Tab stays.
# Lone surrogates too: a cgroup's name that is not UTF-8 reaches Python as them
# (os.fsdecode), and no stream can encode them; each is shown as the metrics show it
# (``\udcff`` for the byte 0xff).
_UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
                          "\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` with each character a log line or a terminal must not take as it is
    (newline included) written as its Python escape (``\\x1b``, ``\\n``, ``\\u2028``).

    A safety net for prose (a message, an error's text), and the same on text already
    escaped: it is NOT one-to-one (a literal backslash-n reads as an escaped newline).
    A name whose identity matters (a job id) goes through ``escaped`` or ``word``."""
    return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text)


def _unprintable(c: str) -> bool:
    return _UNPRINTABLE.match(c) is not None


def _form(c: str) -> str:
    """The one escape noded writes for ``c``: ``\\n``, ``\\r``, else ``\\xNN``, ``\\uNNNN``
    or ``\\UNNNNNNNN`` (lower-case hex), as Python writes them."""
    if c == "\n":
        return "\\n"
    if c == "\r":
        return "\\r"
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


#: what may follow a backslash in one of noded's escapes (lower-case hex only, as _form writes)
_BODY = re.compile(r"x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|n|r")


def _body_char(body: str) -> str | None:
    if body in ("n", "r"):
        return "\n" if body == "n" else "\r"
    n = int(body[1:], 16)
    return chr(n) if n <= 0x10FFFF else None


def _escape_at(text: str, i: int, escape: Callable[[str], bool]) -> str | None:
    """The character the escape at ``text[i]`` (a backslash) stands for, if it is one
    noded writes under ``escape`` (the one form ``_form`` gives: ``\\x0a`` is not a newline's,
    ``\\n`` is); else None."""
    m = _BODY.match(text, i + 1)
    if m is None:
        return None
    c = _body_char(m.group())
    return c if c is not None and escape(c) and _form(c) == "\\" + m.group() else None


def escaped(text: str, escape: Callable[[str], bool] = _unprintable) -> str:
    """``text`` with each character ``escape`` picks written as its escape (``_form``), one
    to one: ``unescaped`` gives ``text`` back, so two names never give the same text.

    A backslash of ``text`` is written ``\\\\`` only where what follows it would otherwise
    read as one of these escapes (the form of a character ``escape`` picks) or as a
    backslash; every other backslash stays as it is. So a systemd unit's own escape reads
    as systemctl shows it (``job\\x2d1.scope``: noded never escapes '-'), and a name that
    holds the text of one of noded's escapes shows it with its backslash doubled
    (``a\\\\nb`` for the five characters a, \\, n, b, and ``a\\nb`` for a, newline, b).
    (The characters ``escape`` picks must not be backslashes, letters or digits.)"""
    if "\\" not in text and not any(escape(c) for c in text):
        return text
    out = []
    for i, c in enumerate(text):
        if escape(c):
            out.append(_form(c))
        elif c == "\\":
            after = text[i + 1:i + 2]
            doubled = after == "\\" or (after and escape(after)) or _escape_at(text, i, escape) is not None
            out.append("\\\\" if doubled else "\\")
        else:
            out.append(c)
    return "".join(out)


def unescaped(text: str, escape: Callable[[str], bool] = _unprintable) -> str:
    """The name ``escaped(name, escape)`` wrote ``text`` for (its inverse): at a backslash,
    ``\\\\`` is a backslash, the form of a character ``escape`` picks is that character, and
    anything else is the backslash itself."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out.append(c)
            i += 1
        elif text[i + 1:i + 2] == "\\":
            out.append("\\")
            i += 2
        elif (e := _escape_at(text, i, escape)) is not None:
            out.append(e)
            i += len(_form(e))
        else:
            out.append("\\")
            i += 1
    return "".join(out)


def in_word(c: str) -> bool:
    """What ``word`` escapes: what ``printable`` does, any Unicode space, ``=`` and quotes."""
    return c.isspace() or c in "=\"'" or _UNPRINTABLE.match(c) is not None


def word(value: str) -> str:
    """``value`` as one word of a ``key=value`` line: printable, with each space (any
    Unicode space), ``=`` and quote written as its escape (``\\x20``, ``\\x3d``, ``\\x22``),
    one to one (``escaped``; ``unescaped(text, in_word)`` reads it back).
    A tenant's cgroup named ``x job=slurm:42 level=0->3`` is then one word holding no
    ``=`` of its own: it adds no key of its own to the line, and a search for
    ``job=slurm:42`` finds only slurm:42's lines; and no two names give the same word."""
    return escaped(value, in_word)


def words(values: Iterable[str]) -> str:
    """Names (job ids) listed in prose: each one ``word``, joined by ", ". A word holds no
    space, so ", " only ever separates two of them: one to one whatever the names hold (a
    tenant's cgroup named ``a, b=c`` is listed as ``a,\\x20b\\x3dc``, never as two jobs)."""
    return ", ".join(map(word, values))


#: a printf-style placeholder of a log message, as logging's %-formatting reads them
_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[diouxXeEfFgGcrsa%]")


def with_values_as_words(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` with each string put in as ``key=%s`` made one ``word``: what a message
    says after ``job=`` (a job id from a tenant's cgroup name, a model name from a job's
    labels) cannot become keys and values of its own. Other arguments as they are."""
    args = record.args
    if not isinstance(args, tuple) or not any(isinstance(a, str) for a in args):
        return record
    msg, out, i = str(record.msg), list(args), 0
    for m in _PLACEHOLDER.finditer(msg):
        spec = m.group()
        if spec == "%%":
            continue
        if "*" in spec:  # a width taken from the arguments: the count below would be off
            return record
        if i < len(out) and spec.endswith("s") and isinstance(out[i], str) and msg[m.start() - 1:m.start()] == "=":
            out[i] = word(out[i])
        i += 1
    return logging.makeLogRecord({**vars(record), "args": tuple(out)})


def syslog_priority(levelno: int) -> int:
    """Python level -> syslog priority (2 crit, 3 err, 4 warning, 5 notice, 6 info, 7 debug)."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= NOTICE:
        return 5
    if levelno >= logging.INFO:
        return 6
    return 7


def field_name(key: str) -> str:
    """A record's extra attribute as a journal field: NODED_ + upper case, [A-Z0-9_] only."""
    name = re.sub(r"[^A-Z0-9_]", "_", key.upper())
    if not name.startswith("NODED_"):
        name = "NODED_" + name.lstrip("_")
    return name[:64]


def _field_bytes(value: str) -> bytes:
    """A field's value as the journal keeps it (bytes): a cgroup's name that is not UTF-8
    (lone surrogates from os.fsdecode) as its own bytes, so ``journalctl NODED_JOB=...``
    finds the job by the name the kernel has; any other lone surrogate as U+FFFD."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace")


def encode_native(fields: Iterable[tuple[str, str | bytes]]) -> bytes:
    """One entry in the native protocol: NAME=value lines; a value with a newline in the
    binary form (NAME, newline, its length as 64-bit little-endian, the value, newline)."""
    out = bytearray()
    for name, value in fields:
        if not _FIELD_NAME.fullmatch(name):
            raise ValueError(f"journal field name {name!r}: must be A-Z, 0-9 and _, start with a letter, "
                             "at most 64 characters")
        data = value if isinstance(value, bytes) else _field_bytes(value)
        key = name.encode("ascii")
        if b"\n" in data:
            out += key + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            out += key + b"=" + data + b"\n"
    return bytes(out)


def under_journald(stream, env: Mapping[str, str]) -> bool:
    """Whether ``stream`` is the journal's stream: $JOURNAL_STREAM is "DEV:INODE" of it.
    (A child whose stderr was redirected inherits the variable, not the match.)"""
    dev, sep, ino = env.get("JOURNAL_STREAM", "").partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


def record_fields(record: logging.LogRecord) -> dict[str, str]:
    """noded's own fields on a record (its ``extra``), named as the journal wants them."""
    return {field_name(k): str(v) for k, v in vars(record).items() if k not in _STANDARD and v is not None}


class LineHandler(logging.StreamHandler):
    """One line per record; with ``prefix``, each line begins ``<N>`` (N: syslog priority)."""

    def __init__(self, stream, *, prefix: bool):
        super().__init__(stream)
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        # A value in a message (a job id from a cgroup's name, which may hold a newline on
        # kernels before 5.2; a registered one) is escaped before it is put in: it cannot
        # split the message into lines of its own. The message's own lines (a traceback)
        # stay lines, each with its priority.
        record = with_values_as_words(record)
        if isinstance(record.args, tuple) and any(isinstance(a, str) for a in record.args):
            record = logging.makeLogRecord(
                {**vars(record), "args": tuple(printable(a) if isinstance(a, str) else a for a in record.args)})
        return super().format(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            # Each line's control characters escaped: a value in a message (a job id from a
            # cgroup's name, an operator's reason, a config key) cannot end the line early,
            # forge one at another priority, or drive the terminal it is shown on.
            text = "\n".join(printable(line) for line in self.format(record).split("\n"))
            if self.prefix:
                tag = f"<{syslog_priority(record.levelno)}>"
                text = "\n".join(tag + line for line in text.split("\n"))  # a traceback keeps its priority
            self.stream.write(text + "\n")
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


class JournalHandler(logging.Handler):
    """Records as native-protocol datagrams to ``path``; ``fallback`` takes any the journal
    would not (it never blocks: a full journal means the fallback, not a wait)."""

    def __init__(self, path: str = DEFAULT_SOCKET, *, fallback: logging.Handler, identifier: str = IDENTIFIER):
        super().__init__()
        self.path = path
        self.fallback = fallback
        self.identifier = identifier
        self.last_error: OSError | None = None  # why the last record went to the fallback
        try:
            self._sock: socket.socket | None = socket.socket(
                socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        except OSError as e:  # AF_UNIX refused here: every record takes the fallback
            self._sock, self.last_error = None, e

    def setFormatter(self, fmt: logging.Formatter | None) -> None:
        super().setFormatter(fmt)
        self.fallback.setFormatter(fmt)

    def fields(self, record: logging.LogRecord) -> list[tuple[str, str]]:
        out = [("MESSAGE", self.format(with_values_as_words(record))),
               ("PRIORITY", str(syslog_priority(record.levelno))),
               ("SYSLOG_IDENTIFIER", self.identifier), ("CODE_FILE", record.pathname),
               ("CODE_LINE", str(record.lineno)), ("CODE_FUNC", record.funcName), ("LOGGER", record.name)]
        return out + sorted(record_fields(record).items())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = encode_native(self.fields(record))
            if self._sock is None:
                raise self.last_error or OSError("no journal socket")
            self._sock.sendto(data, self.path)  # EMSGSIZE, EAGAIN (full), ENOENT, ECONNREFUSED: fallback
        except RecursionError:
            raise
        except OSError as e:
            self.last_error = e
            self.fallback.handle(record)
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.fallback.close()
        super().close()


#: what begins every line of a dry run (``noded run --dry-run``): its decisions are not a real run's
DRY_RUN_MARK = "[dry-run] "


class DryRunMark(logging.Filter):
    """Marks every record of a dry run: the field NODED_DRY_RUN=1 (the formatter puts
    DRY_RUN_MARK before the message), so no line of it, a decision's included, can be
    read as a real run's."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.noded_dry_run = "1"
        return True


def configure_logging(verbose: bool, *, stream=None, journal_socket: str = DEFAULT_SOCKET,
                      env: Mapping[str, str] | None = None, dry_run: bool = False) -> logging.Handler:
    """Logging for ``noded``: WARNING and above (INFO with ``verbose``), and every change
    (``log_change``) whatever the level; to the journal under journald, else to ``stream``
    (stderr). ``dry_run``: every line marked (DryRunMark). Replaces the handler an earlier
    call installed; returns the new one."""
    stream = sys.stderr if stream is None else stream
    env = os.environ if env is None else env
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "noded_installed", False)]:
        root.removeHandler(old)
        old.close()
    logging.addLevelName(NOTICE, "NOTICE")
    if under_journald(stream, env):
        handler: logging.Handler = JournalHandler(journal_socket, fallback=LineHandler(stream, prefix=True))
    else:
        isatty = getattr(stream, "isatty", None)
        handler = LineHandler(stream, prefix=not (isatty and isatty()))
    handler.setFormatter(logging.Formatter("%(name)s: " + (DRY_RUN_MARK if dry_run else "") + "%(message)s"))
    if dry_run:
        handler.addFilter(DryRunMark())
    handler.noded_installed = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    return handler


def _text(value) -> str:
    text = str(value)
    return repr(text) if not text or any(c.isspace() or c in "'\"=" for c in text) else text


def log_change(action: str, job: str | None = None, *, level_from: int | None = None, level_to: int | None = None,
               cause: str | None = None, reason: str | None = None, severity: int = NOTICE, **fields) -> None:
    """One line for one change noded makes (or, failing, tried to make):

        throttle job=slurm:42 level=0->2 cause=contention: node at 91% of peak, ...

    with the fields NODED_ACTION, NODED_JOB, NODED_LEVEL (the level after),
    NODED_LEVEL_FROM, NODED_CAUSE and NODED_<KEY> for each other keyword. Emitted
    whatever the verbosity (the record goes straight to the handlers, past the level
    of its logger); only ``logging.disable`` or a disabled ``noded.changes`` stops it."""
    logger = logging.getLogger(CHANGES)
    if logger.disabled or logger.manager.disable >= severity:
        return
    words = [action]
    if job is not None:
        words.append(f"job={word(job)}")  # the journal's NODED_JOB keeps it exactly
    if level_to is not None:
        words.append(f"level={level_to}" if level_from is None else f"level={level_from}->{level_to}")
    if cause:
        words.append(f"cause={cause}")
    words += [f"{k}={_text(v)}" for k, v in fields.items() if v is not None]
    text = " ".join(words) + (f": {reason}" if reason else "")
    extra = {"noded_action": action, "noded_job": job, "noded_level": level_to, "noded_level_from": level_from,
             "noded_cause": cause or None}
    extra.update({f"noded_{k}": v for k, v in fields.items()})
    try:
        path, line, func, _ = logger.findCaller(False, 2)  # the caller of log_change
    except ValueError:
        path, line, func = "(unknown file)", 0, "(unknown function)"
    record = logger.makeRecord(logger.name, severity, path, line, " ".join(text.splitlines()), (), None, func, extra)
    logger.handle(record)


def log_state(state: str, entered: bool, reason: str, *, severity: int | None = None) -> None:
    """One line when a lasting state an alert can see begins or ends (noded.loop.lasting):

        state=not_watching_jobs entered: no job source configured ...
        state=not_watching_jobs ended: ...

    with the fields NODED_STATE and NODED_STATE_CHANGE (entered, ended). Emitted whatever
    the verbosity, as changes are: an entry at WARNING (something is not done), an end at
    NOTICE, unless ``severity`` says otherwise."""
    if severity is None:
        severity = logging.WARNING if entered else NOTICE
    change = "entered" if entered else "ended"
    logger = logging.getLogger(CHANGES)
    if logger.disabled or logger.manager.disable >= severity:
        return
    text = f"state={_text(state)} {change}: {reason}"
    extra = {"noded_state": state, "noded_state_change": change}
    try:
        path, line, func, _ = logger.findCaller(False, 2)
    except ValueError:
        path, line, func = "(unknown file)", 0, "(unknown function)"
    record = logger.makeRecord(logger.name, severity, path, line, " ".join(text.splitlines()), (), None, func, extra)
    logger.handle(record)
