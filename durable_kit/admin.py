"""A feature on the engine: what a person does to a stored workflow by hand. Resume it, or purge it.

A resume makes a workflow that no worker takes up by itself runnable again;
its next replay reuses every completed step. A purge deletes a finished
workflow's rows and rewrites the file, so their bytes are gone from it too.
Both are read-then-write in one ``BEGIN IMMEDIATE``, and both refuse a
status they do not apply to, changing nothing.
"""
from __future__ import annotations

from .core import state
from .core.journal import Journal
from .core.store import append_event, immediate, now
from .errors import WorkflowError

RESUMABLE = ("paused", "failed", "blocked", "escalated")  # no worker takes these up by itself


def resume(journal: Journal, workflow_id: str, by: str) -> dict:
    """Make a *paused*, *failed*, *blocked* or *escalated* workflow pending again; return its row.

    The next replay reuses every completed step and retries the rest (a blocked one blocks again unless the
    new code replays its history; an escalated step gets one more attempt). The history records from which
    status and by whom (``workflow_resumed``). Any other status is refused and nothing changes.
    """
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
