"""The crash lab's tables and charts: rows as DataFrames, repeated work by point, where random kills landed.

In the workshop's palette: red is work that repeated, orange work that was
needed and never happened (a lost effect), white nothing different from the
clean run; grey is a kill or a pause that landed. The heatmap carries its
own colour key. Importing this module imports pandas and matplotlib;
``durable_kit.harness.crashlab`` does not.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.colors import LinearSegmentedColormap, TwoSlopeNorm
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ...harness.crashlab import summary_row
from .charts import MISSING, NEEDED, REPEATED, projector


def explore_frame(rows: list[dict]) -> pd.DataFrame:
    """``explore``'s rows as a table: one line per point and action, every count its own column."""
    frame = pd.DataFrame([summary_row(r) for r in rows])
    counts = [c for c in frame.columns if c.endswith((" calls", " requests", " effects"))]
    frame[counts] = frame[counts].fillna(0).astype(int)
    return frame


def repeated_frame(rows: list[dict]) -> pd.DataFrame:
    """Repeated work by point (rows) and counter (columns): each count minus the clean run's.

    With several actions per point, or several workflows crashed at it, the
    largest difference is kept (exit and SIGKILL at one point usually agree,
    and so do two copies of one workflow; the table says where they do not).
    """
    crashes = [r for r in rows if r["point"] != "clean"]
    frame = pd.DataFrame([{"point": r["point"], **r["repeated"]} for r in crashes])
    frame = frame.fillna({c: 0 for c in frame.columns if c != "point"})
    order = list(dict.fromkeys(r["point"] for r in crashes))
    frame = frame.groupby("point", sort=False).agg(lambda values: max(values, key=abs)).loc[order]
    columns = sorted(frame.columns, key=lambda c: (not c.endswith(" calls"), c.endswith(" effects"), c))
    return frame[columns].astype(int)


def fuzz_frame(result: dict) -> pd.DataFrame:
    """``fuzz``'s trials as a table: what was armed, what fired, pauses, the status and any violation."""
    return pd.DataFrame([{"trial": r["trial"], "armed": ", ".join(f"{p} ({a})" for p, a in r["armed"]),
                          "fired": ", ".join(r["fired"]), "workers": r["children"], "paused": r["paused"],
                          "status": r["status"],
                          "invariants_held": r["invariants_held"], "violations": "; ".join(r["violations"])}
                         for r in result["rows"]])


def repeated_work_heatmap(rows: list[dict], title: str) -> None:
    """A grid of fault points by counters, with a colour key: red where a crash there repeated work, orange
    where needed work was never done, white where the count is the clean run's."""
    frame = repeated_frame(rows)
    limit = max(1, int(frame.abs().to_numpy().max()))
    colours = LinearSegmentedColormap.from_list("lost-same-repeated", [MISSING, "#ffffff", REPEATED])
    with projector():
        fig, ax = plt.subplots(figsize=(1.25 * len(frame.columns) + 5.5, 0.42 * len(frame) + 2.6))
        ax.imshow(frame.to_numpy(), cmap=colours, norm=TwoSlopeNorm(0, -limit, limit), aspect="auto")
        for (y, x), value in pd.DataFrame(frame.to_numpy()).stack().items():
            if value:
                ax.text(x, y, f"{value:+d}", ha="center", va="center", fontsize=12)
        ax.set_xticks(range(len(frame.columns)), frame.columns, rotation=30, ha="right")
        ax.set_yticks(range(len(frame)), frame.index)
        ax.set_xlabel("counted at the destination, minus the clean run")
        ax.set_ylabel("the worker died at")
        ax.set_title(title)
        ax.legend(handles=[Patch(color=REPEATED, label="more than the clean run: repeated"),
                           Patch(facecolor="#ffffff", edgecolor=NEEDED, label="as the clean run"),
                           Patch(color=MISSING, label="fewer: needed and never done")],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="colour key")
        fig.tight_layout()
        plt.show()


def kill_point_histogram(result: dict, title: str) -> None:
    """How many random kills and pauses landed at each fault point, in the order the clean run reached them; in
    a journal of several workflows, one bar a point, one segment a workflow (``after_send:hold in lab-2``)."""
    several = result.get("workflows", 1) > 1
    named = [where.rsplit(" in ", 1) if several else (where, None) for where in result["points"]]
    points, workflows = list(dict.fromkeys(p for p, _ in named)), list(dict.fromkeys(w for _, w in named))
    with projector():
        fig, ax = plt.subplots(figsize=(11, 0.38 * len(points) + 2.2))
        left = [0] * len(points)
        for n, workflow in enumerate(workflows):
            counts = [result["kill_points"].get(p if workflow is None else f"{p} in {workflow}", 0) for p in points]
            ax.barh(range(len(points)), counts, left=left, color=NEEDED, edgecolor="#ffffff",
                    hatch=("", "//", "..", "xx")[n % 4], label=workflow)
            left = [a + b for a, b in zip(left, counts)]
        ax.set_yticks(range(len(points)), points)
        ax.invert_yaxis()
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(f"kills and pauses that fired, over {result['trials']} trials")
        if several:
            ax.legend(loc="lower right", frameon=False, title="in workflow")
        ax.set_title(title)
        fig.tight_layout()
        plt.show()
