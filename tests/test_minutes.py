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
    cells = [md("# 00 · Test\n\n**Minutes:** 10: 5 for the exercise\n" + "word " * 142),  # 150 words: 1 min
             code("\n".join(["x = 1"] * 15), [PRINTED, CHART]),  # 1 min of code, 0.2 of output, 0.5 of chart
             code("\n".join(["y = 2"] * 150), tags=["solution"])]  # not counted
    reading = minutes.read(notebook(tmp_path, cells))
    assert minutes.reading_minutes(cells) == 1 + 1 + 4 / 20 + 0.5
    assert (reading.words, reading.exercise) == (150, 5)
    assert reading.minutes == 10  # 2.7 x 0.87 + 5 = 7.3, rounded up to 5 minutes


def test_a_deep_dive_runs_to_the_next_heading_of_its_level_or_higher(tmp_path):
    cells = [md("# 00 · Test"), md("## 1. First · core"), md("one"),
             md("## 2. Costs · deep dive"), md("two two"), md("### 2.1 Inside the dive"), md("three three three"),
             md("## 3. Back · core"), md("four four four four")]
    kept = ["".join(c["source"]) for c in minutes.core_cells(cells)]
    assert kept == ["# 00 · Test", "## 1. First · core", "one", "## 3. Back · core", "four four four four"]
    reading = minutes.read(notebook(tmp_path, cells))
    assert (reading.words, reading.core_words) == (26, 13)  # a heading's # and · are not words
