"""The engine's storage: one SQLite file that everything else stands on.

One connection per process (never carried across a fork), WAL journal, ``synchronous=FULL`` unless asked
otherwise, a busy timeout, and ``BEGIN IMMEDIATE`` around every read-then-write. Values cross into the
database as strict JSON with secrets redacted: never pickle.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..errors import SettingError, describe_json_problem, folder_message
from ..redact import Unredactable, redact, redact_value, secrets_in_json

SCHEMA_VERSION = 8
SYNCHRONOUS_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")


def one_of(column: str, values: tuple[str, ...]) -> str:
    """SQL ``column = 'a' OR column = 'b' ...``: SQLite 3.40 builds a temporary table for an IN list on every run."""
    return " OR ".join(f"{column} = '{value}'" for value in values)


SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS workflows (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    input        TEXT NOT NULL,
    -- Each CHECK is written out with OR, not as status IN (...): SQLite 3.40 builds a temporary table
    -- for an IN list every time a statement runs, and here that would be every write of the row.
    status       TEXT NOT NULL CHECK (status = 'pending' OR status = 'running' OR status = 'waiting'
                     OR status = 'paused' OR status = 'complete' OR status = 'failed' OR status = 'escalated'
                     OR status = 'stopped' OR status = 'rejected' OR status = 'blocked' OR status = 'cancelled'),
    output       TEXT,
    error        TEXT,
    next_run_at  REAL DEFAULT 0,  -- may run from this time on (NULL: waits for a person)
    retry_budget INTEGER NOT NULL DEFAULT 10,  -- retries allowed across all its steps
    retries_used INTEGER NOT NULL DEFAULT 0,
    owner        TEXT,  -- the process holding the lease (host:pid:nonce), while one does
    lease_expires_at REAL,  -- by the database's clock (DB_NOW)
    fencing_token INTEGER NOT NULL DEFAULT 0,  -- grows with every lease granted
    version      TEXT,  -- the code version it started under (given, or a hash of the workflow's source)
    cancel_requested TEXT,  -- JSON {by, reason}: stop at the next step boundary and compensate
    origin       TEXT,  -- JSON {workflow, up_to}: the workflow it was forked from
    created_at   REAL NOT NULL,
    created_by   INTEGER,  -- the process that started it (NULL for a fork, whose history says so)
    -- When it completed, by which process, after which history event (the timeline view reads them here)
    completed_at    REAL,
    completed_by    INTEGER,
    completed_after INTEGER,
    updated_at   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
    workflow_id     TEXT NOT NULL REFERENCES workflows (id),
    name            TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status = 'running' OR status = 'complete' OR status = 'failed'
                        OR status = 'retrying'),
    input           TEXT,
    output          TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    error           TEXT,
    next_attempt_at REAL,  -- a retrying step does not run before this time
    repair_message  TEXT,  -- the validation message a repair answers (a retry repeats the repair, not the request)
    position        INTEGER,  -- its place in the workflow's order of steps and waits, checked on every replay
    versions        TEXT,  -- JSON: prompt, model, policy or source versions the step ran under
    -- Its first attempt and its output, each written by one statement with the row: when, by which process,
    -- and after which history event (seq). The timeline view reads them from here, so the history table
    -- keeps no copy. The by columns are NULL in a row no attempt wrote (a fork's copy, an outbox intent,
    -- a patch decision).
    started_at      REAL,
    started_by      INTEGER,
    started_after   INTEGER,
    completed_at    REAL,
    completed_by    INTEGER,
    completed_after INTEGER,
    PRIMARY KEY (workflow_id, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS escalations (
    workflow_id TEXT NOT NULL REFERENCES workflows (id),
    step        TEXT NOT NULL,
    reason      TEXT NOT NULL,
    attempts    TEXT NOT NULL,  -- JSON: every attempt's error, oldest first
    created_at  REAL NOT NULL,
    PRIMARY KEY (workflow_id, step)
);
CREATE TABLE IF NOT EXISTS waits (
    workflow_id TEXT NOT NULL REFERENCES workflows (id),
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind = 'approval' OR kind = 'clarification' OR kind = 'timer'
                    OR kind = 'delivery'),
    request     TEXT,  -- JSON: what a person is shown (a recommendation and its evidence, a question)
    status      TEXT NOT NULL CHECK (status = 'waiting' OR status = 'resolved'),
    decision    TEXT,  -- JSON: the approval, rejection, answer or receipt, saved before the workflow may run on
    wake_at     REAL,  -- a timer's end or a decision's deadline, computed once when the workflow first reached it
    created_at  REAL NOT NULL,
    resolved_at REAL,
    position    INTEGER,  -- its place in the workflow's order of steps and waits, checked on every replay
    PRIMARY KEY (workflow_id, name)
) WITHOUT ROWID;
-- Events that no row records: replays, reuse, later attempts, failures, waits, decisions, faults, leases.
CREATE TABLE IF NOT EXISTS history (
    workflow_id TEXT NOT NULL,
    seq         INTEGER NOT NULL,  -- 1, 2, 3, ... within the workflow
    step        TEXT,
    event       TEXT NOT NULL,
    detail      TEXT,
    pid         INTEGER NOT NULL,
    at          REAL NOT NULL,
    PRIMARY KEY (workflow_id, seq)
) WITHOUT ROWID;
-- A workflow's whole story, oldest first by (after, derived, at): the history table's events, and the events
-- the rows already say (a workflow started, a step's first attempt started, a step completed, the workflow
-- completed), each placed after the history event that was last when it was written.
CREATE VIEW IF NOT EXISTS timeline (workflow_id, after, derived, at, pid, step, event, detail) AS
    SELECT workflow_id, seq, 0, at, pid, step, event, detail FROM history
    UNION ALL
    SELECT id, 0, 1, created_at, created_by, NULL, 'workflow_created',
           kind || CASE WHEN version IS NULL THEN '' ELSE ' (version ' || version || ')' END
      FROM workflows WHERE created_by IS NOT NULL
    UNION ALL
    SELECT workflow_id, started_after, 1, started_at, started_by, name, 'step_started', 'attempt 1'
      FROM steps WHERE started_by IS NOT NULL
    UNION ALL
    SELECT workflow_id, completed_after, 1, completed_at, completed_by, name, 'step_completed', NULL
      FROM steps WHERE completed_by IS NOT NULL
    UNION ALL
    SELECT id, completed_after, 1, completed_at, completed_by, NULL, 'workflow_completed', NULL
      FROM workflows WHERE completed_by IS NOT NULL;
"""


