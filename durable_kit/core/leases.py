"""The engine: one owner at a time. Leases, heartbeats and fencing tokens.

A lease is an owner, an expiry by the database's clock (``DB_NOW``: this machine's wall clock, not monotonic,
not shared with other machines: a clock step makes a lease last longer or end early, costing a late takeover
or a repeat, never a second owner) and a fencing token that grows with every grant. Every write under a lease
checks its token in the same transaction: a stale owner's write is refused (``LeaseLost``), but what it did
outside the journal is not undone. No attempt starts once the lease has expired or its heartbeat gave up. An
owner is gone once its lease expires, or at once if it ran on this machine (same boot and PID namespace) and its
process no longer exists. An attempt taken from an owner whose process lived (known only here) is not a crash.
"""
from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import LeaseHeld, LeaseLost
from ..redact import redact
from .retries import EXPIRED, TAKEN_OVER
from . import state
from .store import DB_NOW, append_event, immediate

LEASE_SECONDS = 10.0
LEASE_SECONDS_MAX = 3600.0  # an hour: an owner that died on another machine is noticed only when its lease expires
__all__ = ["LeaseHeld", "LeaseLost"]  # re-exported: they are raised here


@dataclass(frozen=True)
class Lease:
    """The right to write one workflow's journal, while ``token`` is the workflow's current token."""
    workflow_id: str
    owner: str
    token: int
    seconds: float


@lru_cache(maxsize=1)
def machine() -> str:
    """``hostname/boot:pidns``: where a process id means one process; ``hostname`` alone where that is unknown."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # no /proc (macOS, Windows): no pid shortcut, leases must expire
        return socket.gethostname()
    identity = hashlib.sha256(f"{boot}/{namespace}".encode()).hexdigest()[:10]
    return f"{socket.gethostname()}/{identity}"


def new_owner() -> str:
    """A name for this process as a lease owner: ``machine:pid:nonce`` (see ``machine``)."""
    return f"{machine()}:{os.getpid()}:{os.urandom(3).hex()}"


def owner_is_gone(owner: str | None) -> bool:
    """True if ``owner`` ran on this machine, boot and PID namespace and is gone; no other owner is judged by pid."""
    if not owner or owner.count(":") < 2:
        return False
    where, pid, _ = owner.rsplit(":", 2)
    if "/" not in where or where != machine() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, under another user
        return False
    return _is_zombie(int(pid))


def owner_is_alive(owner: str | None) -> bool:
    """True if ``owner`` ran on this machine, boot and PID namespace and its process (or a reuse of its pid) exists."""
    where, pid, _ = owner.rsplit(":", 2) if owner and owner.count(":") >= 2 else ("", "", "")
    return "/" in where and where == machine() and pid.isdigit() and not owner_is_gone(owner)


def _is_zombie(pid: int) -> bool:
    # A killed process whose parent has not collected it yet still has a pid: it is dead all the same.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:  # no /proc (macOS), or it just went away
        return False


def grant(conn: sqlite3.Connection, workflow_id: str, owner: str, seconds: float = LEASE_SECONDS,
          only_if_due: bool = True) -> Lease | None:
    """Inside the caller's ``BEGIN IMMEDIATE``: a lease for ``owner``, the workflow *running*; None if not granted.

    ``only_if_due=False``: whatever its status, fencing out any owner, but never a final one. Recorded in the
    same commit: ``replay_started``, with how many completed steps are on record."""
    row = state.grant(conn, workflow_id, owner, seconds, only_if_due)
    if row is None:
        return None
    append_event(conn, workflow_id, None, "replay_started", f"{row['completed']} completed steps on record")
    return Lease(workflow_id, owner, row["fencing_token"], seconds)


def take(conn: sqlite3.Connection, row, owner: str, take_over: bool = False,
         seconds: float = LEASE_SECONDS) -> Lease:
    """Inside the caller's ``BEGIN IMMEDIATE``: a person's ``run`` takes the workflow ``row`` (not final) for ``owner``.

    ``row``: ``id``, ``status``, ``owner``, ``fencing_token``, ``lease_left`` (seconds by ``DB_NOW``). A live owner is
    refused (``LeaseHeld``, nothing written) unless ``take_over``. An attempt of an owner that was live, or whose
    process exists here, is recorded as taken over (``note_taken_over``), not as a crash."""
    holder = row["owner"] if row["status"] == "running" else None
    live = (holder is not None and row["lease_left"] is not None and row["lease_left"] >= 0
            and not owner_is_gone(holder))
    if live and not take_over:
        raise LeaseHeld(
            f"workflow {row['id']!r} is running under owner {holder} (token {row['fencing_token']}), whose lease "
            f"expires in {row['lease_left']:.1f} s; nothing was changed. Wait for it (see `status`), or pass "
            "--take-over to fence that owner out (its attempt then counts as taken over, not as a crash).")
    lease = grant(conn, row["id"], owner, seconds, only_if_due=False)
    if holder is not None and (live or owner_is_alive(holder)):
        note_taken_over(conn, row["id"], holder, row["fencing_token"], lease.token, expired=False)
    return lease


def note_taken_over(conn: sqlite3.Connection, workflow_id: str, owner: str, token: int, new_token: int,
                    expired: bool) -> None:
    """Inside the takeover's transaction: one ``attempt_taken_over`` event per step ``owner`` was running.

    ``expired``: its lease ran out (``EXPIRED`` in the detail, which ``TAKEN_OVER_BY_STEP`` counts toward an
    activity that outran its lease); else a person's ``run --take-over`` fenced it out."""
    why = EXPIRED if expired else "a person's run took over"
    for step in conn.execute("SELECT name, attempts FROM steps WHERE workflow_id = ? AND status = 'running'",
                             (workflow_id,)).fetchall():
        append_event(conn, workflow_id, step["name"], TAKEN_OVER,
                     f"attempt {step['attempts']} (token {token}) by {owner} was running when {why} (token "
                     f"{new_token}); it is not counted as a crash")


