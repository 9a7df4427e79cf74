"""A fake notification service in its own SQLite file: the destination's own count of deliveries.

It is outside the workflow's transactions, like a real email or chat API:
what it received stays received, whatever the journal later remembers. With
``dedupe=True`` it delivers a key only once and answers a repeat with the
first delivery; without it, every request is a new message in someone's inbox.
Every request and delivery names the workflow and the action that sent it
(``durable_kit.world.sender``).
"""
from __future__ import annotations

from pathlib import Path

from ..core.store import immediate, now
from . import OutsideWorld, add_column, beside, connect_outside, sender

NOTIFIER_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT,
    at  REAL NOT NULL,
    workflow_id TEXT,  -- the workflow that sent it (NULL: sent outside the kit's effect helpers)
    action      TEXT   -- the effect helper's action that sent it
);
CREATE TABLE IF NOT EXISTS deliveries (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    key       TEXT,
    recipient TEXT NOT NULL,
    message   TEXT NOT NULL,
    at        REAL NOT NULL,
    workflow_id TEXT,  -- the workflow whose request made it
    action      TEXT
)
"""


def notifier_path(db_path: str | Path) -> Path:
    """Where the notifier of a journal database keeps its deliveries: ``x.db`` -> ``x.notify.db``."""
    return beside(db_path, "notify")


class Notifier(OutsideWorld):
    """Delivers messages and commits each delivery before returning; deduplicates by key if asked."""

    def __init__(self, path: str | Path, dedupe: bool = False):
        self.path, self.dedupe = Path(path), dedupe
        self.conn = connect_outside(self.path, NOTIFIER_SCHEMA)
        for table in ("requests", "deliveries"):
            add_column(self.conn, table, "workflow_id")
            add_column(self.conn, table, "action")

    @classmethod
    def beside(cls, db_path: str | Path, dedupe: bool = False) -> "Notifier":
        """The notifier that belongs to the journal at ``db_path``."""
        return cls(notifier_path(db_path), dedupe)

    def send(self, recipient: str, message: str, key: str | None = None) -> dict:
        """Deliver one message (unless ``dedupe`` and ``key`` was delivered before); return its delivery number."""
        workflow_id, action = sender()
        self.conn.execute("INSERT INTO requests (key, at, workflow_id, action) VALUES (?, ?, ?, ?)",
                          (key, now(), workflow_id, action))
        with immediate(self.conn):
            if self.dedupe and key is not None:
                first = self.conn.execute("SELECT seq FROM deliveries WHERE key = ?", (key,)).fetchone()
                if first is not None:
                    return {"delivery": first["seq"], "recipient": recipient}
            seq = self.conn.execute("INSERT INTO deliveries (key, recipient, message, at, workflow_id, action)"
                                    " VALUES (?, ?, ?, ?, ?, ?)",
                                    (key, recipient, message, now(), workflow_id, action)).lastrowid
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

    def request_count(self) -> int:
        """How many send requests reached the service, including repeats it deduplicated."""
        return self.conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]

