"""The engine: the worker. It claims workflows that are due, replays them, and lets go.

A worker holds a workflow, under a lease, only while replaying it: a retry or a wait ends the replay (the time,
or what it waits for, is in the database). ``leases=False`` is the unsafe single worker of notebooks 03 to 05:
at start it takes back every running workflow, and it writes without a token. A storage fault is not the
workflow's failure: the worker says so in one line, backs off and tries again, at the start too; only
``--once`` and ``--until-idle`` end, non-zero, on one that waiting cannot clear (anything but locked or busy).
Every worker stops, whatever its mode, once it finds the journal's file or its write-ahead log removed or
replaced behind its back: its writes would go where no other process reads them.
"""
from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

from ..errors import (SettingError, WorkflowError, describe_storage_fault, files_changed, files_changed_message,
                      passes_by_waiting)
from .journal import WORKFLOWS, Journal, run_workflow
from .leases import LEASE_SECONDS, LEASE_SECONDS_MAX, Lease, grant, new_owner, revoke_abandoned
from .state import DUE
from .store import StorageFault, append_event, immediate, now

STORAGE_BACKOFF_CAP = 5.0  # seconds between tries while the database keeps failing
# Work a pass does before the replays, each ``chore(journal, log) -> how much it did`` (the outbox's dispatch).
PASS_CHORES: list = []


def due_workflows(journal: Journal) -> list[str]:
    """Ids of due workflows (``state.DUE``) of a kind this process can run, soonest first."""
    rows = journal.conn.execute(f"SELECT id, kind FROM workflows WHERE {DUE} ORDER BY next_run_at, id", (now(),))
    return [r["id"] for r in rows if r["kind"] in WORKFLOWS]


def claim_next(journal: Journal, owner: str, lease_seconds: float = LEASE_SECONDS,
               skip: set[str] | frozenset[str] = frozenset()) -> Lease | None:
    """Choose and take the soonest due workflow this process can run (not in ``skip``), in one transaction; or None."""
    kinds, skipped = sorted(WORKFLOWS), sorted(skip)
    with journal.relaxed() as conn, immediate(conn):  # unsynced, like every grant (Workflow.fencing_token syncs)
        row = conn.execute(
            f"SELECT id, status FROM workflows WHERE {DUE}"
            f" AND kind IN ({', '.join('?' * len(kinds))}) AND id NOT IN ({', '.join('?' * len(skipped))})"
            " ORDER BY next_run_at, id LIMIT 1", (now(), *kinds, *skipped)).fetchone()
        if row is None:
            return None
        if row["status"] == "paused":  # a pause until a time that has come: resumed, and said so
            append_event(conn, row["id"], None, "workflow_resumed", "from paused by a worker: the pause's time came")
        return grant(conn, row["id"], owner, lease_seconds)


def run_due(journal: Journal, log=print, owner: str | None = None, lease_seconds: float = LEASE_SECONDS,
            leases: bool = True, trust_pids: bool = True, told: set[str] | None = None) -> int:
    """One pass: the chores, abandoned workflows taken back, each due workflow run once; how much was done.

    A due workflow of a kind no module here registered is left, and said so once per id in ``told``."""
    owner = owner or new_owner()
    told = set() if told is None else told
    refuse_changed_files(journal)
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
    while True:
        refuse_changed_files(journal)  # before each claim: a long pass notices too
        lease = claim_next(journal, owner, lease_seconds, ran)
        if lease is None:
            break
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


class FilesChanged(StorageFault):
    """The journal's file or its write-ahead log was removed or replaced since this process opened it."""


def refuse_changed_files(journal: Journal) -> None:
    """Raise ``FilesChanged`` if the journal's files were removed or replaced since this worker opened them."""
    changed = journal.files_changed()
    if changed:
        raise FilesChanged(files_changed_message(journal.path, changed))


def run_worker(db_path: str | Path, *, once: bool = False, until_idle: bool = False, poll: float = 0.2,
               lease_seconds: float = LEASE_SECONDS, leases: bool = True, trust_pids: bool = True,
               log=print) -> int:
    """Run due workflows until SIGTERM (or after one pass, or once nothing is due); return how many runs.

    A locked or busy database is waited for, with backoff, at the start too. Any other storage fault is raised
    (``sqlite3.Error``) with ``once`` or ``until_idle``; without them the worker keeps trying, except where the
    journal's file or its write-ahead log was removed or replaced behind its back: that is always raised
    (``FilesChanged``, or ``sqlite3.Error`` where SQLite found it first)."""
    for value, name, low, high in ((lease_seconds, "lease_seconds", 0.0, LEASE_SECONDS_MAX), (poll, "poll", 0.0, 3600.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
            raise SettingError(f"run_worker: {name} must be a number of seconds above {low:g} and at most {high:g}, "
                               f"not {value!r}; nothing was run.")
    journal = _open(db_path, poll, log)
    owner = new_owner()
    if not leases:
        for workflow_id, _ in revoke_abandoned(journal.conn, assume_dead=True):
            log(f"{workflow_id}: recovered")
    stopping = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    runs, faults, told = 0, 0, set()  # faults: storage faults in a row
    try:
        while not stopping:
            try:
                ran = run_due(journal, log, owner, lease_seconds, leases, trust_pids, told)
                faults = 0
            except sqlite3.Error as error:
                if (once or until_idle) and not passes_by_waiting(error) or files_changed(error, db_path):
                    raise  # waiting cannot clear it: the command ends with its message
                faults += 1
                wait = _say_fault(db_path, error, poll, faults, log)
                if once:
                    break
                time.sleep(wait)
                continue
            runs += ran
            if once or (until_idle and ran == 0):
                break
            if ran == 0:
                time.sleep(poll)
    except FilesChanged:  # its log may be a file no other process reads: it must never be checkpointed into theirs
        if hasattr(journal.conn, "setconfig") and hasattr(sqlite3, "SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE"):
            journal.conn.setconfig(sqlite3.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, True)  # Python 3.12 and later
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        journal.close()
    log("worker stopped" + (" (SIGTERM)" if stopping else ""))
    return runs


def _open(db_path: str | Path, poll: float, log) -> Journal:
    """The journal, once it opens: a lock another process holds is waited for, with backoff, and said so."""
    faults = 0
    while True:
        try:
            return Journal(db_path, create=not Path(db_path).exists())  # never re-initialise an empty file
        except sqlite3.Error as error:
            if not passes_by_waiting(error):
                raise
            faults += 1
            time.sleep(_say_fault(db_path, error, poll, faults, log))


def _say_fault(db_path: str | Path, error: sqlite3.Error, poll: float, faults: int, log) -> float:
    """Say the storage fault in one line; the seconds to wait before trying again (doubling, capped)."""
    wait = min(STORAGE_BACKOFF_CAP, poll * 2 ** faults)
    log(f"storage fault in {Path(db_path).name}: {error}; nothing was lost, trying again in {wait:.1f} s"
        if passes_by_waiting(error) else
        f"storage fault: {describe_storage_fault(error, db_path)} Trying again in {wait:.1f} s.")
    return wait
