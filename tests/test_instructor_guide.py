"""INSTRUCTORS.md against the committed notebooks: its minutes are the reading model's, so the guide cannot go stale."""
from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

from durable_kit.workshop.lab import minutes

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "INSTRUCTORS.md").read_text(encoding="utf-8")


def part(title: str) -> str:
    """The guide's text under the heading ``title``, up to the next heading of the same or a higher level."""
    lines = GUIDE.splitlines()
    for i, line in enumerate(lines):
        found = minutes.heading(line)
        if found and found[1] == title:
            end = next((j for j in range(i + 1, len(lines))
                        if (h := minutes.heading(lines[j])) and h[0] <= found[0]), len(lines))
            return "\n".join(lines[i + 1:end])
    raise AssertionError(f"INSTRUCTORS.md has no heading {title!r}")


def cells(row: str) -> list[str]:
    """A markdown table row's cells; ``\\|`` is a literal bar."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def tables(text: str) -> list[list[dict[str, str]]]:
    """Every markdown table in ``text``, each as a list of rows keyed by the header's cells."""
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| :]+\|$", lines[i + 1].strip()):
            header, rows, i = cells(lines[i]), [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(header, cells(lines[i]))))
                i += 1
            found.append(rows)
        else:
            i += 1
    return found


def test_the_minutes_table_is_the_reading_model_for_the_committed_notebooks():
    (rows,) = tables(part("Minutes per notebook"))
    model = minutes.table()
    listed = [(r["notebook"].strip("`"), int(r["words"]), int(r["core words"]), int(r["exercise"]),
               int(r["minutes"]), int(r["core minutes"])) for r in rows if r["notebook"] != "all"]
    assert listed == [(r.name, r.words, r.core_words, r.exercise, r.minutes, r.core_minutes) for r in model]
    (total,) = [r for r in rows if r["notebook"] == "all"]
    assert [int(total[c]) for c in ("words", "core words", "exercise", "minutes", "core minutes")] == [
        sum(r.words for r in model), sum(r.core_words for r in model), sum(r.exercise for r in model),
        sum(r.minutes for r in model), sum(r.core_minutes for r in model)]


def test_the_longer_tracks_follow_from_the_same_table():
    (rows,) = tables(part("Full-day and self-paced tracks"))
    model = minutes.table()
    totals = {row["track"]: int(row["minutes"]) for row in rows}
    assert totals == {"full day": sum(r.core_minutes for r in model), "self-paced": sum(r.minutes for r in model)}


def numbers(text: str) -> set[int]:
    """The section numbers of "opening, 1–4, 7" (the opening is 0)."""
    found = set()
    for piece in (p.strip() for p in text.split(",")):
        if piece == "opening":
            found.add(0)
        elif "–" in piece:
            first, last = piece.split("–")
            found.update(range(int(first), int(last) + 1))
        else:
            found.add(int(piece))
    return found


def clock(text: str) -> int:
    hours, mins = text.split(":")
    return int(hours) * 60 + int(mins)


def names_used_and_set(source: str) -> tuple[set[str], set[str]]:
    """The names a code cell reads and the names it binds (IPython magics and shell lines skipped)."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    tree = ast.parse("\n".join(lines))
    used, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else used).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return used, bound


def track_rows() -> list[dict[str, str]]:
    (rows,) = tables(part("3-hour conference track (180 minutes)"))
    return rows


def segment_notebook(row: dict[str, str]) -> str:
    """The notebook number of a track row's segment ("`05` side effects" -> "05")."""
    return row["segment"].split("`")[1]


def notebook_path(number: str) -> Path:
    return next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))


def test_the_3_hour_track_adds_up_by_the_reading_model():
    rows, learner, breaks, at = track_rows(), 0, 0, 0
    for row in rows:
        start, end = (clock(t) for t in row["clock"].split("–"))
        assert start == at and end - start == int(row["minutes"]), row
        at = end
        if row["segment"] == "break":
            breaks += int(row["minutes"])
            continue
        path = notebook_path(segment_notebook(row))
        used = numbers(row["sections used"])
        spent = sum(m for i, (_, _, m) in enumerate(minutes.sections(path)) if i in used)
        if row["exercise"] == "yes":
            spent += minutes.read(path).exercise
        assert int(row["minutes"]) == math.ceil(spent - 1e-9), (row, spent)
        learner += int(row["minutes"])
    assert (learner, breaks, at) == (165, 15, 180)


def test_the_3_hour_track_is_hands_on_for_every_part_of_the_story():
    done = {segment_notebook(row): row["exercise"] for row in track_rows() if row["segment"] != "break"}
    # the crash, the journal, retries, waits, side effects, leases and the agent loop
    assert set(done) >= {"00", "02", "03", "04", "05", "06", "08"}
    assert [n for n in ("00", "02", "05", "06", "08") if done[n] != "yes"] == []


def test_no_cell_of_a_3_hour_segment_needs_a_section_the_segment_skips():
    for row in track_rows():
        if row["segment"] == "break":
            continue
        path = notebook_path(segment_notebook(row))
        used = numbers(row["sections used"])
        parts = minutes.section_cells(path)
        titles = [title for title, _ in parts]
        assert max(used) < len(titles), (path.name, used)
        skipped_core = [titles[i] for i in range(len(titles)) if i not in used and not titles[i].endswith("deep dive")]
        assert all("Exercise" in t for t in skipped_core), (path.name, skipped_core)
        bound_so_far, bound_skipped = set(), set()
        for section, (_, part) in enumerate(parts):
            for cell in part:
                if cell["cell_type"] != "code" or "solution" in cell.get("metadata", {}).get("tags", []):
                    continue
                reads, binds = names_used_and_set("".join(cell["source"]))
                if section in used:
                    missing = (reads - bound_so_far) & bound_skipped
                    assert not missing, f"{path.name} section {section} needs {sorted(missing)} from a skipped section"
                    bound_so_far |= binds
                else:
                    bound_skipped |= binds - bound_so_far


def test_the_run_sheet_follows_the_track_and_quotes_cells_that_exist():
    sheet = part("Run-sheet for the 3-hour track")
    segments = re.findall(r"^#### (\S+) · (\d\d) ", sheet, flags=re.M)
    track = [(row["clock"], segment_notebook(row)) for row in track_rows() if row["segment"] != "break"]
    assert segments == track
    for block in re.split(r"^#### ", sheet, flags=re.M)[1:]:
        number = block.split(" · ")[1][:2]
        path = notebook_path(number)
        code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
                         if c["cell_type"] == "code")
        for row in tables(block)[0]:
            for quoted in re.findall(r"`([^`]+)`", row["do"]):
                if quoted.startswith("python -m"):
                    continue
                assert quoted.rstrip(". ") in code, f"{path.name}: the run-sheet quotes {quoted!r}, no cell has it"
