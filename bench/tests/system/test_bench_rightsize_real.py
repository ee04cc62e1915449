"""bench.rightsize_real's parts that need no cpuset and no daemon: the knee and the ratio it
reports, and its victim (bench.victims.loader) reporting each iteration's time over the
report socket's protocol while it prints its speed every second."""

import json
import os
import socket
import threading

import pytest

from bench.rightsize_real import found_over_best, knee, spread, top_cpus
from bench.scenario.procs import ReportingProcess


def test_the_knee_is_the_fewest_cores_within_the_margin_of_the_best_and_the_ratio_is_against_the_best():
    assert knee({2: 100.0, 1: 98.0}, 0.03) == 1  # one worker: a second core gains nothing measurable
    assert knee({2: 100.0, 1: 96.0}, 0.03) == 2
    assert knee({4: 100.0, 3: 101.0, 2: 99.0, 1: 60.0}, 0.03) == 2
    assert found_over_best({2: 100.0, 1: 80.0}, 1) == 0.8 and found_over_best({2: 90.0, 1: 100.0}, 1) == 1.0
    assert top_cpus([3, 0, 1, 2], 2) == [2, 3]  # where noded's plan puts a GPU job: the top of the node
    assert spread([100.0] * 9 + [50.0]) == pytest.approx(0.45)


class ReportSocket:
    """A stand-in for noded's report socket: takes one request line per connection,
    answers ok, keeps what it was told."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.sock.settimeout(0.2)  # so that close() is seen
        self.requests: list[dict] = []
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            line = b""
            try:
                with conn:
                    conn.settimeout(5)
                    while not line.endswith(b"\n"):
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        line += chunk
                    conn.sendall(b'{"ok": true}\n')
            except OSError:
                pass  # a client that gave up waiting (it does after 0.5 s): its report still counts
            with self.cond:
                if line.endswith(b"\n"):
                    self.requests.append(json.loads(line))
                self.cond.notify_all()

    def wait(self, count: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.requests) >= count, timeout)

    def close(self) -> None:
        self.closed = True
        self.thread.join()
        self.sock.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="the report client sends only to a socket that root serves")
def test_the_loader_reports_each_iterations_time_and_prints_its_speed_and_cpus_every_second(tmp_path):
    server = ReportSocket(str(tmp_path / "report.sock"))
    loader = ReportingProcess("bench.victims.loader", ["tokenise", "--workers", "2", "--batch", "512",
                                                       "--job", "cgroup:v", "--report-socket",
                                                       str(tmp_path / "report.sock")])
    try:
        assert server.wait(5, timeout=60), loader.failure()
        # a second in which iterations ended (the first ones pass while the workers start)
        while not any(line["iterations"] for line in loader.since(0)):
            assert loader.wait_reports(len(loader.reports) + 1, timeout=60), loader.failure()
    finally:
        summary = loader.stop()
        server.close()
    first = server.requests[0]
    assert first["command"] == "report" and first["args"]["job"] == "cgroup:v"
    assert all(0 < r["args"]["iteration_s"] < 5 for r in server.requests)
    busy = next(line for line in loader.reports if line["iterations"])
    assert busy["cpus"] == len(os.sched_getaffinity(0)) and busy["samples_per_s"] > 0 and busy["iteration_s"] > 0
    assert loader.proc.returncode == 0 and summary["workers"] == 2 and summary["iterations"] >= len(server.requests)
