"""Charts with one message each, in the same colours across every notebook.

Grey is work that had to happen once, red is work that repeated, blue is what
the database kept. Each function draws, shows and returns nothing, so a
notebook cell prints no object address.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

NEEDED = "#9e9e9e"
REPEATED = "#d62728"
STORED = "#1f77b4"


def calls_vs_artifacts(labels: Sequence[str], calls: Sequence[int], needed: Sequence[int] | int,
                       stored: Sequence[int], title: str, calls_label: str = "calls",
                       stored_label: str = "stored artifacts", xlabel: str | None = None) -> None:
    """Per label: calls made (needed part grey, repeated part red) beside artifacts stored (blue)."""
    if isinstance(needed, int):
        needed = [needed] * len(labels)
    first = [min(c, n) for c, n in zip(calls, needed)]
    repeated = [c - f for c, f in zip(calls, first)]
    xs = range(len(labels))
    width = 0.38
    crowded = len(labels) > 12
    fig, ax = plt.subplots(figsize=(min(14.0 if crowded else 11.0, 0.7 * len(labels) + 4), 5.2 if crowded else 4.2))
    ax.bar([x - width / 2 for x in xs], first, width, color=NEEDED, label=f"{calls_label}, needed once")
    ax.bar([x - width / 2 for x in xs], repeated, width, bottom=first, color=REPEATED,
           label=f"{calls_label}, repeated")
    ax.bar([x + width / 2 for x in xs], stored, width, color=STORED, label=stored_label)
    ax.set_xticks(list(xs), labels, rotation=60 if crowded else 25, ha="right")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("count")
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    plt.show()
