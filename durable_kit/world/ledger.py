"""The outside world: the call ledger, the outside world's own count of requests.

Every external call (model, source, tool) is appended here, in its own file
and its own transaction, the moment it returns. A crash that loses the
journal's record of a result cannot lose the ledger's record of the call:
that is how repeated work is counted against stored artifacts.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..redact import redact
from ..core.store import now
from . import OutsideWorld, beside, connect_outside

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_id   TEXT,
    kind          TEXT NOT NULL,
    operation     TEXT NOT NULL,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    pid           INTEGER NOT NULL,
    at            REAL NOT NULL
)
"""


def ledger_path(db_path: str | Path) -> Path:
    """Where the ledger of a journal database lives: ``x.db`` -> ``x.calls.db``."""
    return beside(db_path, "calls")


class Ledger(OutsideWorld):
    """Append-only record of external calls; each ``record`` commits on its own."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.conn = connect_outside(self.path, LEDGER_SCHEMA)

    @classmethod
    def beside(cls, db_path: str | Path) -> "Ledger":
        """The ledger that belongs to the journal at ``db_path``."""
        return cls(ledger_path(db_path))

    def record(self, kind: str, operation: str, workflow_id: str | None = None,
               input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Append one call and commit it before returning; its operation is redacted (``redact.redact``)."""
        self.conn.execute(
            "INSERT INTO calls (workflow_id, kind, operation, input_tokens, output_tokens, pid, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (workflow_id, kind, redact(operation), input_tokens, output_tokens, os.getpid(), now()),
        )

    def calls(self, kind: str | None = None, workflow_id: str | None = None) -> list[dict]:
        """Every recorded call, oldest first, optionally only of one kind or workflow."""
        sql, args = "SELECT * FROM calls WHERE 1 = 1", []
        if kind is not None:
            sql, args = sql + " AND kind = ?", args + [kind]
        if workflow_id is not None:
            sql, args = sql + " AND workflow_id = ?", args + [workflow_id]
        return [dict(row) for row in self.conn.execute(sql + " ORDER BY seq", args)]

    def count(self, kind: str | None = None, workflow_id: str | None = None) -> int:
        """How many calls were made (of one kind, for one workflow)."""
        return len(self.calls(kind, workflow_id))

    def tokens(self, workflow_id: str | None = None) -> dict:
        """Total model tokens spent, across every attempt."""
        rows = self.calls("model", workflow_id)
        return {"input_tokens": sum(r["input_tokens"] for r in rows),
                "output_tokens": sum(r["output_tokens"] for r in rows)}

