"""Learner copies of the notebooks, generated from the instructor's notebooks: ``python -m durable_kit.workshop.lab.student``.

The notebooks in ``notebooks/`` are the one source. A learner copy differs
from its source only in this: every cell tagged ``solution`` is replaced by a
stub with a hint, and the outputs of exercise and solution cells are cleared
(an exercise cell is tagged ``exercise``, or defines or checks a ``my_`` name).
Every other cell, output and metadata is kept as it is. The copies go to
``notebooks/student/``, beside the instructor's notebooks, so links between
notebooks, the ``data/`` fixtures and each notebook's ``scratch/`` folder
resolve the same way from there.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import sys
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[3] / "notebooks"
STUDENT_FOLDER = "student"
SOLUTION_TAG = "solution"
EXERCISE_TAG = "exercise"
HINT_LINE = re.compile(r"^\s*#\s*Hint:\s*(.+)$", re.MULTILINE)
LEARNER_CODE = re.compile(r"^\s*(def\s+my_\w+|my_\w+\s*=)|check_\w+\(\s*my_", re.MULTILINE)
GENERIC_HINT = "run the check above on your own my_ answer and follow what it says."


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def is_solution(cell: dict) -> bool:
    """A cell tagged ``solution``."""
    return cell["cell_type"] == "code" and SOLUTION_TAG in _tags(cell)


def is_exercise(cell: dict) -> bool:
    """A code cell tagged ``exercise``, or one that defines or checks a learner's ``my_`` name."""
    if cell["cell_type"] != "code" or is_solution(cell):
        return False
    return EXERCISE_TAG in _tags(cell) or bool(LEARNER_CODE.search("".join(cell["source"])))


def solution_stub(cell: dict, notebook_name: str) -> str:
    """The text that replaces a solution: its ``# Hint:`` lines (or a general hint) and where the answer is."""
    hints = HINT_LINE.findall("".join(cell["source"])) or [GENERIC_HINT]
    lines = ["# The solution is not in the learner's copy. Hint: " + hints[0]]
    lines += [f"# Hint: {hint}" for hint in hints[1:]]
    lines.append(f"# The instructor's notebook, notebooks/{notebook_name}, has the full answer.")
    return "\n".join(lines)


def learner_copy(notebook: dict, notebook_name: str) -> dict:
    """The learner's version of one notebook (the argument is not modified)."""
    copied = copy.deepcopy(notebook)
    for cell in copied["cells"]:
        if is_solution(cell):
            cell["source"] = solution_stub(cell, notebook_name).splitlines(keepends=True)
        if is_solution(cell) or is_exercise(cell):
            cell["outputs"] = []
            cell["execution_count"] = None
    return copied


def to_text(notebook: dict) -> str:
    """A notebook as nbformat writes it (sorted keys, one-space indent, a final newline)."""
    return json.dumps(notebook, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def source_notebooks(notebooks: Path = NOTEBOOKS) -> list[Path]:
    """The instructor's notebooks, in order."""
    return sorted(notebooks.glob("*.ipynb"))


def write_copies(notebooks: Path = NOTEBOOKS, target: Path | None = None) -> list[Path]:
    """Write a learner copy of every notebook to ``target`` (default ``notebooks/student``); return the copies.

    Copies whose source notebook no longer exists are removed; nothing else in
    ``target`` is touched.
    """
    target = Path(target) if target is not None else notebooks / STUDENT_FOLDER
    target.mkdir(parents=True, exist_ok=True)
    written = []
    sources = source_notebooks(notebooks)
    for source in sources:
        notebook = json.loads(source.read_text(encoding="utf-8"))
        copy_path = target / source.name
        copy_path.write_text(to_text(learner_copy(notebook, source.name)), encoding="utf-8")
        written.append(copy_path)
    names = {source.name for source in sources}
    for stale in target.glob("*.ipynb"):
        if stale.name not in names:
            stale.unlink()
    return written


def reset_scratch(notebooks: str | Path | None = None) -> list[Path]:
    """Delete the scratch folders of the instructor's and the learner's notebooks; return what was removed.

    Only folders named ``scratch`` directly in ``notebooks/`` and
    ``notebooks/student/`` are removed: databases and files the notebooks
    made. Notebooks and their outputs are not touched.
    """
    root = Path(notebooks) if notebooks is not None else NOTEBOOKS
    removed = []
    for folder in (root / "scratch", root / STUDENT_FOLDER / "scratch"):
        if folder.is_dir():
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durable_kit.workshop.lab.student", description=(
        "Write the learner copies of every notebook (solutions replaced by a stub with a hint, outputs of "
        "exercise and solution cells cleared) to notebooks/student/."))
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="the instructor's notebooks folder")
    parser.add_argument("--to", type=Path, help="where to write the copies (default: NOTEBOOKS/student)")
    args = parser.parse_args(argv)
    for path in write_copies(args.notebooks, args.to):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
