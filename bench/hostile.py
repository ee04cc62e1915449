"""A hostile local client, for tests/system/test_hostile_clients.py and bench/hostile_clients.py.

Run as a script (as root, it drops to --uid/--gid itself, so the flood comes from an
unprivileged user): it opens --count connections to a Unix socket or a TCP port, sends
--first, then one more byte on every connection still open each --every seconds, and
reopens those the server dropped when --reopen is given. It prints one line
``ready opened=N refused=N timeouts=N`` when the first round of connects is done, and,
when its stdin reaches EOF, ``done opened=N dropped=N refused=N timeouts=N held=N``.
``dropped`` counts connections the server closed (or answered) first.
"""

from __future__ import annotations

import argparse
import errno
import os
import resource
import selectors
import socket
import struct
import sys
import time


def closed_by_peer(s: socket.socket) -> bool:
    try:
        s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True  # EOF, or an answer (a refusal, a drop notice): the server is done with it


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--unix")
    ap.add_argument("--tcp", help="host:port")
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--sources", type=int, default=1, help="TCP: spread over this many 127.x source addresses")
    ap.add_argument("--first", default="x", help="sent on connecting")
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--reopen", action="store_true", help="reconnect what the server dropped, each round")
    ap.add_argument("--uid", type=int)
    ap.add_argument("--gid", type=int)
    args = ap.parse_args()
    want = args.count + 64
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, 1024), max(want, resource.getrlimit(resource.RLIMIT_NOFILE)[1])))
    first = args.first.encode().decode("unicode_escape").encode("latin-1")
    if args.uid is not None:  # last: nothing may need importing after this (the interpreter may be root's)
        os.setgroups([])
        os.setgid(args.gid if args.gid is not None else args.uid)
        os.setuid(args.uid)
    stats = {"opened": 0, "dropped": 0, "refused": 0, "timeouts": 0}
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ, None)
    slots: list[socket.socket | None] = [None] * args.count

    def connect(i: int) -> None:
        if args.unix:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target = args.unix
        else:
            host, port = args.tcp.rsplit(":", 1)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if args.sources > 1:
                k = i % args.sources
                s.bind((f"127.0.{k // 250}.{k % 250 + 2}", 0))
            target = (host, int(port))
        if args.unix:
            # Blocking, so connect() waits for room in a full backlog (a non-blocking one
            # fails with EAGAIN at once); SO_SNDTIMEO bounds that wait.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 2, 0))
        else:
            s.settimeout(2.0)
        try:
            s.connect(target)
            s.sendall(first)
        except (TimeoutError, BlockingIOError):
            stats["timeouts"] += 1
            s.close()
            return
        except OSError as e:
            stats["refused"] += 1
            stats.setdefault(f"errno_{errno.errorcode.get(e.errno, e.errno)}", 0)
            stats[f"errno_{errno.errorcode.get(e.errno, e.errno)}"] += 1
            s.close()
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
        slots[i] = s
        stats["opened"] += 1

    def drop(i: int) -> None:
        s = slots[i]
        sel.unregister(s)
        s.close()
        slots[i] = None
        stats["dropped"] += 1

    for i in range(args.count):
        connect(i)
    print("ready " + " ".join(f"{k}={v}" for k, v in stats.items()), flush=True)
    next_round = time.monotonic() + args.every
    while True:
        for key, _ in sel.select(max(0.0, next_round - time.monotonic())):
            if key.data is None:
                if not os.read(sys.stdin.fileno(), 4096):
                    for i, s in enumerate(slots):  # what the server closed but this loop has not seen yet
                        if s is not None and closed_by_peer(s):
                            drop(i)
                    held = sum(s is not None for s in slots)
                    print("done " + " ".join(f"{k}={v}" for k, v in stats.items()) + f" held={held}", flush=True)
                    return 0
                continue
            drop(key.data)  # the server closed it, or answered (a refusal, a drop notice)
        if time.monotonic() >= next_round:
            next_round += args.every
            for i, s in enumerate(slots):
                if s is None:
                    if args.reopen:
                        connect(i)
                    continue
                try:
                    s.send(b"x")
                except OSError:
                    drop(i)


if __name__ == "__main__":
    sys.exit(main())