def check_lease(conn: sqlite3.Connection, lease: Lease, live: bool = False) -> None:
    """Inside a write transaction: raise ``LeaseLost`` unless ``lease`` holds the current token (``live``: unexpired)."""
    row = conn.execute(f"SELECT fencing_token, lease_expires_at < {DB_NOW} AS expired FROM workflows WHERE id = ?",
                       (lease.workflow_id,)).fetchone()
    if row["fencing_token"] != lease.token:
        raise superseded(lease, row["fencing_token"])
    if live and row["expired"]:
        raise LeaseLost(
            f"workflow {lease.workflow_id!r}: this process's lease (token {lease.token}) expired before it was "
            "renewed; it starts no new attempt and nothing was written.")


def superseded(lease: Lease, current_token: int) -> LeaseLost:
    """The error for a write under ``lease`` after the workflow's token moved on to ``current_token``."""
    return LeaseLost(f"workflow {lease.workflow_id!r}: this process's lease (token {lease.token}) was superseded by "
                     f"token {current_token}; the write was refused and nothing changed.")


def renew(conn: sqlite3.Connection, lease: Lease) -> bool:
    """Inside the caller's transaction: the expiry ``lease.seconds`` from now; False if lost or expired (not revived)."""
    return state.renew(conn, lease.workflow_id, lease.token, lease.seconds)


def release(conn: sqlite3.Connection, lease: Lease) -> None:
    """Give the lease up (the workflow's status says what happens next); a lost lease is left alone."""
    with immediate(conn):
        state.let_go(conn, lease.workflow_id, lease.token)


def revoke_abandoned(conn: sqlite3.Connection, assume_dead: bool = False,
                     trust_pids: bool = True) -> list[tuple[str, str]]:
    """*Running* workflows whose lease expired or owner is gone become *pending*, under a new token; (id, why) pairs.

    An owner whose process exists here has its attempts recorded as taken over. ``trust_pids=False`` waits for
    expiry even for a vanished process; ``assume_dead=True`` takes every one back (unsafe, notebooks 03 to 05)."""
    select = (f"SELECT id, owner, fencing_token, lease_expires_at < {DB_NOW} AS expired FROM workflows"
              " WHERE status = 'running' ORDER BY id")
    if not any(_abandoned(row, assume_dead, trust_pids) for row in conn.execute(select)):
        return []  # looked without the write lock: the usual case costs no lock at all
    revoked = []
    with immediate(conn):
        for row in conn.execute(select).fetchall():  # again, under the lock
            if (why := _abandoned(row, assume_dead, trust_pids)) is None:
                continue
            state.take_back(conn, row["id"])
            append_event(conn, row["id"], None, "recovered", why)
            if not assume_dead and trust_pids and owner_is_alive(row["owner"]):  # paused past its lease, not dead
                note_taken_over(conn, row["id"], row["owner"], row["fencing_token"], row["fencing_token"] + 1,
                                expired=True)
            revoked.append((row["id"], why))
    return revoked


def _abandoned(row, assume_dead: bool, trust_pids: bool) -> str | None:
    # Why a running workflow's owner no longer counts, or None if it still does.
    if assume_dead:
        return "assumed abandoned (no leases)"
    if row["owner"] is None or row["expired"]:
        return "its lease expired"
    return "its owner's process is gone" if trust_pids and owner_is_gone(row["owner"]) else None


