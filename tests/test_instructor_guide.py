"""INSTRUCTORS.md against the committed notebooks: its minutes are the reading model's, so the guide cannot go stale."""
from __future__ import annotations

import re
from pathlib import Path

from durable_kit.lab import minutes

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
