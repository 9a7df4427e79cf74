"""The chart helper: one palette, no empty legend entries, grouped bars with gaps, shared y-limits."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from durable_kit.workshop.lab import charts  # noqa: E402


@pytest.fixture
def drawn(monkeypatch):
    """The figure each chart call shows, instead of showing it."""
    figures = []
    monkeypatch.setattr(plt, "show", lambda: figures.append(plt.gcf()))
    yield figures
    plt.close("all")


def bars_by_colour(fig) -> dict[str, list[tuple[int, float]]]:
    """Each colour's drawn bars as (the label slot nearest the bar's centre, height)."""
    bars = {}
    for patch in fig.axes[0].patches:
        if patch.get_height():
            bars.setdefault(matplotlib.colors.to_hex(patch.get_facecolor()), []).append(
                (round(patch.get_x() + patch.get_width() / 2), patch.get_height()))
    return bars


def legend(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_a_series_that_is_zero_everywhere_has_no_legend_entry_but_a_note(drawn):
    charts.calls_vs_artifacts(["a", "b"], [7, 9], 7, [0, 0], "t", calls_label="model calls",
                              stored_label="stored results")
    (fig,) = drawn
    assert legend(fig) == ["model calls, needed once", "model calls, repeated"]
    assert "stored results: 0 everywhere" in [t.get_text() for t in fig.axes[0].texts]


def test_colours_keep_one_meaning_and_fonts_are_projector_sized(drawn):
    charts.calls_vs_artifacts(["a", "b"], [1, 2], 1, [1, 1], "t")
    (fig,) = drawn
    ax = fig.axes[0]
    colours = {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches}
    assert colours == {charts.NEEDED, charts.REPEATED, charts.KEPT}
    assert ax.title.get_fontsize() == charts.PROJECTOR["axes.titlesize"]
    assert ax.yaxis.label.get_fontsize() == charts.PROJECTOR["axes.labelsize"]
    assert plt.rcParams["font.size"] == 10.0  # the projector sizes did not leak into later charts


def test_groups_leave_a_gap_and_are_named_once(drawn):
    labels = ["exit", "kill", "exit", "kill"]
    charts.calls_vs_artifacts(labels, [1, 1, 2, 2], 1, [1, 1, 1, 1], "t", groups=["naive", "naive", "keys", "keys"])
    (fig,) = drawn
    ticks = list(fig.axes[0].get_xticks())
    assert ticks == [0.0, 1.0, 2.0 + charts.GROUP_GAP, 3.0 + charts.GROUP_GAP]
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["keys", "naive"]
    with pytest.raises(ValueError, match="one group per label"):
        charts.calls_vs_artifacts(labels, [1, 1, 2, 2], 1, [1, 1, 1, 1], "t", groups=["naive"])


def test_two_charts_compared_side_by_side_can_share_a_y_limit(drawn):
    top = charts.shared_ymax([1, 2], [1, 1], [5, 3])
    assert top == 5
    charts.calls_vs_artifacts(["a"], [1], 1, [1], "good", ymax=top)
    charts.calls_vs_artifacts(["a"], [5], 1, [1], "bad", ymax=top)
    assert drawn[0].axes[0].get_ylim() == drawn[1].axes[0].get_ylim()


def test_the_old_positional_call_still_works(drawn):
    charts.calls_vs_artifacts(["x"], [2], [1], [1], "title", "calls", "stored", "xlabel")
    assert drawn[0].axes[0].get_xlabel() == "xlabel"


def test_cost_per_step_draws_each_level_and_the_engines_that_ran(drawn):
    from durable_kit import bench

    tiny = bench.Settings(step_counts=(10, 20), rounds=1, workflow_rounds=1, replay_steps=10, replay_samples=1,
                          fsync_steps=5, fsync_workflows=1)
    result = bench.measure(tiny)
    compared = {"engines": [
        {"engine": "raw", "per_step_vs_raw": {"10": 1.0}, "per_workflow_vs_raw": 1.0},
        {"engine": "kit", "per_step_vs_raw": {"10": 1.5}, "per_workflow_vs_raw": 5.0},
        {"engine": "dbos", "skipped": "the graduate extra is not installed"}]}
    charts.cost_per_step(result, compared)
    (fig,) = drawn
    assert [ax.get_title() for ax in fig.axes] == ["synchronous=FULL", "synchronous=NORMAL",
                                                  "the same work, other engines (FULL)"]
    full = result["levels"]["FULL"]["per_step"]
    assert [t.get_text() for t in fig.axes[0].texts] == [f"{full[n]['ratio']:.1f}×" for n in full]
    assert [t.get_text() for t in fig.axes[2].get_xticklabels()] == ["raw", "kit"]  # a skipped engine draws nothing
    colours = [matplotlib.colors.to_hex(p.get_facecolor()) for p in fig.axes[2].patches[:2]]
    assert colours == [charts.NEEDED, charts.KEPT]


def test_what_was_needed_and_never_done_is_an_orange_bar_of_its_own(drawn):
    charts.calls_vs_artifacts(["sent", "lost"], [7, 7], 7, [7, 7], "t", stored_label="stored",
                              missing=[0, 1], missing_label="notifications never sent")
    (fig,) = drawn
    orange = [p for p in fig.axes[0].patches if matplotlib.colors.to_hex(p.get_facecolor()) == charts.MISSING]
    assert [p.get_height() for p in orange] == [0, 1]
    assert legend(fig)[-1] == "notifications never sent"
    charts.calls_vs_artifacts(["sent"], [7], 7, [7], "t", missing=[0], missing_label="never sent")
    assert [t.get_text() for t in drawn[1].axes[0].texts] == ["no calls repeated; never sent: 0 everywhere"]
def test_a_call_never_made_is_orange_and_a_duplicate_kept_is_red_not_blue(drawn):
    charts.calls_vs_artifacts(["lost", "twice", "once"], [0, 2, 1], 1, [0, 2, 1], "t", calls_label="payment calls",
                              stored_label="refunds")
    (fig,) = drawn
    bars = bars_by_colour(fig)
    assert bars[charts.MISSING] == [(0, 1)]  # the lost refund's needed call
    assert sorted(bars[charts.KEPT]) == [(1, 1), (2, 1)]  # blue counts one refund at most
    assert (1, 1) in bars[charts.REPEATED] and len(bars[charts.REPEATED]) == 2  # a repeated call, a second refund
    assert "refunds, duplicates" in legend(fig) and "payment calls, needed and never made" in legend(fig)


def test_what_is_kept_can_need_fewer_than_the_calls_and_beyond_that_it_is_red(drawn):
    charts.calls_vs_artifacts(["once", "sent twice", "delivered twice"], [13, 14, 14], 13, [1, 1, 2], "t",
                              stored_label="answers delivered", kept_needed=1)
    (fig,) = drawn
    bars = bars_by_colour(fig)
    assert sorted(bars[charts.KEPT]) == [(0, 1), (1, 1), (2, 1)]  # one answer each is what counts
    assert sorted(bars[charts.REPEATED]) == [(1, 1), (2, 1), (2, 1)]  # a repeated call in both, a second answer
    assert "answers delivered, duplicates" in legend(fig)


def test_repeated_bars_are_red_and_projector_sized(drawn):
    charts.repeated_bars(["turn:1", "turn:7"], [125, 569], "t", ylabel="tokens paid twice")
    (fig,) = drawn
    ax = fig.axes[0]
    assert {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches} == {charts.REPEATED}
    assert ax.title.get_fontsize() == charts.PROJECTOR["axes.titlesize"]


# --- every chart of every notebook is drawn by the shared chart modules ------------------------------------------

def chart_cells():
    """(notebook, cell index, source) for each code cell whose committed output holds an image."""
    import json
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "code" and any("image/png" in o.get("data", {}) for o in cell.get("outputs", [])):
                yield path.name, index, "".join(cell["source"])


def test_every_chart_cell_draws_with_the_shared_palette_and_style():
    import re

    from durable_kit.workshop.lab import crashlab_charts

    drawers = {name for module in (charts, crashlab_charts) for name in dir(module)
               if callable(getattr(module, name)) and getattr(getattr(module, name), "__module__", "") == module.__name__
               and not name.startswith("_")} - {"projector", "shared_ymax", "summary_row"}
    cells = list(chart_cells())
    assert len(cells) >= 10
    own_style = re.compile(r"\b(plt|ax|fig|sns)\.|\bcolou?rs?\s*=|#[0-9a-fA-F]{6}\b|\bcmap\s*=")
    for notebook, index, source in cells:
        assert any(re.search(rf"\b{name}\(", source) for name in drawers), (
            f"{notebook} cell {index} draws a chart without durable_kit.workshop.lab.charts: {source[:80]!r}")
        assert not own_style.search(source), (
            f"{notebook} cell {index} sets its own colours or style: {own_style.search(source).group(0)!r}")


def test_every_notebook_shows_at_least_one_chart():
    from pathlib import Path

    notebooks = {path.name for path in (Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")}
    charted = {notebook for notebook, _, _ in chart_cells()}
    assert notebooks and not notebooks - charted, f"no chart in {sorted(notebooks - charted)}"
