"""Floor 2: the step journal. Workflows and steps with durable identities, and replay.

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
"""
from __future__ import annotations

import json
import os
import uuid
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Callable

from .faults import trip
from .leases import Heartbeat, Lease, LeaseLost, check, grant, new_owner, release
from .retries import Crashed, FormatFailure, InvalidRequest, RetryPolicy, decide_and_record
from .store import append_event, connect, from_json, immediate, now, to_json

WORKFLOWS: dict[str, Callable[["Workflow"], Any]] = {}


class WorkflowError(RuntimeError):
    """A workflow or step was used in a way the journal cannot honour; nothing was written."""


class Suspended(BaseException):
    """This replay stops here; the database already says when the workflow may run again.

    A BaseException, like KeyboardInterrupt, so that workflow code catching
    ``Exception`` lets it pass.
    """


class Ended(BaseException):
    """The workflow reached a final status other than *complete*; the status is already committed."""


def workflow(kind: str) -> Callable:
    """Register a workflow function under ``kind`` so any process can run it by name."""
    def register(fn: Callable[["Workflow"], Any]) -> Callable[["Workflow"], Any]:
        WORKFLOWS[kind] = fn
        return fn
    return register


class Journal:
    """Workflows, steps and their append-only history in one SQLite file."""

    def __init__(self, path: str | Path, synchronous: str = "FULL"):
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        self.conn = connect(self.path, self.synchronous)

    @contextmanager
    def marker_transaction(self):
        """A ``BEGIN IMMEDIATE`` transaction for a *running* marker, synced at most at NORMAL.

        A marker only counts attempts and fills the history. Committed at NORMAL
        it survives every process crash; a power loss can lose it, costing one
        attempt count, never an output: the next FULL commit syncs the log up to
        and including it, and outputs are always committed at the configured level.
        """
        relax = self.synchronous in ("FULL", "EXTRA")
        if relax:
            self.conn.execute("PRAGMA synchronous = NORMAL")
        try:
            with immediate(self.conn):
                yield self.conn
        finally:
            if relax:
                self.conn.execute(f"PRAGMA synchronous = {self.synchronous}")

    def start(self, kind: str, input: dict, workflow_id: str | None = None, retry_budget: int = 10) -> str:
        """Create a workflow in status ``pending`` and return its id; starting it again is a no-op.

        The same id with the same kind and input returns the existing workflow;
        with a different kind or input it raises ``WorkflowError`` and writes nothing.
        ``retry_budget`` caps the retries charged across all its steps.
        """
        workflow_id = workflow_id or uuid.uuid4().hex[:12]
        input_json = to_json(input, workflow_id, None, "workflow input")
        with immediate(self.conn):
            row = self.conn.execute("SELECT kind, input FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
            if row is not None:
                if (row["kind"], row["input"]) != (kind, input_json):
                    raise WorkflowError(
                        f"workflow {workflow_id!r} already exists as {row['kind']!r} with input {row['input']}; "
                        "a workflow id names one task for good: pick a new id for a different task."
                    )
                return workflow_id
            self.conn.execute(
                "INSERT INTO workflows (id, kind, input, status, retry_budget, created_at, updated_at)"
                " VALUES (?, ?, ?, 'pending', ?, ?, ?)",
                (workflow_id, kind, input_json, retry_budget, now(), now()),
            )
            self._event(workflow_id, None, "workflow_created", kind)
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
        """The workflow's events, oldest first. For people to read; replay never uses it."""
        rows = self.conn.execute("SELECT * FROM history WHERE workflow_id = ? ORDER BY seq", (workflow_id,))
        return [dict(r) for r in rows]

    def open(self, workflow_id: str, lease: Lease | None = None) -> "Workflow":
        """Begin one replay under ``lease``: read the workflow and its completed outputs once."""
        return Workflow(self, self.workflow(workflow_id), lease)

    def _event(self, workflow_id: str, step: str | None, event: str, detail: str | None = None) -> None:
        # Callers hold a transaction: the event commits with the state change it describes.
        append_event(self.conn, workflow_id, step, event, detail)


class Workflow:
    """One replay of one workflow, from its first line."""

    def __init__(self, journal: Journal, row: dict, lease: Lease | None = None):
        self.journal, self.conn, self.lease = journal, journal.conn, lease
        self.id, self.kind, self.input, self.status = row["id"], row["kind"], row["input"], row["status"]
        self.db_path = journal.path
        # One read per replay: every later lookup is a dictionary access.
        self._outputs, self._not_before, self._repairs, self._interrupted = {}, {}, {}, {}
        for r in self.conn.execute("SELECT name, status, output, attempts, next_attempt_at, repair_message"
                                   " FROM steps WHERE workflow_id = ?", (self.id,)):
            if r["status"] == "complete":
                self._outputs[r["name"]] = r["output"]
                continue
            if r["status"] == "retrying":
                self._not_before[r["name"]] = r["next_attempt_at"]
            if r["status"] == "running":  # its last attempt's process died mid-step
                self._interrupted[r["name"]] = r["attempts"]
            if r["repair_message"] is not None:
                self._repairs[r["name"]] = r["repair_message"]
        self._names_seen: set[str] = set()
        self._reused: list[str] = []

    def execute_step(self, name: str, activity: Callable[[], Any], step_input: Any = None, *,
                     retry: RetryPolicy | None = None, repair: Callable[[str], Any] | None = None,
                     fallback: Callable[[], Any] | None = None) -> Any:
        """Return the step's stored output, or run ``activity`` now and store its output.

        A completed step is found by name alone: its activity does not run and
        ``step_input`` is not compared. Otherwise the attempt is committed as
        *running*, the activity runs (at least once, counting crashes), and its
        output is committed before it is returned. The value returned is the
        stored JSON decoded, so the first run and every replay see the same value.

        Without ``retry`` a failure marks the step *failed* and is raised. With
        ``retry``, the failure's class picks the path (``retries.decide``): a
        durable retry schedule, escalation or stop. ``repair(message)`` gets one
        try after ``InvalidRequest`` or ``FormatFailure``, with the validation
        message; ``fallback()`` answers a ``FormatFailure`` that repair did not fix.
        An attempt whose process died counts against ``max_attempts`` too
        (``Crashed``), so a step that always kills its process escalates.
        The message is stored with the attempt, so a retry after a transient
        failure of the repair repeats the repair, not the request that was wrong.
        """
        self._claim_name(name)
        if name in self._outputs:
            self._reused.append(name)
            return json.loads(self._outputs[name])
        not_before = self._not_before.get(name)
        if not_before is not None and not_before > now():
            self._suspend_until(not_before, f"step {name!r} is not due yet")

        attempts_used = self._interrupted.get(name, 0)
        if retry is not None and attempts_used >= retry.max_attempts:  # the last one killed its process
            self._decide_after_failure(
                name, Crashed("the process died during the attempt"), retry)

        input_json = to_json(step_input, self.id, name, "step input")
        run, repair_message = activity, self._repairs.get(name) if repair else None
        if repair_message is not None:  # an earlier replay chose repair: never resend the bad request
            run = partial(repair, repair_message)
        while True:
            try:
                return self._attempt(name, run, input_json, repair_message)
            except Exception as error:
                if retry is None:
                    raise
                if isinstance(error, (InvalidRequest, FormatFailure)) and repair and repair_message is None:
                    repair_message = str(error)
                    run = partial(repair, repair_message)
                    continue
                if isinstance(error, FormatFailure) and fallback:
                    run, fallback = fallback, None
                    continue
                self._decide_after_failure(name, error, retry)

    @contextmanager
    def _write(self, marker: bool = False):
        """A write transaction that first checks this replay's lease: a stale owner writes nothing."""
        with self.journal.marker_transaction() if marker else immediate(self.conn):
            self._fence()
            yield self.conn

    def _fence(self) -> None:
        if self.lease is not None:
            check(self.conn, self.lease)

    def _claim_name(self, name: str) -> None:
        if name in self._names_seen:
            raise WorkflowError(
                f"workflow {self.id!r}: step {name!r} was already executed in this run. Step and wait names "
                "identify them for good: give each call its own name (for example f'research:{subtopic}')."
            )
        self._names_seen.add(name)

    def wait_for_approval(self, name: str, request: Any) -> dict:
        """Stop until a person approves or rejects ``request``; return the decision.

        The decision is ``{"approved": bool, "by": str, "comment": str}``, saved
        by ``waits.approve`` or ``waits.reject`` (the command line and the
        approval panel call them). No worker is held while the workflow waits.
        """
        from .waits import wait_for
        return wait_for(self, name, "approval", request)

    def ask(self, name: str, question: str) -> str:
        """Stop until a person answers ``question`` (``waits.answer``); return the answer."""
        from .waits import wait_for
        return wait_for(self, name, "clarification", {"question": question})["answer"]

    def sleep(self, name: str, seconds: float) -> None:
        """A durable timer: continue ``seconds`` after this line was first reached, in whatever process."""
        from .waits import wait_for
        wait_for(self, name, "timer", {"seconds": seconds}, seconds)

    def end(self, status: str, reason: str) -> None:
        """End the workflow here with a final ``status`` (rejected, stopped or escalated) and its reason."""
        if status not in ("rejected", "stopped", "escalated"):
            raise ValueError(f"end() takes 'rejected', 'stopped' or 'escalated', not {status!r}")
        with self._write():
            self._write_reused()
            self.conn.execute("UPDATE workflows SET status = ?, error = ?, updated_at = ? WHERE id = ?",
                              (status, reason, now(), self.id))
            self.journal._event(self.id, None, f"workflow_{status}", reason)
        raise Ended(f"workflow {self.id!r}: {status}: {reason}")

    def _decide_after_failure(self, name: str, error: Exception, retry: RetryPolicy) -> None:
        decision = decide_and_record(self.conn, self.id, name, error, retry, fence=self._fence)
        if decision.path == "fail":
            raise error
        if decision.path == "retry":
            raise Suspended(f"workflow {self.id!r}, step {name!r}: retry scheduled in {decision.delay:g} s")
        raise Ended(f"workflow {self.id!r}, step {name!r}: {decision.reason}")

    def _suspend_until(self, run_at: float, why: str) -> None:
        with self._write():
            self._write_reused()
            self.conn.execute("UPDATE workflows SET status = 'pending', next_run_at = ?, updated_at = ? WHERE id = ?",
                              (run_at, now(), self.id))
            self.journal._event(self.id, None, "replay_suspended", why)
        raise Suspended(f"workflow {self.id!r}: {why}")

    def _attempt(self, name: str, activity: Callable[[], Any], input_json: str,
                 repair_message: str | None = None) -> Any:
        """One attempt: commit a running marker, run the activity, commit its output."""
        with self._write(marker=True):
            self._write_reused()
            attempt = self.conn.execute(
                "INSERT INTO steps (workflow_id, name, status, input, attempts, repair_message, started_at)"
                " VALUES (?, ?, 'running', ?, 1, ?, ?)"
                " ON CONFLICT (workflow_id, name) DO UPDATE SET status = 'running', input = excluded.input,"
                "   attempts = attempts + 1, error = NULL, next_attempt_at = NULL,"
                "   repair_message = excluded.repair_message WHERE status != 'complete'"
                " RETURNING attempts",
                (self.id, name, input_json, repair_message, now()),
            ).fetchone()
            if attempt is None:  # another process completed it since this replay began
                return self._adopt_recorded_output(name)
            self.journal._event(self.id, name, "step_started", f"attempt {attempt['attempts']}")
            # Read inside this transaction: a fault armed while the activity runs applies from the next step.
            armed = {row["point"] for row in self.conn.execute(
                "SELECT point FROM faults WHERE point IN ('next_step', ?, ?)",
                (f"after_activity:{name}", f"after_commit:{name}"))}

        try:
            if "next_step" in armed:
                trip(self.conn, "next_step", self.id)
            output_json = to_json(activity(), self.id, name, "activity's output",
                                  "The output was not stored; the step runs again on the next replay.")
        except Exception as exc:
            with self._write():
                self.conn.execute(
                    "UPDATE steps SET status = 'failed', error = ? WHERE workflow_id = ? AND name = ?",
                    (f"{type(exc).__name__}: {exc}", self.id, name))
                self.journal._event(self.id, name, "step_failed", f"{type(exc).__name__}: {exc}")
            raise
        if f"after_activity:{name}" in armed:
            trip(self.conn, f"after_activity:{name}", self.id)

        with self._write():
            updated = self.conn.execute(
                "UPDATE steps SET status = 'complete', output = ?, completed_at = ?"
                " WHERE workflow_id = ? AND name = ? AND status != 'complete'",
                (output_json, now(), self.id, name),
            ).rowcount
            if not updated:
                return self._adopt_recorded_output(name)
            self.journal._event(self.id, name, "step_completed")
        if f"after_commit:{name}" in armed:
            trip(self.conn, f"after_commit:{name}", self.id)
        self._outputs[name] = output_json
        return json.loads(output_json)

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
            self.conn.execute(
                "UPDATE workflows SET status = 'running', updated_at = ? WHERE id = ?", (now(), self.id))
            self.journal._event(self.id, None, "replay_started", f"{len(self._outputs)} completed steps on record")

    def finish(self, output: Any) -> None:
        """Commit the workflow's output and status ``complete`` (with any pending reuse events)."""
        output_json = to_json(output, self.id, None, "workflow's output")
        with self._write():
            self._write_reused()
            self.conn.execute(
                "UPDATE workflows SET status = 'complete', output = ?, error = NULL, updated_at = ? WHERE id = ?",
                (output_json, now(), self.id))
            self.journal._event(self.id, None, "workflow_completed")

    def fail(self, error: BaseException) -> None:
        """Commit status ``failed`` with the error (with any pending reuse events)."""
        with self._write():
            self._write_reused()
            self.conn.execute(
                "UPDATE workflows SET status = 'failed', error = ?, updated_at = ? WHERE id = ?",
                (f"{type(error).__name__}: {error}", now(), self.id))
            self.journal._event(self.id, None, "workflow_failed", f"{type(error).__name__}: {error}")


FINAL_STATUSES = ("complete", "escalated", "stopped", "rejected")


def run_workflow(journal: Journal, workflow_id: str, lease: Lease | None = None, fenced: bool = True) -> Any:
    """Replay the workflow from its first line as far as it can go; return its output, or None.

    A workflow in a final status returns its stored output without running.
    The replay runs under ``lease`` (a worker's), or else takes one itself,
    whatever the workflow's status, fencing out any other owner; a heartbeat
    renews it while the replay runs. ``fenced=False`` runs with no lease at
    all: the unsafe way, kept to show its failure.

    A replay that stops at a retry schedule, a wait, an escalation or an end
    returns None: the database says why. So does a replay whose lease was
    taken over (its refused write is recorded as ``stale_write_refused``). An
    exception from the workflow marks it ``failed`` and is raised again; a
    later replay resumes it.
    """
    row = journal.workflow(workflow_id)
    if row["status"] in FINAL_STATUSES:
        return row["output"]
    fn = WORKFLOWS.get(row["kind"])
    if fn is None:
        raise WorkflowError(
            f"workflow {workflow_id!r} is of kind {row['kind']!r}, which no imported module registered; "
            f"known kinds: {sorted(WORKFLOWS)}. Import the module that defines it (or pass --module FILE)."
        )
    claimed = lease  # released at the end, fenced or not
    if not fenced:
        lease = None
    elif lease is None:
        lease = claimed = grant(journal.conn, workflow_id, new_owner(), only_if_due=False)
    try:
        with Heartbeat(journal.path, lease) if lease else nullcontext():
            wf = journal.open(workflow_id, lease)
            wf.begin()
            try:
                output = fn(wf)
            except (Suspended, Ended):
                return None
            except Exception as exc:
                wf.fail(exc)
                raise
            wf.finish(output)
    except LeaseLost as lost:
        with immediate(journal.conn):
            append_event(journal.conn, workflow_id, None, "stale_write_refused", str(lost))
        return None
    finally:
        if claimed:
            release(journal.conn, claimed)
    return json.loads(to_json(output, workflow_id, None, "workflow's output"))