# Seconds since 1970, computed by SQL: one clock for every lease, whichever process on this machine asks.
DB_NOW = "((julianday('now') - 2440587.5) * 86400.0)"


class SchemaMismatch(RuntimeError):
    """The database was written by a different schema version of durable_kit."""


class StorageFault(RuntimeError):
    """The database file cannot be used as it is (missing, empty, damaged, not a journal); nothing was written."""


class NotJSON(TypeError):
    """A value could not be stored as JSON; nothing was written."""


BUSY_TIMEOUT_MS_MAX = 86_400_000  # one day


def default_busy_timeout_ms() -> int:
    """How long a statement waits for a write lock: ``$DURABLE_KIT_BUSY_TIMEOUT_MS``, else 5000.

    Anything but a whole number of milliseconds from 0 to one day raises ``SettingError``; nothing is opened."""
    value = os.environ.get("DURABLE_KIT_BUSY_TIMEOUT_MS", "5000")
    if not (value.isascii() and value.isdigit()) or int(value) > BUSY_TIMEOUT_MS_MAX:
        raise SettingError(f"DURABLE_KIT_BUSY_TIMEOUT_MS must be a whole number of milliseconds from 0 to "
                           f"{BUSY_TIMEOUT_MS_MAX} (for example 5000), not {value!r}; nothing was opened. "
                           "Set it so, or unset it for the default (5000).")
    return int(value)


def connect(path: str | Path, synchronous: str = "FULL", busy_timeout_ms: int | None = None,
            create: bool = True) -> sqlite3.Connection:
    """Open a journal in WAL mode, creating it and its schema if ``create``; commits are durable per ``synchronous``.

    ``NORMAL`` may lose the last commits on power loss, not on a crash. ``create=False`` refuses a missing or
    empty file (``StorageFault``) instead of making it a new, empty journal.
    """
    level = synchronous.upper()
    if level not in SYNCHRONOUS_LEVELS:
        raise ValueError(f"synchronous must be one of {SYNCHRONOUS_LEVELS}, not {synchronous!r}")
    timeout = default_busy_timeout_ms() if busy_timeout_ms is None else busy_timeout_ms
    refuse_folder(Path(path))
    if not create:
        refuse_missing_or_empty(Path(path))
    # isolation_level=None: we issue BEGIN ourselves, so every transaction is visible in the code.
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=timeout / 1000)
    conn.row_factory = sqlite3.Row
    for pragma in (f"busy_timeout = {int(timeout)}", "journal_mode = WAL", f"synchronous = {level}",
                   "foreign_keys = ON"):
        conn.execute(f"PRAGMA {pragma}")
    _ensure_schema(conn, path)
    return conn


