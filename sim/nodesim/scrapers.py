"""A flood of scrapes by an unprivileged user: the script a bench or a test runs as its own
process (``python -c SCRAPE_FLOOD port seconds in_flight``), keeping ``in_flight`` scrapes
of /metrics open at all times, each read to its end and sent again at once."""

NOBODY = 65534

SCRAPE_FLOOD = """
import encodings.idna, os, socket, sys, time  # all imported before the interpreter's files may be out of reach
os.setgroups([]); os.setgid(%(uid)d); os.setuid(%(uid)d)
port, seconds, n = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
socks, end = [None] * n, time.monotonic() + seconds
print("up", flush=True)
while time.monotonic() < end:  # n scrapes in flight at all times, each reread at once
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        socks[i] = s
    for s in socks:
        while s.recv(65536):
            pass
        s.close()
""" % {"uid": NOBODY}
