"""The engine in one file: durable workflows on SQLite, the ideas of notebooks 02, 03, 04 and 06. Read it top-down.

It imports only the standard library and speaks the kit's names and parameters for what it covers (``workflow``,
``Journal``, ``Workflow.execute_step``, ``approve``, ``run_worker``...): a workflow written for the kit runs here
once its import says ``durable_kit.mini``; ``python -m durable_kit.workshop.lab.mini_worker`` runs a worker. The
parts the exercises write (``run_step``, ``after_failure``, ``decide_wait``, ``fenced``) are looked up when called.

What it promises: every workflow, step and wait has a durable identity; an activity runs at least once; a committed
output is never replaced; a replay that meets another step or wait than the journal recorded there, or a completed
step with another input, blocks the workflow; a failure commits with its retry time; a crash loop escalates; a wait
holds no process; a decision is final; each write of a replay checks its lease's token in that same transaction.

What the full kit (``core/`` and the features beside it) adds, and why: fast paths (one-statement writes, a sync
only where a replay could not redo a write, takeover once an owner's process is gone), as every commit costs;
storage faults said in one line that loses nothing, as disks fill and files lock; redaction, as a journal keeps
what it is given; side-effect strategies (keys, reservations, an outbox, reconciliation), as a repeated activity
repeats its effect; change and time (versions, patches, cancellation, forks, deadlines), as code changes under
running workflows; and what an agent loop needs (failure classes with repair, a retry budget, takeovers not counted
as crashes, parallel steps, pauses, questions, a history).
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

SCHEMA = """CREATE TABLE IF NOT EXISTS workflows (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, input TEXT NOT NULL, output TEXT, error TEXT,
    status TEXT NOT NULL,  -- pending, running, waiting, complete, failed, escalated or blocked
    next_run_at REAL,  -- a worker may run it from this time on; NULL: it waits for a person
    owner TEXT, lease_expires_at REAL, fencing_token INTEGER NOT NULL DEFAULT 0);  -- the lease
CREATE TABLE IF NOT EXISTS steps (  -- a step, or a wait (approval, timer): a row whose output a person or time writes
    workflow_id TEXT NOT NULL REFERENCES workflows (id), name TEXT NOT NULL, kind TEXT NOT NULL,
    position INTEGER NOT NULL,  -- its place among the workflow's steps and waits, checked on every replay
    status TEXT NOT NULL,  -- running, retrying, failed or complete; a wait: waiting or complete
    input TEXT, output TEXT, attempts INTEGER NOT NULL DEFAULT 0, error TEXT,
    next_attempt_at REAL,  -- a retrying step's next try; a timer's end
    PRIMARY KEY (workflow_id, name));"""
FINAL = ("complete", "failed", "escalated", "blocked")  # no worker runs these again
LEASE_SECONDS = 10.0
WORKFLOWS: dict[str, Callable] = {}  # kind -> its function


class WorkflowError(RuntimeError):
    """A workflow or step was used in a way the journal cannot honour."""


class NotWaiting(WorkflowError):
    """The workflow has not reached that wait; nothing was changed."""


class DecisionConflict(WorkflowError):
    """Another decision was saved first and is final; nothing was changed."""


class Suspended(BaseException):
    """This replay stops here; the database already says what comes next, and when."""


class LeaseLost(BaseException):
    """This process may no longer write this workflow; its transaction wrote nothing."""


class Transient(Exception):
    """Infrastructure failed (a timeout, a reset, a 503): retry with backoff."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff: ``base_delay * 2**(attempt - 1)`` seconds, at most ``max_delay``."""
    max_attempts: int = 3
    base_delay: float = 1.0
    max_delay: float = 60.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return min(self.base_delay * 2 ** (attempt - 1), self.max_delay)


CRASH_LIMIT = RetryPolicy()  # attempts that may kill their process before a step without a policy escalates


# The right to write one workflow while ``token`` is its fencing token; renewed for ``seconds`` at a time.
Lease = NamedTuple("Lease", [("workflow_id", str), ("token", int), ("seconds", float)])


def workflow(kind: str) -> Callable:
    """Register a workflow function under ``kind``, so any process that imports it runs it by name."""
    return lambda fn: WORKFLOWS.update({kind: fn}) or fn


