"""Floor 4: the worker. It claims workflows that are due, replays them, and lets go.

A worker holds a workflow only while replaying it. At a retry schedule the
replay stops (the time is in the database) and the worker moves on: nobody
sleeps through a backoff. Any worker, started at any time, sees the same
schedule.

Until notebook 06 adds leases, run **one worker per database**: at start it
takes back every workflow left *running*, assuming whoever ran it is dead.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path

from .effects import dispatch_outbox
from .journal import WORKFLOWS, Journal, WorkflowError, run_workflow
from .store import append_event, immediate, now


def recover_abandoned(journal: Journal) -> list[str]:
    """Make every workflow left *running* pending again; return their ids. One worker per database."""
    with immediate(journal.conn):
        ids = [r["id"] for r in journal.conn.execute("SELECT id FROM workflows WHERE status = 'running' ORDER BY id")]
        for workflow_id in ids:
            journal.conn.execute("UPDATE workflows SET status = 'pending', updated_at = ? WHERE id = ?",
                                 (now(), workflow_id))
            append_event(journal.conn, workflow_id, None, "recovered", "left running by a worker that stopped")
    return ids


def due_workflows(journal: Journal) -> list[str]:
    """Ids of workflows whose time has come and whose kind this process can run, soonest first.

    Due means *pending* (new, resumed by a decision, or at a retry time) or
    *waiting* on a timer that has ended. A workflow waiting for a person has
    no run time (NULL), so it is never due: no worker is held for it.

    A workflow of a kind no imported module registered is left pending for a
    worker that knows it.
    """
    rows = journal.conn.execute(
        "SELECT id, kind FROM workflows WHERE status IN ('pending', 'waiting') AND next_run_at <= ?"
        " ORDER BY next_run_at, id",
        (now(),))
    return [r["id"] for r in rows if r["kind"] in WORKFLOWS]


def claim(journal: Journal, workflow_id: str) -> bool:
    """Atomically move one due workflow to *running*; False if it is no longer due."""
    with immediate(journal.conn):
        claimed = journal.conn.execute(
            "UPDATE workflows SET status = 'running', updated_at = ? "
            "WHERE id = ? AND status IN ('pending', 'waiting') AND next_run_at <= ?",
            (now(), workflow_id, now())).rowcount
    return bool(claimed)


def run_due(journal: Journal, log=print) -> int:
    """One pass: send the outbox, run every workflow due at the start of the pass once; return how much was done."""
    ran = dispatch_outbox(journal, log)
    for workflow_id in due_workflows(journal):
        if not claim(journal, workflow_id):
            continue
        ran += 1
        try:
            run_workflow(journal, workflow_id)
        except WorkflowError as error:
            log(f"{workflow_id}: {error}")
        except Exception as error:  # the workflow is marked failed; the worker goes on
            log(f"{workflow_id}: failed: {type(error).__name__}: {error}")
        log(f"{workflow_id}: {journal.workflow(workflow_id)['status']}")
    return ran


def run_worker(db_path: str | Path, *, once: bool = False, until_idle: bool = False,
               poll: float = 0.2, log=print) -> int:
    """Run due workflows until SIGTERM (or after one pass, or once nothing is due); return how many runs."""
    journal = Journal(db_path)
    for workflow_id in recover_abandoned(journal):
        log(f"{workflow_id}: recovered")
    stopping = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    runs = 0
    try:
        while not stopping:
            ran = run_due(journal, log)
            runs += ran
            if once or (until_idle and ran == 0):
                break
            if ran == 0:
                time.sleep(poll)
    finally:
        signal.signal(signal.SIGTERM, previous)
    log("worker stopped" + (" (SIGTERM)" if stopping else ""))
    return runs

