"""Every table and line a notebook promises is displayed: no value a cell computes and drops, no announcement
that the next cell does not print.

A notebook shows only the value of a cell's last expression. A bare expression anywhere else (a name, a
table, ``frame.head()``) is computed and thrown away: the reader sees nothing, in the committed outputs and in
the learner's copy alike. And a paragraph that ends with a colon promises that the next cell prints
something.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
# Methods whose only use is the value they return: called as a statement of their own, nothing is shown.
SHOWN_ONLY = {"head", "tail", "query", "merge", "pivot", "pivot_table", "drop", "sort_values", "set_index",
              "reset_index", "to_frame", "describe", "value_counts", "DataFrame", "Series", "fillna", "T"}


def code_of(cell: dict) -> ast.Module | None:
    """A code cell's Python (IPython magic and shell lines left out); None for a cell magic such as %%writefile."""
    text = "".join(cell["source"])
    if text.lstrip().startswith("%%"):
        return None
    return ast.parse("\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!"))))


def dropped(value: ast.expr) -> bool:
    """True for an expression whose value is all it is for: a name, a table, ``frame.head()`` ..."""
    if isinstance(value, ast.Constant):
        return not isinstance(value.value, str)  # a lone string is a docstring or a comment
    if isinstance(value, (ast.Await, ast.Yield, ast.YieldFrom)):
        return False
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        return name in SHOWN_ONLY
    return True


def values_not_shown(tree: ast.Module) -> list[str]:
    """Each bare expression statement of a cell that is not the cell's last statement, as source text."""
    found = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if not isinstance(statements, list):
                continue
            for index, statement in enumerate(statements):
                last_of_cell = node is tree and index == len(statements) - 1
                if isinstance(statement, ast.Expr) and not last_of_cell and dropped(statement.value):
                    found.append(f"line {statement.lineno}: {ast.unparse(statement)[:70]}")
    return found


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.name)
def test_no_cell_computes_a_value_and_drops_it(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    hidden = [(index, found) for index, cell in enumerate(cells) if cell["cell_type"] == "code"
              and (tree := code_of(cell)) is not None for found in values_not_shown(tree)]
    assert not hidden, (f"{path.name}: only a cell's last expression is shown; display() these, or make each "
                        f"the last line of a cell of its own: {hidden}")


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.name)
def test_a_paragraph_ending_in_a_colon_is_followed_by_a_cell_that_shows_something(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    silent = []
    for index, cell in enumerate(cells):
        text = "".join(cell["source"]).strip()
        if cell["cell_type"] != "markdown" or not text.endswith(":"):
            continue
        after = cells[index + 1] if index + 1 < len(cells) else None
        if after is None or after["cell_type"] != "code" or not after.get("outputs"):
            silent.append((index, text.splitlines()[-1][-80:]))
    assert not silent, f"{path.name}: these paragraphs announce output that the next cell does not show: {silent}"


def test_the_checks_find_a_dropped_table_and_leave_a_shown_one():
    cell = {"cell_type": "code", "source": "table = frame()\ntable\nassert len(table) == 3\n"}
    assert values_not_shown(code_of(cell)) == ["line 2: table"]
    for fine in ("table = frame()\nassert len(table) == 3\ntable\n", "kit('status')\nprint(1)\n",
                 "for x in rows:\n    print(x)\n", "%%writefile x.py\nvalue\nprint(1)\n"):
        tree = code_of({"cell_type": "code", "source": fine})
        assert tree is None or values_not_shown(tree) == [], fine
    dropped_head = code_of({"cell_type": "code", "source": "frame.head()\nx = 1\n"})
    assert values_not_shown(dropped_head) == ["line 1: frame.head()"]