class Heartbeat:
    """Keeps one lease alive while its replay runs: ``with Heartbeat(db_path, lease) as heartbeat:``.

    One thread per process renews each lease every third of its length; a failed renewal (said on stderr unless
    a storage error) is tried at the next beat, and any exception the thread meets is said on stderr and survived:
    it goes on renewing (a thread that ends anyway is replaced by the next heartbeat). ``gave_up``: a renewal
    found the lease lost or expired."""

    def __init__(self, db_path: str | Path, lease: Lease):
        self.db_path, self.lease, self.gave_up = str(db_path), lease, False
        self.due_at = 0.0  # monotonic time of the next renewal

    def __enter__(self) -> "Heartbeat":
        self.due_at = time.monotonic() + self.lease.seconds / 3
        _renewer().add(self)
        return self

    def __exit__(self, *exc) -> None:
        _renewer().discard(self)


class _Renewer:
    """The one thread of a process that renews its leases (``Heartbeat``)."""

    IDLE_LOOK = 1.0  # seconds between looks when no renewal is due sooner

    def __init__(self, beating: set[Heartbeat] | None = None):
        self.pid, self.beating, self.wake = os.getpid(), beating or set(), threading.Condition()
        self.looks_at = 0.0  # monotonic time of the thread's next look by itself; 0 while it is looking
        self.thread = threading.Thread(target=self._run, name="lease renewals", daemon=True)
        self.thread.start()

    def add(self, heartbeat: Heartbeat) -> None:
        with self.wake:  # a short replay adds and discards its heartbeat without ever waking the thread
            self.beating.add(heartbeat)
            if heartbeat.due_at < self.looks_at:  # due before the thread's next look
                self.wake.notify()

    def discard(self, heartbeat: Heartbeat) -> None:
        with self.wake:  # a journal's connection left without a lease is closed at the thread's next look
            self.beating.discard(heartbeat)

    def _run(self) -> None:
        conns: dict[str, sqlite3.Connection] = {}
        while True:
            try:
                due = self._next_due(conns)
                for path in {h.db_path for h in due}:
                    self._renew_all(conns, path, [h for h in due if h.db_path == path])
            except Exception as error:  # never let the thread die: say so, look again a little later
                self._say(f"lease renewals: {type(error).__name__}: {error}; the renewer goes on")
                with self.wake:  # soon enough for the shortest lease to be renewed in time
                    pause = min([self.IDLE_LOOK, *(h.lease.seconds / 6 for h in self.beating)])
                time.sleep(pause)

    def _next_due(self, conns: dict[str, sqlite3.Connection]) -> list[Heartbeat]:
        # Sleeps until some heartbeat is due; closes the connections of journals left without a lease.
        with self.wake:
            while True:
                for path in list(conns.keys() - {h.db_path for h in self.beating}):
                    conns.pop(path).close()
                if due := [h for h in self.beating if h.due_at <= time.monotonic()]:
                    self.looks_at = 0.0
                    return due
                self.looks_at = min([time.monotonic() + self.IDLE_LOOK, *(h.due_at for h in self.beating)])
                self.wake.wait(max(0.0, self.looks_at - time.monotonic()))

    def _renew_all(self, conns: dict[str, sqlite3.Connection], path: str, due: list[Heartbeat]) -> None:
        shortest = min(h.lease.seconds for h in due) / 3
        try:
            if path not in conns:
                conns[path] = sqlite3.connect(path, isolation_level=None, timeout=shortest)
            with immediate(conns[path]):
                renewed = [renew(conns[path], h.lease) for h in due]
        except Exception as error:  # busy, locked, a storage fault, or a bug: try again at the next beat
            if not isinstance(error, sqlite3.Error):  # nothing is printed for the storage's own faults
                self._say(f"lease renewals in {Path(path).name}: {type(error).__name__}: {error}; the renewer goes "
                          "on and tries these leases again at the next beat")
            renewed = [True] * len(due)  # not lost: tried again at the next beat
        for heartbeat, ok in zip(due, renewed):
            heartbeat.due_at = time.monotonic() + heartbeat.lease.seconds / 3
            if not ok:
                heartbeat.gave_up = True
                self.discard(heartbeat)

    @staticmethod
    def _say(message: str) -> None:
        try:
            print(redact(message), file=sys.stderr, flush=True)
        except Exception:  # no stderr to write to: renewing matters more than saying so
            pass


_RENEWER: _Renewer | None = None
_RENEWER_LOCK = threading.Lock()


def _renewer() -> _Renewer:
    # One per process: a fork's child inherits the object, not its thread. A thread that ended anyway (it never
    # should) is replaced, and the new one renews the heartbeats it had.
    global _RENEWER
    with _RENEWER_LOCK:
        if _RENEWER is None or _RENEWER.pid != os.getpid():
            _RENEWER = _Renewer()
        elif not _RENEWER.thread.is_alive():
            _RENEWER = _Renewer(_RENEWER.beating)
        return _RENEWER
