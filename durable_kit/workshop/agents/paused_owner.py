"""Notebook 06: a worker paused just before it pays a refund, its lease taken over, then resumed.

One refund of order A-1001 per delivery strategy, each in its own database.
Worker A reaches the payment (the fault point ``before_send:refund``, armed
with a short delay so that there is a moment to stop it) and is stopped with
SIGSTOP. Its lease expires; worker B takes the workflow over and finishes
it. Then A is continued with SIGCONT and sends the request it was about to
send, with the fencing token of the lease it lost. Both workers are real
processes (``python -m durable_kit worker --until-idle --expiry-only``), so
B waits for the lease to expire, as a worker on another machine must.

Every count comes from the payment service's own books and the journal's
history. The journal refuses the paused owner's writes by token in every
strategy that writes under a lease; whether its *payment* goes through
depends on what the destination checks (``effects.py``): nothing (naive),
the key, or the fencing token sent with the key.
"""
from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from ... import Journal
from ...harness.faults import arm
from ...world.payments import payments_path
from .refunds import STRATEGIES

WORKFLOW_ID = "refund-A-1001"
KEY = f"{WORKFLOW_ID}:refund"
PAUSE_POINT = "before_send:refund"


def _worker(db: Path, lease_seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "durable_kit", "worker", "--db", str(db), "--until-idle",
                             "--lease-seconds", str(lease_seconds), "--expiry-only", "--poll", "0.05"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _reached(journal: Journal, point: str) -> bool:
    return any(e["event"] == "fault_fired" and (e["detail"] or "").startswith(point)
               for e in journal.history(WORKFLOW_ID))


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:g} s")
        time.sleep(0.02)


def _owner_request(db: Path, owner_token: int | None) -> str:
    """What became of the paused owner's request, read from the payment service's books.

    The owner's request is the service's last one (it was sent after the
    successor finished). It made a refund of its own, was refused because
    a newer token had been seen with its key, or was answered with the
    refund its key already had.
    """
    books = sqlite3.connect(payments_path(db))
    try:
        last = books.execute("SELECT key, at FROM requests ORDER BY seq DESC LIMIT 1").fetchone()
        if last is None:
            return "never sent"
        made_refund = books.execute("SELECT COUNT(*) FROM refunds WHERE at >= ?", (last[1],)).fetchone()[0]
        fence = books.execute("SELECT token FROM fences WHERE key = ?", (KEY,)).fetchone()
    finally:
        books.close()
    if made_refund:
        return "paid"
    if fence is not None and owner_token is not None and fence[0] > owner_token:
        return "refused: older fencing token"
    return "answered with the key's first refund"


def _journal_refusal(journal: Journal) -> str:
    events = [e["event"] for e in journal.history(WORKFLOW_ID)]
    return next((name for name in ("stale_write_refused", "outbox_answer_dropped") if name in events), "")


def _lease_expired(journal: Journal) -> bool:
    """True once no live lease holds the workflow, by the database's clock (the clock a successor reads).

    The outbox's dispatcher sends under no lease: a workflow waiting for its delivery holds none.
    """
    row = journal.conn.execute("SELECT COALESCE(lease_expires_at < (julianday('now') - 2440587.5) * 86400.0, 1) FROM workflows WHERE id = ?",
                               (WORKFLOW_ID,)).fetchone()
    return bool(row[0])


def pause_before_payment(folder: str | Path, strategy: str, lease_seconds: float = 2.0) -> dict:
    """Pause worker A just before it pays, let B take over after A's lease expires, resume A; return the counts.

    Keys: ``strategy``, ``payment_calls`` and ``refunds_at_destination``
    (the payment service's books), ``owner_request`` (what became of A's late
    request), ``journal_refused`` (the event by which the journal refused A's
    late write: ``stale_write_refused`` under a lease, ``outbox_answer_dropped``
    for the outbox's dispatcher; empty if none), ``status`` (the workflow's), ``owner_log`` and
    ``successor_log`` (what each worker printed).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    db = Path(folder) / f"paused-{strategy}.db"
    journal = Journal(db)
    journal.start("refund", {"order_id": "A-1001", "strategy": strategy}, WORKFLOW_ID)
    arm(journal.conn, PAUSE_POINT, "delay", 6.0)  # a moment at the payment, long enough to stop A there
    owner = _worker(db, lease_seconds)
    stopped = False
    try:
        _wait_for(lambda: _reached(journal, PAUSE_POINT), 60, "worker A to reach the payment")
        owner.send_signal(signal.SIGSTOP)
        stopped = True
        owner_token = journal.workflow(WORKFLOW_ID)["fencing_token"]  # A's token (the outbox sends under none)
        _wait_for(lambda: _lease_expired(journal), 120, "worker A's lease to expire while it is stopped")
        successor = _worker(db, lease_seconds)
        successor_log, successor_errors = successor.communicate(timeout=120)
        if successor.returncode != 0:
            raise RuntimeError(f"worker B failed ({successor.returncode}):\n{successor_errors}")
    except BaseException:
        owner.kill()  # never leave a stopped process behind
        raise
    finally:
        if stopped:
            owner.send_signal(signal.SIGCONT)
    owner_log, owner_errors = owner.communicate(timeout=120)
    if owner.returncode != 0 or "Traceback" in owner_errors:
        raise RuntimeError(f"worker A failed ({owner.returncode}):\n{owner_errors}")
    books = sqlite3.connect(payments_path(db))
    try:
        calls = books.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        refunds = books.execute("SELECT COUNT(*) FROM refunds").fetchone()[0]
    finally:
        books.close()
    row = {"strategy": strategy, "payment_calls": calls, "refunds_at_destination": refunds,
           "owner_request": _owner_request(db, owner_token),
           "journal_refused": _journal_refusal(journal),
           "status": journal.workflow(WORKFLOW_ID)["status"],
           "owner_log": owner_log.splitlines(), "successor_log": successor_log.splitlines()}
    journal.close()
    return row


def pause_matrix(folder: str | Path, strategies=STRATEGIES, lease_seconds: float = 2.0) -> list[dict]:
    """``pause_before_payment`` for each strategy, one after another (each pause is timed by a lease)."""
    return [pause_before_payment(folder, strategy, lease_seconds) for strategy in strategies]
