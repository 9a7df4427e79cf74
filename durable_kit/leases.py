"""Floor 7: one owner at a time. Leases, heartbeats and fencing tokens.

A process owns a workflow through a lease: its name as owner, an expiry by
one clock (``DB_NOW``, computed by SQL inside ``BEGIN IMMEDIATE``: with SQLite
that is this machine's clock, which every process sharing the file agrees on;
a database server would offer its own), and a fencing token that grows with
every lease granted. While it replays, a heartbeat renews the lease about
every third of its length.

A lease alone is not enough. A process that pauses (a SIGSTOP, a long garbage
collection, a laptop lid) can wake after its lease expired and another owner
took over, and it does not know. So every journal write carries the token and
checks it in the same transaction: a stale owner's write is refused
(``LeaseLost``) and it stops working on that workflow. What a stale owner did
*outside* the journal (a call it was making when it paused) is not undone;
a destination can refuse it only if it is sent the token too.

An owner that died is noticed two ways: its lease expires, or, on the same
machine, its process no longer exists (``owner_is_gone``), which lets a
restarted worker take over at once instead of waiting out the lease.
"""
from __future__ import annotations

import os
import socket
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from .store import DB_NOW, append_event, immediate, now

LEASE_SECONDS = 10.0

# When a workflow may be claimed: pending (new, decided, or at its retry time) or waiting on a timer that
# has ended. A wait for a person has no run time (NULL), so it never matches. One parameter: now.
DUE = "status IN ('pending', 'waiting') AND next_run_at <= ?"


class LeaseLost(BaseException):
    """This process's lease on a workflow was granted to another owner; nothing was written.

    A BaseException, so workflow code catching ``Exception`` lets it pass.
    """


@dataclass(frozen=True)
class Lease:
    """The right to write one workflow's journal, while ``token`` is the workflow's current token."""

    workflow_id: str
    owner: str
    token: int
    seconds: float


def new_owner() -> str:
    """A name for this process as a lease owner: ``host:pid:nonce``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def owner_is_gone(owner: str | None) -> bool:
    """True if ``owner`` was a process on this machine that no longer exists."""
    if not owner or owner.count(":") < 2:
        return False
    host, pid, _ = owner.rsplit(":", 2)
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, under another user
        return False
    return _is_zombie(int(pid))


def _is_zombie(pid: int) -> bool:
    # A killed process whose parent has not collected it yet still has a pid: it is dead all the same.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (macOS), or it just went away
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def grant(conn: sqlite3.Connection, workflow_id: str, owner: str, seconds: float = LEASE_SECONDS,
          only_if_due: bool = True) -> Lease | None:
    """Grant ``owner`` a lease on the workflow and mark it *running*; None if it is not due.

    ``only_if_due=False`` takes the workflow whatever its status (a person's
    ``run`` command): the new token fences out any current owner.
    """
    with immediate(conn):
        return grant_in_transaction(conn, workflow_id, owner, seconds, only_if_due)


def grant_in_transaction(conn: sqlite3.Connection, workflow_id: str, owner: str, seconds: float,
                         only_if_due: bool = True) -> Lease | None:
    """``grant``, inside the caller's ``BEGIN IMMEDIATE`` transaction."""
    sql = (f"UPDATE workflows SET status = 'running', owner = ?, lease_expires_at = {DB_NOW} + ?,"
           " fencing_token = fencing_token + 1, updated_at = ? WHERE id = ?")
    args = [owner, seconds, now(), workflow_id]
    if only_if_due:
        sql, args = f"{sql} AND {DUE}", args + [now()]
    row = conn.execute(sql + " RETURNING fencing_token", args).fetchone()
    return None if row is None else Lease(workflow_id, owner, row["fencing_token"], seconds)


def check(conn: sqlite3.Connection, lease: Lease) -> None:
    """Inside a write transaction: raise ``LeaseLost`` unless ``lease`` still holds the current token."""
    row = conn.execute("SELECT fencing_token FROM workflows WHERE id = ?", (lease.workflow_id,)).fetchone()
    if row["fencing_token"] != lease.token:
        raise LeaseLost(
            f"workflow {lease.workflow_id!r}: this process's lease (token {lease.token}) was superseded by token "
            f"{row['fencing_token']}; the write was refused and nothing changed.")


def renew(conn: sqlite3.Connection, lease: Lease) -> bool:
    """Push the lease's expiry ``lease.seconds`` past now; False if the lease was lost."""
    with immediate(conn):
        renewed = conn.execute(
            f"UPDATE workflows SET lease_expires_at = {DB_NOW} + ? WHERE id = ? AND fencing_token = ?",
            (lease.seconds, lease.workflow_id, lease.token)).rowcount
    return bool(renewed)


def release(conn: sqlite3.Connection, lease: Lease) -> None:
    """Give the lease up (the workflow's status says what happens next); a lost lease is left alone."""
    with immediate(conn):
        conn.execute("UPDATE workflows SET owner = NULL, lease_expires_at = NULL WHERE id = ? AND fencing_token = ?",
                     (lease.workflow_id, lease.token))


def revoke_abandoned(conn: sqlite3.Connection, assume_dead: bool = False,
                     trust_pids: bool = True) -> list[tuple[str, str]]:
    """Make *running* workflows whose owner is gone or whose lease expired *pending*; return (id, why) pairs.

    Revoking bumps the token, so the old owner's writes are refused from now
    on. ``trust_pids=False`` waits for the lease to expire even when the
    owner's process is visibly gone, as workers on other machines must.
    ``assume_dead=True`` takes back every running workflow: the unsafe
    single-worker assumption of notebooks 03 to 05, kept to show its failure.
    """
    select = (f"SELECT id, owner, lease_expires_at < {DB_NOW} AS expired FROM workflows"
              " WHERE status = 'running' ORDER BY id")
    if not any(_abandoned(row, assume_dead, trust_pids) for row in conn.execute(select)):
        return []  # looked without the write lock: the usual case costs no lock at all
    revoked = []
    with immediate(conn):
        for row in conn.execute(select).fetchall():  # again, under the lock
            why = _abandoned(row, assume_dead, trust_pids)
            if why is None:
                continue
            conn.execute("UPDATE workflows SET status = 'pending', owner = NULL, lease_expires_at = NULL,"
                         " fencing_token = fencing_token + 1, updated_at = ? WHERE id = ?", (now(), row["id"]))
            append_event(conn, row["id"], None, "recovered", why)
            revoked.append((row["id"], why))
    return revoked


def _abandoned(row, assume_dead: bool, trust_pids: bool) -> str | None:
    # Why a running workflow's owner no longer counts, or None if it still does.
    if assume_dead:
        return "assumed abandoned (no leases)"
    if row["owner"] is None or row["expired"]:
        return "its lease expired"
    if trust_pids and owner_is_gone(row["owner"]):
        return "its owner's process is gone"
    return None


class Heartbeat:
    """Renews a lease every ``seconds / 3`` on a thread of its own, with a connection of its own.

    ``lost`` becomes True when a renewal finds the lease gone; the next
    journal write of the old owner is refused anyway.
    """

    def __init__(self, db_path: str | Path, lease: Lease):
        self.db_path, self.lease, self.lost = Path(db_path), lease, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {lease.workflow_id}", daemon=True)

    def _beat(self) -> None:
        conn = sqlite3.connect(str(self.db_path), isolation_level=None, timeout=5)
        conn.row_factory = sqlite3.Row
        try:
            while not self._stop.wait(self.lease.seconds / 3):
                if not renew(conn, self.lease):
                    self.lost = True
                    return
        finally:
            conn.close()

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
