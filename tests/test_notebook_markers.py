"""Every nbval marker in a notebook is one nbval recognises: a misspelt marker is checked as ordinary output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from nbval.plugin import comment_markers

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def marker_lines(path: Path) -> list[tuple[int, str]]:
    """(cell index, comment) for each comment line of a code cell that mentions NBVAL."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(index, line.lstrip("#").strip())
            for index, cell in enumerate(cells) if cell["cell_type"] == "code"
            for line in "".join(cell["source"]).splitlines()
            if line.startswith("#") and "NBVAL" in line]


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda path: path.name)
def test_each_marker_is_one_nbval_reads(path):
    unread = [(index, comment) for index, comment in marker_lines(path) if comment not in comment_markers]
    assert not unread, (f"{path.name}: nbval reads a marker only when the comment line holds it alone; "
                        f"put any explanation on the next line: {unread}")


def test_a_marker_with_an_explanation_on_its_line_is_caught(tmp_path):
    cell = {"cell_type": "code", "source": ["# NBVAL_IGNORE_OUTPUT  (timings differ)\n", "print(1)\n"]}
    notebook = tmp_path / "x.ipynb"
    notebook.write_text(json.dumps({"cells": [cell]}), encoding="utf-8")
    assert [comment for _, comment in marker_lines(notebook) if comment not in comment_markers] == [
        "NBVAL_IGNORE_OUTPUT  (timings differ)"]
