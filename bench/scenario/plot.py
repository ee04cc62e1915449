"""The contention results as a bar chart in the manner of CODA's Fig. 7: the victim's
performance normalised to running alone, per stressor level, without and with noded.

Each panel's y-axis names what its node measures (the victim's own rate on this machine,
the GPU job's utilisation on the simulated node), and where noded ran and took no action
the stressor level's label says why.

    python -m bench.scenario.plot bench/results/contention.json   # the plot again from its data
"""

from __future__ import annotations

import json
import os
import sys

from .contention import THRESHOLD


def measure_label(result: dict, victim: str) -> str:
    """The y-axis of one node's panel: what its victim column measured, over alone."""
    unit = result["unit"]
    if unit.startswith("GPU utilisation"):  # the simulated node: the model of the victim's GPU job
        return f"GPU job's GPU utilisation ({victim}'s model),\nover alone"
    return f"{victim} victim, {unit} over alone"


def no_action_note(cell: dict, threshold: float) -> str:
    """Under a stressor level where noded ran and changed nothing: why, in three short lines
    (bench.scenario.contention.why_no_action, as the table says it)."""
    share = cell["node_share_of_peak"]
    if share < threshold:
        return f"noded: no action,\nnode {share:.0%} of peak\n< {threshold:.0%} threshold"
    return f"noded: no action,\nnode {share:.0%} of peak,\nGPU job not slowed"


def figure(results: list[dict], victim: str, threshold: float = THRESHOLD):
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a host
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.8), squeeze=False, sharey=True)
    for ax, result in zip(axes[0], results):
        cells = [c for c in result["cells"] if c["share"] is not None]
        shares = sorted({c["share"] for c in cells})
        x = range(len(shares))
        width = 0.38
        for offset, noded, colour, label in ((-width / 2, False, "#c44e52", "without noded"),
                                             (width / 2, True, "#4c72b0", "with noded")):
            shown = [next(c for c in cells if c["share"] == s and c["noded"] == noded) for s in shares]
            bars = ax.bar([i + offset for i in x], [c["victim_normalised"] for c in shown], width, color=colour,
                          label=label)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
            if noded:
                notes = ["" if c["actions"] else "\n" + no_action_note(c, threshold) for c in shown]
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="victim alone")
        ax.set_xticks(list(x), [f"{s:.0%}{note}" for s, note in zip(shares, notes)], fontsize=7)
        ax.set_xlabel("stressor bandwidth, share of the node's peak")
        ax.set_ylabel(measure_label(result, victim), fontsize=8)
        ax.yaxis.set_tick_params(labelleft=True)
        ax.set_title(result["node"], fontsize=9)
        ax.set_ylim(0, 1.2)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))  # room for the legend above the panels
    return fig


def plot(results: list[dict], victim: str, path: str, threshold: float = THRESHOLD) -> str:
    import matplotlib.pyplot as plt

    fig = figure(results, victim, threshold)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.scenario.plot CONTENTION_JSON (writes the .png beside it)", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        data = json.load(f)
    print(plot(data["nodes"], data["victim"], os.path.splitext(argv[0])[0] + ".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
