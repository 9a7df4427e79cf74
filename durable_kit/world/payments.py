"""A fake payment service in its own SQLite file: what the money side of the world saw.

Two services in one class. With ``accepts_keys=True`` it deduplicates by
idempotency key, as many payment APIs do: the same key with the same
parameters returns the original refund; the same key with other parameters
is refused. With ``accepts_keys=False`` every request is a new refund, but the
service can list the refunds of an order, which is what reconciliation asks.
Either way it can check fencing tokens: given a key and a token, it refuses a
token lower than the highest it has seen with that key. Every request is
counted, whatever became of it, with the workflow and the action that sent
it (``durable_kit.world.sender``).
"""
from __future__ import annotations

from pathlib import Path

from ..core.store import immediate, now
from . import OutsideWorld, add_column, beside, connect_outside, sender

PAYMENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    key      TEXT,
    order_id TEXT NOT NULL,
    amount   REAL NOT NULL,
    at       REAL NOT NULL,
    workflow_id TEXT,  -- the workflow that sent it (NULL: sent outside the kit's effect helpers)
    action      TEXT   -- the effect helper's action that sent it
);
CREATE TABLE IF NOT EXISTS fences (
    key   TEXT PRIMARY KEY,  -- the effect key the token fences (one workflow's one action)
    token INTEGER NOT NULL   -- the highest fencing token seen with this key
);
CREATE TABLE IF NOT EXISTS refunds (
    refund_id TEXT PRIMARY KEY,
    key       TEXT UNIQUE,
    order_id  TEXT NOT NULL,
    amount    REAL NOT NULL,
    at        REAL NOT NULL,
    workflow_id TEXT,  -- the workflow whose request made it
    action      TEXT
)
"""


class KeyReused(ValueError):
    """An idempotency key came back with different parameters; nothing was refunded."""


class StaleToken(ValueError):
    """A request carried a lower fencing token than one already seen with its key; nothing was refunded."""


def payments_path(db_path: str | Path) -> Path:
    """Where the payment service of a journal database keeps its books: ``x.db`` -> ``x.payments.db``."""
    return beside(db_path, "payments")


class Payments(OutsideWorld):
    """Issues refunds and counts every request it receives."""

    def __init__(self, path: str | Path, accepts_keys: bool = True):
        self.path, self.accepts_keys = Path(path), accepts_keys
        self.conn = connect_outside(self.path, PAYMENTS_SCHEMA)
        for table in ("requests", "refunds"):
            add_column(self.conn, table, "workflow_id")
            add_column(self.conn, table, "action")

    @classmethod
    def beside(cls, db_path: str | Path, accepts_keys: bool = True) -> "Payments":
        """The payment service that belongs to the journal at ``db_path``."""
        return cls(payments_path(db_path), accepts_keys)

    def refund(self, order_id: str, amount: float, key: str | None = None, fencing_token: int | None = None) -> dict:
        """Refund ``amount`` on ``order_id``; with a key (and ``accepts_keys``), at most one refund per key.

        With a ``fencing_token`` (the caller's lease token) and a ``key``, a
        request whose token is lower than one already seen with that key is
        refused (``StaleToken``): a paused worker that lost its lease cannot
        pay after its successor did. Fences are per key, so one workflow's
        token never blocks another's.
        """
        if fencing_token is not None and key is None:
            raise ValueError(f"order {order_id}: a fencing token needs the effect key it fences; nothing was refunded.")
        workflow_id, action = sender()
        self.conn.execute("INSERT INTO requests (key, order_id, amount, at, workflow_id, action)"
                          " VALUES (?, ?, ?, ?, ?, ?)",  # counted on arrival, whatever happens next
                          (key, order_id, amount, now(), workflow_id, action))
        with immediate(self.conn):
            if fencing_token is not None:
                seen = self.conn.execute("SELECT token FROM fences WHERE key = ?", (key,)).fetchone()
                if seen is not None and fencing_token < seen["token"]:
                    raise StaleToken(f"key {key!r}: fencing token {fencing_token} is older than {seen['token']};"
                                     " the sender lost its lease, so nothing was refunded.")
                self.conn.execute("INSERT INTO fences (key, token) VALUES (?, ?) ON CONFLICT (key)"
                                  " DO UPDATE SET token = MAX(token, excluded.token)", (key, fencing_token))
            if self.accepts_keys and key is not None:
                earlier = self.conn.execute("SELECT * FROM refunds WHERE key = ?", (key,)).fetchone()
                if earlier is not None:
                    if (earlier["order_id"], earlier["amount"]) != (order_id, amount):
                        raise KeyReused(
                            f"idempotency key {key!r} was first used to refund {earlier['amount']:g} on order "
                            f"{earlier['order_id']}, not {amount:g} on {order_id}: a key names one action; "
                            "make a new key for a different refund.")
                    return self._receipt(earlier)
            number = self.conn.execute("SELECT COUNT(*) FROM refunds").fetchone()[0] + 1
            refund_id = f"R-{number:04d}"
            self.conn.execute("INSERT INTO refunds (refund_id, key, order_id, amount, at, workflow_id, action)"
                              " VALUES (?, ?, ?, ?, ?, ?, ?)", (refund_id, key if self.accepts_keys else None,
                                                             order_id, amount, now(), workflow_id, action))
            return {"refund_id": refund_id, "order_id": order_id, "amount": amount}

    @staticmethod
    def _receipt(row) -> dict:
        return {"refund_id": row["refund_id"], "order_id": row["order_id"], "amount": row["amount"]}

    def refunds(self, order_id: str | None = None) -> list[dict]:
        """The refunds issued (for one order, if given), oldest first: what reconciliation asks for."""
        sql, args = "SELECT * FROM refunds", ()
        if order_id is not None:
            sql, args = sql + " WHERE order_id = ?", (order_id,)
        return [self._receipt(row) for row in self.conn.execute(sql + " ORDER BY at, refund_id", args)]

    def request_count(self) -> int:
        """How many refund requests reached the service, including repeats it deduplicated."""
        return self.conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]

