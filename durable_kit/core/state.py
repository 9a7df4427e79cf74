"""Every write to a workflow's or a step's row, written once: only this module writes those two tables.

A status changes only along ``WORKFLOW_MOVES`` or ``STEP_MOVES``: each statement's WHERE names the statuses
it may leave, so an unlisted change writes nothing (None, False or 0). Nothing here commits: each function
runs in the caller's transaction, or is one statement that is a transaction of its own.
"""
from __future__ import annotations

import sqlite3
from functools import lru_cache
from typing import Any

from .store import DB_NOW, now, one_of, write

FINAL_STATUSES = ("complete", "escalated", "stopped", "rejected", "cancelled")  # no worker runs these again

# Each status, and the statuses a workflow may come to it from.
WORKFLOW_MOVES = {
    # a lease granted (a worker's claim, a person's run; a new owner takes over a running one) or an unleased replay
    "running": ("pending", "waiting", "paused", "failed", "blocked", "running"),
    # a retry time or a replay suspended; a decision or a receipt; a resume; an owner taken back; a cancellation
    "pending": ("running", "waiting", "paused", "failed", "blocked", "escalated"),
    **{status: ("running",) for status in ("waiting", "paused", "failed", "blocked", *FINAL_STATUSES)},
}
# None: no row yet. A step's output is recorded once, by whichever attempt commits first.
STEP_MOVES = {
    "running": (None, "running", "retrying", "failed"),  # an attempt starts (again, after a crash)
    "failed": ("running", "retrying", "failed"),
    "retrying": ("failed",),  # the failure's retry schedule, in the failure's own transaction
    "complete": (None, "running", "retrying", "failed"),  # None: recorded whole (a patch decision, an outbox step)
}

# Claimable: pending, or waiting or paused until a time that has come; a wait or a pause for a person has no run
# time (NULL), so never. One parameter: now.
DUE = f"({one_of('status', ('pending', 'waiting', 'paused'))}) AND next_run_at <= ?"
# The seq of the workflow ?1's last history event: what a row's *_after column records.
_SEQ = "(SELECT COALESCE(MAX(seq), 0) FROM history WHERE workflow_id = ?1)"


def leaves(table: dict, to: str) -> str:
    """SQL true where the row's status may change to ``to``: ``(status = 'a' OR status = 'b' ...)``."""
    return f"({one_of('status', tuple(s for s in table[to] if s is not None))})"


