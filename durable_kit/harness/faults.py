"""The harness: named crash points, armed in the database, fired in a real process.

A fault is armed by one process (a notebook, a test, the command line) and
fired by another when its code reaches the named boundary. Firing removes the
fault in the same transaction that records it, so it fires at most once. A
fault armed for one workflow (``arm(..., workflow_id=...)``) fires only in
that workflow; one armed for none (``*``) fires in whichever reaches it first.

The journal checks, for every step, ``after_activity:<step>``,
``after_commit:<step>`` and ``next_step`` (just before the activity runs, for
whichever step comes next). Every send to the outside world checks
``before_send:<action>`` and ``after_send:<action>`` (``effects.send_guarded``);
agents may name their own points.

Tracing: when the environment variable ``DURABLE_KIT_TRACE`` names a file,
every ``trip`` appends one JSON line ``{"point": ..., "workflow_id": ...}`` to
it, armed or not, so a clean run lists the boundaries a crash can hit
(``durable_kit.harness.crashlab`` reads it). Code that only checks points it knows
are armed should ask ``tracing()`` first and trip every point while it is true.

Who sends: ``trip`` at ``before_send:<action>`` remembers the workflow and
the action on that thread, and any other point there forgets them; the
hook's ``sender`` answers the fake outside world (``durable_kit.world.sender``),
so the fakes' rows say which workflow's action sent them.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from contextvars import ContextVar
from pathlib import Path

from ..core.retries import Transient
from ..core.store import BOUNDARY_HOOK, FEATURE_TABLES, append_event, connect, immediate

CRASH_EXIT_CODE = 13
ACTIONS = ("exit", "kill", "fail", "delay", "stop")
TRACE_VARIABLE = "DURABLE_KIT_TRACE"
ANY_WORKFLOW = "*"
SENDING = "before_send:"  # the point every send by the kit's effect helpers passes first

# The armed points, in the journal beside the engine's tables (created with them, once this module is imported).
FEATURE_TABLES.append(f"""
CREATE TABLE IF NOT EXISTS faults (
    point       TEXT NOT NULL,
    action      TEXT NOT NULL CHECK (action IN ({", ".join(map(repr, ACTIONS))})),
    seconds     REAL NOT NULL DEFAULT 0,  -- how long 'delay' sleeps
    workflow_id TEXT NOT NULL DEFAULT '{ANY_WORKFLOW}',  -- the one workflow it fires in ('*': the first to reach it)
    PRIMARY KEY (point, workflow_id)
);
""")
NONE_ARMED = "NOT EXISTS (SELECT 1 FROM faults)"  # SQL: no point at all is armed
_SENDER: ContextVar[tuple[str, str] | None] = ContextVar("durable_kit_sender", default=None)  # per thread


class InjectedFailure(Transient):
    """Raised at a boundary armed with ``fail``: a transient error, not a crash, so a retry policy retries it."""


def arm(db: sqlite3.Connection | str | Path, point: str, action: str = "exit", seconds: float = 0,
        workflow_id: str | None = None) -> None:
    """Arm ``point`` in the journal ``db`` (a connection to it, or its path): the next process to reach it ends
    (``exit``/``kill``), raises (``fail``), sleeps (``delay``) or stops itself (``stop``: SIGSTOP, until another
    process sends SIGCONT). With ``workflow_id`` only that workflow's code fires it; without, the first to reach
    it does. Armed again, a point replaces its earlier action for the same workflow."""
    if action not in ACTIONS:
        raise ValueError(f"fault action must be one of {ACTIONS}, not {action!r}")
    conn = db if isinstance(db, sqlite3.Connection) else connect(db)
    try:
        with immediate(conn):
            conn.execute("INSERT OR REPLACE INTO faults (point, action, seconds, workflow_id) VALUES (?, ?, ?, ?)",
                         (point, action, seconds, ANY_WORKFLOW if workflow_id is None else workflow_id))
    except sqlite3.IntegrityError:  # a journal made before 'stop' existed keeps its older CHECK
        raise ValueError(f"this journal was made before the fault action {action!r} existed, so it cannot arm "
                         f"{point!r} with it; nothing was armed: start a new journal") from None
    finally:
        if conn is not db:
            conn.close()


def disarm_all(conn: sqlite3.Connection) -> list[str]:
    """Remove every armed fault; return the points that never fired (each once, whatever its workflows)."""
    with immediate(conn):
        left = [row["point"] for row in conn.execute("SELECT DISTINCT point FROM faults ORDER BY point")]
        conn.execute("DELETE FROM faults")
    return left


def sender() -> tuple[str, str] | None:
    """(workflow, action) of the send under way on this thread: the last ``before_send:`` reached, until another
    point is."""
    return _SENDER.get()


def tracing() -> bool:
    """True when ``$DURABLE_KIT_TRACE`` names a file: every ``trip`` then appends its point to it."""
    return bool(os.environ.get(TRACE_VARIABLE))


def _trace(point: str, workflow_id: str) -> None:
    # One short line per write in append mode: lines from one process stay whole, in the order reached.
    line = json.dumps({"point": point, "workflow_id": workflow_id}) + "\n"
    with open(os.environ[TRACE_VARIABLE], "a", encoding="utf-8") as trace:
        trace.write(line)


def armed(conn: sqlite3.Connection, points: tuple[str, ...]) -> set[str]:
    """Those of ``points`` armed now for any workflow, read in the caller's transaction (``trip`` picks the one)."""
    marks = ", ".join("?" * len(points))
    return {row["point"] for row in conn.execute(f"SELECT point FROM faults WHERE point IN ({marks})", points)}