@contextmanager
def immediate(conn: sqlite3.Connection):
    """The block as one ``BEGIN IMMEDIATE`` transaction (write-locked before its first read): all commits, or none."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextmanager
def fenced(conn: sqlite3.Connection, lease: Lease | None):
    """Notebook 06: ``immediate``, first raising ``LeaseLost`` (nothing written) unless ``lease`` is current or None."""
    with immediate(conn):
        if lease is not None:
            (token,) = conn.execute("SELECT fencing_token FROM workflows WHERE id = ?", (lease.workflow_id,)).fetchone()
            if token != lease.token:
                raise LeaseLost(f"workflow {lease.workflow_id!r}: token {lease.token} was superseded by {token}")
        yield conn


def move(conn: sqlite3.Connection, workflow_id: str, status: str, **columns: Any) -> None:
    """Inside the caller's transaction: the workflow's ``status``, and its ``columns``."""
    sets = "".join(f", {name} = ?" for name in columns)
    conn.execute(f"UPDATE workflows SET status = ?{sets} WHERE id = ?", (status, *columns.values(), workflow_id))


def mark(conn: sqlite3.Connection, workflow_id: str, name: str, status: str, **columns: Any) -> None:
    """Inside the caller's transaction: step or wait ``name``'s ``status`` and ``columns``; never a complete row's."""
    sets = "".join(f", {column} = ?" for column in columns)
    conn.execute(f"UPDATE steps SET status = ?{sets} WHERE workflow_id = ? AND name = ? AND status != 'complete'",
                 (status, *columns.values(), workflow_id, name))


def decoded(row: sqlite3.Row) -> dict:
    return {**dict(row), "input": json.loads(row["input"] or "null"), "output": json.loads(row["output"] or "null")}