def create_workflow(conn: sqlite3.Connection, workflow_id: str, kind: str, input_json: str, retry_budget: int,
                    version: str | None, created_by: int | None = None, origin: str | None = None) -> bool:
    """A new workflow, *pending*; False (nothing written) if the id exists."""
    return bool(write(conn, "INSERT INTO workflows (id, kind, input, status, retry_budget, version, origin, created_at,"
                      " created_by, updated_at) VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                      (workflow_id, kind, input_json, retry_budget, version, origin, now(), created_by, now())))


def move(conn: sqlite3.Connection, workflow_id: str, to: str, columns: dict[str, Any] | None = None,
         expressions: str = "", returning: str = "id", stay: bool = False) -> sqlite3.Row | None:
    """Status ``to``, with ``columns`` and SQL ``expressions`` set, if ``WORKFLOW_MOVES`` allows it (``stay``: or if
    already ``to``); the ``returning`` columns, or None (nothing written) for a missing row or an unlisted move."""
    if to not in WORKFLOW_MOVES:
        raise ValueError(f"no workflow status {to!r}: one of {sorted(WORKFLOW_MOVES)}")
    columns = {"updated_at": now(), **(columns or {})}
    sets = "".join(f", {name} = ?" for name in columns) + (f", {expressions}" if expressions else "")
    allowed = leaves(WORKFLOW_MOVES, to)[:-1] + (f" OR status = '{to}')" if stay else ")")
    return conn.execute(f"UPDATE workflows SET status = '{to}'{sets} WHERE id = ? AND {allowed} RETURNING {returning}",
                        (*columns.values(), workflow_id)).fetchone()


def wake(conn: sqlite3.Connection, workflow_id: str) -> bool:
    """A *waiting* workflow becomes *pending*, due now (a decision, a receipt); any other is left as it is."""
    return bool(conn.execute("UPDATE workflows SET status = 'pending', next_run_at = ?, updated_at = ?"
                             " WHERE id = ? AND status = 'waiting'", (now(), now(), workflow_id)).rowcount)


def request_cancel(conn: sqlite3.Connection, workflow_id: str, request_json: str, running: bool) -> None:
    """Record the cancellation; a workflow not *running* becomes *pending*, due now, so a worker compensates it."""
    if running:
        conn.execute("UPDATE workflows SET cancel_requested = ?, updated_at = ? WHERE id = ?",
                     (request_json, now(), workflow_id))
    else:
        move(conn, workflow_id, "pending", {"cancel_requested": request_json, "next_run_at": now()}, stay=True)


def bring_due(conn: sqlite3.Connection, workflow_id: str, at: float) -> None:
    """Every retry schedule of the workflow, and its run time, comes forward to ``at`` (the crash lab's fast clock)."""
    conn.execute("UPDATE steps SET next_attempt_at = ? WHERE workflow_id = ? AND next_attempt_at IS NOT NULL",
                 (at, workflow_id))
    conn.execute("UPDATE workflows SET next_run_at = ? WHERE id = ? AND next_run_at > ?", (at, workflow_id, at))


# A lease: the new token and the count of complete steps come back. GRANT_IF_DUE also needs it due (one more
# parameter: now). Appended to a replay's last write, LET_GO gives the lease up in that same commit.
GRANT = (f"UPDATE workflows SET status = 'running', owner = ?, lease_expires_at = {DB_NOW} + ?,"
         f" fencing_token = fencing_token + 1, updated_at = ? WHERE id = ? AND {leaves(WORKFLOW_MOVES, 'running')}"
         " RETURNING fencing_token, (SELECT COUNT(*) FROM steps WHERE workflow_id = id AND status = 'complete')"
         " AS completed")
GRANT_IF_DUE = GRANT.replace(" RETURNING", f" AND {DUE} RETURNING")
LET_GO = "owner = NULL, lease_expires_at = NULL"


def grant(conn: sqlite3.Connection, workflow_id: str, owner: str, seconds: float, only_if_due: bool):
    """A new lease: status *running*, a new token; its row (token, completed steps), or None if not granted."""
    args = (owner, seconds, now(), workflow_id) + ((now(),) if only_if_due else ())
    return conn.execute(GRANT_IF_DUE if only_if_due else GRANT, args).fetchone()


def renew(conn: sqlite3.Connection, workflow_id: str, token: int, seconds: float) -> bool:
    """The lease's expiry ``seconds`` past now, if ``token`` is current and the lease has not expired."""
    return bool(conn.execute(f"UPDATE workflows SET lease_expires_at = {DB_NOW} + ? WHERE id = ? AND fencing_token = ?"
                             f" AND lease_expires_at >= {DB_NOW}", (seconds, workflow_id, token)).rowcount)


def let_go(conn: sqlite3.Connection, workflow_id: str, token: int | None = None) -> None:
    """Give the lease up (only ``token``'s, if given); the status says what happens next."""
    conn.execute(f"UPDATE workflows SET {LET_GO} WHERE id = ? AND (? IS NULL OR fencing_token = ?)",
                 (workflow_id, token, token))


def take_back(conn: sqlite3.Connection, workflow_id: str) -> bool:
    """A *running* workflow whose owner is gone becomes *pending*, unowned, under a new token (fencing the old)."""
    return bool(conn.execute("UPDATE workflows SET status = 'pending', owner = NULL, lease_expires_at = NULL,"
                             " fencing_token = fencing_token + 1, updated_at = ? WHERE id = ? AND status = 'running'",
                             (now(), workflow_id)).rowcount)


# A completed replay's last write: output and status, if running; COMPLETE also needs token ?5 current and no
# cancellation asked, and gives the lease up in the same statement.
RECORD_COMPLETION = (
    "UPDATE workflows SET status = 'complete', output = ?2, error = NULL, updated_at = ?3, completed_at = ?3,"
    f"   completed_by = ?4, completed_after = {_SEQ}")
COMPLETE = (f"{RECORD_COMPLETION}, {LET_GO} WHERE id = ?1 AND {leaves(WORKFLOW_MOVES, 'complete')}"
            " AND fencing_token = ?5 AND cancel_requested IS NULL")
COMPLETE_IN_TRANSACTION = f"{RECORD_COMPLETION} WHERE id = ?1 AND {leaves(WORKFLOW_MOVES, 'complete')}"


def delete_workflow(conn: sqlite3.Connection, workflow_id: str) -> dict[str, int]:
    """Inside the caller's transaction: every row of the workflow, in every table; how many went, per table."""
    tables = [r[0] for r in conn.execute("SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) c"
                                         " WHERE m.type = 'table' AND c.name = 'workflow_id' ORDER BY m.name")]
    return {table: conn.execute(f"DELETE FROM {table} WHERE {'id' if table == 'workflows' else 'workflow_id'} = ?",
                                (workflow_id,)).rowcount for table in (*tables, "workflows")}


# A step's first attempt as one statement: its *running* row, only if the replay still holds a live lease (?9;
# NULL: unleased), nobody asked to cancel, no fault is armed at all ({none_armed}: the boundary hook's SQL; rare:
# then the transaction path runs) and no row exists yet.
_NEW_ATTEMPT = ("INSERT INTO steps (workflow_id, name, status, input, attempts, repair_message, position, versions,"
                "   started_at, started_by, started_after)")
START_FIRST_ATTEMPT = (
    f"{_NEW_ATTEMPT} SELECT id, ?2, 'running', ?3, 1, ?4, ?5, ?6, ?7, ?8,   {_SEQ}"
    " FROM workflows WHERE id = ?1 AND cancel_requested IS NULL"
    f"   AND (?9 IS NULL OR (fencing_token = ?9 AND lease_expires_at >= {DB_NOW}))"
    "   AND {none_armed} ON CONFLICT (workflow_id, name) DO NOTHING")


@lru_cache(maxsize=None)
def start_first_attempt(none_armed: str) -> str:
    """``START_FIRST_ATTEMPT`` with the hook's ``none_armed``: one string, so SQLite's statement cache keeps it."""
    return START_FIRST_ATTEMPT.format(none_armed=none_armed)


# Any attempt, inside the caller's transaction: the row, or one more attempt on it; its attempt count comes back.
START_ATTEMPT = (
    f"{_NEW_ATTEMPT} VALUES (?1, ?2, 'running', ?3, 1, ?4, ?5, ?6, ?7, ?8,   {_SEQ})"
    " ON CONFLICT (workflow_id, name) DO UPDATE SET status = 'running', input = excluded.input,"
    "   attempts = attempts + 1, error = NULL, next_attempt_at = NULL,"
    f"   repair_message = excluded.repair_message, versions = excluded.versions WHERE {leaves(STEP_MOVES, 'running')}"
    " RETURNING attempts")

# A step's output as one statement: recorded only if none is yet and the replay's token (?6) is still current.
COMMIT_OUTPUT = (
    "UPDATE steps SET status = 'complete', output = ?3, completed_at = ?4, completed_by = ?5,"
    f"   completed_after = {_SEQ}"
    f" WHERE workflow_id = ?1 AND name = ?2 AND {leaves(STEP_MOVES, 'complete')}"
    "   AND (?6 IS NULL OR EXISTS (SELECT 1 FROM workflows WHERE id = ?1 AND fencing_token = ?6))")


def start_attempt(conn: sqlite3.Connection, workflow_id: str, name: str, input_json: str,
                  repair_message: str | None, position: int, versions_json: str | None, pid: int) -> int | None:
    """Inside the caller's transaction: the step *running*, its attempt counted; the count, or None if complete."""
    row = conn.execute(START_ATTEMPT, (workflow_id, name, input_json, repair_message, position, versions_json, now(),
                                       pid)).fetchone()
    return None if row is None else row["attempts"]


def record_step(conn: sqlite3.Connection, workflow_id: str, name: str, input_json: str | None, output_json: str,
                position: int | None, only_if_new: bool = True) -> bool:
    """A step recorded whole, *complete*, in one attempt; with ``only_if_new``, False if it exists (nothing written)."""
    conflict = " ON CONFLICT (workflow_id, name) DO NOTHING" if only_if_new else ""
    return bool(conn.execute(
        "INSERT INTO steps (workflow_id, name, status, input, output, attempts, position, started_at, completed_at)"
        f" VALUES (?, ?, 'complete', ?, ?, 1, ?, ?, ?){conflict}",
        (workflow_id, name, input_json, output_json, position, now(), now())).rowcount)


def fail_step(conn: sqlite3.Connection, workflow_id: str, name: str, detail: str) -> bool:
    """The step's attempt failed, with ``detail``; False (nothing written) if the step is complete."""
    return bool(conn.execute(f"UPDATE steps SET status = 'failed', error = ? WHERE workflow_id = ? AND name = ?"
                             f" AND {leaves(STEP_MOVES, 'failed')}", (detail, workflow_id, name)).rowcount)


def schedule_step(conn: sqlite3.Connection, workflow_id: str, name: str, run_at: float) -> bool:
    """The failed step's next attempt at ``run_at``: status *retrying*."""
    return bool(conn.execute(f"UPDATE steps SET status = 'retrying', next_attempt_at = ? WHERE workflow_id = ?"
                             f" AND name = ? AND {leaves(STEP_MOVES, 'retrying')}", (run_at, workflow_id, name)).rowcount)


def copy_steps(conn: sqlite3.Connection, from_id: str, to_id: str, position: int, completed_at: float) -> int:
    """Inside a fork's transaction: ``from_id``'s completed steps up to ``position``, and the patch decisions
    taken before it, as ``to_id``'s (none of their attempts counted); how many steps were copied."""
    copied = conn.execute(
        "INSERT INTO steps (workflow_id, name, status, input, output, attempts, position, versions, started_at,"
        " completed_at) SELECT ?, name, status, input, output, 0, position, versions, started_at, completed_at"
        " FROM steps WHERE workflow_id = ? AND status = 'complete' AND position IS NOT NULL AND position <= ?",
        (to_id, from_id, position)).rowcount
    # Patch decisions taken before the fork point (one recorded before their input said where: by time).
    conn.execute(
        "INSERT INTO steps (workflow_id, name, status, input, output, attempts, started_at, completed_at)"
        " SELECT ?, name, status, input, output, 0, started_at, completed_at FROM steps"
        " WHERE workflow_id = ? AND status = 'complete' AND position IS NULL AND name LIKE 'patched:%'"
        "   AND COALESCE(json_extract(input, '$.after_position') < ?, completed_at <= ?)",
        (to_id, from_id, position, completed_at))
    return copied
