"""The contention results as a bar chart in the manner of CODA's Fig. 7: the victim's
performance normalised to running alone, per stressor level, without and with noded."""

from __future__ import annotations


def plot(results: list[dict], victim: str, path: str) -> str:
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
            values = [next(c["victim_normalised"] for c in cells if c["share"] == s and c["noded"] == noded)
                      for s in shares]
            bars = ax.bar([i + offset for i in x], values, width, color=colour, label=label)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="victim alone")
        ax.set_xticks(list(x), [f"{s:.0%}" for s in shares])
        ax.set_xlabel("stressor bandwidth, share of the node's peak")
        ax.set_title(result["node"], fontsize=9)
        ax.set_ylim(0, 1.2)
    axes[0][0].set_ylabel(f"{victim} victim, normalised performance")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))  # room for the legend above the panels
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
