"""Charts with one message each, in one palette with one meaning per colour in every notebook.

Grey is work that had to happen once, red is work that repeated, blue is what
was kept (stored by the journal or received by the destination: the result
that counts). Orange is work that was needed and never happened (a lost
effect). No other colour means anything. Fonts are sized for a projector.
Each function draws, shows and returns nothing, so a notebook cell prints no
object address.
"""
from __future__ import annotations

from contextlib import contextmanager
from itertools import groupby
from typing import Iterator, Sequence

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

NEEDED = "#9e9e9e"    # needed once
REPEATED = "#d62728"  # repeated: paid for or done again
STORED = "#1f77b4"    # kept: what the database stored or the destination holds
KEPT = STORED
MISSING = "#ff7f0e"   # needed and never done (for example a lost notification)


# Sizes a room can read from the back: matplotlib's defaults are 10 pt.
PROJECTOR = {
    "font.size": 14,
    "axes.titlesize": 16,
    "axes.labelsize": 14,
    "xtick.labelsize": 12,
    "ytick.labelsize": 13,
    "legend.fontsize": 13,
}

GROUP_GAP = 0.8  # empty bar slots between two groups of labels


@contextmanager
def projector() -> Iterator[None]:
    """Projector font sizes for the charts drawn inside the block; matplotlib's defaults after it."""
    with plt.rc_context(PROJECTOR):
        yield


def shared_ymax(*counts: Sequence[int]) -> int:
    """One y-limit for charts that are compared side by side: the largest count in any of them."""
    return max((max(series, default=0) for series in counts), default=0)


def _positions(labels: Sequence[str], groups: Sequence[str] | None) -> list[float]:
    """X positions of the labels, with a gap wherever the group changes."""
    if not groups:
        return [float(i) for i in range(len(labels))]
    if len(groups) != len(labels):
        raise ValueError(f"groups has {len(groups)} entries for {len(labels)} labels: give one group per label")
    xs, x = [], 0.0
    for i, group in enumerate(groups):
        if i and group != groups[i - 1]:
            x += GROUP_GAP
        xs.append(x)
        x += 1.0
    return xs


def _label_groups(ax, xs: list[float], groups: Sequence[str]) -> None:
    """Write each group's name once, centred under its bars."""
    start = 0
    for group, members in groupby(groups):
        count = len(list(members))
        centre = (xs[start] + xs[start + count - 1]) / 2
        ax.annotate(group, xy=(centre, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 6),
                    textcoords="offset points", ha="center", va="bottom", fontweight="bold")
        start += count


def calls_vs_artifacts(labels: Sequence[str], calls: Sequence[int], needed: Sequence[int] | int,
                       stored: Sequence[int], title: str, calls_label: str = "calls",
                       stored_label: str = "stored artifacts", xlabel: str | None = None, *,
                       groups: Sequence[str] | None = None, ymax: int | None = None,
                       missing: Sequence[int] | None = None, missing_label: str = "needed, never done",
                       kept_needed: Sequence[int] | int | None = None) -> None:
    """Per label: calls made (needed part grey, repeated part red) beside what was kept (blue).

    A call that was needed and never made is drawn orange in the calls bar.
    What was kept beyond the needed count is a duplicate: blue counts only up
    to ``kept_needed`` (by default ``needed``: one artifact per call), and the
    rest of the kept bar is red. ``missing`` (one count
    per label) adds a third, orange bar: what was needed and never done, such
    as a lost notification; where it is zero for every label, a note says so.

    ``groups`` (one name per label) separates the bars into groups with a gap
    and names each group once above its bars. ``ymax`` fixes the top of the
    y-axis, so two charts compared side by side share a scale (``shared_ymax``).
    A series that is zero for every label gets no bars and no legend entry; a
    note under the chart says it is zero instead.
    """
    if isinstance(needed, int):
        needed = [needed] * len(labels)
    kept_needed = needed if kept_needed is None else kept_needed
    if isinstance(kept_needed, int):
        kept_needed = [kept_needed] * len(labels)
    if not len(labels) == len(calls) == len(needed) == len(stored) == len(missing or stored):
        raise ValueError(f"give one value per label: {len(labels)} labels, {len(calls)} calls, "
                         f"{len(needed)} needed, {len(stored)} stored, {len(missing or stored)} missing")
    first = [min(c, n) for c, n in zip(calls, needed)]
    repeated = [c - f for c, f in zip(calls, first)]
    never = [n - f for n, f in zip(needed, first)]
    kept = [min(s, n) for s, n in zip(stored, kept_needed)]
    kept_twice = [s - k for s, k in zip(stored, kept)]
    xs = _positions(labels, groups)
    third = bool(missing) and any(missing)
    width = 0.27 if third else 0.4
    left, right = (-width, 0.0) if third else (-width / 2, width / 2)
    crowded = len(labels) > 12
    with projector():
        fig, ax = plt.subplots(figsize=(min(16.0, 0.75 * (xs[-1] + 1 if xs else 1) + 5.5), 6.2 if crowded else 5.2))
        notes = []
        series = [(first, NEEDED, f"{calls_label}, needed once", None),
                  (repeated, REPEATED, f"{calls_label}, repeated", first),
                  (never, MISSING, f"{calls_label}, needed and never made", first)]
        for values, colour, label, bottom in series:
            if any(values):
                ax.bar([x + left for x in xs], values, width, bottom=bottom, color=colour, label=label)
            elif label.endswith("repeated"):
                notes.append(f"no {calls_label} repeated")
        if any(stored):
            ax.bar([x + right for x in xs], kept, width, color=KEPT, label=stored_label)
            if any(kept_twice):
                ax.bar([x + right for x in xs], kept_twice, width, bottom=kept, color=REPEATED,
                       label=f"{stored_label}, duplicates", hatch="//", edgecolor="white")
        else:
            notes.append(f"{stored_label}: 0 everywhere")
        if third:
            ax.bar([x + width for x in xs], missing, width, color=MISSING, label=missing_label)
        elif missing is not None:
            notes.append(f"{missing_label}: 0 everywhere")
        ax.set_xticks(xs, labels, rotation=60 if crowded else 25, ha="right")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        top = ymax if ymax is not None else max([*calls, *stored, *(missing or []), 1])
        ax.set_ylim(0, top * 1.08)
        ax.set_ylabel("count")
        if xlabel:
            ax.set_xlabel(xlabel)
        if groups:
            _label_groups(ax, xs, groups)
            ax.set_title(title, pad=30)
        else:
            ax.set_title(title)
        if notes:
            ax.text(0.0, -0.02, "; ".join(notes), transform=fig.transFigure, ha="left", va="bottom",
                    fontsize=12, style="italic")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        fig.tight_layout(rect=(0, 0.04 if notes else 0, 1, 1))
        plt.show()