class Journal:
    """Workflows, their steps and their waits, in one SQLite file: WAL, and each commit on disk when it returns."""

    def __init__(self, path: str | Path):
        self.path, self.conn = Path(path), sqlite3.connect(str(path), isolation_level=None, timeout=10)
        self.conn.row_factory = sqlite3.Row
        self.conn.executescript("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;" + SCHEMA)

    def start(self, kind: str, input: Any, workflow_id: str | None = None) -> str:
        """A new workflow, *pending* and due now; its id. An id names one task for good: a second start does nothing."""
        workflow_id = workflow_id or uuid.uuid4().hex[:12]
        self.conn.execute("INSERT OR IGNORE INTO workflows (id, kind, input, status, next_run_at) VALUES"
                          " (?, ?, ?, 'pending', 0)", (workflow_id, kind, json.dumps(input)))
        return workflow_id

    def workflow(self, workflow_id: str) -> dict:
        """The workflow's row, input and output decoded."""
        row = self.conn.execute("SELECT * FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
        if row is None:
            raise WorkflowError(f"no workflow {workflow_id!r} in {self.path.name}")
        return decoded(row)

    def steps(self, workflow_id: str) -> list[dict]:
        """The workflow's steps (not its waits) in the order it reached them, input and output decoded."""
        return [decoded(r) for r in self.conn.execute(
            "SELECT * FROM steps WHERE workflow_id = ? AND kind = 'step' ORDER BY position", (workflow_id,))]


STORED = "SELECT output FROM steps WHERE workflow_id = ? AND name = ? AND status = 'complete'"


class Workflow:
    """One replay of one workflow from its first line: the steps and waits its code asks for, in order."""

    def __init__(self, journal: Journal, row: dict, lease: Lease | None):
        self.conn, self.lease, self.db_path, self.id = journal.conn, lease, journal.path, row["id"]
        self.input, self.fencing_token, self.position, self.names = row["input"], lease and lease.token, 0, set()
        self.recorded = {r["position"]: dict(r) for r in self.conn.execute(  # what the journal holds, read once
            "SELECT * FROM steps WHERE workflow_id = ?", (self.id,))}

    def execute_step(self, name: str, activity: Callable, step_input: Any = None, *, retry: RetryPolicy | None = None):
        """Step ``name``'s stored output, or ``activity``'s committed now (``run_step``). A failed step runs again at
        its retry time; one whose ``max_attempts`` attempts all ended unfinished (crashed, taken over) escalates."""
        input_json, policy = json.dumps(step_input), retry or CRASH_LIMIT
        here = self._place(name, "step", input_json) or {"status": None}
        if here["status"] == "retrying" and here["next_attempt_at"] > time.time():
            self._stop("pending", next_run_at=here["next_attempt_at"])
        if here["status"] == "running" and here["attempts"] >= policy.max_attempts:
            return self._failed(name, Transient(f"the process died in attempt {here['attempts']}"), policy)

        def attempt() -> Any:  # counted, in a commit of its own, before the work starts
            with fenced(self.conn, self.lease) as conn:
                conn.execute("INSERT INTO steps (workflow_id, name, kind, position, input, status, attempts) VALUES"
                             " (?, ?, 'step', ?, ?, 'running', 1) ON CONFLICT DO UPDATE SET status = 'running',"
                             " attempts = attempts + 1 WHERE status != 'complete'",
                             (self.id, name, self.position, input_json))
            return activity()
        try:
            return run_step(self, name, attempt)
        except Exception as error:
            return self._failed(name, error, retry)

    def wait_for_approval(self, name: str, request: Any) -> dict:
        """Stop until a person approves or rejects ``request``; the decision ``{"approved", "by", "comment"}``."""
        return self._wait(name, "approval", request, None)

    def sleep(self, name: str, seconds: float) -> None:
        """A durable timer: go on ``seconds`` after this line was first reached, in whatever process."""
        self._wait(name, "timer", {"seconds": seconds}, seconds)

    def _place(self, name: str, kind: str, input_json: str | None) -> dict | None:
        """The next place in the order, and what the journal recorded there; the workflow is blocked on a difference."""
        if name in self.names:
            raise WorkflowError(f"workflow {self.id!r}: {name!r} asked for twice; give each step its own name")
        self.names.add(name)
        self.position += 1
        here = self.recorded.get(self.position)
        if here is not None and (here["name"], here["kind"]) != (name, kind):
            self._stop("blocked", error=f"at position {self.position} the journal recorded {here['kind']} "
                       f"{here['name']!r}, the code asked for {kind} {name!r}: renamed, inserted, removed or reordered")
        if here is not None and here["status"] == "complete" and kind == "step" and here["input"] != input_json:
            self._stop("blocked", error=f"step {name!r} completed with input {here['input']}, now given {input_json}")
        return here

    def _failed(self, name: str, error: Exception, policy: RetryPolicy | None) -> Any:
        """Commit the failed attempt and its path (``after_failure``) together; then stop, or raise ``error``."""
        with fenced(self.conn, self.lease) as conn:
            mark(conn, self.id, name, "failed", error=f"{type(error).__name__}: {error}")
            path = after_failure(conn, self.id, name, error, policy)
            if path == "escalate":  # no worker runs it again: a person decides what comes next
                move(conn, self.id, "escalated", error=f"step {name!r}: {type(error).__name__}: {error}")
        raise error if path == "fail" else Suspended(f"workflow {self.id!r}, step {name!r}: {path}")

    def _wait(self, name: str, kind: str, request: Any, seconds: float | None) -> Any:
        """The wait's decision, or the wait saved (a timer's end fixed the first time) and this replay stopped."""
        self._place(name, kind, None)
        with fenced(self.conn, self.lease) as conn:
            conn.execute("INSERT OR IGNORE INTO steps (workflow_id, name, kind, position, input, status,"
                         " next_attempt_at) VALUES (?, ?, ?, ?, ?, 'waiting', ?)",
                         (self.id, name, kind, self.position, json.dumps(request), seconds and time.time() + seconds))
            row = dict(conn.execute("SELECT *, next_attempt_at <= ? AS ended FROM steps WHERE workflow_id = ?"
                                    " AND name = ?", (time.time(), self.id, name)).fetchone())  # NULL: no end
            if row["status"] == "waiting" and row["ended"]:
                row.update(status="complete", output="null")  # the timer's end has come
                mark(conn, self.id, name, "complete", output="null")
            if row["status"] == "waiting":
                move(conn, self.id, "waiting", next_run_at=row["next_attempt_at"])  # NULL: due only once decided
        if row["status"] == "waiting":
            raise Suspended(f"workflow {self.id!r} waits for {kind} {name!r}")
        return json.loads(row["output"])

    def _stop(self, status: str, **columns: Any) -> None:
        with fenced(self.conn, self.lease) as conn:
            move(conn, self.id, status, **columns)
        raise Suspended(f"workflow {self.id!r}: {status}: {columns}")


def run_step(wf: Workflow, name: str, activity: Callable[[], Any]) -> Any:
    """Notebook 02: step ``name``'s stored output, or ``activity()``'s committed once; no stored output is replaced."""
    stored = wf.conn.execute(STORED, (wf.id, name)).fetchone()
    if stored is not None:
        return json.loads(stored["output"])
    output = activity()
    with fenced(wf.conn, wf.lease) as conn:
        stored = conn.execute(STORED, (wf.id, name)).fetchone()
        if stored is not None:  # another process committed it while the activity ran: its output stands
            return json.loads(stored["output"])
        mark(conn, wf.id, name, "complete", output=json.dumps(output))
    return json.loads(json.dumps(output))  # what every replay will return


def after_failure(conn, workflow_id: str, step: str, error: Exception, policy: RetryPolicy | None) -> str:
    """Notebook 03, in the failed attempt's transaction: ``retry`` (the step *retrying*, the workflow *pending*, both
    due in ``policy.delay(attempts)``), ``escalate`` (``Transient``, a crash too, at ``max_attempts``) or ``fail``."""
    if policy is None or not isinstance(error, Transient):
        return "fail"
    (attempts,) = conn.execute("SELECT attempts FROM steps WHERE workflow_id = ? AND name = ?",
                               (workflow_id, step)).fetchone()
    if attempts >= policy.max_attempts:
        return "escalate"
    retry_at = time.time() + policy.delay(attempts)
    mark(conn, workflow_id, step, "retrying", next_attempt_at=retry_at)
    move(conn, workflow_id, "pending", next_run_at=retry_at)
    return "retry"


def approve(journal: Journal, workflow_id: str, by: str, comment: str = "", wait: str | None = None) -> dict:
    """Approve wait ``wait`` (None: the only approval wait): the decision, ``wait`` and ``saved`` (``decide_wait``)."""
    return _decide(journal, workflow_id, wait, {"approved": True, "by": by, "comment": comment})


def reject(journal: Journal, workflow_id: str, by: str, comment: str = "", wait: str | None = None) -> dict:
    """Reject wait ``wait``, as ``approve`` approves it."""
    return _decide(journal, workflow_id, wait, {"approved": False, "by": by, "comment": comment})


def _decide(journal: Journal, workflow_id: str, wait: str | None, decision: dict) -> dict:
    with immediate(journal.conn) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM steps WHERE workflow_id = ? AND kind = 'approval'",
                                            (workflow_id,))]
        if wait is None and len(names) != 1:
            raise NotWaiting(f"workflow {workflow_id!r} has had {len(names)} approval waits: name the one you decide")
        decided, saved = decide_wait(conn, workflow_id, wait or names[0], decision)
    return {**decided, "wait": wait or names[0], "saved": saved}