# The tables a feature keeps beside the engine's (``effects.py``: the outbox, reserved keys), created with them.
FEATURE_TABLES: list[str] = []


def _schema() -> str:
    return SCHEMA + "".join(FEATURE_TABLES)


def _ensure_schema(conn: sqlite3.Connection, path: str | Path) -> None:
    # An existing journal is checked by reading only, so opening it never waits for another process's write lock.
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' OR type = 'view'")}
    if set(re.findall(r"CREATE (?:TABLE|VIEW) IF NOT EXISTS (\w+)", _schema())) <= names:
        return check_version(conn.execute("SELECT version FROM schema_version").fetchone(), path)
    with immediate(conn):
        for statement in filter(str.strip, _schema().split(";")):
            conn.execute(statement)
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        if row is None:
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        else:
            check_version(row, path)


def check_version(row, path: str | Path) -> None:
    if row is None or row["version"] != SCHEMA_VERSION:
        raise SchemaMismatch(
            f"{path} has schema version {row and row['version']}, this durable_kit expects {SCHEMA_VERSION}: "
            "use a new database file, or the durable_kit version that wrote it.")


def refuse_folder(path: Path) -> None:
    """Refuse (``StorageFault``) a folder given as the journal's file."""
    if path.is_dir():
        raise StorageFault(folder_message(path))


def refuse_missing_or_empty(path: Path) -> None:
    """Refuse (``StorageFault``) a missing or empty file: it would become a new, empty journal."""
    if not path.exists():
        raise StorageFault(f"{path}: no such journal; nothing was created. Check the path, "
                           "or create a journal with `start`.")
    if path.stat().st_size == 0:
        raise StorageFault(f"{path} is empty (0 bytes), not a journal; nothing was changed. If records of the "
                           "ledger or a destination beside it matter, restore the journal from a copy; otherwise "
                           "delete the empty file and `start` again.")


def files_of(path: str | Path) -> tuple:
    """The identity (device, inode) of the journal's file and of its write-ahead log; None for one that is missing."""
    found = []
    for name in (str(path), f"{path}-wal"):
        try:
            stat = os.stat(name)
            found.append((stat.st_dev, stat.st_ino))
        except FileNotFoundError:
            found.append(None)
    return tuple(found)


BEGIN_ATTEMPTS = 4


