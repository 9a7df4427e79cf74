"""How long a notebook takes a learner, by the instructor guide's reading model: ``python -m durable_kit.workshop.lab.minutes``.

The model, timed once on learners with notebooks 04 to 06: prose at 150
words a minute, code at 15 lines a minute, printed output at 20 lines a
minute, half a minute per chart; solution cells are not counted. The sum
times 0.87, plus the exercise budgets, rounded up to 5 minutes. An exercise's
budget is in its section's heading ("## 4. Exercise: ... (10 minutes)"). The
core is the notebook without its deep-dive sections (a heading ending in
``· deep dive``, up to the next heading of the same or a higher level), and
counts only the exercises in it.

The figures are stated in each notebook's header ("**Minutes:** 45 in all, 30
for the core"); the README's notebook map and the instructor guide's table
are written from them. ``--write`` rewrites all three from the model after a
notebook changed; the tests fail until it has.
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
EXERCISE_HEADING = re.compile(r"\bExercise\b.*\((\d+) minutes\)")
STATED = re.compile(r"\*\*Minutes:\*\* (\d+) in all, (?:(\d+) for the core|all of it core)")
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


def exercise_budgets(path: Path) -> tuple[int, int]:
    """(every exercise, the core's exercises) in minutes, from the exercise sections' headings."""
    budgets = [(int(found.group(1)), title.endswith(DEEP_DIVE)) for title, _ in section_cells(path)
               if (found := EXERCISE_HEADING.search(title))]
    return sum(m for m, _ in budgets), sum(m for m, deep in budgets if not deep)


def read(path: Path) -> Reading:
    """The model's figures for one notebook."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    exercise, core_exercise = exercise_budgets(path)
    core = core_cells(cells)
    return Reading(path.name, _words(cells), _words(core), exercise,
                   _round_up(reading_minutes(cells) * PACE + exercise),
                   _round_up(reading_minutes(core) * PACE + core_exercise))


def stated(path: Path) -> tuple[int, int] | None:
    """(minutes, core minutes) as the notebook's header states them ("**Minutes:** 40 in all, 25 for the core"
    or "**Minutes:** 20 in all, all of it core": as many words either way), or None if it states none."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    found = STATED.search("".join(cells[0]["source"])) if cells else None
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2) or found.group(1))


def table(folder: Path = NOTEBOOKS) -> list[Reading]:
    """Every numbered notebook in ``folder``, in order."""
    return [read(path) for path in sorted(folder.glob("[0-9][0-9]_*.ipynb"))]


def header_figures(reading: Reading) -> str:
    """What a header says after "**Minutes:** ", from the model."""
    if reading.minutes == reading.core_minutes:
        return f"{reading.minutes} in all, all of it core"
    return f"{reading.minutes} in all, {reading.core_minutes} for the core"


def write_header(path: Path, reading: Reading) -> bool:
    """Rewrite the figures of ``path``'s header from ``reading``; True if they changed."""
    from .student import to_text

    notebook = json.loads(path.read_text(encoding="utf-8"))
    text = "".join(notebook["cells"][0]["source"])
    found = STATED.search(text)
    if found is None:
        raise ValueError(f"{path.name}: its first cell states no minutes (\"**Minutes:** 45 in all, 30 for the core\")")
    new = text[:found.start()] + f"**Minutes:** {header_figures(reading)}" + text[found.end():]
    if new == text:
        return False
    notebook["cells"][0]["source"] = new.splitlines(keepends=True)
    path.write_text(to_text(notebook), encoding="utf-8")
    return True


MAP_COLUMNS = ("minutes", "core minutes")


def readme_map(readme: str, rows: list[Reading]) -> str:
    """``readme`` with its notebook map's two minutes columns written from ``rows`` (the headers' figures)."""
    by_name = {r.name: r for r in rows}
    lines = readme.splitlines(keepends=True)
    header = None
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells and cells[-2:] == list(MAP_COLUMNS):
            header = cells
        elif cells is None:
            header = None
        elif header and (name := cells[1].strip("`")) in by_name:
            cells[-2:] = [str(by_name[name].minutes), str(by_name[name].core_minutes)]
            lines[i] = "| " + " | ".join(cells) + " |\n"
    return "".join(lines)


def guide_table(rows: list[Reading]) -> str:
    """The instructor guide's table of minutes per notebook."""
    out = ["| notebook | words | core words | exercise | minutes | core minutes |", "|---|---|---|---|---|---|"]
    for name, figures in [(f"`{r.name}`", [r]) for r in rows] + [("all", rows)]:
        columns = [sum(getattr(r, field) for r in figures)
                   for field in ("words", "core_words", "exercise", "minutes", "core_minutes")]
        out.append(f"| {name} | " + " | ".join(map(str, columns)) + " |")
    return "\n".join(out) + "\n"


def guide_with_table(guide: str, rows: list[Reading]) -> str:
    """``guide`` with the table under "## Minutes per notebook" replaced by ``guide_table(rows)``."""
    start = guide.index("\n| notebook | words |", guide.index("## Minutes per notebook")) + 1
    end = guide.index("\n\n", start) + 1
    return guide[:start] + guide_table(rows) + guide[end:]


def write_all(folder: Path = NOTEBOOKS) -> list[str]:
    """Rewrite the headers from the model, then the README's map and the guide's table from them; what changed."""
    root = folder.parent
    changed = [path.name for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")) if write_header(path, read(path))]
    rows = table(folder)
    for name, rewrite in (("README.md", lambda text: readme_map(text, rows)),
                          ("INSTRUCTORS.md", lambda text: guide_with_table(text, rows))):
        path = root / name
        text = path.read_text(encoding="utf-8")
        if rewrite(text) != text:
            path.write_text(rewrite(text), encoding="utf-8")
            changed.append(name)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durable_kit.workshop.lab.minutes",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS)
    parser.add_argument("--sections", action="store_true", help="also each section's minutes, for planning a track")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the notebooks' headers, the README's map and INSTRUCTORS.md's table")
    args = parser.parse_args(argv)
    if args.write:
        for name in write_all(args.notebooks):
            print(f"rewrote the minutes in {name}")
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
