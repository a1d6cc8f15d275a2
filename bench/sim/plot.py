"""The openb simulator's allocation curves as a PNG: per pod list, allocation against arrived
GPU demand for every policy run, gpushare and FGD drawn bold, and gpushare less FGD below.

    python -m bench.sim.plot bench/results/openb-sim.json     # writes ...-curves.png beside it

matplotlib is a dev dependency (pyproject.toml), never a runtime one.
"""

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from bench.sim.engine import LEVELS, POLICIES

HIGHLIGHT = {"gpushare": "#d62728", "fgd": "#1f77b4"}


def plot_curves(doc: dict[str, Any], png: Path) -> None:
    """One column per pod list: allocation curves on top, gpushare - FGD below (drawn with
    the Agg backend: no display needed)."""
    plt.switch_backend("Agg")
    table: dict[str, dict[str, dict[str, Any]]] = doc["traces"]
    traces = [t for t, rows in table.items() if any("curve" in r for r in rows.values())]
    if not traces:
        raise ValueError("the results hold no curves (re-run bench.sim.run)")
    fig, axes = plt.subplots(
        2,
        len(traces),
        figsize=(3.6 * len(traces), 6.4),
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 1.3]},
        sharex=True,
    )
    for k, trace in enumerate(traces):
        rows, top, bottom = table[trace], axes[0][k], axes[1][k]
        for policy in POLICIES:
            curve = rows.get(policy, {}).get("curve")
            if curve is None:
                continue
            bold = policy in HIGHLIGHT
            top.plot(
                LEVELS,
                curve,
                label=policy,
                color=HIGHLIGHT.get(policy),
                linewidth=2.2 if bold else 0.9,
                alpha=1.0 if bold else 0.55,
                marker="o" if bold else None,
                markersize=3,
            )
        top.plot(LEVELS, LEVELS, color="grey", linestyle=":", linewidth=0.8)
        top.set_title(trace)
        top.set_ylim(50, 100)
        top.grid(alpha=0.3)
        g, f = rows.get("gpushare", {}).get("curve"), rows.get("fgd", {}).get("curve")
        if g is not None and f is not None:
            gaps = [a - b for a, b in zip(g, f, strict=True)]
            bottom.bar(
                LEVELS,
                gaps,
                width=6,
                color=["#2ca02c" if d >= 0 else "#d62728" for d in gaps],
            )
        bottom.axhline(0, color="black", linewidth=0.6)
        bottom.grid(alpha=0.3)
        bottom.set_xlabel("arrived GPU demand (% of capacity)")
        if k == 0:
            top.set_ylabel("allocated GPU share (%)")
            bottom.set_ylabel("gpushare - FGD (points)")
    axes[0][0].legend(fontsize=7, loc="lower right")
    seeds = doc.get("seeds")
    fig.suptitle(f"openb placement: allocation by arrived demand (seeds {seeds})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(args[0])
    png = path.with_name(path.stem + "-curves.png")
    plot_curves(json.loads(path.read_text()), png)
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
