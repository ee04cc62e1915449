"""nodectl's request to noded: one request over the admin socket, and its answer, checked
whole against its command's shape before any of it is used (noded.admin.replyshape). Used by
nodectl and by the Slurm hooks (noded.integrations.slurm), which need nothing else of nodectl."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from noded.server.client import NotThePeer, ReplyTooLarge, request_line
from noded.admin.protocol import VERSION, encode
from noded.admin.replyshape import SHAPES, MalformedReply, check_reply


DEFAULT_SOCKET = "/run/noded/noded.sock"


class NodectlError(Exception):
    pass


class NotNodedsAnswer(NodectlError):
    """What came back is not an answer noded gives: not JSON, or not of its command's shape."""


class RefusedByNoded(NodectlError):
    """noded answered, and its answer is an error (the request was refused): not a noded
    that is down or silent."""


#: how long nodectl waits for noded, connecting, asking and reading the answer together
DEFAULT_TIMEOUT_S = 10.0


#: a reply larger than this is not noded's (a status of thousands of jobs is a few MiB)
MAX_REPLY_BYTES = 64 * 1024 * 1024


#: noded runs as root: a socket answered by anyone else is not noded's (a socket path
#: another user could replace), and no request is sent to it
NODED_UID = 0


def request(path: str, command: str, args: dict[str, Any] | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """One request and its reply, all within ``timeout`` seconds (not per read: a daemon
    that answers a byte at a time cannot hold nodectl longer). The reply is checked whole
    against the command's shape: one that is not noded's is NotNodedsAnswer, before any of
    it is read."""
    try:
        buf = request_line(path, encode({"version": VERSION, "command": command, "args": args or {}}), timeout,
                           MAX_REPLY_BYTES, peer_uid=NODED_UID)
    except ReplyTooLarge as e:
        raise NodectlError(f"{e}: not noded's") from None
    except NotThePeer as e:
        raise NodectlError(f"{e}: not noded (it runs as root); nothing was sent") from None
    except TimeoutError:
        raise NodectlError(f"{path}: noded did not answer within {timeout:g}s; is it overloaded or "
                           "stopped? (a request it has not read yet is not carried out: nodectl gave up on it)") from None
    except FileNotFoundError:
        raise NodectlError(f"no admin socket at {path}: is noded running?") from None
    except PermissionError:
        raise NodectlError(f"permission denied on {path}: run as root or as a member of noded's admin group") from None
    except ConnectionRefusedError:
        raise NodectlError(_refused(path)) from None
    except OSError as e:
        raise NodectlError(f"{path}: {e.strerror or e}") from None
    if not buf:
        raise NodectlError(f"{path}: noded closed the connection without an answer")
    try:
        reply = json.loads(buf)
    except ValueError:  # not JSON, or not UTF-8
        reply = None
    except RecursionError:  # noded's answers nest a few levels; this one beyond Python's stack
        raise NotNodedsAnswer(f"{path}: not an answer from noded: nested deeper than Python reads "
                              f"({buf[:40]!r}...)") from None
    if not isinstance(reply, dict):
        raise NotNodedsAnswer(f"{path}: not an answer from noded: {buf[:200]!r}")
    if not reply.get("ok"):
        raise RefusedByNoded(reply.get("error", "unknown error"))
    result = reply.get("result")
    if command in SHAPES:
        try:
            check_reply(command, result)
        except MalformedReply as e:
            raise NotNodedsAnswer(f"{path}: an answer to {command!r} of a shape noded does not give ({e}); "
                                  "is it noded, of this version?") from None
    return result


def _refused(path: str) -> str:
    """Why a connect to ``path`` was refused: a socket no process listens on (noded is
    down), or no socket at all (the kernel refuses both alike; the second is a wrong path,
    and restarting noded would not help)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is None or stat.S_ISSOCK(mode):
        return f"{path}: nothing is listening (noded stopped or is starting?)"
    kind = next((name for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                                         (stat.S_ISFIFO, "a FIFO")) if test(mode)), "a device")
    return f"{path} is {kind}, not a socket: --socket (or $NODED_SOCKET) must name noded's admin socket"
