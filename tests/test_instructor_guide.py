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


def test_each_notebook_states_the_model_s_minutes_in_its_header():
    for reading in minutes.table():
        assert minutes.stated(ROOT / "notebooks" / reading.name) == (reading.minutes, reading.core_minutes), (
            f"{reading.name}: its header's minutes are not the model's; run "
            "`python -m durable_kit.workshop.lab.minutes --write`")


def test_the_readme_map_states_the_headers_minutes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Notebook map"):]
    (rows,) = tables(section[:section.index("\n## ", 5)])
    listed = {row["notebook"].strip("`"): (int(row["minutes"]), int(row["core minutes"])) for row in rows}
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert listed == {path.name: minutes.stated(path) for path in notebooks}


def test_every_exercise_heading_names_its_minutes():
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        titles = [title for title, _ in minutes.section_cells(path) if "Exercise" in title]
        assert titles, f"{path.name} has no exercise section"
        assert all(minutes.EXERCISE_HEADING.search(t) for t in titles), (path.name, titles)


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


def kind(row: dict[str, str]) -> str:
    """A track row's kind: a notebook's ``segment`` (named with its number in backticks), a ``break``, or ``slack``
    (a welcome, questions, a laptop that fails: time the room needs and no notebook uses)."""
    return "segment" if "`" in row["segment"] else "break" if row["segment"] == "break" else "slack"


def segments() -> list[dict[str, str]]:
    return [row for row in track_rows() if kind(row) == "segment"]


def segment_notebook(row: dict[str, str]) -> str:
    """The notebook number of a track row's segment ("`05` side effects" -> "05")."""
    return row["segment"].split("`")[1]


def notebook_path(number: str) -> Path:
    return next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))


def test_the_3_hour_track_adds_up_by_the_reading_model_with_slack():
    spent, at = {"segment": 0, "break": 0, "slack": 0}, 0
    for row in track_rows():
        start, end = (clock(t) for t in row["clock"].split("–"))
        assert start == at and end - start == int(row["minutes"]), row
        at = end
        spent[kind(row)] += int(row["minutes"])
        if kind(row) != "segment":
            continue
        path = notebook_path(segment_notebook(row))
        used = numbers(row["sections used"])
        titles = [title for i, (title, _, _) in enumerate(minutes.sections(path)) if i in used]
        budgets = [int(found.group(1)) for title in titles if (found := minutes.EXERCISE_HEADING.search(title))]
        assert (row["exercise"] == "yes") == bool(budgets), row
        needed = sum(m for i, (_, _, m) in enumerate(minutes.sections(path)) if i in used) + sum(budgets)
        assert int(row["minutes"]) == math.ceil(needed - 1e-9), (row, needed)
    assert at == 180 and spent["segment"] <= 150 and spent["break"] == 15 and 15 <= spent["slack"] <= 20, spent
    text = part("3-hour conference track (180 minutes)")
    assert (f"That is {spent['segment']} minutes of learner time, {spent['break']} of breaks and "
            f"{spent['slack']} of slack") in " ".join(text.split())


def test_the_3_hour_track_runs_the_agent_loop_early_with_an_exercise_and_a_chart():
    rows = track_rows()
    done = {segment_notebook(row): row["exercise"] for row in segments()}
    # the crash, the journal, the agent loop, retries, waits, side effects and leases
    assert set(done) >= {"00", "02", "03", "04", "05", "06", "08"}
    assert [n for n in ("00", "02", "05", "08") if done[n] != "yes"] == []
    first_break = next(i for i, row in enumerate(rows) if kind(row) == "break")
    loop = next(i for i, row in enumerate(rows) if kind(row) == "segment" and segment_notebook(row) == "08")
    assert loop < first_break, "the agent loop runs before the first break, where a late room cuts last"
    (row,) = [r for r in segments() if segment_notebook(r) == "08"]
    parts = minutes.section_cells(notebook_path("08"))
    charts = [c for i in numbers(row["sections used"]) for c in parts[i][1]
              if any("image/png" in o.get("data", {}) for o in c.get("outputs", []))]
    assert charts, "the agent loop's segment shows a chart"


def test_each_header_says_which_sections_the_3_hour_track_runs():
    on_track = {segment_notebook(row): numbers(row["sections used"]) for row in segments()}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        header = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
        said = re.search(r"\*\*On the 3-hour track:\*\* ([^.]*)\.", " ".join(header.split()))
        assert said, f"{path.name}: the header does not say whether the 3-hour track runs it"
        every = set(range(len(minutes.section_cells(path))))
        stated = (set() if said.group(1) == "not run" else every if said.group(1) == "every section" else
                  {0} | numbers(said.group(1).removeprefix("sections ").replace(" and ", ", ")))
        assert stated == on_track.get(path.name[:2], set()), (path.name, said.group(1))


def test_no_cell_of_a_3_hour_segment_needs_a_section_the_segment_skips():
    for row in segments():
        path = notebook_path(segment_notebook(row))
        used = numbers(row["sections used"])
        parts = minutes.section_cells(path)
        assert max(used) < len(parts), (path.name, used)
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


def test_the_run_sheet_follows_the_track_and_quotes_cells_of_the_sections_it_runs():
    sheet = part("Run-sheet for the 3-hour track")
    headed = re.findall(r"^#### (\S+) · (\d\d) ", sheet, flags=re.M)
    assert headed == [(row["clock"], segment_notebook(row)) for row in segments()]
    used = {segment_notebook(row): numbers(row["sections used"]) for row in segments()}
    for block in re.split(r"^#### ", sheet, flags=re.M)[1:]:
        number = block.split(" · ")[1][:2]
        path = notebook_path(number)
        parts = minutes.section_cells(path)
        for row in tables(block)[0]:
            cited = {int(n) for n in re.findall(r"§(\d+)", row["do"])} | ({0} if "§opening" in row["do"] else set())
            assert cited <= used[number], f"{path.name}: the run-sheet's {row['at']} cites sections {cited}"
            code = "\n".join("".join(c["source"]) for i in cited for c in parts[i][1] if c["cell_type"] == "code")
            for quoted in re.findall(r"`([^`]+)`", row["do"]):
                if quoted.startswith("python -m"):
                    continue
                assert quoted.rstrip(". ") in code, (f"{path.name}: the run-sheet's {row['at']} quotes {quoted!r}, "
                                                     f"which no cell of the sections it cites has")
