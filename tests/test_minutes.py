"""The instructor guide's reading model, on a notebook made for the test: what it counts and what it leaves out."""
from __future__ import annotations

import json

from durable_kit.workshop.lab import minutes


def md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def code(text: str, outputs=(), tags=()) -> dict:
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": text, "outputs": list(outputs),
            "execution_count": 1}


PRINTED = {"output_type": "stream", "name": "stdout", "text": "a\nb\nc\nd\n"}
CHART = {"output_type": "display_data", "data": {"image/png": "...", "text/plain": "<Figure size 640x480 with 1 Axes>"}}


def notebook(tmp_path, cells):
    path = tmp_path / "00_test.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_prose_code_output_and_charts_count_solutions_do_not(tmp_path):
    cells = [md("# 00 · Test\n\n" + "word " * 142),  # 144 words
             md("## 1. Exercise: count (5 minutes) · core"),  # 6 words: 150 in all, 1 min
             code("\n".join(["x = 1"] * 15), [PRINTED, CHART]),  # 1 min of code, 0.2 of output, 0.5 of chart
             code("\n".join(["y = 2"] * 150), tags=["solution"])]  # not counted
    reading = minutes.read(notebook(tmp_path, cells))
    assert minutes.reading_minutes(cells) == 1 + 1 + 4 / 20 + 0.5
    assert (reading.words, reading.exercise) == (150, 5)
    assert reading.minutes == 10  # 2.7 x 0.87 + 5 = 7.3, rounded up to 5 minutes


def test_an_exercise_in_a_deep_dive_counts_in_all_not_in_the_core(tmp_path):
    cells = [md("# 00 · Test\n\n**Minutes:** 5 in all, all of it core"),
             md("## 1. Exercise: one (10 minutes) · core"),
             md("## 2. Exercise: two (15 minutes) · deep dive")]
    path = notebook(tmp_path, cells)
    assert minutes.exercise_budgets(path) == (25, 10)
    reading = minutes.read(path)
    assert (reading.minutes, reading.core_minutes) == (30, 15)


def test_write_puts_the_model_s_figures_in_the_header_the_map_and_the_guide(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    cells = [md("# 00 · Test\n\n**Minutes:** 5 in all, all of it core (the model). More.\n"),
             md("## 1. Exercise: one (10 minutes) · core"), md("## 2. Exercise: two (15 minutes) · deep dive")]
    path = folder / "00_test.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    (tmp_path / "README.md").write_text("## Notebook map\n\n| # | notebook | you will see | minutes | core minutes |\n"
                                        "|---|---|---|---|---|\n| 00 | `00_test.ipynb` | a test | 1 | 1 |\n\nafter\n")
    (tmp_path / "INSTRUCTORS.md").write_text("## Minutes per notebook\n\nThe model.\n\n| notebook | words | old |\n"
                                             "|---|---|---|\n| x | 1 | 2 |\n\n## Tracks\n")
    assert minutes.write_all(folder) == ["00_test.ipynb", "README.md", "INSTRUCTORS.md"]
    assert minutes.stated(path) == (30, 15)
    assert "".join(json.loads(path.read_text())["cells"][0]["source"]).endswith(
        "**Minutes:** 30 in all, 15 for the core (the model). More.\n")
    assert "| 00 | `00_test.ipynb` | a test | 30 | 15 |\n\nafter" in (tmp_path / "README.md").read_text()
    guide = (tmp_path / "INSTRUCTORS.md").read_text()
    assert "| `00_test.ipynb` | 26 | 19 | 25 | 30 | 15 |\n| all | 26 | 19 | 25 | 30 | 15 |\n\n## Tracks" in guide
    assert minutes.write_all(folder) == []  # the figures do not move the figures


def test_a_deep_dive_runs_to_the_next_heading_of_its_level_or_higher(tmp_path):
    cells = [md("# 00 · Test"), md("## 1. First · core"), md("one"),
             md("## 2. Costs · deep dive"), md("two two"), md("### 2.1 Inside the dive"), md("three three three"),
             md("## 3. Back · core"), md("four four four four")]
    kept = ["".join(c["source"]) for c in minutes.core_cells(cells)]
    assert kept == ["# 00 · Test", "## 1. First · core", "one", "## 3. Back · core", "four four four four"]
    reading = minutes.read(notebook(tmp_path, cells))
    assert (reading.words, reading.core_words) == (26, 13)  # a heading's # and · are not words
