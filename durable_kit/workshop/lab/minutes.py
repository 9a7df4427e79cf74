"""How long a notebook takes a learner, by the instructor guide's reading model: ``python -m durable_kit.workshop.lab.minutes``.

The model, timed once on learners with notebooks 04 to 06: prose at 150
words a minute, code at 15 lines a minute, printed output at 20 lines a
minute, half a minute per chart; solution cells are not counted. The sum
times 0.87, plus the exercise budget the notebook's header names ("N for
the exercise"), rounded up to 5 minutes. The core is the notebook without
its deep-dive sections (a heading ending in ``· deep dive``, up to the next
heading of the same or a higher level).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[3] / "notebooks"
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE, OUTPUT_LINES_PER_MINUTE, MINUTES_PER_CHART = 150, 15, 20, 0.5
PACE = 0.87  # the model read 13% slower than the timed learner
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
EXERCISE_BUDGET = re.compile(r"(\d+) for the exercise")
DEEP_DIVE = "· deep dive"
ANY_DEEP_DIVE = re.compile(r"\bdeep dive\b", re.IGNORECASE)  # any spelling is cut, so a stray one cannot hide


@dataclass(frozen=True)
class Reading:
    """One notebook's prose words and minutes by the model, whole and core only."""
    name: str
    words: int
    core_words: int
    exercise: int
    minutes: int
    core_minutes: int


def heading(line: str) -> tuple[int, str] | None:
    """(level, title) of a markdown heading line, or None."""
    match = HEADING.match(line)
    return (len(match.group(1)), match.group(2).strip()) if match else None


def _heading(cell: dict) -> tuple[int, str] | None:
    if cell["cell_type"] != "markdown":
        return None
    first = "".join(cell["source"]).strip().splitlines()[:1]
    return heading(first[0]) if first else None


def core_only(notebook: dict) -> dict:
    """A copy of ``notebook`` without its deep-dive sections (the argument is not modified).

    A section whose heading says "deep dive" (in any spelling) runs to the
    next heading of the same or a higher level, also when a heading sits in
    the middle of a markdown cell; headings inside code fences are text.
    """
    cut = copy.deepcopy(notebook)
    cells, skipping = [], None  # skipping: the level of the deep-dive heading being cut
    for cell in cut["cells"]:
        cell["source"] = "".join(cell["source"])
        if cell["cell_type"] != "markdown":
            if skipping is None:
                cells.append(cell)
            continue
        kept, fenced = [], False
        for line in cell["source"].splitlines(keepends=True):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            found = None if fenced else heading(line)
            if found and skipping is not None and found[0] <= skipping:
                skipping = None
            if found and skipping is None and ANY_DEEP_DIVE.search(found[1]):
                skipping = found[0]
            if skipping is None:
                kept.append(line)
        if "".join(kept).strip():
            cell["source"] = "".join(kept)
            cells.append(cell)
    cut["cells"] = cells
    return cut


def core_cells(cells: list[dict]) -> list[dict]:
    """The cells outside every deep-dive section (see ``core_only``)."""
    return core_only({"cells": cells})["cells"]


def _output_lines(cell: dict) -> tuple[int, int]:
    lines = charts = 0
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if "image/png" in data or "image/svg+xml" in data:
            charts += 1
            continue
        text = output.get("text") or data.get("text/plain") or ""
        lines += len("".join(text).splitlines())
    return lines, charts


def words(text: str) -> int:
    """Words of prose: the tokens with a letter or digit (a heading's ``#`` and a ``·`` are not words)."""
    return sum(1 for token in text.split() if any(ch.isalnum() for ch in token))


def _words(cells: list[dict]) -> int:
    return sum(words("".join(c["source"])) for c in cells if c["cell_type"] == "markdown")


def reading_minutes(cells: list[dict]) -> float:
    """Minutes to read and run ``cells`` by the model, before the pace factor and the exercise."""
    minutes = 0.0
    for cell in cells:
        if cell["cell_type"] == "markdown":
            minutes += words("".join(cell["source"])) / WORDS_PER_MINUTE
        elif cell["cell_type"] == "code" and "solution" not in cell.get("metadata", {}).get("tags", []):
            minutes += len("".join(cell["source"]).strip().splitlines()) / CODE_LINES_PER_MINUTE
            lines, charts = _output_lines(cell)
            minutes += lines / OUTPUT_LINES_PER_MINUTE + charts * MINUTES_PER_CHART
    return minutes


def _round_up(minutes: float) -> int:
    return 5 * math.ceil(minutes / 5 - 1e-9)


def section_cells(path: Path) -> list[tuple[str, list[dict]]]:
    """Each ``##`` section of a notebook with its cells, the opening (before the first heading) first."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    parts: list[tuple[str, list[dict]]] = [("(opening)", [])]
    for cell in cells:
        heading = _heading(cell)
        if heading is not None and heading[0] <= 2 and parts[-1][1]:
            parts.append((heading[1], []))
        parts[-1][1].append(cell)
    return parts


def sections(path: Path) -> list[tuple[str, bool, float]]:
    """Each ``##`` section of a notebook: its heading, whether it is a deep dive, and its minutes at the model's pace.

    Minutes here are before rounding and without the exercise budget, so a
    track can add up the sections it uses.
    """
    return [(title, title.endswith(DEEP_DIVE), reading_minutes(part) * PACE) for title, part in section_cells(path)]


def read(path: Path) -> Reading:
    """The model's figures for one notebook."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    budget = EXERCISE_BUDGET.search("".join(cells[0]["source"])) if cells else None
    exercise = int(budget.group(1)) if budget else 0
    core = core_cells(cells)
    return Reading(path.name, _words(cells), _words(core), exercise,
                   _round_up(reading_minutes(cells) * PACE + exercise),
                   _round_up(reading_minutes(core) * PACE + exercise))


def table(folder: Path = NOTEBOOKS) -> list[Reading]:
    """Every numbered notebook in ``folder``, in order."""
    return [read(path) for path in sorted(folder.glob("[0-9][0-9]_*.ipynb"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durable_kit.workshop.lab.minutes", description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS)
    parser.add_argument("--sections", action="store_true", help="also each section's minutes, for planning a track")
    args = parser.parse_args(argv)
    rows = table(args.notebooks)
    if args.sections:
        for path in sorted(args.notebooks.glob("[0-9][0-9]_*.ipynb")):
            print(path.name)
            for title, deep, spent in sections(path):
                print(f"  {spent:5.1f}  {title}")
    print(f"{'notebook':32} {'words':>6} {'core words':>10} {'exercise':>8} {'minutes':>7} {'core':>5}")
    for r in rows:
        print(f"{r.name:32} {r.words:6} {r.core_words:10} {r.exercise:8} {r.minutes:7} {r.core_minutes:5}")
    print(f"{'all':32} {sum(r.words for r in rows):6} {sum(r.core_words for r in rows):10} "
          f"{sum(r.exercise for r in rows):8} {sum(r.minutes for r in rows):7} {sum(r.core_minutes for r in rows):5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
