"""How many descriptors the control plane may hold, and making sure the process can.

Each endpoint caps its open connections (``Limits.max_connections``), so together
they hold at most ``CONTROL_PLANE_DESCRIPTORS``, whatever clients do. Everything else
the process may open belongs to the control loop (resctrl counters, cgroup files,
/proc, MPS pipes, the state directory): it gets a large reserve that no number of
clients can eat into. ``ensure_descriptor_budget`` raises RLIMIT_NOFILE's soft limit
to cover both, before anything is opened, and refuses to start where even the hard
limit cannot hold the caps plus a minimum reserve.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from noded.server.stream import Limits

#: the admin socket (root and the admin group): nodectl calls, a few at a time
ADMIN = Limits(deadline_s=5.0, max_request_bytes=64 * 1024, max_connections=64, max_per_peer=16)
#: the report socket (mode 0666: any local user): one short `report` per training iteration
REPORTS = Limits(deadline_s=5.0, max_request_bytes=4096, max_connections=256, max_per_peer=32)
#: the metrics endpoint (TCP): Prometheus's scrape, whose timeout is 10 s by default
METRICS = Limits(deadline_s=10.0, max_request_bytes=8192, max_connections=64, max_per_peer=16)

#: per endpoint, besides its clients: the listener, the selector and a wake-up socket pair
_PER_ENDPOINT = 4
CONTROL_PLANE_DESCRIPTORS = sum(limits.max_connections + _PER_ENDPOINT for limits in (ADMIN, REPORTS, METRICS))

#: what the control loop is given besides: one descriptor per monitored group, L3 domain
#: and counter (500 jobs x 4 domains x 2 events = 4000), plus files, pipes and children
LOOP_RESERVE = 8192
#: below this the loop could run short on a busy host: refuse to start instead
LOOP_MINIMUM = 1024

#: what systemd/noded.service sets (LimitNOFILE=): CONTROL_PLANE_DESCRIPTORS + LOOP_RESERVE, rounded up
UNIT_LIMIT_NOFILE = 16384


class DescriptorBudgetError(Exception):
    pass


@dataclass(frozen=True)
class DescriptorBudget:
    soft: int  # the soft limit now in force
    raised_from: int | None  # the soft limit before, where it was raised
    control_plane: int
    loop_reserve: int  # what is left for the loop: soft - control_plane

    def describe(self) -> str:
        raised = f" (raised from {self.raised_from})" if self.raised_from is not None else ""
        return (f"descriptor limit {self.soft}{raised}: at most {self.control_plane} for admin, report and "
                f"metrics clients, {self.loop_reserve} for the control loop")


def ensure_descriptor_budget(control_plane: int = CONTROL_PLANE_DESCRIPTORS, *, reserve: int = LOOP_RESERVE,
                             minimum: int = LOOP_MINIMUM) -> DescriptorBudget:
    """Raise RLIMIT_NOFILE's soft limit towards control_plane + reserve (as far as the hard
    limit allows); DescriptorBudgetError if it cannot reach control_plane + minimum."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    want = control_plane + reserve
    need = control_plane + minimum
    if soft != infinite and soft < want:
        target = want if hard == infinite or hard >= want else hard
        if target < need:
            raise DescriptorBudgetError(
                f"the descriptor limit is too low: RLIMIT_NOFILE allows {hard} at most, and noded needs "
                f"{need} ({control_plane} for admin, report and metrics clients, {minimum} for its control loop; "
                f"{want} is better): raise it (systemd: LimitNOFILE={UNIT_LIMIT_NOFILE}; a shell: ulimit -n)")
        if target > soft:
            try:
                # Under the unit, LimitNOFILE has set it already; setrlimit is filtered out there.
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            except (OSError, ValueError) as e:
                if soft < need:
                    raise DescriptorBudgetError(f"cannot raise the descriptor limit from {soft} to {target}: {e}; "
                                                f"noded needs {need}") from None
                target = soft
        return DescriptorBudget(target, soft if target != soft else None, control_plane, target - control_plane)
    limit = soft if soft != infinite else 1 << 30
    return DescriptorBudget(limit, None, control_plane, limit - control_plane)
