"""The harness: run a workflow in a real child process and report what survived.

The child is a new Python interpreter (``python -m durable_kit run ...``),
never a fork: it opens its own database connection and imports the workflow
by name, exactly as a restarted worker would.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .faults import arm, disarm_all
from ..core.journal import Journal
from ..world.ledger import Ledger


@dataclass
class RunReport:
    """One child process: how it ended and what the database held afterwards."""

    exit_code: int
    crash_point: str | None
    status: str
    steps_completed: list[str] = field(default_factory=list)
    calls_made: int = 0
    stderr: str = ""

    @property
    def crashed(self) -> bool:
        return self.exit_code != 0


def run_in_child(db_path: str | Path, workflow_id: str, crash_at: str | None = None, action: str = "exit",
                 module: str | Path | None = None, timeout: float = 120) -> RunReport:
    """Replay ``workflow_id`` in a new process, optionally armed to crash at ``crash_at``.

    A crash point that the run did not reach is disarmed afterwards, so it is
    armed for this one run only.
    """
    journal = Journal(db_path)
    ledger = Ledger.beside(db_path)
    calls_before = ledger.count(workflow_id=workflow_id)
    if crash_at:
        arm(journal.conn, crash_at, action)
    command = [sys.executable, "-m", "durable_kit", "run", "--db", str(db_path), "--workflow", workflow_id]
    if module:
        command += ["--module", str(module)]
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    finally:
        disarm_all(journal.conn)
    return RunReport(
        exit_code=child.returncode,
        crash_point=crash_at,
        status=journal.workflow(workflow_id)["status"],
        steps_completed=[s["name"] for s in journal.steps(workflow_id) if s["status"] == "complete"],
        calls_made=ledger.count(workflow_id=workflow_id) - calls_before,
        stderr=child.stderr,
    )


def worker_in_child(db_path: str | Path, module: str | Path | None = None,
                    timeout: float = 120) -> subprocess.CompletedProcess:
    """Run one worker in a new process until nothing is due (``worker --until-idle``); return how it ended.

    An armed crash point ends it early with exit code 13 (``exit``) or -9 (``kill``).
    """
    command = [sys.executable, "-m", "durable_kit", "worker", "--db", str(db_path), "--until-idle"]
    if module:
        command += ["--module", str(module)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
