"""Floor 6: side effects and the guarantee each delivery strategy gives.

An activity runs at least once, so a side effect inside it can happen twice:
the process may die after the effect and before the step's output is stored.
Each strategy here states exactly what it promises instead.

Keys are made from the workflow and the logical action (``"<workflow>:notify"``),
never from the attempt, so every attempt of one action carries the same key.
"""
from __future__ import annotations

import sqlite3
from typing import Any, Callable

from .faults import trip
from .store import append_event, immediate, now


def effect_key(workflow_id: str, action: str) -> str:
    """The key of one logical action of one workflow; the same in every attempt."""
    return f"{workflow_id}:{action}"


def send_at_most_once(conn: sqlite3.Connection, workflow_id: str, action: str,
                      send: Callable[[str], Any]) -> dict:
    """Reserve the action's key in the journal, commit, then call ``send(key)``: **at most once**.

    If the key was reserved by an earlier attempt, ``send`` is not called
    again, whether or not that attempt got as far as sending. So the effect
    never happens twice, and it is **lost** if a process dies between the
    reservation's commit and the send (fault point ``after_reserve:<action>``).
    Use it where a duplicate is worse than a loss, and make the loss visible:
    the result says ``sent: False``.
    """
    key = effect_key(workflow_id, action)
    with immediate(conn):
        reserved = conn.execute("INSERT INTO reservations (key, workflow_id, reserved_at) VALUES (?, ?, ?)"
                                " ON CONFLICT (key) DO NOTHING", (key, workflow_id, now())).rowcount
        append_event(conn, workflow_id, action, "key_reserved" if reserved else "key_already_reserved", key)
    if not reserved:
        return {"key": key, "sent": False,
                "note": "an earlier attempt reserved this key and may or may not have sent it; not sent again"}
    trip(conn, f"after_reserve:{action}", workflow_id)
    return {"key": key, "sent": True, "receipt": send(key)}
