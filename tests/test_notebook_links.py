"""Every notebook a notebook or the README refers to exists in notebooks/."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
FILE_NAME = re.compile(r"\b(\d\d_[A-Za-z0-9_]+\.ipynb)\b")
# "notebook 04", "Notebook 05's", "notebooks 04 and 05", "notebooks 04, 05 or 06"
NUMBERED = re.compile(r"\b[Nn]otebooks?\s+((?:\d\d(?:,\s*|\s+and\s+|\s+or\s+|\s*[-–]\s*))*\d\d)\b")


def documents() -> list[Path]:
    """The README and every instructor notebook (the learner copies are generated from them)."""
    return [ROOT / "README.md", *sorted(NOTEBOOKS.glob("*.ipynb"))]


def texts(path: Path) -> list[str]:
    """The README's text, or the source of every cell of a notebook (outputs are not prose)."""
    if path.suffix == ".md":
        return [path.read_text(encoding="utf-8")]
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(cell["source"]) for cell in notebook["cells"]]


def references(text: str) -> set[str]:
    """Each notebook the text names, as a file name or as a two-digit number."""
    found = set(FILE_NAME.findall(text))
    for group in NUMBERED.findall(text):
        found.update(re.findall(r"\d\d", group))
    return found


def exists(reference: str) -> bool:
    if reference.endswith(".ipynb"):
        return (NOTEBOOKS / reference).exists()
    return any(NOTEBOOKS.glob(f"{reference}_*.ipynb"))


def test_the_patterns_find_what_a_reader_would_follow():
    text = "See notebook 04, notebooks 05 and 06, Notebook 07's timer and 02_step_journal.ipynb; not 2026 or 0.9."
    assert references(text) == {"04", "05", "06", "07", "02_step_journal.ipynb"}


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.name)
def test_every_referenced_notebook_exists(path):
    missing = sorted({ref for text in texts(path) for ref in references(text) if not exists(ref)})
    assert not missing, (f"{path.name} refers to notebooks that do not exist in notebooks/: {missing}. "
                         "Point to an existing notebook, or say 'a planned notebook on ...' until it lands.")
