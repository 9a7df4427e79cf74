"""The core path runs: every learner notebook, with its deep-dive sections removed, executes top to bottom.

The 3-hour track skips every section headed ``· deep dive``. A deep-dive
section runs from its heading to the next heading of the same or a higher
level, so this test cuts exactly that (also when a heading sits in the middle
of a markdown cell) and executes what is left with nbclient, on this
interpreter, in a temporary copy of the notebooks folder: the learner copies
are generated there with ``durable_kit.workshop.lab.student``, so ``scratch/`` and the
links between notebooks resolve as they do for a learner.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from durable_kit.workshop.lab import student
from durable_kit.workshop.lab.minutes import core_only, heading

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SECTION = re.compile(r"^(\d+)\. \S.* · (core|deep dive)$")  # the convention: "## <n>. <title> · core"
KERNEL = "core-path"


def test_core_only_cuts_a_deep_dive_up_to_the_next_heading_of_its_level():
    def md(text):
        return {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(keepends=True)}

    def code(text):
        return {"cell_type": "code", "metadata": {}, "source": text, "outputs": [], "execution_count": None}

    notebook = {"cells": [
        md("# title\n## 1. a · core\ntext"), code("a = 1"),
        md("## 2. b · deep dive\n### inside\n```\n## not a heading\n```"), code("b = 2"),
        md("more of b\n## 3. c · core\ntext c"), code("c = 3"),
        md("### 3.1 d · deep dive"), code("d = 4"), md("## Deep dive · 4. e"), code("e = 5"), md("## Key points"),
    ]}
    cut = core_only(notebook)
    assert ["".join(c["source"]) for c in cut["cells"]] == [
        "# title\n## 1. a · core\ntext", "a = 1", "## 3. c · core\ntext c", "c = 3", "## Key points"]
    assert len(notebook["cells"]) == 11


def section_headings(notebook: dict) -> list[tuple[str, bool]]:
    """Each ``##`` heading's title and whether it opens its cell, in order (code fences skipped)."""
    titles, fenced = [], False
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for number, line in enumerate("".join(cell["source"]).strip().splitlines()):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            found = None if fenced else heading(line)
            if found and found[0] == 2:
                titles.append((found[1], number == 0))
    return titles


@pytest.mark.parametrize("path", student.source_notebooks(NOTEBOOKS), ids=lambda path: path.name)
def test_every_section_heading_follows_the_convention_numbered_in_order(path):
    headings = section_headings(json.loads(path.read_text(encoding="utf-8")))
    inside = [title for title, opens in headings if not opens]
    assert not inside, (f"{path.name}: start a cell with each section heading (the reading model, "
                        f"durable_kit.workshop.lab.minutes, sees a heading only there): {inside}")
    titles = [title for title, _ in headings]
    wrong = [title for title in titles if not SECTION.match(title)]
    assert not wrong, (f"{path.name}: write each section heading as '## <n>. <title> · core' (or '· deep dive'): "
                       f"{wrong}")
    numbers = [int(SECTION.match(title).group(1)) for title in titles]
    assert numbers == list(range(1, len(titles) + 1)), f"{path.name}: sections numbered {numbers}"


def test_the_convention_refuses_other_spellings():
    assert SECTION.match("3. Kill it · deep dive") and SECTION.match("12. Key points · core")
    for title in ("Key points", "Deep dive · 6. Usage", "5. Other engines (deep dive)", "7. Exercise"):
        assert not SECTION.match(title), title


@pytest.fixture(scope="module")
def learner_notebooks(tmp_path_factory) -> Path:
    """Learner copies of this worktree's notebooks, in a temporary notebooks/student folder."""
    root = tmp_path_factory.mktemp("core-path") / "notebooks"
    root.mkdir()
    for source in student.source_notebooks(NOTEBOOKS):
        shutil.copy(source, root / source.name)
    student.write_copies(root, root / student.STUDENT_FOLDER)
    return root / student.STUDENT_FOLDER


@pytest.fixture(scope="module")
def kernel_on_this_interpreter(tmp_path_factory):
    """A kernelspec that starts this interpreter (so this worktree's durable_kit and venv are the ones used)."""
    folder = tmp_path_factory.mktemp("jupyter")
    spec = folder / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "core path", "language": "python"}), encoding="utf-8")
    patch = pytest.MonkeyPatch()
    patch.setenv("JUPYTER_PATH", str(folder))
    yield KERNEL
    patch.undo()


def code_sources(notebook: dict) -> list[str]:
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]


def test_a_core_that_only_drops_the_last_code_cells_is_a_prefix():
    def code(text):
        return {"cell_type": "code", "metadata": {}, "source": text, "outputs": [], "execution_count": None}

    def md(text):
        return {"cell_type": "markdown", "metadata": {}, "source": text}

    at_the_end = {"cells": [md("## 1. a · core"), code("a = 1"), md("## 2. b · deep dive"), code("b = a")]}
    in_between = {"cells": [md("## 1. a · core"), code("a = 1"), md("## 2. b · deep dive"), code("b = a"),
                            md("## 3. c · core"), code("c = a")]}
    assert is_prefix(at_the_end) and not is_prefix(in_between)


def is_prefix(learner: dict) -> bool:
    """True when the core-only copy runs exactly the first code cells of the whole copy, in order."""
    core, whole = code_sources(core_only(learner)), code_sources(learner)
    return whole[:len(core)] == core


@pytest.mark.parametrize("name", [path.name for path in student.source_notebooks(NOTEBOOKS)])
def test_core_only_copy_runs_top_to_bottom(name, learner_notebooks, kernel_on_this_interpreter):
    learner = json.loads((learner_notebooks / name).read_text(encoding="utf-8"))
    if is_prefix(learner):
        # Its deep dives all come after its last core code cell, so the core-only run is the first part of
        # the whole copy's run, which tests/test_student_copies.py executes top to bottom: nothing to add.
        assert (learner_notebooks / name).read_text(encoding="utf-8") == (
            NOTEBOOKS / student.STUDENT_FOLDER / name).read_text(encoding="utf-8"), f"{name}: regenerate the copies"
        return
    notebook = nbformat.from_dict(core_only(learner))
    client = NotebookClient(notebook, kernel_name=kernel_on_this_interpreter, timeout=600,
                            resources={"metadata": {"path": str(learner_notebooks)}})
    try:
        client.execute()
        problem = None
    except CellExecutionError as error:
        failed = next((cell for cell in notebook.cells if cell.get("cell_type") == "code" and any(
            output.get("output_type") == "error" for output in cell.get("outputs", []))), None)
        source = failed["source"] if failed else "(cell not found)"
        problem = (f"{name}, core only: a cell failed.\n--- cell ---\n{source}\n--- error ---\n"
                   f"{error.ename}: {error.evalue}")
    if problem:
        pytest.fail(problem, pytrace=False)