def repeated_bars(labels: Sequence[str], values: Sequence[int], title: str, ylabel: str,
                  xlabel: str | None = None, label: str = "paid again") -> None:
    """One red bar per label: how much work repeated there (for example tokens a crash paid twice)."""
    with projector():
        fig, ax = plt.subplots(figsize=(min(16.0, 0.75 * len(labels) + 5.5), 5.2))
        ax.bar(list(labels), list(values), color=REPEATED, label=label)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        if xlabel:
            ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        fig.tight_layout()
        plt.show()


def cost_per_step(result: dict, compared: dict | None = None) -> None:
    """What a journaled step costs on this machine: the kit (blue) against the raw SQLite floor (grey).

    ``result`` is ``bench.measure``'s: one panel per ``synchronous`` level,
    microseconds per step for workflows of 10, 100 and 1000 steps, the ratio
    over each pair. ``compared`` (``bench.compare``'s, optional) adds a panel
    of the same work on every engine as multiples of the raw floor (the other
    engines in white: their colour means nothing).
    """
    levels = list(result["levels"])
    engines = [e for e in (compared or {}).get("engines", []) if "skipped" not in e]
    panels = len(levels) + (1 if engines else 0)
    width = 0.38
    with projector():
        fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 5.2), squeeze=False)
        for ax, level in zip(axes[0], levels):
            per_step = result["levels"][level]["per_step"]
            counts = list(per_step)
            xs = range(len(counts))
            raw = [per_step[n]["raw_us"] for n in counts]
            kit = [per_step[n]["kit_us"] for n in counts]
            ax.bar([x - width / 2 for x in xs], raw, width, color=NEEDED, label="raw INSERT + COMMIT")
            ax.bar([x + width / 2 for x in xs], kit, width, color=KEPT, label="journaled step")
            for x, n in zip(xs, counts):
                ax.text(x + width / 2, kit[x], f"{per_step[n]['ratio']:.1f}×", ha="center", va="bottom")
            ax.set_xticks(list(xs), [f"{n} steps" for n in counts])
            ax.set_ylim(0, max(kit + raw) * 1.2)
            ax.set_ylabel("µs per step")
            ax.set_title(f"synchronous={level}")
        if engines:
            ax = axes[0][-1]
            n = next(iter(engines[0]["per_step_vs_raw"]))
            names = [e["engine"] for e in engines]
            per_step = [e["per_step_vs_raw"][n] for e in engines]
            per_workflow = [e["per_workflow_vs_raw"] for e in engines]
            xs = range(len(names))
            colours = [{"raw": NEEDED, "kit": KEPT}.get(name, "white") for name in names]
            ax.bar([x - width / 2 for x in xs], per_step, width, color=colours, edgecolor="black",
                   label=f"per step ({n} steps)")
            ax.bar([x + width / 2 for x in xs], per_workflow, width, color=colours, edgecolor="black", hatch="//",
                   label="per 1-step workflow")
            ax.set_xticks(list(xs), names)
            ax.set_ylabel("× one raw commit")
            ax.set_title("the same work, other engines (FULL)")
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
        axes[0][0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
        fig.tight_layout()
        plt.show()
