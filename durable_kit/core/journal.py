"""The engine: the step journal. Workflows and steps with durable identities, and replay.

A workflow is a plain function that takes a ``Workflow`` handle and calls
``execute_step`` for every piece of work that may fail, take time, give a
different answer twice, or touch the outside world. After any crash the
function runs again from its first line; ``execute_step`` returns the stored
output of every step that already completed instead of running it again.

Guarantees, exactly:

* **At-least-once activities.** An activity can run more than once: a process
  can die after the activity did its work and before its output was committed.
* **One recorded outcome per step.** Once a step's output is committed it is
  never replaced; every later replay returns that same output.
* Code outside ``execute_step`` runs on every replay, so it must be
  deterministic and free of side effects.

What each write of a replay protects, and whether it is synced to disk
(at ``synchronous=FULL``, the default; a replay runs inside
``Journal.relaxed``, where SQLite syncs nothing and the replay syncs what
must outlive a power loss). Every write survives a process crash.

1. ``Journal.start`` (one statement, synced): the task and its input exist
   once ``start`` returns.
2. The lease grant (``leases.grant``, with the ``replay_started`` event; not
   synced): the new fencing token. A power loss that loses it also ends
   every process that held it; a token that leaves the process is synced
   first (``Workflow.fencing_token``), so none that left is handed out again.
3. Per attempt, the *running* marker (one statement for a first attempt; not
   synced): the attempt count. A power loss may lose it, costing an attempt
   count, never an output.
4. Per step, its output (one statement, synced before ``execute_step``
   returns it): one recorded outcome.
5. The replay's last write, with the lease given up in the same commit.
   Where the replay completed (the output and status ``complete``; one
   statement, or with a cancellation that came after the last boundary a
   transaction that also records it; not synced): a replay computes the
   same output from the steps' synced outputs. Every other stop (a retry time, a wait, a pause,
   an end, a failure, a block) is synced: it records a time or a decision
   that a replay must not make again.

A one-step workflow is therefore synced twice: its start and its step's
output. Each write's history events are read from the rows themselves where
a row records them (``Journal.history``), so the usual path writes one
statement per change.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import sqlite3
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Callable

from . import waits
from ..errors import Ended, LeaseLost, NonDeterminism, Suspended, WorkflowError, is_storage_fault
from .leases import Heartbeat, Lease, check_lease, new_owner, release, superseded, take
from .retries import (TAKEN_OVER_BY_STEP, Crashed, FormatFailure, InvalidRequest, RetryPolicy, decide, record_failure,
                      within)
from ..redact import redact, register_secret
from . import state
from .state import (COMMIT_OUTPUT, COMPLETE, COMPLETE_IN_TRANSACTION, FINAL_STATUSES, START_FIRST_ATTEMPT,
                    create_workflow, delete_workflow, move, record_step, start_attempt)
from .store import (DB_NOW, append_event, boundary, connect, connect_read_only, encode, every_boundary, from_json,
                    immediate, now, to_json, write)

WORKFLOWS: dict[str, Callable[["Workflow"], Any]] = {}
VERSIONS: dict[str, str] = {}  # kind -> the code version a new workflow of that kind records
INPUTS: dict[str, dict[str, type]] = {}  # kind -> the input keys it needs, and their types

MAX_RETRY_BUDGET = 1_000_000  # retries a workflow may be given across all its steps

# A step without a retry policy whose attempts keep killing their process escalates after this many.
CRASH_LIMIT = RetryPolicy(max_attempts=3)


def source_version(fn: Callable) -> str:
    """A version for code that names none: ``src-`` and the first 12 hex digits of a hash of its source."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):  # defined where no source file is kept: fall back to its compiled code
        source = repr(fn.__code__.co_code)
    return "src-" + hashlib.sha256(source.encode()).hexdigest()[:12]


def workflow(kind: str, version: str | None = None, inputs: dict[str, type] | None = None) -> Callable:
    """Register a workflow function under ``kind`` so any process can run it by name.

    ``version`` names the code; without it, a hash of the function's source
    (``source_version``). A workflow records the version it started
    under. ``inputs`` declares the input keys it needs and their types:
    ``Journal.start`` refuses an input without them.
    """
    def register(fn: Callable[["Workflow"], Any]) -> Callable[["Workflow"], Any]:
        WORKFLOWS[kind] = fn
        VERSIONS[kind] = version or source_version(fn)
        INPUTS[kind] = dict(inputs or {})
        return fn
    return register


def check_input(kind: str, workflow_id: str, value: Any) -> None:
    """Raise ``WorkflowError`` if ``value`` lacks a key the kind declared, or has it with the wrong type."""
    needed = INPUTS.get(kind) or {}
    if not needed:
        return
    if not isinstance(value, dict):
        raise WorkflowError(f"workflow {workflow_id!r} of kind {kind!r}: the input must be a JSON object with "
                            f"{sorted(needed)}; nothing was started.")
    for key, expected in needed.items():
        if key not in value:
            raise WorkflowError(f"workflow {workflow_id!r} of kind {kind!r} needs input {key!r} "
                                f"({expected.__name__}); it got {sorted(value)}. Nothing was started.")
        if not isinstance(value[key], expected) or isinstance(value[key], bool) and expected is not bool:
            raise WorkflowError(f"workflow {workflow_id!r} of kind {kind!r}: input {key!r} must be a "
                                f"{expected.__name__}, not {type(value[key]).__name__}. Nothing was started.")


# What a person resumes by hand (``Journal.resume``): no worker takes these up by itself.
RESUMABLE = ("paused", "failed", "blocked", "escalated")


