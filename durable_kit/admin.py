"""A feature on the engine: what a person reads and does by hand. A journal read only, waits, resume, purge.

A resume makes a workflow that no worker takes up by itself runnable again;
its next replay reuses every completed step. A purge deletes a finished
workflow's rows and rewrites the file, so their bytes are gone from it too.
Both are read-then-write in one ``BEGIN IMMEDIATE``, and both refuse a
status they do not apply to, changing nothing.
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from .core import state
from .core.journal import Journal
from .core.store import (SchemaMismatch, StorageFault, append_event, check_version, default_busy_timeout_ms,
                         from_json, immediate, now, refuse_folder, refuse_missing_or_empty)
from .decisions import describe, event_name, utc
from .errors import WorkflowError, check_text, describe_storage_fault

def read_only(path: str | Path) -> Journal:
    """An existing journal opened only to read it: no file, schema or WAL mode is created, no lock taken.

    Refused with one line naming the path and what to do (``StorageFault``): a missing, empty, damaged or
    folder path, an SQLite file that is not a journal; another schema version raises ``SchemaMismatch``. A
    journal in a folder this process cannot write, with no write-ahead log beside it, is read as it stands.
    """
    path = Path(path)
    timeout = default_busy_timeout_ms() / 1000
    refuse_folder(path)
    refuse_missing_or_empty(path)
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    log = Path(f"{path}-wal")
    if not os.access(path.parent, os.W_OK) and not (log.exists() and log.stat().st_size > 0):
        uri += "&immutable=1"  # SQLite cannot create its shared-memory file here, and nothing waits in a log
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=timeout)
    conn.row_factory = sqlite3.Row
    try:
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"schema_version", "workflows"} <= tables:
                raise StorageFault(f"{path} is an SQLite file but not a durable_kit journal (it has no workflows "
                                   "table); nothing was changed. Point --db at a journal, or create one with `start`.")
            row = conn.execute("SELECT version FROM schema_version").fetchone()
        except sqlite3.DatabaseError as error:
            raise StorageFault(describe_storage_fault(error, path)) from None
        check_version(row, path)
    except (StorageFault, SchemaMismatch):
        conn.close()
        raise
    return Journal(path, conn=conn)


RESUMABLE = ("paused", "failed", "blocked", "escalated")  # no worker takes these up by itself


def resume(journal: Journal, workflow_id: str, by: str) -> dict:
    """Make a *paused*, *failed*, *blocked* or *escalated* workflow pending again; return its row.

    The next replay reuses every completed step and retries the rest (a blocked one blocks again unless the
    new code replays its history; an escalated step gets one more attempt). The history records from which
    status and by whom (``workflow_resumed``). Any other status is refused and nothing changes.
    """
    if not check_text(by, "who resumes it", f"workflow {workflow_id!r}").strip():
        raise WorkflowError(f"workflow {workflow_id!r}: say who resumes it (a name); nothing was changed.")
    with immediate(journal.conn):
        row = journal.row_for_update(workflow_id)
        if row["status"] not in RESUMABLE:
            raise WorkflowError(
                f"workflow {workflow_id!r} is {row['status']!r}, not paused, failed, blocked or escalated; nothing "
                "was changed. Only those are resumed by hand: the others resume by themselves, or are finished.")
        state.move(journal.conn, workflow_id, "pending", {"next_run_at": now()})
        append_event(journal.conn, workflow_id, None, "workflow_resumed", f"from {row['status']} by {by}")
    return journal.workflow(workflow_id)


def purge(journal: Journal, workflow_id: str) -> dict[str, int]:
    """Delete every row of one finished workflow, then rewrite the file; how many rows went, per table.

    Deleted rows leave their bytes in the file's free pages and the write-ahead log, so purge then truncates
    the log and runs VACUUM. It cannot reach copies elsewhere: backups, the ledger, the destinations' files.
    Only a workflow in a final status is purged; any other is refused and nothing changes.
    """
    with immediate(journal.conn):
        row = journal.row_for_update(workflow_id)
        if row["status"] not in state.FINAL_STATUSES:
            raise WorkflowError(f"workflow {workflow_id!r} is {row['status']!r}, not finished; only a finished "
                                "workflow can be purged. Cancel it first. Nothing was changed.")
        counts = state.delete_workflow(journal.conn, workflow_id)
    journal.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    journal.conn.execute("VACUUM")
    return counts


def waits(journal: Journal, workflow_id: str) -> list[dict]:
    """The workflow's waits, oldest first, request and decision decoded."""
    rows = journal.conn.execute("SELECT * FROM waits WHERE workflow_id = ? ORDER BY created_at, name", (workflow_id,))
    return [{**dict(r), "request": from_json(r["request"]), "decision": from_json(r["decision"])} for r in rows]


def open_wait(journal: Journal, workflow_id: str) -> dict | None:
    """What the workflow waits for now (its open wait), or None."""
    return next((w for w in waits(journal, workflow_id) if w["status"] == "waiting"), None)


def named_wait(journal: Journal, workflow_id: str, name: str) -> dict | None:
    """One wait of the workflow by name, request and decision decoded; None if it was not reached yet."""
    return next((w for w in waits(journal, workflow_id) if w["name"] == name), None)


def describe_outcome(workflow_id: str, result: dict) -> str:
    """One line for a person: what was saved, or that an earlier identical decision stands and nothing was saved."""
    decided = {k: v for k, v in result.items() if k not in ("wait", "saved", "decided_at")}
    if result["saved"]:
        return f"{workflow_id}, wait {result['wait']!r}: saved: {describe(decided)}"
    return (f"{workflow_id}, wait {result['wait']!r}: already {event_name(decided)} by {decided['by']} "
            f"at {utc(result['decided_at'])}; nothing saved")
