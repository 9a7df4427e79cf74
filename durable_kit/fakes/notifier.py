"""A fake notification service in its own SQLite file: the destination's own count of deliveries.

It is outside the workflow's transactions, like a real email or chat API:
what it received stays received, whatever the journal later remembers.
"""
from __future__ import annotations

from pathlib import Path

from ..store import beside, connect_outside, now

NOTIFIER_SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    key       TEXT,
    recipient TEXT NOT NULL,
    message   TEXT NOT NULL,
    at        REAL NOT NULL
)
"""


def notifier_path(db_path: str | Path) -> Path:
    """Where the notifier of a journal database keeps its deliveries: ``x.db`` -> ``x.notify.db``."""
    return beside(db_path, "notify")


class Notifier:
    """Delivers every message it is sent (no deduplication) and commits it before returning."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.conn = connect_outside(self.path, NOTIFIER_SCHEMA)

    @classmethod
    def beside(cls, db_path: str | Path) -> "Notifier":
        """The notifier that belongs to the journal at ``db_path``."""
        return cls(notifier_path(db_path))

    def send(self, recipient: str, message: str, key: str | None = None) -> dict:
        """Deliver one message; return its delivery number."""
        seq = self.conn.execute("INSERT INTO deliveries (key, recipient, message, at) VALUES (?, ?, ?, ?)",
                                (key, recipient, message, now())).lastrowid
        return {"delivery": seq, "recipient": recipient}

    def deliveries(self, key: str | None = None) -> list[dict]:
        """Every delivery, oldest first (only those sent with ``key``, if given)."""
        sql, args = "SELECT seq, key, recipient, message FROM deliveries", ()
        if key is not None:
            sql, args = sql + " WHERE key = ?", (key,)
        return [dict(row) for row in self.conn.execute(sql + " ORDER BY seq", args)]

    def count(self, key: str | None = None) -> int:
        """How many messages were delivered (with ``key``, if given)."""
        return len(self.deliveries(key))

    def close(self) -> None:
        self.conn.close()
