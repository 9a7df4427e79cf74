"""Fake services for your own agent: a destination that keeps its own books and counts what it receives.

Subclass ``KeyedService`` for a destination that deduplicates by idempotency
key (a seat hold, a booking, a payment API with keys) and ``UnkeyedService``
for one that does not (a card terminal, a fax line); give each a ``name``
and methods that call ``request``. Each service lives in its own SQLite file
beside the journal (``x.db`` -> ``x.<name>.db``), outside every transaction
of the workflow, like a real API: what it received stays received, whatever
the journal later remembers. Every request and effect row names the workflow
and the action that sent it (``durable_kit.world.sender``; NULL for a send
outside the kit's effect helpers). ``durable_kit.harness.crashlab`` counts its requests and
effects, per workflow and per key, after every crash.

    class SeatHolds(KeyedService):
        name = "seats"

        def hold(self, flight: str, key: str) -> dict:
            return self.request("hold", {"flight": flight}, key)

    seats = SeatHolds.beside(wf.db_path)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.store import immediate, now
from . import OutsideWorld, add_column, beside, connect_outside, sender

SERVICE_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    key       TEXT,
    operation TEXT NOT NULL,
    payload   TEXT NOT NULL,  -- JSON
    at        REAL NOT NULL,
    workflow_id TEXT,  -- the workflow that sent it (NULL: sent outside the kit's effect helpers)
    action      TEXT   -- the effect helper's action that sent it
);
CREATE TABLE IF NOT EXISTS fences (
    key   TEXT PRIMARY KEY,  -- the key the token fences (one workflow's one action)
    token INTEGER NOT NULL   -- the highest fencing token seen with this key
);
CREATE TABLE IF NOT EXISTS effects (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    effect_id TEXT NOT NULL UNIQUE,
    key       TEXT,
    operation TEXT NOT NULL,
    payload   TEXT NOT NULL,  -- JSON
    at        REAL NOT NULL,
    workflow_id TEXT,  -- the workflow whose request made it
    action      TEXT
)
"""


class KeyReused(ValueError):
    """An idempotency key came back with a different operation or payload; nothing was done."""


class StaleToken(ValueError):
    """A request carried a lower fencing token than one already seen with its key; nothing was done."""


class FakeService(OutsideWorld):
    """A destination that records every request and every effect in its own file; see the subclasses."""

    name = "service"
    accepts_keys = False

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.conn = connect_outside(self.path, SERVICE_SCHEMA)
        for table in ("requests", "effects"):
            add_column(self.conn, table, "workflow_id")
            add_column(self.conn, table, "action")

    @classmethod
    def beside(cls, db_path: str | Path, name: str | None = None):
        """The service of this class that belongs to the journal at ``db_path`` (``x.<name>.db``)."""
        return cls(beside(db_path, name or cls.name))

    def request(self, operation: str, payload: Any, key: str | None = None,
                fencing_token: int | None = None) -> dict:
        """Receive one request (counted on arrival, whatever happens next); return the effect's receipt.

        A keyed service answers a repeated key with the first receipt and does
        nothing new; the same key with another operation or payload raises
        ``KeyReused``. An unkeyed service makes a new effect for every request
        (it keeps the key only to fence by).
        With ``fencing_token`` (the caller's lease token) and a ``key``, a
        token lower than one already seen with that key raises ``StaleToken``
        and does nothing: a paused owner that lost its lease cannot act after
        its successor did. Fences are per key, so one workflow's token never
        blocks another's. A token without a key raises ``ValueError`` before
        anything is counted.
        """
        if fencing_token is not None and key is None:
            raise ValueError(f"{self.name}: {operation} with a fencing token needs the key it fences, for example "
                             "effect_key(wf.id, action); nothing was sent.")
        payload_json = json.dumps(payload, sort_keys=True)
        workflow_id, action = sender()
        self.conn.execute("INSERT INTO requests (key, operation, payload, at, workflow_id, action)"
                          " VALUES (?, ?, ?, ?, ?, ?)", (key, operation, payload_json, now(), workflow_id, action))
        with immediate(self.conn):
            if fencing_token is not None:
                self._fence(operation, key, fencing_token)
            if self.accepts_keys and key is not None:
                earlier = self.conn.execute("SELECT * FROM effects WHERE key = ?", (key,)).fetchone()
                if earlier is not None:
                    if (earlier["operation"], earlier["payload"]) != (operation, payload_json):
                        raise KeyReused(
                            f"{self.name}: key {key!r} was first used for {earlier['operation']} "
                            f"{earlier['payload']}, not {operation} {payload_json}: a key names one action; "
                            "make a new key for a different one.")
                    return self._receipt(earlier)
            number = self.conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0] + 1
            effect_id = f"{self.name}-{number:04d}"
            self.conn.execute("INSERT INTO effects (effect_id, key, operation, payload, at, workflow_id, action)"
                              " VALUES (?, ?, ?, ?, ?, ?, ?)",
                              (effect_id, key if self.accepts_keys else None, operation, payload_json, now(),
                               workflow_id, action))
        return {"effect_id": effect_id, "operation": operation, **self.perform(operation, payload)}

    def perform(self, operation: str, payload: Any) -> dict:
        """The service's answer to a new effect, merged into the receipt; override it (deterministically)."""
        return {}

    def _fence(self, operation: str, key: str, token: int) -> None:
        seen = self.conn.execute("SELECT token FROM fences WHERE key = ?", (key,)).fetchone()
        if seen is not None and token < seen["token"]:
            raise StaleToken(f"{self.name}: {operation} with key {key!r}: fencing token {token}, older than "
                             f"{seen['token']}; the sender lost its lease, so nothing was done.")
        self.conn.execute("INSERT INTO fences (key, token) VALUES (?, ?) ON CONFLICT (key)"
                          " DO UPDATE SET token = MAX(token, excluded.token)", (key, token))

    def _receipt(self, row) -> dict:
        return {"effect_id": row["effect_id"], "operation": row["operation"],
                **self.perform(row["operation"], json.loads(row["payload"]))}

    def effects(self, operation: str | None = None, **match: Any) -> list[dict]:
        """The effects made, oldest first (of one operation, whose payload has every ``match`` field, if given).

        This is what reconciliation asks: "did you already do this?"
        """
        sql, args = "SELECT * FROM effects", ()
        if operation is not None:
            sql, args = sql + " WHERE operation = ?", (operation,)
        rows = [{"effect_id": r["effect_id"], "key": r["key"], "operation": r["operation"],
                 "payload": json.loads(r["payload"])} for r in self.conn.execute(sql + " ORDER BY seq", args)]
        return [r for r in rows if all(isinstance(r["payload"], dict) and r["payload"].get(field) == value
                                       for field, value in match.items())]

    def effect_count(self) -> int:
        """How many effects the service made: what the customer, the airline or the bank sees."""
        return self.conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0]

    def request_count(self) -> int:
        """How many requests reached the service, including repeats a keyed service deduplicated."""
        return self.conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]



class KeyedService(FakeService):
    """A destination that deduplicates by idempotency key: one effect per key, however often it is sent."""

    accepts_keys = True


class UnkeyedService(FakeService):
    """A destination without keys: every request is a new effect, but ``effects(...)`` answers reconciliation."""

    accepts_keys = False