def decide_wait(conn: sqlite3.Connection, workflow_id: str, wait: str, decision: dict) -> tuple[dict, bool]:
    """Notebook 04, in one ``BEGIN IMMEDIATE``: save ``decision`` on approval wait ``wait``, the workflow due now:
    ``(decision, True)``. Final: the same again gives ``(the first, False)``, another ``DecisionConflict``, and a wait
    not reached ``NotWaiting``, none of them writing."""
    row = conn.execute("SELECT status, output FROM steps WHERE workflow_id = ? AND name = ? AND kind = 'approval'",
                       (workflow_id, wait)).fetchone()
    if row is None:
        raise NotWaiting(f"workflow {workflow_id!r} has not reached an approval wait {wait!r}; nothing was changed")
    if row["status"] == "complete":
        first = json.loads(row["output"])
        if first["approved"] != decision["approved"]:
            raise DecisionConflict(f"workflow {workflow_id!r}, wait {wait!r}: {first} is final; nothing was changed")
        return first, False
    mark(conn, workflow_id, wait, "complete", output=json.dumps(decision))
    move(conn, workflow_id, "pending", next_run_at=time.time())
    return decision, True


# Runnable at ?1: pending, or waiting for a time that has come (NULL: for a person), or running on an expired lease.
DUE = "(status = 'pending' OR status = 'waiting') AND next_run_at <= ?1 OR status = 'running' AND lease_expires_at < ?1"


