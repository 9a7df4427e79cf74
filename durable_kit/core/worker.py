"""The engine: the worker. It claims workflows that are due, replays them, and lets go.

A worker holds a workflow only while replaying it. At a retry schedule or a
wait the replay stops (the time, or what it waits for, is in the database)
and the worker moves on: nobody sleeps through a backoff or a person's lunch.
Any worker, started at any time, sees the same schedule.

Claiming a workflow grants a lease (``leases.py``, notebook 06): any number of
workers can share one database, and a workflow whose owner died is taken back
once its lease expires, or at once if its owner's process is gone from this
machine. ``leases=False`` is the unsafe worker of notebooks 03 to 05's
assumption (one worker per database): at start it takes back *every*
running workflow, and it writes without a fencing token.

A storage fault (the database locked past its timeout, busy, full, read-only,
an I/O error) is not a workflow's failure: the worker says so in one line,
backs off, and tries again; the workflow it was running keeps its journal and
is taken back once its lease expires. A worker started while another process
holds the write lock waits in the same way. A fault that waiting cannot
clear (read-only, damaged, full or past a file-size limit: anything but locked
or busy) ends ``--once`` and ``--until-idle`` with that fault's message and a
non-zero exit status; a worker without either keeps trying, saying the cause.
"""
from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

from ..errors import WorkflowError, passes_by_waiting
from .journal import WORKFLOWS, Journal, run_workflow
from .leases import LEASE_SECONDS, Lease, grant, new_owner, revoke_abandoned
from .state import DUE
from .store import describe_storage_fault, immediate, now


STORAGE_BACKOFF_CAP = 5.0  # seconds between tries while the database keeps failing

# Work a pass does before the replays, each ``chore(journal, log) -> how much it did``: the outbox's dispatch
# registers itself here (``effects.py``).
PASS_CHORES: list = []


def due_workflows(journal: Journal) -> list[str]:
    """Ids of workflows whose time has come and whose kind this process can run, soonest first.

    Due means *pending* (new, resumed by a decision, or at a retry time) or
    *waiting* on a timer that has ended. A workflow waiting for a person has
    no run time (NULL), so it is never due: no worker is held for it.
    A workflow of a kind no imported module registered is left for a worker that knows it.
    """
    rows = journal.conn.execute(
        f"SELECT id, kind FROM workflows WHERE {DUE} ORDER BY next_run_at, id", (now(),))
    return [r["id"] for r in rows if r["kind"] in WORKFLOWS]


def claim_next(journal: Journal, owner: str, lease_seconds: float = LEASE_SECONDS,
               skip: set[str] = frozenset()) -> Lease | None:
    """Atomically take the soonest due workflow this process can run (not in ``skip``); None if none is.

    Choosing and claiming happen in one transaction, so workers sharing a
    database never queue up on claims that another worker already won.
    """
    kinds, skipped = sorted(WORKFLOWS), sorted(skip)
    # Unsynced, like every grant: the token is synced before it leaves (Workflow.fencing_token).
    with journal.relaxed() as conn, immediate(conn):
        row = conn.execute(
            f"SELECT id FROM workflows WHERE {DUE}"
            f" AND kind IN ({', '.join('?' * len(kinds))}) AND id NOT IN ({', '.join('?' * len(skipped))})"
            " ORDER BY next_run_at, id LIMIT 1", (now(), *kinds, *skipped)).fetchone()
        return None if row is None else grant(conn, row["id"], owner, lease_seconds)


