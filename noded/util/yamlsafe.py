"""The one YAML loader for every file noded reads (config, job labels, co-location
profiles, simulated-node scenarios): those files are untrusted input.

Bytes in, bounded: at most ``max_bytes`` read from a regular file (never a FIFO or a
device, never a blocking open), strict UTF-8, at most ``MAX_NODES`` nodes nested at
most ``MAX_DEPTH`` deep. Only plain YAML: scalars (str, int, float, bool, null),
mappings with scalar keys, and lists. Refused, with the file and the line:

* anchors and aliases: noded's files never need them, and refusing them bounds
  expansion (a "billion laughs" document is a few hundred bytes);
* duplicate mapping keys (PyYAML keeps the last one silently), naming both lines;
* tags other than ``!!str``, ``!!seq`` and ``!!map`` (``!!python/…``, ``!!binary``,
  ``!!timestamp``, local tags), and YAML 1.1 merge keys (``<<``).

Dates and YAML 1.1 base-60 numbers (``1:30``) are read as strings: a base-60 number
of a million digits takes minutes to convert, and a date is never a noded value.

Built on PyYAML: its parser (libyaml's where PyYAML has it, else the pure-Python
one) and composer, with the checks above added where each thing is composed or
constructed.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, MappingStartEvent, ScalarEvent, SequenceStartEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.resolver import BaseResolver

from noded.util.journal import printable
from noded.util.settled import Unsettled, unsettled_reason

try:
    from yaml.cyaml import CParser
except ImportError:  # PyYAML built without libyaml: the pure-Python parser, slower, same rules
    CParser = None

#: the largest file read; noded's own files are a few KiB
MAX_BYTES = 1 << 20
#: nodes in one document: bounds memory and time whatever the bytes say (a labels file
#: for a thousand jobs is about 6000)
MAX_NODES = 50_000
#: nesting of mappings and lists (noded's deepest file nests 4)
MAX_DEPTH = 64

_TAG = "tag:yaml.org,2002:"
PLAIN_TAGS = frozenset(_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map"))
#: tags a file may write out: those that name what the value already is
EXPLICIT_TAGS = frozenset(_TAG + t for t in ("str", "seq", "map")) | {"!"}

# PyYAML's YAML 1.1 character set (yaml.reader.Reader.NON_PRINTABLE)
_NON_PRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")


class YamlError(ValueError):
    """A YAML file refused: the file, the line (1-based; None where none applies),
    the dotted key where one applies, and why."""

    def __init__(self, where: str, line: int | None, reason: str, key: str | None = None):
        self.where, self.line, self.reason, self.key = where, line, reason, key
        super().__init__(printable(f"{self.location}: {self.detail}"))  # a key's control characters escaped

    @property
    def location(self) -> str:
        """FILE:LINE, or FILE where no line applies."""
        return f"{self.where}:{self.line}" if self.line else self.where

    @property
    def detail(self) -> str:
        """KEY: REASON, or REASON where no key applies."""
        return f"{self.key}: {self.reason}" if self.key else self.reason


@dataclass(frozen=True)
class Document:
    #: the value: dict, list, str, int, float, bool or None (an empty file)
    data: Any
    #: dotted key ("a.b", "a.list[2].c") -> the 1-based line it is written on
    lines: Mapping[str, int]

    def line_of(self, key: str) -> int | None:
        """The line of ``key``, else of the nearest enclosing key written in the file."""
        while key:
            if key in self.lines:
                return self.lines[key]
            cut = max(key.rfind("."), key.rfind("["))
            key = key[:cut] if cut > 0 else ""
        return self.lines.get("")


class _Resolver(BaseResolver):
    """YAML 1.1's implicit types as PyYAML's SafeLoader has them, less base-60 numbers,
    dates, merge keys and the '=' value key."""


_Resolver.add_implicit_resolver(
    _TAG + "bool",
    re.compile(r"^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"))
_Resolver.add_implicit_resolver(
    _TAG + "float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))
_Resolver.add_implicit_resolver(
    _TAG + "int",
    re.compile(r"""^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+)$""", re.X),
    list("-+0123456789"))
_Resolver.add_implicit_resolver(
    _TAG + "null",
    re.compile(r"^(?:~|null|Null|NULL|)$"),
    ["~", "n", "N", ""])


class _Composer(Composer):
    """PyYAML's composer, refusing anchors, aliases, other tags, too many or too deep nodes."""

    def __init__(self, where: str, max_nodes: int):
        super().__init__()
        self._where, self._max_nodes = where, max_nodes
        self._nodes = self._depth = 0

    def _refuse(self, mark, reason: str):
        return YamlError(self._where, mark.line + 1 if mark is not None else None, reason)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            raise self._refuse(event.start_mark, f"alias *{_cut(event.anchor)} refused: noded's files take no anchors "
                                                 "or aliases")
        if event.anchor is not None:
            raise self._refuse(event.start_mark, f"anchor &{_cut(event.anchor)} refused: noded's files take no anchors "
                                                 "or aliases")
        if isinstance(event, (ScalarEvent, SequenceStartEvent, MappingStartEvent)):
            if event.tag is not None and event.tag not in EXPLICIT_TAGS:
                raise self._refuse(event.start_mark, f"tag {_shown(event.tag)} refused: only plain scalars, mappings "
                                                     "and lists")
        self._nodes += 1
        if self._nodes > self._max_nodes:
            raise self._refuse(event.start_mark, f"more than {self._max_nodes} values in one file")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise self._refuse(event.start_mark, f"nested more than {MAX_DEPTH} deep")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node.tag not in PLAIN_TAGS:  # the resolver only makes plain tags; this keeps it so
            raise self._refuse(node.start_mark, f"tag {_shown(node.tag)} refused: only plain scalars, mappings and lists")
        return node


