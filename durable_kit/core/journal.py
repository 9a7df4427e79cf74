"""The engine: the step journal. Workflows and steps with durable identities, and replay.

A workflow is a function of a ``Workflow``. After any crash it runs again from
its first line, and ``execute_step`` returns the stored output of every step
that completed instead of running it again.

Guarantees, exactly:

* **At-least-once activities.** An activity can run more than once: a process
  can die after the activity did its work and before its output was committed.
* **One recorded outcome per step.** Once a step's output is committed it is
  never replaced; every later replay returns that same output.
* Code outside ``execute_step`` runs on every replay, so it must be
  deterministic and free of side effects.

What each write costs. A replay runs inside ``Journal.relaxed``: every write
survives a process crash, and the start, each step's output and every stop
that records a time or a decision are also synced to disk before anything
relies on them. Three writes are not synced: the grant, an attempt's
*running* marker and a completed replay's last write. A power loss may lose
them, costing an attempt count or a replay, never an output (a fencing token
is synced before it leaves the process).
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import sqlite3
import threading
import uuid
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Callable

from . import state, waits
from ..errors import Ended, LeaseLost, NonDeterminism, Suspended, WorkflowError, check_text, is_storage_fault
from .leases import Heartbeat, Lease, check_lease, new_owner, release, superseded, take
from .retries import (TAKEN_OVER_BY_STEP, Crashed, FormatFailure, InvalidRequest, OutranLease, RetryPolicy,
                      record_failure)
from ..redact import redact, register_secret
from .state import COMMIT_OUTPUT, COMPLETE, COMPLETE_IN_TRANSACTION, FINAL_STATUSES, move, start_first_attempt
from .store import (BOUNDARY_HOOK, DB_NOW, append_event, boundary, connect, encode, every_boundary, files_of,
                    from_json, immediate, now, to_json, write)

WORKFLOWS: dict[str, Callable[["Workflow"], Any]] = {}  # kind -> its function
VERSIONS: dict[str, str] = {}  # kind -> the code version a new workflow of that kind records
INPUTS: dict[str, dict[str, type]] = {}  # kind -> the input keys it needs, and their types
MAX_RETRY_BUDGET = 1_000_000
STOPPED = ("paused", "failed", "blocked")  # not final, but no person's run starts them again without a resume
CRASH_LIMIT = RetryPolicy(max_attempts=3)  # attempts that killed their process before a step without a policy escalates

# How features extend every replay (``change.py`` adds cancellation). ``boundary(wf, new)`` runs before each new
# attempt or wait (``new``), and where a replay passes a decided wait or its code raised; it may end the replay.
# ``failed(wf, step, error, retry)``, inside a failed attempt's write, returns why the workflow pauses instead, or
# None. ``ended(wf, status)`` runs inside the write that gives the workflow a final status.
EXTENSIONS: dict[str, list[Callable]] = {"boundary": [], "failed": [], "ended": []}


def workflow(kind: str, version: str | None = None, inputs: dict[str, type] | None = None) -> Callable:
    """Register a workflow function under ``kind``, so any process runs it by name.

    A new workflow records ``version`` (else ``source_version``). ``Journal.start`` refuses an input that lacks
    a key of ``inputs`` or has it with another type.
    """
    def register(fn: Callable[["Workflow"], Any]) -> Callable[["Workflow"], Any]:
        WORKFLOWS[kind], VERSIONS[kind], INPUTS[kind] = fn, version or source_version(fn), dict(inputs or {})
        return fn
    return register


def source_version(fn: Callable) -> str:
    """``src-`` and 12 hex digits of a hash of the function's source (or of its compiled code, if none is kept)."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = repr(fn.__code__.co_code)
    return "src-" + hashlib.sha256(source.encode()).hexdigest()[:12]


def _check_start(kind: str, workflow_id: str, value: Any, retry_budget: Any) -> None:
    what = f"workflow {workflow_id!r} of kind {kind!r}"
    needed = INPUTS.get(kind) or {}
    if needed and not isinstance(value, dict):
        raise WorkflowError(f"{what}: the input must be a JSON object with {sorted(needed)}; nothing was started.")
    for key, expected in needed.items():
        if key not in value:
            raise WorkflowError(f"{what} needs input {key!r} ({expected.__name__}); it got {sorted(value)}. "
                                "Nothing was started.")
        if not isinstance(value[key], expected) or isinstance(value[key], bool) and expected is not bool:
            raise WorkflowError(f"{what}: input {key!r} must be a {expected.__name__}, not "
                                f"{type(value[key]).__name__}. Nothing was started.")
    if not isinstance(retry_budget, int) or isinstance(retry_budget, bool) or not 0 <= retry_budget <= MAX_RETRY_BUDGET:
        raise WorkflowError(f"{what}: retry_budget must be a whole number of retries from 0 to {MAX_RETRY_BUDGET}, "
                            f"not {retry_budget!r}. Give one in that range (the default is 10). Nothing was started.")


