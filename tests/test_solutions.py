"""Every solution passes its own check, in the instructor's notebooks, and nothing in a notebook can stop a right
answer from passing.

The instructor's notebooks are executed in this same test command by strict nbval (``notebooks`` is in
``testpaths``), which fails on any cell whose output differs from the committed one. So the committed output
of a solution is what its execution prints: asserting that it says ``pass:`` here, on cells nbval compares,
is the executed proof without a second run of every notebook. The learner's copies are executed with each
solution written into them by ``tests/test_student_copies.py``.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from durable_kit.workshop.lab import student

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOURCES = student.source_notebooks(NOTEBOOKS)
CHECK_CALL = re.compile(r"\bcheck_\w+\(\s*(my|solution)_\w+")
VERDICT = re.compile(r"^(pass|not quite|not yet):", re.MULTILINE)


def cells_of(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def printed(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("name") == "stdout")


def python_of(cell: dict) -> ast.Module | None:
    """A code cell's Python without IPython magic lines; None for a cell magic (%%writefile runs no Python here)."""
    source = text(cell)
    if source.lstrip().startswith("%%"):
        return None
    return ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))


def checked(source: str, who: str) -> set[str]:
    """The check functions a cell calls on a ``my_`` or ``solution_`` name."""
    return {m.group(0).split("(")[0] for m in CHECK_CALL.finditer(source) if m.group(1) == who}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_every_solution_check_says_pass_in_the_executed_outputs(path):
    cells = cells_of(path)
    solutions = [c for c in cells if student.is_solution(c) and checked(text(c), "solution")]
    assert solutions, f"{path.name}: no solution cell runs a check on a solution_ answer"
    for cell in solutions:
        assert "NBVAL" not in text(cell), f"{path.name}: a solution's output must be compared by nbval"
        verdicts = VERDICT.findall(printed(cell))
        assert verdicts == ["pass"] * len(checked(text(cell), "solution")), (
            f"{path.name}: a solution's check did not say pass: {printed(cell)!r}")
    exercised = set().union(*(checked(text(c), "my") for c in cells if c["cell_type"] == "code"))
    solved = set().union(*(checked(text(c), "solution") for c in solutions))
    assert exercised == solved, f"{path.name}: checks run on a my_ answer {exercised}, on a solution {solved}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_committed_output_is_an_error_or_a_warning(path):
    for index, cell in enumerate(cells_of(path)):
        for output in cell.get("outputs", []):
            assert output.get("name") != "stderr", f"{path.name} cell {index} wrote to stderr: {output.get('text')}"
            assert output.get("output_type") != "error", f"{path.name} cell {index} raised {output.get('ename')}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_an_untouched_exercise_s_check_says_not_yet(path):
    """The committed output of every check on a learner's ``my_`` stub: one ``not yet:`` line per check."""
    for cell in cells_of(path):
        calls = len([m for m in CHECK_CALL.finditer(text(cell)) if m.group(1) == "my"])
        if cell["cell_type"] == "code" and not student.is_solution(cell) and calls:
            assert VERDICT.findall(printed(cell)) == ["not yet"] * calls, (path.name, printed(cell))


def kit_names(cells: list[dict]) -> set[str]:
    """The names the notebook imports from durable_kit (and ``durable_kit`` itself)."""
    names = set()
    for cell in cells:
        tree = python_of(cell) if cell["cell_type"] == "code" else None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "durable_kit":
                names.update(alias.asname or alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("durable_kit"))
    return names


def rebound(tree: ast.Module, names: set[str]) -> set[str]:
    """Of ``names``, those the cell binds other than by importing them from durable_kit."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            continue  # a parameter is local to its function
        elif isinstance(node, ast.Import) and not any(a.name.startswith("durable_kit") for a in node.names):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] != "durable_kit":
            bound.update(a.asname or a.name for a in node.names)
    return bound & names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_cell_rebinds_a_name_the_notebook_imports_from_durable_kit(path):
    cells = cells_of(path)
    names = kit_names(cells)
    clashes = [(index, sorted(found)) for index, cell in enumerate(cells) if cell["cell_type"] == "code"
               and (tree := python_of(cell)) is not None and (found := rebound(tree, names))]
    assert not clashes, (f"{path.name}: these cells rebind names imported from durable_kit, so a learner's answer "
                         f"that uses the kit's name gets the notebook's value instead: {clashes}")


def test_a_rebinding_is_found_and_a_parameter_is_not():
    names = kit_names([{"cell_type": "code", "source": "from durable_kit import patched, Journal\n"}])
    assert names == {"patched", "Journal"}
    assert rebound(ast.parse("patched = frame()\n"), names) == {"patched"}
    assert rebound(ast.parse("for Journal in rows:\n    pass\n"), names) == {"Journal"}
    assert rebound(ast.parse("def f(patched):\n    return patched\nfrom durable_kit import Journal\n"), names) == set()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_cell_outside_a_solution_reads_a_name_only_a_solution_binds(path):
    """The notebook runs top to bottom without its solutions, as a learner's copy does."""
    cells = cells_of(path)
    solution_only, elsewhere = set(), set()
    for cell in cells:
        tree = python_of(cell) if cell["cell_type"] == "code" else None
        if tree is None:
            continue
        binds = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        binds |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        (solution_only if student.is_solution(cell) else elsewhere).update(binds)
    solution_only -= elsewhere
    readers = [(index, sorted(used)) for index, cell in enumerate(cells)
               if cell["cell_type"] == "code" and not student.is_solution(cell) and (tree := python_of(cell))
               and (used := {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                             and isinstance(n.ctx, ast.Load)} & solution_only)]
    assert not readers, f"{path.name}: these cells read names only a solution defines: {readers}"