#: the largest integer a file may hold: one Python can still print in decimal (its limit is
#: 4300 digits; a decimal one past it already fails to convert); far beyond any count or size
MAX_INT_BITS = 14_000


class _Constructor(SafeConstructor):
    """SafeConstructor, with numbers it cannot convert refused as errors of this module
    (not a ValueError from deep inside)."""

    def _number(self, node, convert):
        try:
            return convert(self, node)
        except (ValueError, OverflowError) as e:
            raise YamlError(self._where, node.start_mark.line + 1, f"{_cut(repr(node.value), 40)} is not a number noded "
                                                                  f"can read ({e})") from None

    def construct_yaml_int(self, node):
        value = self._number(node, SafeConstructor.construct_yaml_int)
        if value.bit_length() > MAX_INT_BITS:
            # a hex, octal or binary number converts at any length, but Python cannot print it
            # past 4300 digits (a ValueError in any message naming it)
            raise YamlError(self._where, node.start_mark.line + 1, f"{_cut(repr(node.value), 40)} is too large a "
                                                                  f"number (more than {MAX_INT_BITS} bits)")
        return value

    def construct_yaml_float(self, node):
        return self._number(node, SafeConstructor.construct_yaml_float)


_Constructor.add_constructor(_TAG + "int", _Constructor.construct_yaml_int)
_Constructor.add_constructor(_TAG + "float", _Constructor.construct_yaml_float)


def loader_class(libyaml: bool):
    """The loader over libyaml's parser (fast) or PyYAML's own (where PyYAML lacks libyaml)."""
    if libyaml:
        class Loader(_Composer, CParser, _Constructor, _Resolver):
            def __init__(self, text: str, where: str, max_nodes: int):
                CParser.__init__(self, text)
                _Composer.__init__(self, where, max_nodes)
                _Constructor.__init__(self)
                _Resolver.__init__(self)
    else:
        from yaml.parser import Parser
        from yaml.reader import Reader
        from yaml.scanner import Scanner

        class Loader(Reader, Scanner, Parser, _Composer, _Constructor, _Resolver):
            def __init__(self, text: str, where: str, max_nodes: int):
                Reader.__init__(self, text)
                Scanner.__init__(self)
                Parser.__init__(self)
                _Composer.__init__(self, where, max_nodes)
                _Constructor.__init__(self)
                _Resolver.__init__(self)
    return Loader


_Loader = loader_class(CParser is not None)


