"""A feature on the engine: side effects, and the exact guarantee of each way to deliver one.

An activity runs at least once, so an effect inside it can happen twice: the
process may die after the destination acted and before the step's output was
stored. No executor can prevent that on its own. What it can do is pick a
strategy and state its guarantee:

* **No key** (``send(None)`` inside a step): at-least-once calls, and each
  call may be a new effect. A crash after the effect repeats it.
* **A key the destination deduplicates** (``send(effect_key(...))`` inside a
  step): at-least-once calls, **one effect**, if the destination honours keys.
* **Reserve the key locally before sending** (``send_at_most_once``): **at
  most once**. A crash between the reservation and the send loses the effect.
* **Transactional outbox** (``send_via_outbox`` and ``dispatch_outbox``): the
  intent commits with the step that decided it; a dispatcher sends it with its
  key and then marks it sent. A crash between the send and the mark sends it
  again, so the destination must deduplicate: at-least-once calls, one effect.
  A cancellation withdraws a delivery no dispatcher has tried; one already
  tried may have reached its destination, so it stays pending and is sent.
* **Reconciliation** (``reconcile_then_send``): before sending, ask the
  destination whether the effect already happened. One effect, if the
  destination can answer and nobody else acts on the same thing between the
  question and the send. A paused owner that lost its lease may wake up
  between the two: "list, then charge" is safe only if the destination also
  checks the fencing token (``wf.fencing_token``) and refuses an older one.

Every helper takes the workflow handle first. Keys are made from the workflow
and the logical action (``"<workflow>:refund"``), never from the attempt, so
every attempt of one action carries the same key. Fault points:
``before_send:<action>`` and ``after_send:<action>`` around every send made
by these helpers (``send_guarded`` inside a step, the others by themselves,
and the outbox dispatcher).

Fencing. A journal write of a stale owner is refused by its token; a call
it already started to the outside world is not. Pass ``wf.fencing_token``
to every destination that can check one: a destination that remembers the
highest token seen for a key and refuses lower ones stops a paused owner's
late send after its successor sent. A destination that does not check
tokens gets the guarantee of its strategy above and no more.
"""
from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .core import state
from .core.store import FEATURE_TABLES, append_event, boundary, connect, from_json, immediate, now, to_json
from .core.waits import wait_for
from .core.worker import PASS_CHORES

if TYPE_CHECKING:
    from .core.journal import Journal, Workflow

FEATURE_TABLES.append("""
CREATE TABLE IF NOT EXISTS reservations (
    key         TEXT PRIMARY KEY,  -- from the workflow and the logical action, never the attempt
    workflow_id TEXT NOT NULL REFERENCES workflows (id),
    reserved_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    key         TEXT PRIMARY KEY,  -- sent with the request, so the destination can deduplicate
    workflow_id TEXT NOT NULL REFERENCES workflows (id),
    action      TEXT NOT NULL,
    destination TEXT NOT NULL,  -- a sender registered with effects.destination
    payload     TEXT NOT NULL,  -- JSON
    -- withdrawn: by a cancellation, before any dispatcher tried it
    status      TEXT NOT NULL CHECK (status = 'pending' OR status = 'sent' OR status = 'withdrawn'),
    result      TEXT,  -- JSON: the destination's answer
    attempts    INTEGER NOT NULL DEFAULT 0,
    created_at  REAL NOT NULL,
    sent_at     REAL
);
""")

NOT_SENT = "not sent by this attempt: an earlier attempt reserved the key and may or may not have sent it"

# Outbox destinations by name: send(journal_path, payload, key) -> the destination's answer (JSON-ready).
DESTINATIONS: dict[str, Callable[[Path, Any, str], Any]] = {}


def effect_key(workflow_id: str, action: str) -> str:
    """The key of one logical action of one workflow; the same in every attempt."""
    return f"{workflow_id}:{action}"


def send_guarded(wf: "Workflow", action: str, send: Callable[[], Any]) -> Any:
    """Call ``send()`` between the fault points ``before_send:<action>`` and ``after_send:<action>``.

    Adds no guarantee of its own: inside a step, the strategy of ``send`` (a
    key or none) decides how many effects a repeated attempt makes. It works
    on the activity's thread too (a step under ``time_limit``, a parallel branch).
    """
    if threading.get_ident() == wf.thread:
        return _between_fault_points(wf.conn, wf.id, action, send)
    conn = connect(wf.db_path, create=False)  # an SQLite connection is used only by the thread that opened it
    try:
        return _between_fault_points(conn, wf.id, action, send)
    finally:
        conn.close()


def _between_fault_points(conn: sqlite3.Connection, workflow_id: str, action: str, send: Callable[[], Any]) -> Any:
    boundary(conn, f"before_send:{action}", workflow_id)
    result = send()
    boundary(conn, f"after_send:{action}", workflow_id)
    return result


def send_at_most_once(wf: "Workflow", action: str, send: Callable[[str], Any]) -> dict:
    """Reserve the action's key in the journal, commit, then call ``send(key)``: **at most once**.

    If the key was reserved by an earlier attempt, ``send`` is not called
    again, whether or not that attempt got as far as sending. So the effect
    never happens twice, and it is **lost** if a process dies between the
    reservation's commit and the send. The result says ``sent: False`` when
    this attempt did not send, so the loss can be seen and followed up.
    """
    conn, workflow_id = wf.conn, wf.id
    key = effect_key(workflow_id, action)
    with wf.write():
        reserved = conn.execute("INSERT INTO reservations (key, workflow_id, reserved_at) VALUES (?, ?, ?)"
                                " ON CONFLICT (key) DO NOTHING", (key, workflow_id, now())).rowcount
        append_event(conn, workflow_id, action, "key_reserved" if reserved else "key_already_reserved", key)
    if not reserved:
        return {"key": key, "sent": False, "note": NOT_SENT}
    return {"key": key, "sent": True, "receipt": send_guarded(wf, action, lambda: send(key))}


