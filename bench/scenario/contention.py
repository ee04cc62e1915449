"""The contention matrix: the victim alone, then beside the stressor at each share of
the peak, each without and with noded; every figure normalised to the victim alone."""

from __future__ import annotations

from .noded_run import SCENARIO_CONTENTION

SHARES = (0.25, 0.5, 0.75, 1.0)
#: noded's throttle threshold (a share of the node's peak) in every cell
THRESHOLD = SCENARIO_CONTENTION.threshold


def run_matrix(node, shares, warmup_s: int, seconds: int, progress) -> dict:
    """Cells in the order they ran; ``progress(label, done, total)`` while each runs."""
    plan = [(None, False)] + [(s, w) for s in shares for w in (False, True)]
    cells = []
    for i, (share, with_noded) in enumerate(plan):
        label = f"[{i + 1}/{len(plan)}] {node.key}: " + (
            "victim alone" if share is None else f"stressor {share:.0%}, noded {'on' if with_noded else 'off'}")
        cell = node.run_cell(share, with_noded, warmup_s, seconds,
                             progress=lambda done, total, label=label: progress(label, done, total))
        cell.update(share=share, noded=with_noded)
        cells.append(cell)
    solo = cells[0]["victim"]
    for c in cells:
        c["victim_normalised"] = round(c["victim"] / solo, 3) if solo else None
        c["node_share_of_peak"] = round(c["node_gbps"] / node.peak_gbps, 3)
    return {"node": node.name, "key": node.key, "unit": node.unit, "peak_gbps": node.peak_gbps,
            "victim_solo": solo, "cells": cells}


def describe_actions(actions: list[dict], throttle: str | None, why_none: str = "") -> str:
    """noded's actions in a cell: "-" without noded, "none" (with ``why_none``) where it took none."""
    if not actions:
        return "-" if throttle is None else f"none: {why_none}" if why_none else "none"
    parts = []
    for a in actions[:3]:
        verb = "halved cores" if throttle == "cores" and a["kind"] == "throttle" else \
            f"{a['kind']} L{a['from']}->L{a['to']}"
        parts.append(f"{verb} at {a['t']:.1f}s")
    more = f" (+{len(actions) - 3})" if len(actions) > 3 else ""
    return "; ".join(parts) + more


def why_no_action(cell: dict, threshold: float) -> str:
    """Why noded, running in ``cell``, changed nothing, from what the cell measured: the
    node under the throttle threshold; else the GPU job not slowed below its baseline
    (the threshold's other half, which the cell does not record)."""
    share = cell["node_share_of_peak"]
    if share < threshold:
        return f"node at {share:.0%} of peak, under the {threshold:.0%} threshold"
    return f"node at {share:.0%} of peak, but the GPU job not below its baseline"


def table(result: dict, threshold: float = THRESHOLD) -> str:
    head = (f"{result['node']}: victim in {result['unit']}, alone {result['victim_solo']:g}; "
            f"node peak {result['peak_gbps']:.1f} GB/s")
    lines = [head, f"  {'stressor':>8} {'noded':>5} {'victim/solo':>11} {'node GB/s':>9} {'of peak':>7} "
                   f"{'noded CPU':>9}  noded's actions"]
    for c in result["cells"]:
        stressor = "none" if c["share"] is None else f"{c['share']:.0%}"
        cpu = c.get("noded_cpu_share")
        lines.append(f"  {stressor:>8} {'on' if c['noded'] else 'off':>5} {c['victim_normalised']:>11.2f} "
                     f"{c['node_gbps']:>9.1f} {c['node_share_of_peak']:>7.0%} "
                     f"{'-' if cpu is None else f'{cpu:.1%}':>9}  "
                     f"{describe_actions(c['actions'], c['throttle'], why_no_action(c, threshold))}")
    lines.append("  noded CPU: the daemon's own (a process of its own, /proc) over the cell, a share of one core")
    return "\n".join(lines)