class Journal:
    """Workflows, steps and their append-only history in one SQLite file."""

    def __init__(self, path: str | Path, synchronous: str = "FULL", create: bool = True,
                 conn: sqlite3.Connection | None = None):
        """Open the journal at ``path``; ``create=False`` refuses a missing or empty file. ``conn``: one already open."""
        self.path, self.synchronous = Path(path), synchronous.upper()
        self.conn = conn or connect(self.path, self.synchronous, create=create)
        self.relaxing = False  # inside ``relaxed``
        self._log: Any = None  # the write-ahead log, opened for ``sync``
        self.files = files_of(self.path)  # as opened: a worker checks they are still the same files

    def files_changed(self) -> str | None:
        """Which of the journal's files was removed or replaced since this process opened it, or None."""
        files = files_of(self.path)
        if self.files[1] is None:  # the log appeared after the journal was opened
            self.files = (self.files[0], files[1])
        for what, opened, seen in zip((f"the journal's file ({self.path.name})",
                                       f"its write-ahead log ({self.path.name}-wal)"), self.files, files):
            if opened != seen:
                return what
        return None

    @contextmanager
    def relaxed(self):
        """Inside the block the connection commits at NORMAL, and a replay syncs (``sync``) what must outlive a power loss."""
        if self.relaxing or self.synchronous not in ("FULL", "EXTRA"):
            yield self.conn
            return
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.relaxing = True
        try:
            yield self.conn
        finally:
            self.relaxing = False
            self.conn.execute(f"PRAGMA synchronous = {self.synchronous}")

    def sync(self) -> None:
        """Put every commit so far on disk, as FULL does after each: an fsync of the write-ahead log (none below FULL)."""
        if self.synchronous not in ("FULL", "EXTRA"):
            return
        if self._log is None:  # the log exists while a connection is open; SQLite takes no lock on it
            self._log = open(f"{self.path}-wal", "rb", buffering=0)
        (os.fdatasync if hasattr(os, "fdatasync") else os.fsync)(self._log.fileno())

    def close(self) -> None:
        """Close the connection and the log's descriptor (again is harmless)."""
        self.conn.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def start(self, kind: str, input: dict, workflow_id: str | None = None, retry_budget: int = 10,
              registered_elsewhere: bool = False) -> str:
        """Create a workflow, *pending*, and return its id; the same id, kind and input again is a no-op.

        The same id with another kind or input is refused, and so is a kind no module in this process registered
        (unless ``registered_elsewhere``: only the workers load it). ``retry_budget`` caps the retries of all its
        steps. A refusal writes nothing.
        """
        if kind not in WORKFLOWS and not registered_elsewhere:
            raise WorkflowError(
                f"no module in this process registered the workflow kind {kind!r} (known: {sorted(WORKFLOWS)}); "
                "nothing was started. Import the module that defines it, or pass registered_elsewhere=True if "
                "only the workers load it.")
        if workflow_id is not None and not check_text(workflow_id, "the id", f"a workflow of kind {kind!r}").strip():
            raise WorkflowError("a workflow id cannot be empty (an unset variable?): an empty id would start a new "
                                "task every time. Give the id, or leave it out for a random one. Nothing was started.")
        workflow_id = workflow_id or uuid.uuid4().hex[:12]
        _check_start(kind, workflow_id, input, retry_budget)
        input_json = to_json(input, workflow_id, None, "workflow input")
        if not state.create_workflow(self.conn, workflow_id, kind, input_json, retry_budget, VERSIONS.get(kind),
                                     os.getpid()):
            row = self.conn.execute("SELECT kind, input FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
            if (row["kind"], row["input"]) != (kind, input_json):  # they never change: no lock is needed
                raise WorkflowError(
                    f"workflow {workflow_id!r} already exists as {row['kind']!r} with input {row['input']}; "
                    "a workflow id names one task for good: pick a new id for a different task.")
        return workflow_id

    def workflow(self, workflow_id: str) -> dict:
        """The workflow's row, input and output decoded."""
        row = self.conn.execute("SELECT * FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
        if row is None:
            raise WorkflowError(f"no workflow {workflow_id!r} in {self.path.name}: start it first, or check the id.")
        return {**dict(row), "input": from_json(row["input"]), "output": from_json(row["output"])}

    def row_for_update(self, workflow_id: str) -> sqlite3.Row:
        """Inside the caller's write: the workflow's stored row, or ``WorkflowError`` naming the id."""
        row = self.conn.execute("SELECT * FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
        if row is None:
            raise WorkflowError(f"no workflow {workflow_id!r} in {self.path.name}; check the id.")
        return row

    def steps(self, workflow_id: str) -> list[dict]:
        """Every step of the workflow in the order it first started, input and output decoded."""
        rows = self.conn.execute("SELECT * FROM steps WHERE workflow_id = ? ORDER BY started_at, name", (workflow_id,))
        return [{**dict(r), "input": from_json(r["input"]), "output": from_json(r["output"])} for r in rows]

    def history(self, workflow_id: str) -> list[dict]:
        """The workflow's events, oldest first, numbered from 1 (``seq``): for people; a replay never reads it.

        Read from the ``timeline`` view: the history table's events and those the rows record themselves.
        """
        rows = self.conn.execute("SELECT step, event, detail, pid, at FROM timeline WHERE workflow_id = ?"
                                 " ORDER BY after, derived, at", (workflow_id,))
        return [{"workflow_id": workflow_id, "seq": seq, **dict(r)} for seq, r in enumerate(rows, start=1)]

    def open(self, workflow_id: str, lease: Lease | None = None, heartbeat: Heartbeat | None = None) -> "Workflow":
        """Begin one replay under ``lease`` (a superseded one is refused: ``LeaseLost``); without one, mark it running."""
        row = self.workflow(workflow_id)
        if lease is not None and row["fencing_token"] != lease.token:
            raise superseded(lease, row["fencing_token"])
        wf = Workflow(self, row, lease, heartbeat)
        if lease is None:  # a lease's grant marked it running
            wf.begin()
        return wf


def divergence(recorded: dict[int, dict], position: int, name: str, input_json: str | None,
               wait: bool = False) -> str | None:
    """What differs between the journal's step or wait at ``position`` and the one the code asks for; None if nothing."""
    here, asked = recorded.get(position), "wait" if wait else "step"
    if here is None:
        elsewhere = next((p for p, r in recorded.items() if r["name"] == name), None)
        return None if elsewhere is None else (
            f"{asked} {name!r} is asked for at position {position}, but the journal recorded it at position "
            f"{elsewhere} ({'steps and waits' if wait else 'steps'} reordered)")
    if here["name"] != name or here["wait"] != wait:
        later = any(p > position and r["name"] == name for p, r in recorded.items())
        earlier = any(p < position and r["name"] == name for p, r in recorded.items())
        if here["wait"] or wait:
            why = "reordered" if earlier else "removed, or reordered" if later else "renamed, inserted or removed"
            return (f"at position {position} the journal recorded {'wait' if here['wait'] else 'step'} "
                    f"{here['name']!r}, but the code asked for {asked} {name!r} ({why})")
        why = ("steps reordered" if earlier else "a step removed, or steps reordered" if later
               else "a step renamed, inserted or removed")
        return f"at position {position} the journal recorded step {here['name']!r}, but the code asked for {name!r} ({why})"
    if here["status"] == "complete" and here["input"] != input_json:
        return (f"step {name!r} completed with input {here['input']}, but the code now gives {input_json} "
                "(its stored output belongs to the old input)")
    return None


def left_over(recorded: dict[int, dict], position: int) -> str | None:
    """At a replay's end: the completed steps and decided waits the code no longer asked for, or None."""
    left = [(p, r) for p, r in sorted(recorded.items()) if p > position and r["status"] in ("complete", "resolved")]
    if not left:
        return None
    if not any(r["wait"] for _, r in left):
        named = ", ".join(f"{r['name']!r} (position {p})" for p, r in left)
        return f"the journal recorded completed steps the code no longer asks for: {named} (steps removed)"
    named = ", ".join(f"{'wait' if r['wait'] else 'step'} {r['name']!r} (position {p})" for p, r in left)
    return f"the journal recorded what the code no longer asks for: {named} (removed)"


# What a replay reads once: every step, and every wait's place in the order (one statement).
RECORDED = ("SELECT name, status, input, output, attempts, next_attempt_at, repair_message, position, 0 AS wait"
            " FROM steps WHERE workflow_id = ?1 UNION ALL SELECT name, status, NULL, NULL, NULL, NULL, NULL,"
            " position, 1 FROM waits WHERE workflow_id = ?1 AND position IS NOT NULL")


class Replay:
    """What one replay of a workflow read once, and every write it makes, each fenced by its lease.

    ``Workflow`` stands on it; features (waits, effects, change, parallel) extend a replay through its public
    methods: ``claim``, ``place``, ``reuse``, ``completed``, ``at_boundary``, ``write``, ``starting`` and the attempt's
    writes.
    """

    def __init__(self, journal: Journal, row: dict, lease: Lease | None = None, heartbeat: Heartbeat | None = None):
        self.journal, self.conn, self.lease, self.heartbeat = journal, journal.conn, lease, heartbeat
        self.id, self.kind, self.input, self.version = row["id"], row["kind"], row["input"], row["version"]
        self.db_path, self.position, self.released = journal.path, 0, False  # released: by the write that let go
        self.compensations: list[tuple[str, Callable[[Any], Any], Any]] = []  # for a cancellation (``change.py``)
        self._outputs: dict[str, str] = {}  # completed steps' outputs, as JSON
        self._tried: dict[str, dict] = {}  # steps with a row but no output: retry time, attempts that died, repair
        self._by_position: dict[int, dict] = {}  # what the journal recorded at each place in the order
        self._names, self._reused, self._token_synced, self._tracing = set(), [], False, every_boundary()
        self.thread = threading.get_ident()  # the only thread that may use ``conn``
        for r in self.conn.execute(RECORDED, (self.id,)):
            if r["position"] is not None:
                self._by_position[r["position"]] = {"name": r["name"], "status": r["status"], "input": r["input"],
                                                    "wait": r["wait"]}
            if r["wait"]:
                continue
            if r["status"] == "complete":
                self._outputs[r["name"]] = r["output"]
            else:  # tried before: a retry time; a *running* row's last attempt died mid-step; a repair
                self._tried[r["name"]] = {"not_before": r["next_attempt_at"] if r["status"] == "retrying" else None,
                                          "died": r["attempts"] if r["status"] == "running" else 0,
                                          "outran": 0, "repair": r["repair_message"]}
        if any(t["died"] for t in self._tried.values()):  # attempts taken over by another owner are not crashes
            for r in self.conn.execute(TAKEN_OVER_BY_STEP, (self.id,)):
                if r["step"] in self._tried and self._tried[r["step"]]["died"]:
                    self._tried[r["step"]]["died"] -= r["attempts"]
                    self._tried[r["step"]]["outran"] = r["in_a_row"]

    def place(self, name: str, input_json: str | None = None, wait: bool = False) -> int:
        """Give the next step or wait (named once a replay) its position; block if the journal recorded another there."""
        self.claim(name)
        self.position += 1
        problem = divergence(self._by_position, self.position, name, input_json, wait)
        if problem:
            self._block(problem)
        return self.position

    def reuse(self, name: str) -> bool:
        """True if step ``name`` completed before; its reuse is then recorded with this replay's next write."""
        if name not in self._outputs:
            return False
        self._reused.append(name)
        return True

    def completed(self, name: str) -> bool:
        """True if step ``name`` has an output on record."""
        return name in self._outputs

    def output(self, name: str) -> Any:
        """The stored output of completed step ``name``, decoded."""
        return json.loads(self._outputs[name])

    def recorded_after(self) -> list[str]:
        """The names the journal recorded at positions this replay has not reached."""
        return [r["name"] for p, r in sorted(self._by_position.items()) if p > self.position]

    def at_boundary(self, new: bool = True) -> None:
        """A step boundary: each feature's check (``EXTENSIONS["boundary"]``) runs, and may end this replay."""
        for check in EXTENSIONS["boundary"]:
            check(self, new)

    @contextmanager
    def write(self, last: bool = False):
        """A transaction under this replay's lease (a stale owner writes nothing), synced before the block returns.

        Pending reuse events are written first. ``last`` ends this replay and gives the lease up in the same
        commit; so does ``let_go`` inside the block.
        """
        self._whole: dict[str, str] = {}
        with self._fenced():
            self._write_reused()
            yield self.conn
            if last:
                self.let_go(self.conn)
        self._synced()
        self._outputs.update(self._whole)  # known to this replay once committed

    def record_step(self, name: str, position: int, input_json: str | None, output_json: str) -> None:
        """Inside ``write``: step ``name`` recorded whole, *complete*, at ``position`` (an outbox step)."""
        state.record_step(self.conn, self.id, name, input_json, output_json, position, only_if_new=False)
        self._whole[name] = output_json

    def let_go(self, conn: sqlite3.Connection) -> None:
        """Inside a write: this replay stops here, and its lease is given up in the same commit."""
        if self.lease is not None:
            state.let_go(conn, self.id)
            self.released = True

    @contextmanager
    def starting(self):
        """The write that starts attempts: also refused once the lease expired or the heartbeat gave up; not synced."""
        with self._fenced(live=True):
            self._write_reused()
            yield self.conn

    def mark_running(self, name: str, input_json: str, repair_message: str | None = None,
                     versions_json: str | None = None, position: int | None = None) -> set[str] | None:
        """Inside ``starting``: the attempt's *running* row at ``position`` (else the last placed); its armed points.

        None if the step is complete: nothing was written.
        """
        attempts = state.start_attempt(self.conn, self.id, name, input_json, redact(repair_message),
                                       self.position if position is None else position, versions_json, os.getpid())
        if attempts is None:
            return None
        if attempts > 1:  # the first attempt's start is in the row itself
            append_event(self.conn, self.id, name, "step_started", f"attempt {attempts}")
        points = ("next_step", f"after_activity:{name}", f"after_commit:{name}")
        if self._tracing:  # a tracing run reaches every boundary
            return set(points)
        # Read in this transaction: a fault armed while the activity runs applies from the next step.
        return BOUNDARY_HOOK["armed"](self.conn, points)

    def encode_output(self, name: str, result: Any, armed: set[str]) -> tuple[str, Any]:
        """An activity's result as JSON (not yet stored) and decoded; then the ``after_activity`` point, if armed."""
        encoded = encode(result, self.id, name, "activity's output",
                         "The output was not stored; the step runs again on the next replay.")
        if f"after_activity:{name}" in armed:
            boundary(self.conn, f"after_activity:{name}", self.id)
        return encoded

    def commit_output(self, name: str, output: tuple[str, Any], armed: set[str]) -> Any:
        """Commit the output (JSON, decoded) unless one is recorded; return the recorded one. Synced before it returns.

        One statement that checks this replay's token (``COMMIT_OUTPUT``); where it writes nothing, the token is
        checked in a transaction (``LeaseLost``) and the output another process recorded first is returned.
        """
        token = None if self.lease is None else self.lease.token
        if not write(self.conn, COMMIT_OUTPUT, (self.id, name, output[0], now(), os.getpid(), token)):
            with self._fenced():  # LeaseLost if the token moved on
                pass
            self._synced()
            return self.recorded_output(name)
        self._synced()
        if f"after_commit:{name}" in armed:
            boundary(self.conn, f"after_commit:{name}", self.id)
        self._outputs[name] = output[0]
        return output[1]

    def fail_attempt(self, name: str, error: Exception) -> None:
        """A failed attempt answered at once (by a repair, a fallback, a fan-out): recorded, no path decided."""
        with self.write():
            record_failure(self.conn, self.id, name, error, None)

    def recorded_output(self, name: str) -> Any:
        """The output recorded for ``name`` (by whichever attempt committed first), decoded."""
        output = self.conn.execute(
            "SELECT output FROM steps WHERE workflow_id = ? AND name = ?", (self.id, name)).fetchone()["output"]
        self._outputs[name] = output
        return json.loads(output)

    @contextmanager
    def _fenced(self, live: bool = False):
        # A write transaction that first checks this replay's token (and with ``live`` its expiry and heartbeat).
        with immediate(self.conn):
            if self.lease is not None:
                if live and self.heartbeat is not None and self.heartbeat.gave_up:
                    raise LeaseLost(f"workflow {self.id!r}: this process's heartbeat could not renew its lease "
                                    f"(token {self.lease.token}); it starts no new attempt and nothing was written.")
                check_lease(self.conn, self.lease, live=live)
            yield self.conn

    def _synced(self) -> None:
        if self.journal.relaxing:  # inside ``Journal.relaxed``: put the commit on disk now, as FULL would have
            self.journal.sync()

    def claim(self, name: str) -> None:
        """Take ``name`` for this replay; a second step or wait of that name is refused (``WorkflowError``)."""
        if name in self._names:
            raise WorkflowError(
                f"workflow {self.id!r}: step {name!r} was already executed in this run. Step and wait names "
                "identify them for good: give each call its own name (for example f'research:{subtopic}').")
        self._names.add(name)

    def _write_reused(self) -> None:
        # Reuse events wait for the next write, so a replay costs no commit per reused step.
        if self._reused:
            pid, at = os.getpid(), now()
            last = self.conn.execute("SELECT COALESCE(MAX(seq), 0) FROM history WHERE workflow_id = ?",
                                     (self.id,)).fetchone()[0]
            self.conn.executemany("INSERT INTO history (workflow_id, seq, step, event, detail, pid, at)"
                                  " VALUES (?, ?, ?, 'step_reused', NULL, ?, ?)",
                                  [(self.id, last + i, n, pid, at) for i, n in enumerate(self._reused, start=1)])
            self._reused.clear()

    def _record_pause(self, reason: str, until: float | None = None) -> None:
        move(self.conn, self.id, "paused", {"error": redact(reason), "next_run_at": until})
        append_event(self.conn, self.id, None, "workflow_paused",
                     reason + ("" if until is None else f" (resumes in {max(0.0, until - now()):.0f} s)"))

    def _block(self, problem: str) -> None:
        message = (f"workflow {self.id!r}: non-deterministic replay: {problem}. Nothing after it ran. Deploy code that "
                   "replays the recorded history (for example behind durable_kit.patched), then resume it, or fork it.")
        self._stop("blocked", {"error": redact(message)}, "workflow_blocked", problem)
        raise NonDeterminism(message)

    def _suspend_until(self, run_at: float, why: str) -> None:
        self._stop("pending", {"next_run_at": run_at}, "replay_suspended", why)
        raise Suspended(f"workflow {self.id!r}: {why}")

    def _stop(self, status: str, columns: dict, event: str, detail: str) -> None:
        # The write that ends this replay: the status and columns, its event, the lease given up, in one commit.
        with self.write(last=True):
            moved = move(self.conn, self.id, status, columns)
            append_event(self.conn, self.id, None, event, detail)
            if moved and status in FINAL_STATUSES:
                for hook in EXTENSIONS["ended"]:
                    hook(self, status)

    def begin(self) -> None:
        """Mark the workflow running and record that a replay started."""
        with self.write():
            move(self.conn, self.id, "running")
            append_event(self.conn, self.id, None, "replay_started", f"{len(self._outputs)} completed steps on record")

    def finish(self, output: Any) -> Any:
        """Commit the output and status *complete*, and give the lease up (not synced); return the stored output.

        Under a lease with no reuse event pending, one statement that also checks the token (``COMPLETE``).
        """
        output_json, decoded = encode(output, self.id, None, "workflow's output")
        problem = left_over(self._by_position, self.position)
        if problem:
            self._block(problem)
        parameters = (self.id, output_json, now(), os.getpid())
        if self.lease is not None and not self._reused and write(self.conn, COMPLETE, (*parameters, self.lease.token)):
            self.released = True
            return decoded
        # Else: no lease, reuse events to write, a lost token (LeaseLost), or a cancellation asked for meanwhile.
        with self._fenced():
            self._write_reused()
            if self.conn.execute(COMPLETE_IN_TRANSACTION, parameters).rowcount:
                for hook in EXTENSIONS["ended"]:
                    hook(self, "complete")
            self.let_go(self.conn)
        return decoded

    def fail(self, error: BaseException) -> None:
        """Commit status *failed* with the error."""
        said = f"{type(error).__name__}: {error}"
        self._stop("failed", {"error": redact(said)}, "workflow_failed", said)


class Workflow(Replay):
    """One replay of one workflow, from its first line: the steps, waits and stops workflow code asks for.

    Workflow code reads ``id``, ``kind``, ``input``, ``db_path`` (beside which the outside world keeps its files)
    and ``fencing_token``; it never writes through ``conn``, the journal's connection.
    """

    @property
    def fencing_token(self) -> int | None:
        """This replay's lease token, for a destination that refuses older ones; synced to disk before it is returned."""
        if self.lease is None:
            return None
        if not self._token_synced:  # its grant was not synced
            self.journal.sync()
            self._token_synced = True
        return self.lease.token

    def secret(self, variable: str) -> str:
        """Environment variable ``variable``'s value, redacted from everything written from now on (never an input)."""
        value = os.environ.get(variable)
        if not value:
            raise WorkflowError(f"workflow {self.id!r} needs the secret {variable!r}: set that environment variable "
                                "in the worker's environment (never in the workflow's input).")
        register_secret(value)
        return value

    def execute_step(self, name: str, activity: Callable[[], Any], step_input: Any = None, *,
                     retry: RetryPolicy | None = None, repair: Callable[[str], Any] | None = None,
                     fallback: Callable[[], Any] | None = None, versions: dict | None = None,
                     compensate: Callable[[Any], Any] | None = None) -> Any:
        """Return the step's stored output, or run ``activity`` now and store its output.

        A step completed at this position with the same ``step_input`` is reused: its activity does not run.
        Otherwise the attempt is committed as *running*, the activity runs, and its output is committed before
        it is returned, decoded from the stored JSON. A failure without ``retry`` marks the step *failed* and is
        raised; with ``retry`` its class picks the path (``retries.decide``), committed with the failure.
        ``repair(message)`` gets one try after ``InvalidRequest`` or ``FormatFailure``, ``fallback()`` after a
        ``FormatFailure`` repair did not fix; a retry repeats the repair, not the request. Attempts whose process
        died count (``Crashed``: ``retry.max_attempts``, else ``CRASH_LIMIT``); taken-over ones do not, but as many
        taken over in a row because their lease expired (since the step last failed) escalate it: its activity
        outran its lease (``OutranLease``).
        ``versions`` are recorded with the step; ``compensate(output)`` undoes it if the workflow is cancelled.
        """
        input_json = to_json(step_input, self.id, name, "step input")
        self.place(name, input_json)
        if self.reuse(name):
            output = json.loads(self._outputs[name])
            return output if compensate is None else self._completed(name, compensate, output)
        policy, tried = retry or CRASH_LIMIT, self._tried.get(name)
        if tried:  # tried before: a cancellation, a retry time or attempts that died come first
            self.at_boundary()
            if tried["not_before"] is not None and tried["not_before"] > now():
                self._suspend_until(tried["not_before"], f"step {name!r} is not due yet")
            if tried["died"] >= policy.max_attempts:
                return self._after_failure(name, Crashed("the process died during the attempt"), policy)
            if tried["outran"] >= policy.max_attempts:
                return self._after_failure(name, OutranLease(
                    f"{tried['outran']} attempts of step {name!r} in a row were taken over while their process lived: "
                    "its lease expired before its heartbeat could renew it (an activity that holds the process, or "
                    "Python's GIL, longer than the lease). Raise the lease (--lease-seconds) or let the activity yield "
                    "(release the GIL, or split it into shorter steps), then resume it"), policy)
        versions_json = None if versions is None else to_json(versions, self.id, name, "step versions")
        repair_message = tried["repair"] if tried and repair else None
        run: Callable[[], Any] = (activity if repair is None or repair_message is None  # never resend a bad request
                                  else partial(repair, repair_message))
        while True:
            armed = self._start_attempt(name, input_json, repair_message, versions_json)
            if armed is None:  # another process completed it since this replay began
                return self.recorded_output(name)
            try:
                if "next_step" in armed:
                    boundary(self.conn, "next_step", self.id)
                output = self.encode_output(name, run(), armed)
            except Exception as error:
                if retry and isinstance(error, (InvalidRequest, FormatFailure)) and repair and repair_message is None:
                    self.fail_attempt(name, error)
                    run = partial(repair, repair_message := str(error))
                    continue
                if retry and isinstance(error, FormatFailure) and fallback:
                    self.fail_attempt(name, error)
                    run, fallback = fallback, None
                    continue
                return self._after_failure(name, error, retry)
            return self._completed(name, compensate, self.commit_output(name, output, armed))

    def _completed(self, name: str, compensate: Callable[[Any], Any] | None, output: Any) -> Any:
        if compensate is not None:
            self.compensations.append((name, compensate, output))
        return output

    def _start_attempt(self, name: str, input_json: str, repair_message: str | None,
                       versions_json: str | None) -> set[str] | None:
        """Mark the step *running*: the armed fault points, or None if it is complete (nothing written).

        A first attempt is usually one statement at NORMAL (``START_FIRST_ATTEMPT``), which itself checks a live
        lease, no cancellation and no fault armed. Any other attempt, and a first one it does not take, is a
        transaction (``starting``), after the boundary's checks.
        """
        first = not (name in self._tried or self._reused or self._tracing or (self.heartbeat and self.heartbeat.gave_up))
        if first and write(self.conn, start_first_attempt(BOUNDARY_HOOK["none_armed"]), (
                self.id, name, input_json, redact(repair_message), self.position, versions_json, now(), os.getpid(),
                None if self.lease is None else self.lease.token)):
            armed = set()
        else:
            self.at_boundary()
            with self.starting():
                armed = self.mark_running(name, input_json, repair_message, versions_json)
        if armed is not None:  # a later attempt of this replay takes the transaction
            self._tried.setdefault(name, {"not_before": None, "died": 0, "outran": 0, "repair": None})
        return armed

    def _after_failure(self, name: str, error: Exception, retry: RetryPolicy | None) -> Any:
        """Commit the failed attempt and its path in one transaction, then raise; a step completed meanwhile returns."""
        with self.write() as conn:
            pause = next(filter(None, (hook(self, name, error, retry) for hook in EXTENSIONS["failed"])), None)
            decision = record_failure(conn, self.id, name, error, None if pause else retry)
            if decision is not None and pause:
                self._record_pause(pause)
            if decision is not None and (pause or decision.path != "fail"):  # a schedule, a pause or an end
                self.let_go(conn)
        boundary(self.conn, f"after_failure:{name}", self.id)
        if decision is None:  # a failure never replaces an output
            return self.recorded_output(name)
        if pause:
            raise Suspended(f"workflow {self.id!r} paused: {pause}")
        if decision.path == "fail":
            raise error
        if decision.path == "retry":
            raise Suspended(f"workflow {self.id!r}, step {name!r}: retry scheduled in {decision.delay:g} s")
        raise Ended(f"workflow {self.id!r}, step {name!r}: {decision.reason}")

    def wait_for_approval(self, name: str, request: Any, deadline: float | None = None) -> dict:
        """Stop until a person approves or rejects ``request`` (``durable_kit.approve``/``reject``); return the decision.

        ``{"approved": bool, "by": str, "comment": str}``. No worker is held meanwhile. With ``deadline`` (seconds
        from when this line is first reached) the first of the decision and the deadline wins for good; the
        deadline returns ``{"timed_out": True, ...}`` for the code to choose a path.
        """
        return waits.wait_for(self, name, "approval", request, deadline=deadline)

    def ask(self, name: str, question: str, deadline: float | None = None) -> str | None:
        """Stop until a person answers ``question`` (``durable_kit.answer``); the answer, or None past ``deadline``."""
        decision = waits.wait_for(self, name, "clarification", {"question": question}, deadline=deadline)
        return None if decision.get("timed_out") else decision["answer"]

    def sleep(self, name: str, seconds: float) -> None:
        """A durable timer: go on ``seconds`` after this line was first reached, in whatever process."""
        waits.wait_for(self, name, "timer", {"seconds": seconds}, seconds)

    def end(self, status: str, reason: str) -> None:
        """End the workflow here with a final ``status`` (rejected, stopped or escalated) and its reason.

        A step boundary, like an error past the recorded steps: a cancellation asked for before it ends the
        workflow *cancelled* instead."""
        if status not in ("rejected", "stopped", "escalated"):
            raise ValueError(f"end() takes 'rejected', 'stopped' or 'escalated', not {status!r}")
        self.at_boundary(new=False)  # a cancellation asked for first ends it instead
        self._stop(status, {"error": redact(reason)}, f"workflow_{status}", reason)
        raise Ended(f"workflow {self.id!r}: {status}: {reason}")

    def pause(self, reason: str, until: float | None = None) -> None:
        """Save the workflow *paused* and stop: a worker resumes it from ``until`` (seconds since 1970), else a person."""
        self.at_boundary()
        with self.write(last=True):
            self._record_pause(reason, until)
        raise Suspended(f"workflow {self.id!r} paused: {reason}")


def run_workflow(journal: Journal, workflow_id: str, lease: Lease | None = None, fenced: bool = True,
                 take_over: bool = False) -> Any:
    """Replay the workflow from its first line as far as it can go; return its output, or None.

    A final workflow returns its stored output without running (read in the transaction that grants the lease);
    a *paused*, *failed* or *blocked* one is refused (``WorkflowError``) unless run under a worker's ``lease``:
    only ``resume`` starts it again, and says so in the history.
    The replay runs under ``lease``, else takes one (``leases.take``: refused with ``LeaseHeld`` from a live
    owner unless ``take_over``); a heartbeat renews it. ``fenced=False`` runs with no lease: the unsafe way.
    A replay that stops at a retry time, a wait, a pause, an end or a lost lease returns None; the database says
    why. An exception marks the workflow *failed* and is raised again, unless a feature's boundary check ends
    it first (a cancellation). A storage fault is raised without marking anything.
    """
    with journal.relaxed():  # each write that must outlive a power loss is synced by itself
        claimed, wf = lease, None  # a lease to give up at the end
        try:
            with immediate(journal.conn):  # read, check, grant and read the steps: one transaction
                row = journal.conn.execute("SELECT id, kind, input, status, version, fencing_token, output, owner,"
                                           f" lease_expires_at - {DB_NOW} AS lease_left FROM workflows WHERE id = ?",
                                           (workflow_id,)).fetchone() or journal.row_for_update(workflow_id)
                if row["status"] in FINAL_STATUSES:
                    return from_json(row["output"])
                if lease is None and row["status"] in STOPPED:  # a person's run: only a resume starts these again
                    raise WorkflowError(
                        f"workflow {workflow_id!r} is {row['status']}; nothing was changed. Resume it first (`resume`: "
                        "the history records who resumed it, and from what), then run it or let a worker run it.")
                fn = WORKFLOWS.get(row["kind"])
                if fn is None:
                    raise WorkflowError(
                        f"workflow {workflow_id!r} is of kind {row['kind']!r}, which no imported module registered; "
                        f"known kinds: {sorted(WORKFLOWS)}. Import the module that defines it (or pass --module FILE).")
                if not fenced:
                    lease = None
                elif lease is None:  # unsynced: the token is synced before it leaves (``fencing_token``)
                    lease = claimed = take(journal.conn, row, new_owner(), take_over)
                elif row["fencing_token"] != lease.token:  # a worker's lease, superseded since its claim
                    raise superseded(lease, row["fencing_token"])
                wf = Workflow(journal, {**dict(row), "input": from_json(row["input"])}, lease)
            with Heartbeat(journal.path, lease) if lease else nullcontext() as heartbeat:
                wf.heartbeat = heartbeat
                if claimed is None:  # no grant recorded the replay's start
                    wf.begin()
                try:
                    output = wf.finish(fn(wf))
                except (Suspended, Ended):
                    return None
                except Exception as exc:
                    if not is_storage_fault(exc):
                        try:
                            wf.at_boundary(new=False)
                        except (Suspended, Ended):
                            return None
                        wf.fail(exc)
                    raise
        except LeaseLost as lost:
            with immediate(journal.conn):
                append_event(journal.conn, workflow_id, None, "stale_write_refused", str(lost))
            return None
        finally:
            if claimed and not (wf is not None and wf.released):  # the replay's last write let go already
                try:
                    release(journal.conn, claimed)
                except sqlite3.Error:  # a storage fault: the lease expires by itself
                    pass
    return output