def run_due(journal: Journal, log=print, owner: str | None = None, lease_seconds: float = LEASE_SECONDS,
            leases: bool = True, trust_pids: bool = True, told: set[str] | None = None) -> int:
    """One pass: its chores (the outbox is sent), take back abandoned workflows, run each due workflow once; how much was done.

    A due workflow of a kind no module registered here is left for a worker
    that knows it, and said so once per id in ``told``.
    """
    owner = owner or new_owner()
    told = set() if told is None else told
    for row in journal.conn.execute(f"SELECT id, kind FROM workflows WHERE {DUE} ORDER BY id", (now(),)).fetchall():
        if row["kind"] not in WORKFLOWS and row["id"] not in told:
            told.add(row["id"])
            log(f"{row['id']}: its kind {row['kind']!r} is registered by no module in this worker; left pending "
                "for a worker that knows it (pass --module FILE)")
    done = sum(chore(journal, log) for chore in PASS_CHORES)
    if leases:
        for workflow_id, _ in revoke_abandoned(journal.conn, trust_pids=trust_pids):
            log(f"{workflow_id}: recovered")
    ran: set[str] = set()
    while (lease := claim_next(journal, owner, lease_seconds, ran)) is not None:
        workflow_id = lease.workflow_id
        ran.add(workflow_id)  # once per pass, even if it is due again at once
        done += 1
        try:
            run_workflow(journal, workflow_id, lease, fenced=leases)
        except WorkflowError as error:
            log(f"{workflow_id}: {error}")
        except sqlite3.Error:  # a storage fault, not the workflow's: run_worker backs off
            raise
        except Exception as error:  # the workflow is marked failed; the worker goes on
            log(f"{workflow_id}: failed: {type(error).__name__}: {error}")
        row = journal.workflow(workflow_id)
        if leases and row["fencing_token"] != lease.token:
            log(f"{workflow_id}: lease lost to token {row['fencing_token']}; this worker stopped working on it")
        elif leases and row["status"] == "running":  # its replay stopped without a write that says why: LeaseLost
            log(f"{workflow_id}: lease lost (it expired before the heartbeat could renew it); this worker stopped "
                "working on it")
        else:
            log(f"{workflow_id}: {row['status']}")
    return done


def run_worker(db_path: str | Path, *, once: bool = False, until_idle: bool = False, poll: float = 0.2,
               lease_seconds: float = LEASE_SECONDS, leases: bool = True, trust_pids: bool = True,
               log=print) -> int:
    """Run due workflows until SIGTERM (or after one pass, or once nothing is due); return how many runs.

    A locked or busy database is waited for, with backoff, and said so, at
    the start too. Any other storage fault is raised (``sqlite3.Error``)
    with ``once`` or ``until_idle``; without them the worker keeps trying.
    """
    journal = _open(db_path, poll, log)
    owner = new_owner()
    if not leases:
        for workflow_id, _ in revoke_abandoned(journal.conn, assume_dead=True):
            log(f"{workflow_id}: recovered")
    stopping = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    runs, faults_in_a_row, told = 0, 0, set()
    try:
        while not stopping:
            try:
                ran = run_due(journal, log, owner, lease_seconds, leases, trust_pids, told)
                faults_in_a_row = 0
            except sqlite3.Error as error:
                if (once or until_idle) and not passes_by_waiting(error):
                    raise  # waiting cannot clear it: the command ends with its message
                faults_in_a_row += 1
                log(_fault_line(db_path, error, _backoff(poll, faults_in_a_row)))
                if once:
                    break
                time.sleep(_backoff(poll, faults_in_a_row))
                continue
            runs += ran
            if once or (until_idle and ran == 0):
                break
            if ran == 0:
                time.sleep(poll)
    finally:
        signal.signal(signal.SIGTERM, previous)
        journal.close()
    log("worker stopped" + (" (SIGTERM)" if stopping else ""))
    return runs


def _open(db_path: str | Path, poll: float, log) -> Journal:
    """The journal, once it opens: a lock another process holds is waited for, with backoff, and said so."""
    faults_in_a_row = 0
    while True:
        try:
            return Journal(db_path, create=not Path(db_path).exists())  # never re-initialise an empty file
        except sqlite3.Error as error:
            if not passes_by_waiting(error):
                raise
            faults_in_a_row += 1
            log(_fault_line(db_path, error, _backoff(poll, faults_in_a_row)))
            time.sleep(_backoff(poll, faults_in_a_row))


def _backoff(poll: float, faults_in_a_row: int) -> float:
    return min(STORAGE_BACKOFF_CAP, poll * 2 ** faults_in_a_row)


def _fault_line(db_path: str | Path, error: sqlite3.Error, wait: float) -> str:
    if passes_by_waiting(error):
        return f"storage fault in {Path(db_path).name}: {error}; nothing was lost, trying again in {wait:.1f} s"
    return f"storage fault: {describe_storage_fault(error, db_path)} Trying again in {wait:.1f} s."