class Journal:
    """Workflows, steps and their append-only history in one SQLite file."""

    def __init__(self, path: str | Path, synchronous: str = "FULL", create: bool = True, read_only: bool = False):
        """Open the journal at ``path``; ``create=False`` refuses a missing or empty file, ``read_only`` never writes."""
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        self.conn = connect_read_only(self.path) if read_only else connect(self.path, self.synchronous, create=create)
        self.relaxing = False  # inside ``relaxed``: commits at NORMAL, synced by ``sync`` where needed
        self._log = None  # the write-ahead log opened for reading, for ``sync``; closed with its object

    @contextmanager
    def relaxed(self):
        """Inside the block the journal's connection commits at NORMAL; ``run_workflow`` runs replays so.

        A commit at NORMAL survives every process crash; a power loss can lose
        it. Inside the block the replay syncs (``sync``) every write that must
        outlive a power loss right after its commit, which is what FULL does
        after every commit, and leaves the rest unsynced: its grant, the
        *running* markers, and a completed replay's last write (the module
        docstring says why each may be lost). Nested blocks are one block.
        """
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
        """Put every commit made so far on disk, as a synced commit does: an fsync of the write-ahead log.

        What ``synchronous=FULL`` does after a commit, done only where it is
        needed (see ``relaxed``). A no-op for a journal at NORMAL or OFF, which
        has chosen to lose its last commits on a power loss.
        """
        if self.synchronous not in ("FULL", "EXTRA"):
            return
        if self._log is None:  # the log exists while a connection is open; SQLite takes no lock on it
            self._log = open(f"{self.path}-wal", "rb", buffering=0)
        (os.fdatasync if hasattr(os, "fdatasync") else os.fsync)(self._log.fileno())

    def close(self) -> None:
        """Close the journal's connection and its descriptor of the log (again is harmless)."""
        self.conn.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def start(self, kind: str, input: dict, workflow_id: str | None = None, retry_budget: int = 10,
              registered_elsewhere: bool = False) -> str:
        """Create a workflow in status ``pending`` and return its id; starting it again is a no-op.

        The same id with the same kind and input returns the existing workflow;
        with a different kind or input it raises ``WorkflowError`` and writes nothing.
        ``retry_budget`` caps the retries charged across all its steps: a whole
        number from 0 to ``MAX_RETRY_BUDGET``, else refused with nothing written.
        A kind no module in this process registered is refused (a misspelt kind
        would wait for ever), unless ``registered_elsewhere``: only the workers load it.
        """
        if kind not in WORKFLOWS and not registered_elsewhere:
            raise WorkflowError(
                f"no module in this process registered the workflow kind {kind!r} (known: {sorted(WORKFLOWS)}); "
                "nothing was started. Import the module that defines it, or pass registered_elsewhere=True if "
                "only the workers load it.")
        if workflow_id is not None and not workflow_id.strip():
            raise WorkflowError("a workflow id cannot be empty (an unset variable?): an empty id would start a new "
                                "task every time. Give the id, or leave it out for a random one. Nothing was started.")
        workflow_id = workflow_id or uuid.uuid4().hex[:12]
        check_input(kind, workflow_id, input)
        if not isinstance(retry_budget, int) or isinstance(retry_budget, bool) \
                or not 0 <= retry_budget <= MAX_RETRY_BUDGET:
            raise WorkflowError(f"workflow {workflow_id!r} of kind {kind!r}: retry_budget must be a whole number of "
                                f"retries from 0 to {MAX_RETRY_BUDGET}, not {retry_budget!r}. Give one in that range "
                                "(the default is 10). Nothing was started.")
        input_json = to_json(input, workflow_id, None, "workflow input")
        created = create_workflow(self.conn, workflow_id, kind, input_json, retry_budget, VERSIONS.get(kind),
                                  os.getpid())
        if not created:  # kind and input never change once written: no lock is needed to compare them
            row = self.conn.execute("SELECT kind, input FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
            if (row["kind"], row["input"]) != (kind, input_json):
                raise WorkflowError(
                    f"workflow {workflow_id!r} already exists as {row['kind']!r} with input {row['input']}; "
                    "a workflow id names one task for good: pick a new id for a different task."
                )
        return workflow_id

    def workflow(self, workflow_id: str) -> dict:
        """The workflow's row, with input and output decoded."""
        row = self.conn.execute("SELECT * FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
        if row is None:
            raise WorkflowError(f"no workflow {workflow_id!r} in {self.path.name}: start it first, or check the id.")
        return {**dict(row), "input": from_json(row["input"]), "output": from_json(row["output"])}

    def steps(self, workflow_id: str) -> list[dict]:
        """Every step of the workflow in the order it first started, outputs decoded."""
        rows = self.conn.execute(
            "SELECT * FROM steps WHERE workflow_id = ? ORDER BY started_at, name", (workflow_id,))
        return [{**dict(r), "input": from_json(r["input"]), "output": from_json(r["output"])} for r in rows]

    def history(self, workflow_id: str) -> list[dict]:
        """The workflow's events, oldest first, numbered from 1 (``seq``). For people to read; replay never uses it.

        Read from the ``timeline`` view: the history table's events and those
        the rows already record (the workflow's start and completion, each
        step's first attempt and its output), so no event is written twice.
        """
        rows = self.conn.execute("SELECT step, event, detail, pid, at FROM timeline WHERE workflow_id = ?"
                                 " ORDER BY after, derived, at", (workflow_id,))
        return [{"workflow_id": workflow_id, "seq": seq, **dict(r)} for seq, r in enumerate(rows, start=1)]

    def row_for_update(self, workflow_id: str):
        """Inside the caller's write transaction: the workflow's stored row, or ``WorkflowError`` naming the id."""
        row = self.conn.execute("SELECT * FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
        if row is None:
            raise WorkflowError(f"no workflow {workflow_id!r} in {self.path.name}; check the id.")
        return row

    def open(self, workflow_id: str, lease: Lease | None = None, heartbeat: Heartbeat | None = None) -> "Workflow":
        """Begin one replay under ``lease``: read the workflow and its completed outputs once.

        A lease already superseded is refused here (``LeaseLost``), before any
        of the workflow's code runs; every later write checks it again.
        """
        row = self.workflow(workflow_id)
        if lease is not None and row["fencing_token"] != lease.token:
            raise superseded(lease, row["fencing_token"])
        wf = Workflow(self, row, lease, heartbeat)
        if lease is None:  # a lease's grant marked it running; without one, the replay does
            wf.begin()
        return wf

    def resume(self, workflow_id: str, by: str) -> dict:
        """Make a *paused*, *failed*, *blocked* or *escalated* workflow pending again, so the next worker replays it.

        A replay reuses every completed step and retries the rest (a blocked
        one blocks again unless the new code replays its history). An
        escalated workflow's step gets one more attempt; if that fails the
        same way, it escalates again. The resume is recorded in the history
        (``workflow_resumed``, from which status, by whom). Any other status
        is refused with a ``WorkflowError`` and nothing changes. Returns the row.
        """
        with immediate(self.conn):
            row = self.row_for_update(workflow_id)
            if row["status"] not in RESUMABLE:
                raise WorkflowError(
                    f"workflow {workflow_id!r} is {row['status']!r}, not paused, failed, blocked or escalated; nothing "
                    "was changed. Only those are resumed by hand: the others resume by themselves, or are finished.")
            move(self.conn, workflow_id, "pending", {"next_run_at": now()})
            self._event(workflow_id, None, "workflow_resumed", f"from {row['status']} by {by}")
        return self.workflow(workflow_id)

    def purge(self, workflow_id: str) -> dict[str, int]:
        """Delete every row of one finished workflow, then rewrite the file; how many rows went, per table.

        What deletion can do in SQLite: the rows are gone from every query at
        once, but their bytes stay in the file's free pages and in the
        write-ahead log until overwritten. So purge then checkpoints the log
        (truncating it) and runs VACUUM, which rewrites the whole file. It
        cannot reach copies elsewhere: backups, the ledger and the
        destinations' own files beside the journal. Only a workflow in a
        final status can be purged; any other is refused and nothing changes.
        """
        with immediate(self.conn):
            row = self.row_for_update(workflow_id)
            if row["status"] not in FINAL_STATUSES:
                raise WorkflowError(f"workflow {workflow_id!r} is {row['status']!r}, not finished; only a finished "
                                    "workflow can be purged. Cancel it first. Nothing was changed.")
            counts = delete_workflow(self.conn, workflow_id)
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.execute("VACUUM")
        return counts

    def _event(self, workflow_id: str, step: str | None, event: str, detail: str | None = None) -> None:
        # Callers hold a transaction: the event commits with the state change it describes.
        append_event(self.conn, workflow_id, step, event, detail)


# A compensation is retried like a flaky call; it must happen, so once its tries are spent it pauses the
# workflow for a person (``Workflow._compensation_failed``), never ends it.
COMPENSATION_RETRY = RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=30.0)
COMPENSATION = "compensate:"  # a compensation's step name: this prefix and the name of the step it undoes

# What a workflow that ended while a cancellation was asked for did instead, by its final status.
ENDED_INSTEAD = {"complete": "completed", "escalated": "escalated", "stopped": "stopped", "rejected": "was rejected"}


def too_late(status: str, request: dict) -> str:
    """What ``status`` and ``history`` say of a cancellation that came after the workflow's last boundary."""
    return (f"{ENDED_INSTEAD.get(status, status)} before the cancellation took effect "
            f"(requested by {request['by']}: {request['reason']})")


def patch_input(position: int) -> str:
    """A patch decision's stored input: how many steps its replay had placed when it was decided (for ``fork``)."""
    return json.dumps({"after_position": position})


def divergence(recorded: dict[int, dict], position: int, name: str, input_json: str | None,
               wait: bool = False) -> str | None:
    """What differs between the journal's step or wait at ``position`` and the one the code asks for; None if nothing.

    Steps and waits share one order: a wait renamed, moved or removed after
    the workflow passed it diverges as a step does.
    """
    here = recorded.get(position)
    asked = "wait" if wait else "step"
    if here is None:
        elsewhere = next((p for p, r in recorded.items() if r["name"] == name), None)
        if elsewhere is not None:
            return (f"{asked} {name!r} is asked for at position {position}, but the journal recorded it at position "
                    f"{elsewhere} ({'steps and waits' if wait else 'steps'} reordered)")
        return None
    if here["name"] != name or here["wait"] != wait:
        later = any(p > position and r["name"] == name for p, r in recorded.items())
        earlier = any(p < position and r["name"] == name for p, r in recorded.items())
        if here["wait"] or wait:  # a wait is involved: say which is which
            why = "reordered" if earlier else "removed, or reordered" if later else "renamed, inserted or removed"
            return (f"at position {position} the journal recorded {'wait' if here['wait'] else 'step'} "
                    f"{here['name']!r}, but the code asked for {asked} {name!r} ({why})")
        why = ("steps reordered" if earlier else "a step removed, or steps reordered" if later
               else "a step renamed, inserted or removed")
        return (f"at position {position} the journal recorded step {here['name']!r}, but the code asked for "
                f"{name!r} ({why})")
    if here["status"] == "complete" and here["input"] != input_json:
        return (f"step {name!r} completed with input {here['input']}, but the code now gives {input_json} "
                "(its stored output belongs to the old input)")
    return None


def steps_left_over(recorded: dict[int, dict], last_position: int) -> str | None:
    """At the end of a replay: the completed steps and decided waits the code no longer asked for, or None."""
    left = [(p, r) for p, r in sorted(recorded.items())
            if p > last_position and r["status"] in ("complete", "resolved")]
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


class Workflow:
    """One replay of one workflow, from its first line.

    Attributes a workflow function may read: ``id``, ``kind``, ``input`` (the
    decoded input it was started with), ``db_path`` (the journal file, beside
    which the outside world keeps its own files) and ``fencing_token`` (the
    lease's token, for destinations that refuse a stale sender; None without
    a lease). ``conn`` is the journal's connection: workflow code never writes
    through it directly.
    """

    def __init__(self, journal: Journal, row: dict, lease: Lease | None = None, heartbeat: Heartbeat | None = None):
        self.journal, self.conn, self.lease, self.heartbeat = journal, journal.conn, lease, heartbeat
        self.id, self.kind, self.input = row["id"], row["kind"], row["input"]
        self.db_path, self.version = journal.path, row["version"]
        # One read per replay: every later lookup is a dictionary access.
        self._outputs, self._not_before, self._repairs, self._interrupted = {}, {}, {}, {}
        self._by_position: dict[int, dict] = {}  # what the journal recorded at each place in the order of steps
        self._position = 0  # how many steps this replay has placed so far
        self._compensations: list[tuple[str, Callable[[Any], Any], Any]] = []
        self._cancelling = False
        self.released = False  # set by the write that gave the lease up
        self._token_synced = False  # whether this replay's grant was put on disk (``fencing_token``)
        self._tracing = every_boundary()  # read once a replay: every boundary is reached while it is true
        self._thread = threading.get_ident()  # the thread that may use ``conn``
        self._recorded: set[str] = set()  # names with a row: a step without one starts by the first-attempt statement
        for r in self.conn.execute(RECORDED, (self.id,)):
            if r["position"] is not None:
                self._by_position[r["position"]] = {"name": r["name"], "status": r["status"], "input": r["input"],
                                                    "wait": r["wait"]}
            if r["wait"]:
                continue
            self._recorded.add(r["name"])
            if r["status"] == "complete":
                self._outputs[r["name"]] = r["output"]
                continue
            if r["status"] == "retrying":
                self._not_before[r["name"]] = r["next_attempt_at"]
            if r["status"] == "running":  # its last attempt's process died mid-step
                self._interrupted[r["name"]] = r["attempts"]
            if r["repair_message"] is not None:
                self._repairs[r["name"]] = r["repair_message"]
        if self._interrupted:  # attempts another owner took over ended, but not by a crash: they do not count
            for r in self.conn.execute(TAKEN_OVER_BY_STEP, (self.id,)):
                if r["step"] in self._interrupted:
                    self._interrupted[r["step"]] -= r["attempts"]
        self._names_seen: set[str] = set()
        self._reused: list[str] = []

    def secret(self, variable: str) -> str:
        """The value of environment variable ``variable``, redacted from everything written from now on.

        Secrets belong in the environment, never in a workflow's input: the
        journal keeps its input for good.
        """
        value = os.environ.get(variable)
        if not value:
            raise WorkflowError(f"workflow {self.id!r} needs the secret {variable!r}: set that environment variable "
                                "in the worker's environment (never in the workflow's input).")
        register_secret(value)
        return value

    @contextmanager
    def connection_here(self):
        """The journal's connection for the calling thread: ``conn`` on this replay's own thread.

        On another thread (an activity of a step with ``timeout``, a parallel
        branch) it is a connection of that thread's own, closed afterwards:
        an SQLite connection is used only by the thread that opened it.
        """
        if threading.get_ident() == self._thread:
            yield self.conn
            return
        conn = connect(self.db_path, create=False)
        try:
            yield conn
        finally:
            conn.close()

    @property
    def fencing_token(self) -> int | None:
        """This replay's lease token: send it to a destination that refuses tokens older than one it has seen.

        The grant that issued the token was committed at NORMAL, so the first
        read in a replay syncs the journal first (``Journal.sync``): a token
        that leaves this process is on disk, and no power loss hands it out again.
        """
        if self.lease is None:
            return None
        if not self._token_synced:
            self.journal.sync()
            self._token_synced = True
        return self.lease.token

    def execute_step(self, name: str, activity: Callable[[], Any], step_input: Any = None, *,
                     retry: RetryPolicy | None = None, repair: Callable[[str], Any] | None = None,
                     fallback: Callable[[], Any] | None = None, versions: dict | None = None,
                     compensate: Callable[[Any], Any] | None = None, timeout: float | None = None) -> Any:
        """Return the step's stored output, or run ``activity`` now and store its output.

        A completed step is found by its name at its position, with the same
        ``step_input`` (see below); its activity does not run. Otherwise the attempt is committed as
        *running*, the activity runs (at least once, counting crashes), and its
        output is committed before it is returned. The value returned is the
        stored JSON decoded, so the first run and every replay see the same value.

        Without ``retry`` a failure marks the step *failed* and is raised. With
        ``retry``, the failure's class picks the path (``retries.decide``): a
        durable retry schedule, escalation or stop, committed in the same
        transaction as the failed attempt. ``repair(message)`` gets one try
        after ``InvalidRequest`` or ``FormatFailure``, with the validation
        message; ``fallback()`` answers a ``FormatFailure`` that repair did not
        fix. The message is stored with the attempt, so a retry after a
        transient failure of the repair repeats the repair, not the request.
        An attempt whose process died counts too (``Crashed``): after
        ``retry.max_attempts`` such attempts, or ``CRASH_LIMIT`` without a
        policy, the step escalates instead of looping for ever. An attempt
        whose lease another owner took over while its process lived is not a
        crash and never counts (``leases.note_taken_over``).

        Every replay must ask for the same steps and waits in the same order,
        steps with the same inputs: a step or wait renamed, reordered, inserted
        or removed, or a completed step asked for with another input, blocks the workflow
        (``NonDeterminism``) before anything after it runs. ``versions``
        (prompt, model, policy, source) are recorded with the step.
        ``compensate(output)`` undoes a completed step if the workflow is
        cancelled (``change.cancel``; ``stop_if_cancelled`` says in what
        order). ``timeout`` fails an attempt that takes
        longer (``StepTimeout``, transient): the activity runs on a thread
        that cannot be stopped, so its late result is discarded but whatever
        it does meanwhile still happens (``send_guarded`` works on that thread).
        """
        self._claim_name(name)
        input_json = to_json(step_input, self.id, name, "step input")
        self._place(name, input_json)
        if name in self._outputs:
            self._reused.append(name)
            output = json.loads(self._outputs[name])
            self._remember(name, compensate, output)
            return output
        crash_policy = retry or CRASH_LIMIT
        if name in self._recorded:  # tried before: a cancellation, a retry time or attempts that died come first
            self.stop_if_cancelled()
            not_before = self._not_before.get(name)
            if not_before is not None and not_before > now():
                self._suspend_until(not_before, f"step {name!r} is not due yet")
            if self._interrupted.get(name, 0) >= crash_policy.max_attempts:  # the last one killed its process
                return self._after_failure(name, Crashed("the process died during the attempt"), crash_policy)

        versions_json = None if versions is None else to_json(versions, self.id, name, "step versions")
        run, repair_message = activity, self._repairs.get(name) if repair else None
        if repair_message is not None:  # an earlier replay chose repair: never resend the bad request
            run = partial(repair, repair_message)
        while True:
            armed = self._start_attempt(name, input_json, repair_message, versions_json)
            if armed is None:  # another process completed it since this replay began
                return self._adopt_recorded_output(name)
            try:
                output = self._run_attempt(name, run, armed, timeout)
            except Exception as error:
                if retry is not None and isinstance(error, (InvalidRequest, FormatFailure)) \
                        and repair and repair_message is None:
                    self._record_attempt_failure(name, error)
                    repair_message = str(error)
                    run = partial(repair, repair_message)
                    continue
                if retry is not None and isinstance(error, FormatFailure) and fallback:
                    self._record_attempt_failure(name, error)
                    run, fallback = fallback, None
                    continue
                return self._after_failure(name, error, retry)
            output = self._commit_output(name, output, armed)
            self._remember(name, compensate, output)
            return output

    def patched(self, name: str) -> bool:
        """True where new code may take its new path; False in a workflow that already went past this line.

        Wrap a change to a workflow's steps in ``if wf.patched("why"):``. A
        workflow that had recorded steps beyond this point before the change
        replays the old path; a new one takes the new path. The answer is
        recorded the first time, so every later replay agrees, and so does a
        fork taken past this line (``change.fork`` copies the answer).
        """
        key = f"patched:{name}"
        self._claim_name(key)
        if key in self._outputs:
            return json.loads(self._outputs[key])
        new_path = not any(position > self._position for position in self._by_position)
        with self.write():
            # Its input: how many steps came before it, for a fork (``change.fork``).
            inserted = record_step(self.conn, self.id, key, patch_input(self._position), json.dumps(new_path), None)
            if inserted:
                self.journal._event(self.id, key, "patch_decided", "new path" if new_path else "old path (replaying "
                                    "a history written before the change)")
        if not inserted:
            return self._adopt_recorded_output(key)
        self._outputs[key] = json.dumps(new_path)
        return new_path

    def _place(self, name: str, input_json: str | None, wait: bool = False) -> int:
        """Give the next step (or wait) its position; block the workflow if the journal recorded something else there."""
        self._position += 1
        problem = divergence(self._by_position, self._position, name, input_json, wait)
        if problem:
            self._block(problem)
        return self._position

    def _block(self, problem: str) -> None:
        message = (f"workflow {self.id!r}: non-deterministic replay: {problem}. Nothing after it ran. Deploy code "
                   "that replays the recorded history (for example behind wf.patched), then resume it, or fork it.")
        self._stop("blocked", {"error": redact(message)}, "workflow_blocked", problem)
        raise NonDeterminism(message)

    def _stop(self, status: str, columns: dict, event: str, detail: str) -> None:
        """The write that ends this replay: ``status`` with ``columns``, its history event, the lease given up.

        A final status reached while a cancellation was asked for says, in the same commit, that it came too late.
        """
        with self.write(last=True):
            row = move(self.conn, self.id, status, columns, returning="cancel_requested")
            self.journal._event(self.id, None, event, detail)
            if status in FINAL_STATUSES:
                self._report_late_cancellation(status, row)

    def _remember(self, name: str, compensate: Callable[[Any], Any] | None, output: Any) -> None:
        if compensate is not None:
            self._compensations.append((name, compensate, output))

    def at_frontier(self) -> bool:
        """True where this replay has gone past every step it recorded (its compensations aside): a new boundary."""
        return not any(position > self._position and not recorded["name"].startswith(COMPENSATION)
                       for position, recorded in self._by_position.items())

    def _cancel_instead_of_failing(self) -> None:
        """Where the code raised past every recorded step: a boundary too, so a cancellation asked for comes first.

        Every completed step was replayed, so every compensation is known;
        ``stop_if_cancelled`` then compensates and raises. Anywhere else
        (inside the recorded history, or while compensating) it does nothing.
        """
        if not self._cancelling and self.at_frontier():
            self.stop_if_cancelled()

    def stop_if_cancelled(self) -> None:
        """At a step boundary: if someone cancelled the workflow, compensate what it did and end it *cancelled*.

        Every compensation registered so far runs, newest first, each the
        durable step ``compensate:<step>``: a completed one is reused, so a
        replay after a crash or a retry continues where the last stopped. One
        that keeps failing pauses the workflow there (``_compensation_failed``)
        and no older one runs before it succeeds. In the commit that ends it
        *cancelled*, each outbox delivery of the workflow that no dispatcher
        has tried is withdrawn and never sent; one already tried may have
        reached its destination, so it stays pending and is sent again with
        its key, and the history says so.
        """
        if self._cancelling:
            return
        row = self.conn.execute("SELECT cancel_requested FROM workflows WHERE id = ?", (self.id,)).fetchone()
        if row["cancel_requested"] is None:
            return
        request = json.loads(row["cancel_requested"])
        self._cancelling = True
        undone = []
        for name, undo, output in reversed(self._compensations):  # newest first, each a durable step of its own
            self.execute_step(f"{COMPENSATION}{name}", partial(undo, output), {"undoes": name},
                              retry=COMPENSATION_RETRY)
            undone.append(name)
        reason = f"cancelled by {request['by']}: {request['reason']}"
        with self.write(last=True):
            move(self.conn, self.id, "cancelled", {"error": redact(reason), "next_run_at": None})
            said = reason + (f"; compensated {', '.join(undone)}" if undone else "; nothing to undo")
            withdrawn = [r["action"] for r in self.conn.execute(
                "UPDATE outbox SET status = 'withdrawn' WHERE workflow_id = ? AND status = 'pending'"
                " AND attempts = 0 RETURNING action", (self.id,))]
            tried = [r["action"] for r in self.conn.execute(
                "SELECT action FROM outbox WHERE workflow_id = ? AND status = 'pending' ORDER BY action", (self.id,))]
            if withdrawn:
                said += f"; withdrew the undelivered {', '.join(sorted(withdrawn))}"
            if tried:
                said += f"; already tried, so it may still arrive: {', '.join(tried)}"
            self.journal._event(self.id, None, "workflow_cancelled", said)
        raise Ended(f"workflow {self.id!r}: {reason}")

    def execute_parallel(self, branches: dict[str, Callable[[], Any]],
                         inputs: dict[str, Any] | None = None, max_threads: int = 4) -> dict[str, Any]:
        """Run independent steps at once; return each branch's output by name.

        Each branch is its own step with the same guarantees as
        ``execute_step``: completed branches are reused, the others start
        together (one commit marks them all *running*), run in threads, and
        each output is committed as soon as that branch finishes. A crash
        mid-fan-out therefore reruns only the branches not yet committed.
        A branch that raises is marked *failed*; the others still commit, then
        the first error is raised (no retry policy here: retry the whole
        fan-out from a later replay, which reuses what finished).
        Activities run in other threads: they must not touch ``wf.conn``
        (``send_guarded`` uses ``wf.connection_here()``), and anything else
        they write to SQLite needs a connection opened in that thread.
        """
        inputs = inputs or {}
        results: dict[str, Any] = {}
        inputs_json = {}
        for name in branches:
            self._claim_name(name)
            inputs_json[name] = to_json(inputs.get(name), self.id, name, "step input")
            self._place(name, inputs_json[name])
            if name in self._outputs:
                self._reused.append(name)
                results[name] = json.loads(self._outputs[name])
        to_run = {name: fn for name, fn in branches.items() if name not in results}
        if to_run:
            self.stop_if_cancelled()
            started = {}
            with self._write(synced=False, starting=True):
                self._write_reused()
                for name in to_run:
                    started[name] = self._start_in_transaction(name, inputs_json[name], None, None)
            for name, armed in started.items():
                if armed is None:  # another process completed it since this replay began
                    results[name] = self._adopt_recorded_output(name)
            first_error: Exception | None = None
            runnable = {name: to_run[name] for name in started if started[name] is not None}
            if any("next_step" in started[name] for name in runnable):
                boundary(self.conn, "next_step", self.id)
            with ThreadPoolExecutor(max_workers=max(1, min(max_threads, len(runnable)))) as pool:
                futures = {pool.submit(fn): name for name, fn in runnable.items()}
                for future in as_completed(futures):  # commit each branch as it finishes, in this thread
                    name = futures[future]
                    try:
                        output = self._encode_output(name, future.result(), started[name])
                    except Exception as error:
                        self._record_attempt_failure(name, error)
                        first_error = first_error or error
                        continue
                    results[name] = self._commit_output(name, output, started[name])
            if first_error is not None:
                raise first_error
        return {name: results[name] for name in branches}

    # --- what features built on the replay use (effects, waits), with ``at_frontier``, ``stop_if_cancelled`` and
    # ``let_go``: one name each ---

    def place(self, name: str, input_json: str | None = None, wait: bool = False) -> int:
        """Claim ``name`` for this replay and give it the next position; blocks the workflow if the journal differs."""
        self._claim_name(name)
        return self._place(name, input_json, wait)

    def reuse(self, name: str) -> bool:
        """True if ``name`` completed on an earlier run: its reuse is then recorded with this replay's next write."""
        if name not in self._outputs:
            return False
        self._reused.append(name)
        return True

    @contextmanager
    def write(self, last: bool = False):
        """A transaction under this replay's lease (a stale owner writes nothing), synced before the block returns.

        Pending reuse events are written first. ``last`` ends this replay and
        gives the lease up in the same commit; so does ``let_go`` inside it.
        """
        self._whole: dict[str, str] = {}
        with self._write(last=last) as conn:
            self._write_reused()
            yield conn
        self._outputs.update(self._whole)  # known to this replay once committed

    def record_step(self, name: str, position: int, input_json: str | None, output_json: str) -> None:
        """Inside ``write``: the step ``name`` recorded whole, *complete*, at ``position`` (an outbox step)."""
        record_step(self.conn, self.id, name, input_json, output_json, position, only_if_new=False)
        self._whole[name] = output_json

    @contextmanager
    def _write(self, synced: bool = True, starting: bool = False, last: bool = False):
        """A write transaction that first checks this replay's lease: a stale owner writes nothing.

        ``synced=False`` leaves the commit unsynced inside ``Journal.relaxed``
        (a marker, a completed replay's end); every other write is synced at
        the journal's level before the block returns. ``starting=True`` (the
        write that starts an attempt) also refuses when the lease has expired
        by the database's clock or the heartbeat gave up, so an owner that
        lost contact starts nothing new. ``last=True`` (the write that ends
        this replay) also gives the lease up, in the same commit.
        """
        with immediate(self.conn):
            self._fence(starting)
            yield self.conn
            if last:
                self.let_go(self.conn)
        if synced:
            self._synced()

    def _synced(self) -> None:
        # After a commit inside ``Journal.relaxed``: put it on disk now, as FULL would have.
        if self.journal.relaxing:
            self.journal.sync()

    def let_go(self, conn: sqlite3.Connection) -> None:
        """Inside a write (``write``): this replay stops here, and its lease is given up in the same commit."""
        if self.lease is not None:
            state.let_go(conn, self.id)
            self.released = True

    def _fence(self, starting: bool = False) -> None:
        if self.lease is None:
            return
        if starting and self.heartbeat is not None and self.heartbeat.gave_up:
            raise LeaseLost(f"workflow {self.id!r}: this process's heartbeat could not renew its lease "
                            f"(token {self.lease.token}); it starts no new attempt and nothing was written.")
        check_lease(self.conn, self.lease, live=starting)

    def _claim_name(self, name: str) -> None:
        if name in self._names_seen:
            raise WorkflowError(
                f"workflow {self.id!r}: step {name!r} was already executed in this run. Step and wait names "
                "identify them for good: give each call its own name (for example f'research:{subtopic}')."
            )
        self._names_seen.add(name)

    def wait_for_approval(self, name: str, request: Any, deadline: float | None = None) -> dict:
        """Stop until a person approves or rejects ``request``; return the decision.

        The decision is ``{"approved": bool, "by": str, "comment": str}``, saved
        by ``waits.approve`` or ``waits.reject`` naming this wait (the command
        line's ``--wait NAME``, the approval panel bound to it). No worker is
        held while the workflow waits. With ``deadline`` (seconds from when
        this line is first reached), whichever comes first wins for good: the
        decision, or the deadline, which returns ``{"timed_out": True, ...}``
        for the code to choose a path (remind, escalate, cancel).
        """
        return waits.wait_for(self, name, "approval", request, deadline=deadline)

    def ask(self, name: str, question: str, deadline: float | None = None) -> str | None:
        """Stop until a person answers ``question`` (``waits.answer``); the answer, or None past ``deadline``."""
        decision = waits.wait_for(self, name, "clarification", {"question": question}, deadline=deadline)
        return None if decision.get("timed_out") else decision["answer"]

    def sleep(self, name: str, seconds: float) -> None:
        """A durable timer: continue ``seconds`` after this line was first reached, in whatever process."""
        waits.wait_for(self, name, "timer", {"seconds": seconds}, seconds)

    def end(self, status: str, reason: str) -> None:
        """End the workflow here with a final ``status`` (rejected, stopped or escalated) and its reason."""
        if status not in ("rejected", "stopped", "escalated"):
            raise ValueError(f"end() takes 'rejected', 'stopped' or 'escalated', not {status!r}")
        self._stop(status, {"error": redact(reason)}, f"workflow_{status}", reason)
        raise Ended(f"workflow {self.id!r}: {status}: {reason}")

    def pause(self, reason: str, until: float | None = None) -> None:
        """Save the workflow as *paused* (a provider is down, a quota is spent) and stop this replay.

        With ``until`` (seconds since 1970) a worker resumes it from then on;
        without, it stays paused until a person calls ``Journal.resume``.
        Nothing is held meanwhile, and the replay that resumes it reuses every
        completed step.
        """
        self.stop_if_cancelled()
        with self.write(last=True):
            self._record_pause(reason, until)
        raise Suspended(f"workflow {self.id!r} paused: {reason}")

    def _record_pause(self, reason: str, until: float | None = None) -> None:
        # Inside the caller's write: status *paused* with its reason, and the event that says so.
        move(self.conn, self.id, "paused", {"error": redact(reason), "next_run_at": until})
        self.journal._event(self.id, None, "workflow_paused",
                            reason + ("" if until is None else f" (resumes in {max(0.0, until - now()):.0f} s)"))

    def _after_failure(self, name: str, error: Exception, retry: RetryPolicy | None) -> Any:
        """Commit the failed attempt and the path it takes in one transaction; raise accordingly.

        If the step completed meanwhile (an unfenced racer), that recorded
        output is returned instead: a failure never replaces an output.
        A compensation (while cancelling) is retried by its policy, and
        never ends the workflow: a failure that would escalate, stop or fail
        it pauses it instead (``_compensation_failed``).
        """
        with self.write() as conn:
            stuck = self._compensation_failed(name, error, retry) if self._cancelling else None
            decision = record_failure(conn, self.id, name, error, None if stuck else retry)
            if decision is not None and stuck:
                self._record_pause(stuck)
            if decision is not None and (stuck or decision.path != "fail"):  # a schedule, a pause or an end
                self.let_go(conn)
        boundary(self.conn, f"after_failure:{name}", self.id)
        if decision is None:
            return self._adopt_recorded_output(name)
        if stuck:
            raise Suspended(f"workflow {self.id!r} paused: {stuck}")
        if decision.path == "fail":
            raise error
        if decision.path == "retry":
            raise Suspended(f"workflow {self.id!r}, step {name!r}: retry scheduled in {decision.delay:g} s")
        raise Ended(f"workflow {self.id!r}, step {name!r}: {decision.reason}")

    def _compensation_failed(self, name: str, error: Exception, retry: RetryPolicy | None) -> str | None:
        """Inside the failure's write: None if this compensation's failure is retried, else why the workflow pauses.

        A compensation must happen, and the older ones may run only after it
        (newest first), so no failure of one ends the workflow: once its
        policy would not retry (its attempts or the retry budget spent, or a
        failure no retry answers), the workflow is *paused* for a person. A
        ``resume`` continues from this compensation; from then on each
        failed attempt pauses it again.
        """
        row = self.conn.execute(
            "SELECT s.attempts, w.retry_budget - w.retries_used AS budget_left FROM steps s"
            " JOIN workflows w ON w.id = s.workflow_id WHERE s.workflow_id = ? AND s.name = ?",
            (self.id, name)).fetchone()
        if row is None:
            return None
        policy = retry or COMPENSATION_RETRY
        decision = decide(error, row["attempts"], policy, row["budget_left"])
        if decision.path == "retry":
            return None
        why = (f"{type(error).__name__} on attempt {row['attempts']}, after a resume: {error}"
               if row["attempts"] > policy.max_attempts else decision.reason)
        return (f"cancelling: compensation {name!r} did not succeed ({why}); no older compensation runs before it "
                "does. Fix the cause, then resume it: it continues from this compensation.")

    def _record_attempt_failure(self, name: str, error: Exception) -> None:
        # A failure answered at once (by a repair or a fallback, or by failing the fan-out): no decision to take.
        with self._write():
            record_failure(self.conn, self.id, name, error, None)

    def _suspend_until(self, run_at: float, why: str) -> None:
        self._stop("pending", {"next_run_at": run_at}, "replay_suspended", why)
        raise Suspended(f"workflow {self.id!r}: {why}")

    def _run_attempt(self, name: str, activity: Callable[[], Any], armed: set[str],
                     timeout: float | None = None) -> tuple[str, Any]:
        """Run the activity of a started attempt; its output as JSON (not yet stored) and decoded."""
        if "next_step" in armed:
            boundary(self.conn, "next_step", self.id)
        result = activity() if timeout is None else within(timeout, activity, self.id, name)
        return self._encode_output(name, result, armed)

    def _encode_output(self, name: str, result: Any, armed: set[str]) -> tuple[str, Any]:
        """An activity's result as JSON (not yet stored) and decoded; then the ``after_activity`` point, if armed."""
        encoded = encode(result, self.id, name, "activity's output",
                         "The output was not stored; the step runs again on the next replay.")
        if armed and f"after_activity:{name}" in armed:
            boundary(self.conn, f"after_activity:{name}", self.id)
        return encoded

    def _start_attempt(self, name: str, input_json: str, repair_message: str | None,
                       versions_json: str | None = None) -> set[str] | None:
        """Mark the step *running* and count the attempt; the fault points armed for it.

        None if the step is already complete (then nothing was written). A
        step's first attempt is usually one statement (``_start_first_attempt``);
        any other attempt, and a first one that statement does not take, is a
        transaction that looks at each condition in turn (``_start_in_transaction``).
        """
        if self._start_first_attempt(name, input_json, repair_message, versions_json):
            return set()
        self.stop_if_cancelled()
        with self._write(synced=False, starting=True):
            self._write_reused()
            return self._start_in_transaction(name, input_json, repair_message, versions_json)

    def _start_first_attempt(self, name: str, input_json: str, repair_message: str | None,
                             versions_json: str | None) -> bool:
        """The usual first attempt as one statement at NORMAL: True if it wrote the step's *running* row.

        The statement itself checks what the transaction would: this replay's
        lease still current and not expired, no cancellation asked for, no
        fault armed, no row for the step yet. Where any of them fails
        it writes nothing and the transaction path decides. Its row records
        the attempt's start, process and place in the history (``timeline``).
        """
        if name in self._recorded or self._reused or self._tracing or (self.heartbeat and self.heartbeat.gave_up):
            return False
        started = write(self.conn, START_FIRST_ATTEMPT, (
            self.id, name, input_json, redact(repair_message), self._position, versions_json, now(), os.getpid(),
            None if self.lease is None else self.lease.token))
        if started:
            self._recorded.add(name)
        return bool(started)

    def _start_in_transaction(self, name: str, input_json: str, repair_message: str | None,
                              versions_json: str | None) -> set[str] | None:
        """Inside the marker's write: the attempt's row, its history event after the first, its armed points."""
        attempts = start_attempt(self.conn, self.id, name, input_json, redact(repair_message), self._position,
                                 versions_json, os.getpid())
        if attempts is None:
            return None
        self._recorded.add(name)
        if attempts > 1:  # the first attempt's start is in the row itself
            self.journal._event(self.id, name, "step_started", f"attempt {attempts}")
        points = ("next_step", f"after_activity:{name}", f"after_commit:{name}")
        if self._tracing:  # every boundary is tripped, so a clean run lists them all
            return set(points)
        # Read inside this transaction: a fault armed while the activity runs applies from the next step.
        return {row["point"] for row in self.conn.execute("SELECT point FROM faults WHERE point IN (?, ?, ?)",
                                                          points)}

    def _commit_output(self, name: str, output: tuple[str, Any], armed: set[str]) -> Any:
        """Commit the step's output (JSON, decoded) unless one is already recorded; return the recorded output.

        One statement that also checks this replay's token (``COMMIT_OUTPUT``),
        synced at the journal's level before the output is returned. If the
        statement writes nothing, the token is checked in a transaction
        (``LeaseLost`` if superseded) and the output some other process
        recorded first is returned.
        """
        output_json, decoded = output
        updated = write(self.conn, COMMIT_OUTPUT, (self.id, name, output_json, now(), os.getpid(),
                                                   None if self.lease is None else self.lease.token))
        if not updated:
            with self._write():
                pass
            return self._adopt_recorded_output(name)
        self._synced()
        if armed and f"after_commit:{name}" in armed:
            boundary(self.conn, f"after_commit:{name}", self.id)
        self._outputs[name] = output_json
        return decoded

    def _adopt_recorded_output(self, name: str) -> Any:
        # One recorded outcome per step: a later attempt returns the first outcome, never replaces it.
        output = self.conn.execute(
            "SELECT output FROM steps WHERE workflow_id = ? AND name = ?", (self.id, name)).fetchone()["output"]
        self._outputs[name] = output
        return json.loads(output)

    def _write_reused(self) -> None:
        # Reuse events are batched into the next write, so replay costs no commit per reused step.
        if self._reused:
            pid, at = os.getpid(), now()
            last = self.conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM history WHERE workflow_id = ?", (self.id,)).fetchone()[0]
            self.conn.executemany(
                "INSERT INTO history (workflow_id, seq, step, event, detail, pid, at)"
                " VALUES (?, ?, ?, 'step_reused', NULL, ?, ?)",
                [(self.id, last + i, name, pid, at) for i, name in enumerate(self._reused, start=1)])
            self._reused.clear()

    def begin(self) -> None:
        """Mark the workflow running and record that a replay started."""
        with self._write():
            move(self.conn, self.id, "running")
            self.journal._event(self.id, None, "replay_started", f"{len(self._outputs)} completed steps on record")

    def finish(self, output: Any) -> Any:
        """Commit the workflow's output and status ``complete`` and give the lease up; return the stored output.

        Not synced inside ``Journal.relaxed``: a replay computes the same
        output from the steps' synced outputs. Under a lease, with no reuse event
        pending, one statement (``COMPLETE``) that also checks the token.
        """
        output_json, decoded = encode(output, self.id, None, "workflow's output")
        problem = steps_left_over(self._by_position, self._position)
        if problem:
            self._block(problem)
        parameters = (self.id, output_json, now(), os.getpid())
        if self.lease is not None and not self._reused and write(self.conn, COMPLETE, (*parameters, self.lease.token)):
            self.released = True
            return decoded
        # Else a transaction: no lease, reuse events to write, the token moved on (LeaseLost) or a cancellation
        # came after the last boundary, which the history then reports.
        with self._write(synced=False, last=True):
            self._write_reused()
            late = self.conn.execute(f"{COMPLETE_IN_TRANSACTION} RETURNING cancel_requested", parameters).fetchone()
            self._report_late_cancellation("complete", late)
        return decoded

    def _report_late_cancellation(self, status: str, row) -> None:
        # Inside the write that ended the workflow: a cancellation asked for meanwhile took no effect; say so.
        if row is not None and row["cancel_requested"] is not None:
            self.journal._event(self.id, None, "cancel_too_late",
                                too_late(status, json.loads(row["cancel_requested"])))

    def fail(self, error: BaseException) -> None:
        """Commit status ``failed`` with the error (with any pending reuse events)."""
        self._stop("failed", {"error": redact(f"{type(error).__name__}: {error}")}, "workflow_failed",
                   f"{type(error).__name__}: {error}")


def run_workflow(journal: Journal, workflow_id: str, lease: Lease | None = None, fenced: bool = True,
                 take_over: bool = False) -> Any:
    """Replay the workflow from its first line as far as it can go; return its output, or None.

    A workflow in a final status returns its stored output without running;
    the status is read in the same transaction that grants the lease, so a
    final workflow is never run again. The replay runs under ``lease`` (a
    worker's), or else takes one itself (``leases.take``), whatever the
    workflow's other status, except from a live owner (running, its lease
    not expired, its process not gone): that is refused with ``LeaseHeld``
    and nothing changes, unless ``take_over``, whose new token fences that
    owner out and whose attempt is then not counted as a crash. A heartbeat
    renews the lease while the replay runs. ``fenced=False`` runs with no lease at all: the unsafe way,
    kept to show its failure.

    A replay that stops at a retry schedule, a wait, a pause or an end
    returns None: the database says why. So does a replay whose lease was
    lost (its refused write is recorded as ``stale_write_refused``). An
    exception from the workflow marks it ``failed`` and is raised again;
    ``Journal.resume`` resumes it. Where a cancellation was asked for and
    the exception came past every recorded step, the workflow compensates
    and ends *cancelled* instead (``Workflow._cancel_instead_of_failing``). A storage fault (locked, full, read-only)
    is raised without marking anything: the workflow resumes once the
    storage answers.
    """
    with journal.relaxed():  # each write that must outlive a power loss is synced by itself
        claimed, wf = lease, None  # a lease to give up at the end, fenced or not
        try:
            with immediate(journal.conn):  # read, check, grant and read the steps: one transaction
                row = journal.conn.execute("SELECT id, kind, input, status, version, fencing_token, output, owner,"
                                           f" lease_expires_at - {DB_NOW} AS lease_left FROM workflows WHERE id = ?",
                                           (workflow_id,)).fetchone()
                if row is None:
                    journal.row_for_update(workflow_id)  # the error that names the id
                if row["status"] in FINAL_STATUSES:
                    return from_json(row["output"])
                fn = WORKFLOWS.get(row["kind"])
                if fn is None:
                    raise WorkflowError(
                        f"workflow {workflow_id!r} is of kind {row['kind']!r}, which no imported module registered; "
                        f"known kinds: {sorted(WORKFLOWS)}. Import the module that defines it (or pass --module FILE).")
                if not fenced:
                    lease = None
                elif lease is None:  # unsynced: the token is synced before it leaves (Workflow.fencing_token)
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
                            wf._cancel_instead_of_failing()
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
                except sqlite3.Error:  # storage fault: the lease expires by itself
                    pass
    return output