def write(conn: sqlite3.Connection, sql: str, parameters: tuple = ()) -> int:
    """Run one write statement; how many rows it changed. Outside BEGIN it is a transaction of its own.

    SQLite write-locks before its WHERE reads, as in ``immediate``; a lock still busy after the busy timeout is
    tried again, up to ``BEGIN_ATTEMPTS`` times in all."""
    for attempt in range(1, BEGIN_ATTEMPTS + 1):
        try:
            return conn.execute(sql, parameters).rowcount
        except sqlite3.OperationalError as error:  # nothing was written: the statement rolled back
            if "locked" not in str(error) or attempt == BEGIN_ATTEMPTS:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """The block as one ``BEGIN IMMEDIATE`` transaction (write-locked before its first read): all commits, or none.

    A BEGIN still locked after the busy timeout is tried again, up to ``BEGIN_ATTEMPTS`` times in all."""
    write(conn, "BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


_ENCODE = json.JSONEncoder(allow_nan=False, sort_keys=True, separators=(",", ":")).encode
MAX_DEPTH = 200  # levels of lists and objects a stored value may have: every process can read it back


def to_json(value: Any, workflow_id: str, step: str | None, what: str,
            outcome: str = "Nothing was written.") -> str:
    """Encode ``value`` as strict JSON with secrets redacted, or raise ``NotJSON`` naming the workflow and step."""
    return encode(value, workflow_id, step, what, outcome)[0]


def encode(value: Any, workflow_id: str, step: str | None, what: str,
           outcome: str = "Nothing was written.") -> tuple[str, Any]:
    """``to_json``, and that JSON decoded again: what every later read of the stored value returns.

    Secrets are redacted in the decoded value, string by string and key by key, never across two strings.
    ``NotJSON``: not strict JSON, nested deeper than ``MAX_DEPTH``, a string with a lone surrogate, or keys that
    redaction would merge.
    """
    if value is None:
        return "null", None
    advice = ("Use only dict, list, str, int, float (finite), bool and None; "
              "convert other values (for example a datetime to an ISO string) first.")
    try:
        text = _ENCODE(value)
        problem = too_deep(text)
        if problem is None:
            decoded = json.loads(text)
    except RecursionError:  # the encoder's own limit, below which every value is refused here anyway
        problem = f"it is nested deeper than {MAX_DEPTH} levels"
    except (TypeError, ValueError) as exc:  # not JSON, NaN or infinite, a circular reference
        problem = describe_json_problem(value, MAX_DEPTH) or str(exc)
    else:
        # json.dumps turns int, float, bool and None keys into strings: a value not equal once decoded is walked.
        if problem is None and decoded != value:
            problem = describe_json_problem(value, MAX_DEPTH)
        if problem is None and "\\ud" in text:  # a character outside the BMP, or a lone surrogate: not text
            problem = lone_surrogate(decoded)
            if problem:
                advice = "Give text in UTF-8 (a lone surrogate is usually a byte that was not UTF-8)."
        if problem is None:
            entries = secrets_in_json(text)
            if not entries:  # the usual case: a quick look at the text finds no secret's mark
                return text, decoded
            try:
                cleaned = redact_value(decoded, entries)
            except Unredactable as unsafe:
                raise NotJSON(f"{_where(workflow_id, step)}: the {what} cannot be stored safely: {unsafe}. Keep "
                              f"secrets out of keys (put them in values), then try again. {outcome}") from None
            return (text, decoded) if cleaned is decoded else (_ENCODE(cleaned), cleaned)
    if problem.startswith("it is nested"):
        advice = f"Use a flatter value (at most {MAX_DEPTH} levels of lists and objects)."
    raise NotJSON(f"{_where(workflow_id, step)}: the {what} cannot be stored as JSON ({problem}). {advice} {outcome}")


def lone_surrogate(value: Any) -> str | None:
    """Where a decoded JSON value holds a lone surrogate (no file or terminal can hold one), or None."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        return f"it holds a lone surrogate, {error.object[error.start]!r}"
    return None


def _where(workflow_id: str, step: str | None) -> str:
    return f"workflow {workflow_id!r}" + (f", step {step!r}" if step else "")


_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # a string (skipped whole), or a bracket


def too_deep(text: str) -> str | None:
    """Why ``text`` (JSON) is nested too deep to store, or None; a value with few brackets is not even walked."""
    if len(text) <= 2 * MAX_DEPTH or text.count("[") + text.count("{") <= MAX_DEPTH:
        return None
    depth = 0
    for token in _STRUCTURE.finditer(text):
        mark = token.group()
        if mark in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return f"it is nested deeper than {MAX_DEPTH} levels"
        elif mark in "]}":
            depth -= 1
    return None


# The next seq as a scalar subquery: an INSERT ... SELECT from its own table would copy the row to a temporary table.
APPEND_EVENT = (
    "INSERT INTO history (workflow_id, seq, step, event, detail, pid, at)"
    " VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM history WHERE workflow_id = ?1), ?2, ?3, ?4, ?5, ?6)"
)


def append_event(conn: sqlite3.Connection, workflow_id: str, step: str | None, event: str,
                 detail: str | None = None) -> None:
    """Append one event to the workflow's history, its detail redacted; the caller's transaction commits it."""
    conn.execute(APPEND_EVENT, (workflow_id, step, event, redact(detail), os.getpid(), now()))


def from_json(text: str | None) -> Any:
    """Decode a stored JSON value (``None`` stays ``None``)."""
    return None if text is None else json.loads(text)


# Named points where a crash can be chosen (``next_step``, ``after_commit:<step>``...): the core calls ``boundary``
# there. The harness (``durable_kit.harness.faults``) installs what happens and keeps the table of armed points:
# ``armed`` gives those of some points armed now, ``none_armed`` is SQL true while no point is, ``every`` true asks
# for every point, ``sender`` names the (workflow, action) whose send is under way on this thread, for the outside
# world's books. NO_HOOK: what the core does without one.
NO_HOOK: dict[str, Any] = {"trip": lambda conn, point, workflow_id: None, "every": lambda: False,
                           "armed": lambda conn, points: set(), "none_armed": "1", "sender": lambda: None}
BOUNDARY_HOOK: dict[str, Any] = dict(NO_HOOK)


def boundary(conn: sqlite3.Connection, point: str, workflow_id: str) -> None:
    """Reach the named boundary ``point``: what the installed hook does there (nothing without one)."""
    BOUNDARY_HOOK["trip"](conn, point, workflow_id)


def every_boundary() -> bool:
    """True while the installed hook wants every boundary reached, not only the armed ones."""
    return BOUNDARY_HOOK["every"]()


_last_now = 0.0


def now() -> float:
    """Wall-clock seconds, never the same twice in one process; for people to read, never used to replay."""
    global _last_now
    _last_now = max(time.time(), _last_now + 1e-6)  # two events of one process never tie in the timeline
    return _last_now
