"""A source's default cap (``jobs.sources[].cap_gbps``) through the daemon (issue #27,
item 2): every CPU job of that source held at it, from the config alone; the jobs come
from a cgroup source over real (v1 cpuset) cgroups, as on a host."""

import os
import threading
import time

import pytest
import yaml

from support.waiting import wait_for
from support.bandwidth import rate_bounds_over, within

from noded.commands.wiring import build_daemon
from noded.config import parse_config
from nodesim.node import SimNode
from nodesim.scenario import parse_scenario
from nodesim.sim_node import LABELS, daemon_config, find_cpuset_root, write_labels

GB = 1e9
SCENARIO = """seed: 1
duration_s: 600
node: {profile: intel-quantised, gpus: 1, peak_gbps: 1000}
events:
  - {at: 0, start: {id: hog, cpu: hog}}
  - {at: 0, start: {id: quiet, cpu_gbps: 2}}
"""


@pytest.mark.fuse
def test_every_cpu_job_of_a_source_is_held_at_its_default_cap(tmp_path):
    try:
        root = find_cpuset_root()
    except RuntimeError as e:
        pytest.skip(str(e))
    sim = SimNode(parse_scenario(SCENARIO, "inline"), workdir=str(tmp_path), cpuset_root=root).start()
    daemon = None
    try:
        base = {"tick_s": 0.25, "metrics": {"port": 0}}
        mapping = daemon_config(sim, base, str(tmp_path))
        mapping["jobs"]["sources"][0]["cap_gbps"] = 12  # the hog asks 16 GB/s, the quiet job 2
        config = parse_config(yaml.safe_dump(mapping), "test")
        sim.step()  # the jobs start
        write_labels(sim, os.path.join(str(tmp_path), LABELS))
        daemon = build_daemon(config).daemon
        results = []
        deadline, t = time.monotonic() + 20, time.monotonic()

        def tick_until(pred, what):
            nonlocal t
            while time.monotonic() < deadline:
                t += config.tick_s
                threading.Event().wait(max(0.0, t - time.monotonic()))  # paced as a host's ticks
                sim.step()
                results.append(daemon.tick())
                if pred(results[-1]):
                    return results[-1]
            raise AssertionError(f"timed out waiting for {what}; last caps: {dict(results[-1].caps)}")

        r = tick_until(lambda r: {"cgroup:hog", "cgroup:quiet"} <= set(r.caps)
                       and all(c.mode == "noded" for c in r.caps.values()), "both jobs capped and steered")
        for job in ("cgroup:hog", "cgroup:quiet"):
            c = r.caps[job]
            assert c.cap_bps == 12 * GB and c.source == "source default" and "jobs.sources[].cap_gbps" in c.why
            assert r.sample.jobs[job].source == "cgroup" and job not in r.levels
        rc = sim.open_resctrl()
        group = daemon.parts.throttle.cap_name("cgroup:hog")
        # (a deadline, not a pace: the holder settles in seconds, and beside stress-ng and the
        # suite its 100 ms periods are starved; 10 s ran out there once)
        wait_for(lambda: within(rate_bounds_over(rc, group, 1.0), 12 * GB, 0.05), timeout=30,
                 what="the hog within 5 % of its source's cap")
        # a job under its cap moves what it asks: a cap is a ceiling, not a share
        quiet = daemon.parts.throttle.cap_name("cgroup:quiet")
        wait_for(lambda: within(rate_bounds_over(rc, quiet, 1.0), 2 * GB, 0.1), timeout=30,
                 what="the quiet job at the 2 GB/s it asks")
        daemon.shutdown()
        daemon = None
        assert not [g.name for g in rc.list_ctrl_groups() if g.name.startswith(config.resctrl.prefix)]
    finally:
        if daemon is not None:
            daemon.shutdown()
        sim.stop()