def _check_keys(loader, node, prefix: str, lines: dict[str, int]) -> None:
    """Refuse non-scalar and duplicate mapping keys (by value: ``1`` and ``true`` are one
    key to Python), and record the line of every key and list item."""
    if isinstance(node, MappingNode):
        seen: dict[Any, ScalarNode] = {}
        for k, v in node.value:
            line = k.start_mark.line + 1
            if not isinstance(k, ScalarNode):
                raise YamlError(loader._where, line, "a mapping key must be a plain scalar, not a mapping or a list",
                                prefix or None)
            value = loader.construct_object(k)
            key = f"{prefix}.{value}" if prefix else str(value)
            first = seen.get(value)
            if first is not None:
                also = "" if first.value == k.value else f" (written {_cut(repr(first.value))} there)"
                raise YamlError(loader._where, line, f"duplicate key: first at line {first.start_mark.line + 1}{also}",
                                _cut(key))
            seen[value] = k
            lines[key] = line
            _check_keys(loader, v, key, lines)
    elif isinstance(node, SequenceNode):
        for i, v in enumerate(node.value):
            lines.setdefault(f"{prefix}[{i}]", v.start_mark.line + 1)
            _check_keys(loader, v, f"{prefix}[{i}]", lines)


def _decode(data: bytes, where: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise YamlError(where, line, f"not UTF-8: byte 0x{data[e.start]:02x} at column {column} "
                                     f"(byte {e.start} of the file)") from None
    bad = _NON_PRINTABLE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        raise YamlError(where, line, f"control character U+{ord(bad.group()):04X} at column {column} "
                                     "is not allowed in YAML")
    return text


def parse_yaml(data: bytes | str, where: str, *, max_bytes: int = MAX_BYTES, max_nodes: int = MAX_NODES) -> Document:
    """One YAML document from ``data`` (UTF-8 bytes, or text); raises only YamlError."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise YamlError(where, None, f"{len(raw)} bytes is over the {_size(max_bytes)} limit for a YAML file")
    text = _decode(raw, where)
    loader = _Loader(text, where, max_nodes)
    lines: dict[str, int] = {}
    try:
        node = loader.get_single_node()
        value = None
        if node is not None:
            lines[""] = node.start_mark.line + 1
            _check_keys(loader, node, "", lines)
            value = loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        reason = ": ".join(str(p) for p in (e.context, e.problem) if p) or "not valid YAML"
        raise YamlError(where, mark.line + 1 if mark is not None else None, reason) from None
    except yaml.YAMLError as e:  # a ReaderError the check above did not foresee
        raise YamlError(where, None, str(e).replace("\n", " ")) from None
    finally:
        loader.dispose()
    return Document(value, lines)


def read_regular_file(path: str, *, max_bytes: int = MAX_BYTES, kind: str = "a YAML file",
                      settle_s: float | None = None, now: Callable[[], float] = time.time) -> bytes:
    """A regular file's bytes, at most ``max_bytes``: a FIFO, device or directory is
    refused (opened without blocking, checked before a byte is read). Raises YamlError
    (its message names the limit as that for ``kind``). Where ``settle_s`` is given, raises
    noded.util.settled.Unsettled instead unless the file did not change while it was read
    and had not changed for ``settle_s`` seconds of ``now`` (the wall clock) when it was."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise YamlError(path, None, e.strerror or str(e)) from None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise YamlError(path, None, f"not a regular file (a {_file_kind(before.st_mode)})")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        after = os.fstat(fd) if settle_s is not None else before
    except OSError as e:
        raise YamlError(path, None, e.strerror or str(e)) from None
    finally:
        os.close(fd)
    if settle_s is not None:
        _check_settled(path, before, after, settle_s, now)
    if size > max_bytes:
        raise YamlError(path, None, f"larger than the {_size(max_bytes)} limit for {kind}")
    return b"".join(chunks)


def _check_settled(path: str, before: os.stat_result, after: os.stat_result, settle_s: float,
                   now: Callable[[], float]) -> None:
    try:
        at_path: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        at_path = None
    except OSError as e:
        raise YamlError(path, None, e.strerror or str(e)) from None
    reason = unsettled_reason(before, after, at_path, round(now() * 1e9), settle_s)
    if reason is not None:
        raise Unsettled(path, reason)


def read_yaml_file(path: str, *, max_bytes: int = MAX_BYTES, max_nodes: int = MAX_NODES) -> Document:
    """The YAML document in a file; raises only YamlError (a read error included)."""
    return parse_yaml(read_regular_file(path, max_bytes=max_bytes), path, max_bytes=max_bytes, max_nodes=max_nodes)


def _shown(tag: str) -> str:
    return _cut("!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag)


def _cut(text: str, limit: int = 80) -> str:
    """Part of the file in a message, cut short: one name may be a megabyte."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"