# The fault ``trip`` fires: the one armed for this workflow, else one armed for any.
ARMED_HERE = ("SELECT action, seconds, workflow_id FROM faults WHERE point = ?1 AND (workflow_id = ?2"
              f" OR workflow_id = '{ANY_WORKFLOW}') ORDER BY workflow_id = '{ANY_WORKFLOW}' LIMIT 1")


def trip(conn: sqlite3.Connection, point: str, workflow_id: str) -> None:
    """If ``point`` is armed for this workflow (or any), record it in the history and act; otherwise return.

    While ``tracing()``, the point is first appended to the trace file (before
    the armed check, so a crash at it is traced too). The ``sender`` is set
    before either: the workflow and the action at ``before_send:<action>``,
    none at any other point.

    ``exit`` ends the process with ``os._exit(CRASH_EXIT_CODE)``: no cleanup,
    no flush, no ``finally``. ``kill`` sends SIGKILL to this process (POSIX).
    ``delay`` sleeps, then returns; ``stop`` sends SIGSTOP to this process and
    returns once it is continued (SIGCONT), as a paused owner would; ``fail``
    raises ``InjectedFailure``.
    """
    _SENDER.set((workflow_id, point[len(SENDING):]) if point.startswith(SENDING) else None)
    if tracing():
        _trace(point, workflow_id)
    if conn.execute(ARMED_HERE, (point, workflow_id)).fetchone() is None:
        return
    with immediate(conn):
        row = conn.execute(ARMED_HERE, (point, workflow_id)).fetchone()
        if row is None:  # another process fired it between our two reads
            return
        action = row["action"]
        conn.execute("DELETE FROM faults WHERE point = ? AND workflow_id = ?", (point, row["workflow_id"]))
        append_event(conn, workflow_id, None, "fault_fired", f"{point} ({action})")
    if action == "exit":
        os._exit(CRASH_EXIT_CODE)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "delay":
        time.sleep(row["seconds"])
        return
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    raise InjectedFailure(f"injected failure at {point!r} in workflow {workflow_id!r}")


# Every process that imports the kit fires armed faults at the core's boundaries (``store.boundary``).
BOUNDARY_HOOK.update(trip=trip, every=tracing, armed=armed, none_armed=NONE_ARMED, sender=sender)
