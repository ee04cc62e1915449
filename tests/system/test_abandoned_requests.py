"""A request whose client gave up before noded read it is not carried out.

An operator's `nodectl --timeout 2 throttle JOB --level 1` against a noded that is stopped
(SIGSTOP, a debugger, a host swapping hard) is told "noded did not answer" and exits 1. Were
the request carried out once noded runs again, the override would appear with nobody told:
the operator believes nothing changed ("an error is an error"). The client's hang-up is
what noded sees of its giving up: a request from a client that has closed its connection
is dropped unread, and counted. A client that only shut its sending side down (it still
waits for the answer) is answered as before.
"""

import socket
import threading

from noded.admin import nodectl
from noded.server.client import request_line
from noded.server.stream import Limits, Protocol, StreamServer, unix_peer


class Recording(Protocol):
    """Records each request it carries out; the first waits for a gate (noded stopped)."""

    def __init__(self):
        self.carried_out: list[bytes] = []
        self.entered = threading.Event()
        self.gate = threading.Event()

    def framed(self, data, new_from, eof):
        at = data.find(b"\n", new_from)
        if at >= 0:
            return bytes(data[:at])
        return bytes(data) if eof else None

    def respond(self, request, peer):
        self.carried_out.append(request)
        if request == b"hold":
            self.entered.set()
            self.gate.wait(10)
        return b"done " + request + b"\n"


def serving(tmp_path):
    path = str(tmp_path / "recording.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    proto = Recording()
    return path, proto, StreamServer(sock, proto, name="recording", limits=Limits(), peer_of=unix_peer).start()


def held(path, proto):
    """A connection whose request holds the server's thread, as a stopped noded is held."""
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(10)
    c.connect(path)
    c.sendall(b"hold\n")
    assert proto.entered.wait(10)
    return c


def test_a_request_whose_client_gave_up_is_not_carried_out(tmp_path):
    path, proto, server = serving(tmp_path)
    try:
        first = held(path, proto)
        # nodectl's own transport, with a short deadline: it gives up and closes.
        try:
            request_line(path, b"throttle\n", 0.3, 1024)
            raise AssertionError("answered while the server was held")
        except TimeoutError:
            pass
        proto.gate.set()
        assert first.recv(100) == b"done hold\n"
        first.close()
        # A later request is answered: the abandoned one came before it, and was dropped.
        assert request_line(path, b"status\n", 10, 1024) == b"done status\n"
        assert proto.carried_out == [b"hold", b"status"]
        assert server.stats.abandoned == 1
    finally:
        proto.gate.set()
        server.stop()


def test_a_client_that_only_shut_its_sending_side_is_still_answered(tmp_path):
    path, proto, server = serving(tmp_path)
    try:
        first = held(path, proto)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(10)
            c.connect(path)
            c.sendall(b"throttle")
            c.shutdown(socket.SHUT_WR)  # "that is all I send", and it waits for the answer
            proto.gate.set()
            assert first.recv(100) == b"done hold\n"
            first.close()
            assert c.recv(100) == b"done throttle\n"
        assert proto.carried_out == [b"hold", b"throttle"]
        assert server.stats.abandoned == 0
    finally:
        proto.gate.set()
        server.stop()


def test_nodectl_says_what_a_request_it_gave_up_on_did(tmp_path, capsys):
    # A "daemon" that accepts and never answers.
    path = str(tmp_path / "mute.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(path)
        mute.listen(4)
        code = nodectl.main(["--socket", path, "--timeout", "0.3", "throttle", "cgroup:hog", "--level", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert "noded did not answer within 0.3s" in err and "not carried out" in err, err
