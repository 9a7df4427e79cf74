"""Learner copies: generated from the instructor's notebooks, current, and runnable with no exercise done."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from durable_kit.workshop.lab import student

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
COPIES = NOTEBOOKS / student.STUDENT_FOLDER
SOURCES = student.source_notebooks(NOTEBOOKS)
REGENERATE = "regenerate them with `python -m durable_kit.workshop.lab.student`"


def test_the_committed_copies_are_current(tmp_path):
    written = student.write_copies(NOTEBOOKS, tmp_path)
    assert [p.name for p in written] == [p.name for p in SOURCES]
    committed = sorted(p.name for p in COPIES.glob("*.ipynb"))
    assert committed == [p.name for p in SOURCES], f"learner copies missing or extra: {REGENERATE}"
    stale = [p.name for p in written if p.read_text(encoding="utf-8") != (COPIES / p.name).read_text(encoding="utf-8")]
    assert not stale, f"learner copies out of date: {stale}; {REGENERATE}"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_a_copy_differs_only_in_solutions_and_exercise_outputs(source):
    original = json.loads(source.read_text(encoding="utf-8"))
    copy = json.loads((COPIES / source.name).read_text(encoding="utf-8"))
    assert copy["metadata"] == original["metadata"]
    assert [c.get("id") for c in copy["cells"]] == [c.get("id") for c in original["cells"]]
    solutions = 0
    for before, after in zip(original["cells"], copy["cells"]):
        if student.is_solution(before):
            solutions += 1
            text = "".join(after["source"])
            assert text.startswith("# The solution is not in the learner's copy. Hint: ")
            assert all(line.startswith("#") for line in text.splitlines()), text
            assert (after["outputs"], after["execution_count"]) == ([], None)
        elif student.is_exercise(before):
            assert after["source"] == before["source"]
            assert (after["outputs"], after["execution_count"]) == ([], None)
        else:
            assert after == before
    assert solutions >= 1, f"{source.name} has no cell tagged 'solution': every notebook has an exercise"


def test_the_generator_replaces_solutions_and_clears_exercise_outputs():
    cell = lambda source, tags=(), outputs=(): {  # noqa: E731
        "cell_type": "code", "execution_count": 3, "id": source[:8], "metadata": {"tags": list(tags)},
        "outputs": list(outputs), "source": source}
    shown = [{"output_type": "stream", "name": "stdout", "text": "16\n"}]
    notebook = {"cells": [
        cell("setup = 1", outputs=shown),
        cell("my_guess = ...", outputs=shown),
        cell("check_guess(my_guess)", outputs=shown),
        cell("# Hint: count per attempt\nsolution_guess = 16\ncheck_guess(solution_guess)", ("solution",), shown),
        cell("table()", ("exercise",), shown),
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    copy = student.learner_copy(notebook, "09_example.ipynb")
    assert copy["cells"][0] == notebook["cells"][0]
    for index in (1, 2, 4):
        assert copy["cells"][index]["outputs"] == [] and copy["cells"][index]["execution_count"] is None
        assert copy["cells"][index]["source"] == notebook["cells"][index]["source"]
    assert "".join(copy["cells"][3]["source"]) == (
        "# The solution is not in the learner's copy. Hint: count per attempt\n"
        "# The instructor's notebook, notebooks/09_example.ipynb, has the full answer.")
    assert notebook["cells"][3]["outputs"] == shown  # the source notebook is not modified


def written_in(solution: str) -> str:
    """A solution as a learner who wrote it would have it: every ``solution_`` name is their ``my_`` name."""
    return re.sub(r"\bsolution_(\w+)", r"my_\1", solution)


def checks_called(source: str) -> int:
    return len(re.findall(r"\bcheck_\w+\(\s*my_", source))


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_each_copy_runs_top_to_bottom_and_each_solution_written_in_passes(source, tmp_path):
    """One run of each learner copy, as a learner makes it: every check first says ``not yet:`` to the untouched
    stub; then the answer, written where the copy's hint is (the instructor's solution, its names the learner's
    ``my_`` names), passes its check in that same kernel; no cell writes to stderr or raises."""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    copy_path = COPIES / source.name
    assert copy_path.exists(), f"no learner copy of {source.name}: {REGENERATE}"
    notebook = nbformat.read(copy_path, as_version=4)
    instructor = nbformat.read(source, as_version=4)
    answers = []
    for cell, original in zip(notebook.cells, instructor.cells):
        if student.is_solution(original):
            cell.source = written_in(original.source)
            answers.append(cell)
    assert answers, f"{source.name}: no solution to write in"
    # Run from a learner's folder of its own (so two copies running at once never share a scratch
    # folder), as a learner does, on this interpreter's kernel.
    folder = tmp_path / "notebooks" / student.STUDENT_FOLDER
    folder.mkdir(parents=True)
    shutil.copy(copy_path, folder / source.name)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    said = lambda cell: "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")  # noqa: E731
    stubs = [c for c in notebook.cells
             if c.cell_type == "code" and all(c is not a for a in answers) and checks_called(c.source)]
    assert stubs, f"{source.name}: no cell checks a learner's my_ answer"
    for cell in stubs:
        verdicts = re.findall(r"^(pass|not quite|not yet):", said(cell), flags=re.M)
        assert verdicts == ["not yet"] * checks_called(cell.source), (
            f"{source.name}: an untouched stub's check should say not yet: {said(cell)!r}")
    for cell in answers:
        verdicts = re.findall(r"^(pass|not quite|not yet):", said(cell), flags=re.M)
        assert verdicts == ["pass"] * checks_called(cell.source), (
            f"{source.name}: a solution written into the learner's copy did not pass: {said(cell)!r}")
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error", f"{source.name} cell {index} raised {output.get('ename')}"
            assert output.get("name") != "stderr", f"{source.name} cell {index} wrote to stderr: {output.get('text')}"


def test_reset_scratch_removes_only_the_scratch_folders(tmp_path):
    from conftest import run_python

    notebooks = tmp_path / "notebooks"
    for folder in (notebooks / "scratch" / "00", notebooks / "student" / "scratch" / "02"):
        folder.mkdir(parents=True)
        (folder / "work.db").write_text("x")
    (notebooks / "00_welcome.ipynb").write_text("{}")
    (notebooks / "student" / "00_welcome.ipynb").write_text("{}")
    done = run_python("-m", "durable_kit", "reset-scratch", "--notebooks", str(notebooks))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"removed {notebooks / 'scratch'}", f"removed {notebooks / 'student' / 'scratch'}"]
    assert sorted(str(p.relative_to(notebooks)) for p in notebooks.rglob("*")) == [
        "00_welcome.ipynb", "student", "student/00_welcome.ipynb"]
    again = run_python("-m", "durable_kit", "reset-scratch", "--notebooks", str(notebooks))
    assert (again.returncode, again.stdout) == (0, "")
