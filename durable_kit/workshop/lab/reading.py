"""Where to read an idea: the lines of ``durable_kit/mini.py`` and of the kit that hold it, found in the source.

Each notebook that builds a part of the engine in one file (02, 03, 04, 06) ends its exercise with
``where_to_read("NN")``. The lines are computed each time from the source, by name (``Class.method``, a function,
or a module-level name), so they follow the code wherever it moves; a name that is gone or found twice raises.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2]
ONE_FILE = [PACKAGE / "mini.py"]
# The kit an idea is read in: the core, and the features beside it (a decision is a feature, decisions.py).
KIT = sorted((PACKAGE / "core").glob("*.py")) + [PACKAGE / name for name in
                                                ("decisions.py", "effects.py", "change.py", "parallel.py", "admin.py")]

# notebook -> (the idea, its names in mini.py, its names in the kit)
IDEAS = {
    "02": [("a step's stored output, or its activity run and its output committed once",
            ["Workflow.execute_step", "run_step", "mark"], ["Workflow.execute_step", "Replay.commit_output"]),
           ("a replay reads the journal once and reuses what it holds",
            ["Workflow.__init__", "Workflow._place"], ["Replay.__init__", "Replay.reuse"])],
    "03": [("a failure and its path, committed in one transaction",
            ["Workflow._failed", "after_failure"], ["Workflow._after_failure", "record_failure"]),
           ("the backoff, and the limit on attempts that crash",
            ["RetryPolicy", "CRASH_LIMIT"], ["RetryPolicy", "decide", "CRASH_LIMIT"])],
    "04": [("a wait is a row, and a workflow waiting for a person is never due",
            ["Workflow._wait", "DUE"], ["wait_for", "DUE"]),
           ("a decision is final, saved in the write that makes the workflow runnable",
            ["decide_wait", "approve"], ["decide_wait", "approve"])],
    "06": [("every write checks the lease's token in its own transaction",
            ["fenced"], ["check_lease", "Replay._fenced"]),
           ("a lease granted with a new token, and kept by a heartbeat",
            ["claim", "heartbeat"], ["claim_next", "Heartbeat"])],
}


@lru_cache(maxsize=None)
def _definitions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Every module-level function, class and name of ``path``, and every method as ``Class.method``: their lines."""
    found: dict[str, list[tuple[int, int]]] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append((first, node.end_lineno))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append((first, node.end_lineno))
        if isinstance(node, ast.ClassDef):
            for method in node.body:
                if isinstance(method, ast.FunctionDef):
                    start = min([method.lineno] + [d.lineno for d in method.decorator_list])
                    found.setdefault(f"{node.name}.{method.name}", []).append((start, method.end_lineno))
    return found


def where(name: str, files: list[Path]) -> tuple[Path, int, int]:
    """(file, first line, last line) of the one definition of ``name`` in ``files``; ``LookupError`` if none or two."""
    places = [(path, *lines) for path in files for lines in _definitions(path).get(name, [])]
    if len(places) != 1:
        raise LookupError(f"{name!r} is defined {len(places)} times in {[p.name for p in files]}, not once: "
                          f"{places}. Point the reading table (durable_kit/workshop/lab/reading.py) at its new name.")
    return places[0]


def lines_of(names: list[str], files: list[Path]) -> list[str]:
    """``path: name (lines a–b)`` for each name, the path relative to the repository."""
    out = []
    for name in names:
        path, first, last = where(name, files)
        span = f"line {first}" if first == last else f"lines {first}–{last}"
        out.append(f"{path.relative_to(PACKAGE.parent)}: {name} ({span})")
    return out


def where_to_read(notebook: str) -> None:
    """Print, for each idea notebook ``notebook`` built, its lines in the engine in one file and in the kit."""
    for idea, in_one_file, in_kit in IDEAS[notebook]:
        print(f"{idea}:")
        for line in lines_of(in_one_file, ONE_FILE) + lines_of(in_kit, KIT):
            print(f"    {line}")
