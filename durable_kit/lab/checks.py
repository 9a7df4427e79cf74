"""Checks for the notebooks' exercises: each runs the learner's code against a fresh journal."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from ..journal import Journal


def check_execute_step(execute_step: Callable) -> str:
    """Check an ``execute_step(journal, workflow_id, name, activity)`` written in notebook 02.

    It must run the activity once, store its output, and on a second call (a
    replay) return the stored output without running the activity again.
    """
    runs = []

    def activity() -> dict:
        runs.append(1)
        return {"subtopics": ["a", "b"], "run": len(runs)}

    with tempfile.TemporaryDirectory() as folder:
        journal = Journal(Path(folder) / "check.db")
        journal.start("exercise", {"topic": "t"}, "exercise-1")
        first = execute_step(journal, "exercise-1", "plan", activity)
        assert len(runs) == 1, f"the activity should run once on the first call; it ran {len(runs)} times"
        assert first == {"subtopics": ["a", "b"], "run": 1}, f"the first call should return the activity's output, got {first!r}"
        stored = [s for s in journal.steps("exercise-1") if s["name"] == "plan"]
        assert stored and stored[0]["status"] == "complete", "the step's row should be stored with status 'complete'"
        assert stored[0]["output"] == first, "the stored output should equal the returned one"
        again = execute_step(journal, "exercise-1", "plan", activity)
        assert len(runs) == 1, "a replay must return the stored output without running the activity"
        assert again == first, f"a replay should return {first!r}, got {again!r}"
        journal.conn.close()
    return "execute_step: runs the activity once, stores its output, and a replay reuses it"