def reconcile_then_send(wf: "Workflow", action: str, already_done: Callable[[], Any],
                        send: Callable[[], Any]) -> dict:
    """Ask the destination first (``already_done()``, a truthy answer if the effect exists); send only if not.

    One effect, provided the destination can answer truthfully and nothing
    else acts on the same thing between the question and the send; against
    a paused owner of this same workflow, only if ``send`` carries
    ``wf.fencing_token`` and the destination refuses an older token.
    """
    found = already_done()
    if found:
        with wf.write():
            append_event(wf.conn, wf.id, action, "reconciled", "the destination already has this effect: not sent")
        return {"sent": False, "receipt": found}
    return {"sent": True, "receipt": send_guarded(wf, action, send)}


def destination(name: str) -> Callable:
    """Register ``send(journal_path, payload, key)`` as the outbox destination ``name``."""
    def register(send: Callable[[Path, Any, str], Any]) -> Callable[[Path, Any, str], Any]:
        DESTINATIONS[name] = send
        return send
    return register


def send_via_outbox(wf: "Workflow", action: str, destination_name: str, payload: Any) -> Any:
    """Commit the intent as step ``action`` and an outbox row in one transaction; return the destination's answer.

    The workflow then waits (no worker held) until ``dispatch_outbox`` has
    sent the row and saved the answer as the wait ``<action>:receipt``.
    """
    key = effect_key(wf.id, action)
    payload_json = to_json(payload, wf.id, action, "outbox payload")
    position = wf.place(action, payload_json)
    if not wf.reuse(action):
        wf.at_boundary()
        output_json = to_json({"key": key, "destination": destination_name}, wf.id, action, "outbox intent")
        with wf.write():
            wf.record_step(action, position, payload_json, output_json)
            wf.conn.execute(
                "INSERT INTO outbox (key, workflow_id, action, destination, payload, status, created_at)"
                " VALUES (?, ?, ?, ?, ?, 'pending', ?)", (key, wf.id, action, destination_name, payload_json, now()))
            append_event(wf.conn, wf.id, action, "outbox_enqueued", key)
    return wait_for(wf, f"{action}:receipt", "delivery", {"key": key})


def dispatch_outbox(journal: "Journal", log: Callable[[str], None] = print) -> int:
    """Send every pending outbox row with its key, then mark it sent and wake its workflow; return how many sent.

    At-least-once: a crash after a send and before its mark sends it again
    on the next dispatch, with the same key; two workers dispatching at once
    may both send a row. Either way the destination's deduplication keeps
    one effect. The row's status is the dispatcher's fence: only a row still
    *pending* is marked sent, so the first answer saved is the receipt for
    good and a later dispatcher's answer is dropped, never saved over it.
    A destination not registered in this process, or one that raises, leaves
    the row pending for a later pass.
    """
    conn = journal.conn
    sent = 0
    for row in conn.execute("SELECT * FROM outbox WHERE status = 'pending' ORDER BY created_at, key").fetchall():
        send = DESTINATIONS.get(row["destination"])
        if send is None:
            continue
        with immediate(conn):
            counted = conn.execute("UPDATE outbox SET attempts = attempts + 1 WHERE key = ? AND status = 'pending'",
                                   (row["key"],)).rowcount
        if not counted:  # another dispatcher marked it sent since we listed it
            continue
        try:
            result = _between_fault_points(conn, row["workflow_id"], row["action"],
                                           lambda: send(journal.path, from_json(row["payload"]), row["key"]))
            result_json = to_json(result, row["workflow_id"], row["action"], "destination's answer")
        except Exception as error:  # left pending: the next dispatch sends it again, with the same key
            log(f"{row['workflow_id']}: outbox {row['key']} not sent: {type(error).__name__}: {error}")
            continue
        with immediate(conn):
            marked = conn.execute("UPDATE outbox SET status = 'sent', result = ?, sent_at = ?"
                                  " WHERE key = ? AND status = 'pending'", (result_json, now(), row["key"])).rowcount
            if not marked:  # another dispatcher's answer was saved first: it stays the receipt
                append_event(conn, row["workflow_id"], row["action"], "outbox_answer_dropped", row["key"])
                continue
            conn.execute(  # the receipt is saved before the workflow becomes runnable, like a person's decision
                "INSERT INTO waits (workflow_id, name, kind, request, status, decision, created_at, resolved_at)"
                " VALUES (?, ?, 'delivery', ?, 'resolved', ?, ?, ?) ON CONFLICT (workflow_id, name) DO UPDATE"
                " SET status = 'resolved', decision = excluded.decision, resolved_at = excluded.resolved_at"
                " WHERE waits.status = 'waiting'",
                (row["workflow_id"], f"{row['action']}:receipt", json.dumps({"key": row["key"]}), result_json,
                 now(), now()))
            state.wake(conn, row["workflow_id"])
            append_event(conn, row["workflow_id"], row["action"], "outbox_sent", row["key"])
        sent += 1
    return sent


PASS_CHORES.append(dispatch_outbox)  # every worker's pass sends the outbox first
