"""The lines notebooks 02, 03, 04 and 06 name, in mini.py and in the kit, exist and hold what they name."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from durable_kit.workshop.lab import reading

ROOT = Path(__file__).resolve().parents[1]


def definition_line(name: str) -> re.Pattern:
    """The line that starts ``name``'s definition: ``def``, ``class`` or an assignment (a method: its own name)."""
    last = re.escape(name.split(".")[-1])
    return re.compile(rf"^\s*(?:@|(?:async\s+)?def\s+{last}\b|class\s+{last}\b|{last}\s*(?::[^=]*)?=)")


@pytest.mark.parametrize("notebook", sorted(reading.IDEAS))
def test_every_named_line_range_exists_and_starts_at_its_definition(notebook):
    for _, in_one_file, in_kit in reading.IDEAS[notebook]:
        for names, files in ((in_one_file, reading.ONE_FILE), (in_kit, reading.KIT)):
            for name in names:
                path, first, last = reading.where(name, files)
                lines = path.read_text(encoding="utf-8").splitlines()
                assert 1 <= first <= last <= len(lines), (name, path, first, last)
                start = next(i for i in range(first - 1, last) if not lines[i].lstrip().startswith("@"))
                assert definition_line(name).match(lines[start]), (name, path, lines[start])
                if "." in name:  # a method: inside its class
                    owner = name.split(".")[0]
                    assert any(re.match(rf"class\s+{owner}\b", line) for line in lines[:first]), (name, path)


def test_a_name_found_twice_or_never_is_refused():
    with pytest.raises(LookupError, match="defined 2 times"):
        reading.where("grant", reading.KIT)  # core/state.py and core/leases.py: ambiguous, so never named
    with pytest.raises(LookupError, match="defined 0 times"):
        reading.where("no_such_function", reading.ONE_FILE)


@pytest.mark.parametrize("notebook", sorted(reading.IDEAS))
def test_each_notebook_prints_the_lines_of_the_idea_it_taught(notebook, capsys):
    path = next((ROOT / "notebooks").glob(f"{notebook}_*.ipynb"))
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    (cell,) = [c for c in cells if c["cell_type"] == "code" and f'where_to_read("{notebook}")' in "".join(c["source"])]
    reading.where_to_read(notebook)
    printed = capsys.readouterr().out
    committed = "".join("".join(o.get("text", "")) for o in cell["outputs"] if o.get("name") == "stdout")
    numbers = re.compile(r"\((lines \d+–\d+|line \d+)\)")  # as nbval's sanitize file reads them
    assert numbers.sub("(LINES)", committed) == numbers.sub("(LINES)", printed)
    assert "durable_kit/mini.py" in printed and "durable_kit/core/" in printed
