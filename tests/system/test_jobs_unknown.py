"""`nodectl jobs` where noded does not know its jobs is an error, not an empty table.

Before: with its job source's root gone (discovery failing at every tick) or before its
first tick, `nodectl jobs` printed the header alone and exited 0, which reads as "no jobs
here" (`nodectl status` said NOT WATCHING jobs, but a script or an operator asking for the
jobs was not told). Overrides already refused to act on jobs noded does not know; `jobs`
now says the same, exit 1, in text and in --json.
"""

from __future__ import annotations

import json

from support.admin import nodectl_run
from test_cli_habits import job, tick_result


def test_jobs_when_discovery_failed_is_an_error_naming_why(admin_socket, capsys):
    served = admin_socket(tick_result([], jobs_known=False))
    code, out, err = nodectl_run(served.path, "jobs", capsys=capsys)
    assert code == 1 and out == ""
    assert err == "nodectl: noded does not know its jobs now (discovery failed at the last tick; nodectl status " \
                  "says where): try again later\n", err
    code, out, err = nodectl_run(served.path, "jobs", "--json", capsys=capsys)
    assert code == 1 and out == "" and "does not know its jobs now" in err


def test_jobs_before_the_first_tick_is_an_error(admin_socket, capsys):
    served = admin_socket(None)
    code, out, err = nodectl_run(served.path, "jobs", capsys=capsys)
    assert code == 1 and out == ""
    assert err == "nodectl: noded has not sampled its jobs yet: try again after its first tick\n", err


def test_jobs_known_are_listed_as_before(admin_socket, capsys):
    served = admin_socket(tick_result([job("sim:hog")]))
    code, out, err = nodectl_run(served.path, "jobs", "--json", capsys=capsys)
    assert code == 0 and err == "" and [j["job"] for j in json.loads(out)] == ["sim:hog"]
    served = admin_socket(tick_result([]))  # known, and none: an empty table is the truth
    code, out, err = nodectl_run(served.path, "jobs", capsys=capsys)
    assert code == 0 and out == "JOB  KIND  GB/s  GPU  LEVEL  NOTE\n" and err == ""