def claim(conn, owner: str, seconds: float, workflow_id: str | None = None, skip=()) -> Lease | None:
    """In one transaction: a new token's lease on the soonest due workflow of a kind known here (not in ``skip``), or
    on ``workflow_id`` if neither final nor under a live lease; None if there is none."""
    with immediate(conn):
        rows = conn.execute(f"SELECT id, kind FROM workflows WHERE ?2 IS NULL AND ({DUE}) OR id = ?2 AND status NOT IN"
                            f" {FINAL} AND NOT (status = 'running' AND lease_expires_at >= ?1)"
                            " ORDER BY next_run_at, id", (time.time(), workflow_id))
        workflow_id = next((r["id"] for r in rows if r["kind"] in WORKFLOWS and r["id"] not in skip), None)
        if workflow_id is None:
            return None
        (token,) = conn.execute("UPDATE workflows SET status = 'running', owner = ?, lease_expires_at = ?,"
                                " fencing_token = fencing_token + 1 WHERE id = ? RETURNING fencing_token",
                                (owner, time.time() + seconds, workflow_id)).fetchone()
    return Lease(workflow_id, token, seconds)


def heartbeat(db_path: str | Path, lease: Lease, done: threading.Event) -> None:
    """Until ``done``, renew ``lease`` every third of its length on a connection of its own; stop once superseded."""
    conn = sqlite3.connect(str(db_path), isolation_level=None, timeout=lease.seconds / 3)
    while not done.wait(lease.seconds / 3):
        with suppress(sqlite3.OperationalError):  # locked: tried again at the next beat
            if not conn.execute("UPDATE workflows SET lease_expires_at = ? WHERE id = ? AND fencing_token = ?",
                                (time.time() + lease.seconds, lease.workflow_id, lease.token)).rowcount:
                break
    conn.close()


def run_workflow(journal: Journal, workflow_id: str, lease: Lease | None = None) -> Any:
    """Replay it from its first line as far as it goes, under ``lease`` or one it claims (``WorkflowError`` if another's
    is live), kept by a ``heartbeat``: its output, or None (the database says why); a code error marks it *failed*."""
    row = journal.workflow(workflow_id)
    if row["status"] in FINAL:
        return row["output"]
    lease = lease or claim(journal.conn, uuid.uuid4().hex, LEASE_SECONDS, workflow_id)
    if lease is None or row["kind"] not in WORKFLOWS:
        raise WorkflowError(f"workflow {workflow_id!r}: under another owner's lease, or of a kind not registered here")
    wf, done = Workflow(journal, row, lease), threading.Event()
    threading.Thread(target=heartbeat, args=(journal.path, lease, done), daemon=True).start()
    try:
        output = WORKFLOWS[row["kind"]](wf)
        with fenced(journal.conn, lease) as conn:
            move(conn, workflow_id, "complete", output=json.dumps(output))
        return output
    except (Suspended, LeaseLost):
        return None
    except Exception as error:
        with fenced(journal.conn, lease) as conn:
            move(conn, workflow_id, "failed", error=f"{type(error).__name__}: {error}")
        raise
    finally:
        done.set()


def run_worker(db_path: str | Path, *, once: bool = False, until_idle: bool = False, poll: float = 0.2,
               lease_seconds: float = LEASE_SECONDS, log: Callable[[str], Any] = print) -> int:
    """Run due workflows (``DUE``), each under a lease, until the process ends, ``once`` or ``until_idle``; how many."""
    journal, owner, runs = Journal(db_path), uuid.uuid4().hex, 0
    while True:
        ran: set[str] = set()  # each workflow once a pass, even if it is due again at once
        while (lease := claim(journal.conn, owner, lease_seconds, skip=ran)) is not None:
            ran.add(lease.workflow_id)
            try:
                run_workflow(journal, lease.workflow_id, lease)
            except (Exception, LeaseLost) as error:
                log(f"{lease.workflow_id}: {type(error).__name__}: {error}")
            row = journal.workflow(lease.workflow_id)
            log(f"{lease.workflow_id}: " + (row["status"] if row["fencing_token"] == lease.token else "lease lost"))
        runs += len(ran)
        if once or (until_idle and not ran):
            journal.conn.close()
            return runs
        time.sleep(0 if ran else poll)
