"""`nodectl admit --profile FILE.csv` reads a tenant's ncu output as untrusted bytes.

Before: a CSV with a field over 128 KiB was a `_csv.Error` traceback; a CSV not in UTF-8 a
UnicodeDecodeError traceback; a FIFO named .csv held nodectl in open() for good, and any
size was read whole into memory. Now the file is read as noded reads its own files
(regular files only, opened without blocking, bounded), and whatever it holds is a
profile or a ProfileError naming the file, exit 1, one line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from noded.colocation.profiles import MAX_NCU_CSV_BYTES, JobProfile, ProfileError, read_ncu_csv

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = ("gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,"
          "dram__throughput.avg.pct_of_peak_sustained_elapsed\nusecond,%,%\n")


def admit(tmp_path, profile) -> subprocess.CompletedProcess:
    """nodectl admit with ``profile``, against a socket that would answer nothing: the
    profile is read (and refused) before anything is sent."""
    return subprocess.run([sys.executable, "-m", "noded.admin.nodectl", "--socket", str(tmp_path / "absent.sock"),
                           "--timeout", "5", "admit", "--job", "j", "--model", "m", "--batch-size", "1",
                           "--profile", str(profile)], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_a_field_over_the_csv_modules_limit_is_a_profile_error(tmp_path):
    big = tmp_path / "big.csv"
    big.write_text(HEADER + "a" * 200_000 + ",1,1\n")
    p = admit(tmp_path, big)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith(f"nodectl: {big}: not an ncu CSV (") and p.stderr.count("\n") == 1, p.stderr


def test_a_csv_not_in_utf8_is_a_profile_error_naming_the_byte(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(HEADER.encode() + b"1,\xff,1\n")
    p = admit(tmp_path, bad)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"nodectl: {bad}: not UTF-8: byte 0xff" in p.stderr, p.stderr


def test_a_fifo_named_csv_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "profile.csv"
    os.mkfifo(fifo)
    p = admit(tmp_path, fifo)  # before: blocked in open() until the 60 s timeout
    assert p.returncode == 1 and f"nodectl: {fifo}: not a regular file (a FIFO)" in p.stderr, p.stderr


def test_a_csv_over_the_size_limit_is_refused_naming_the_limit(tmp_path):
    huge = tmp_path / "huge.csv"
    with open(huge, "wb") as f:
        f.truncate(MAX_NCU_CSV_BYTES + 1)  # sparse: no disk spent
    p = admit(tmp_path, huge)
    assert p.returncode == 1 and f"larger than the {MAX_NCU_CSV_BYTES >> 20} MiB limit for an ncu CSV file" \
        in p.stderr, p.stderr


def test_a_good_csv_is_still_read(tmp_path):
    good = tmp_path / "good.csv"
    good.write_text(HEADER + "100,50,20\n300,10,40\n")
    p = read_ncu_csv(str(good), model="m", batch_size=1)
    assert isinstance(p, JobProfile) and p.window_us == 400


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=4096) | st.builds(lambda tail: HEADER.encode() + tail, st.binary(max_size=512)))
def test_any_bytes_are_a_profile_or_a_profile_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("csv") / "p.csv"
    path.write_bytes(data)
    try:
        assert isinstance(read_ncu_csv(str(path), model="m", batch_size=1), JobProfile)
    except ProfileError as e:
        assert str(path) in str(e) and "\n" not in str(e)


def test_a_socket_named_csv_is_refused_too(tmp_path):
    path = str(tmp_path / "s.csv")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    try:
        p = admit(tmp_path, path)
        # open() itself refuses a socket, with the kernel's word for it
        assert p.returncode == 1 and p.stderr == f"nodectl: {path}: No such device or address\n", p.stderr
    finally:
        s.close()
