"""A feature on the engine: a long task changes course. New code behind a patch, a cancellation, a fork, a
step's time limit.

``patched`` lets new code take a new path where no history says otherwise;
its answer is recorded, so every replay agrees. A cancellation is
cooperative: the workflow stops at its next step boundary and its completed
steps are undone by their compensations, newest first, each a durable step
of its own; one that keeps failing pauses the workflow before any older one
runs, and ``resume`` continues from it, through the engine's extension points
(``EXTENSIONS`` in ``core/journal.py``). A fork tries a fixed prompt again
from a given step: a new workflow that follows the original's recorded
decisions up to that step, leaving the original untouched. ``time_limit``
fails an attempt that takes too long, but cannot stop it. The determinism
check and deadlines are the engine's (``core/journal.py``, ``core/waits.py``).
"""
from __future__ import annotations

import json
import math
import threading
import weakref
from functools import partial
from typing import Any, Callable

from .errors import Ended, WorkflowError, check_text
from .core.journal import EXTENSIONS, VERSIONS, Journal, Workflow
from .core import state
from .core.retries import RetryPolicy, Transient, decide
from .core.store import append_event, immediate, to_json
from .redact import redact

# A compensation is retried like a flaky call; it must happen, so once its tries are spent it pauses the
# workflow for a person (``compensation_failed``), never ends it.
COMPENSATION_RETRY = RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=30.0)
COMPENSATION = "compensate:"  # a compensation's step name: this prefix and the name of the step it undoes

# What a workflow that ended while a cancellation was asked for did instead, by its final status.
ENDED_INSTEAD = {"complete": "completed", "escalated": "escalated", "stopped": "stopped", "rejected": "was rejected"}

_CANCELLING: "weakref.WeakSet" = weakref.WeakSet()  # the replays running their compensations


def too_late(status: str, request: dict) -> str:
    """What the history and ``status`` say of a cancellation that came after the workflow's last boundary."""
    return (f"{ENDED_INSTEAD.get(status, status)} before the cancellation took effect "
            f"(requested by {request['by']}: {request['reason']})")


def patched(wf: Workflow, name: str) -> bool:
    """True where new code may take its new path; False in a workflow that had recorded steps past this line.

    Wrap a change in ``if patched(wf, "why"):``. The answer is recorded the first time, so every later replay
    agrees, and so does a fork taken past this line (``fork`` copies it).
    """
    key = f"patched:{name}"
    wf.claim(key)
    if wf.completed(key):
        return wf.output(key)
    new_path = not wf.recorded_after()
    with wf.write():  # its input says how many steps came before it, for a fork
        inserted = state.record_step(wf.conn, wf.id, key, json.dumps({"after_position": wf.position}),
                                     json.dumps(new_path), None)
        if inserted:
            append_event(wf.conn, wf.id, key, "patch_decided",
                         "new path" if new_path else "old path (replaying a history written before the change)")
    return new_path if inserted else wf.recorded_output(key)


class StepTimeout(Transient):
    """An attempt took longer than its ``time_limit``; its late result is discarded."""


def time_limit(seconds: float, activity: Callable[[], Any]) -> Callable[[], Any]:
    """``activity``, failing with ``StepTimeout`` (transient: a retry may try again) after ``seconds`` without a result.

    Give it to ``execute_step`` as the activity. A time limit cannot stop the attempt's thread: a late activity
    runs on, and what it sends is still sent.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
        raise ValueError(f"time_limit: seconds must be a finite number above 0, not {seconds!r}")

    def limited() -> Any:
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = activity()
            except BaseException as error:  # handed to the attempt's thread below
                outcome["error"] = error

        thread = threading.Thread(target=run, name="time-limited activity", daemon=True)
        thread.start()
        thread.join(seconds)
        if thread.is_alive():
            raise StepTimeout(f"no result after {seconds:g} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]
    return limited


def stop_if_cancelled(wf, new: bool = True) -> None:
    """At a step boundary: if someone cancelled the workflow, compensate what it did and end it *cancelled*.

    Where the replay passed a decided wait or its code raised (not ``new``), only if nothing but
    compensations was recorded after this point. Every compensation registered so far runs, newest first,
    each the durable step ``compensate:<step>`` (a completed one is reused). In the commit that ends it
    *cancelled*, each outbox delivery no dispatcher has tried is withdrawn and never sent; one already tried
    may have reached its destination, so it stays pending and is sent again with its key, and the history
    says so.
    """
    if wf in _CANCELLING or not new and any(not n.startswith(COMPENSATION) for n in wf.recorded_after()):
        return
    request = _request(wf)
    if request is None:
        return
    _CANCELLING.add(wf)
    undone = []
    for name, undo, output in reversed(wf.compensations):  # newest first, each a durable step of its own
        wf.execute_step(f"{COMPENSATION}{name}", partial(undo, output), {"undoes": name}, retry=COMPENSATION_RETRY)
        undone.append(name)
    reason = f"cancelled by {request['by']}: {request['reason']}"
    with wf.write(last=True):
        state.move(wf.conn, wf.id, "cancelled", {"error": redact(reason), "next_run_at": None})
        said = reason + (f"; compensated {', '.join(undone)}" if undone else "; nothing to undo")
        withdrawn = [r["action"] for r in wf.conn.execute(
            "UPDATE outbox SET status = 'withdrawn' WHERE workflow_id = ? AND status = 'pending'"
            " AND attempts = 0 RETURNING action", (wf.id,))]
        tried = [r["action"] for r in wf.conn.execute(
            "SELECT action FROM outbox WHERE workflow_id = ? AND status = 'pending' ORDER BY action", (wf.id,))]
        if withdrawn:
            said += f"; withdrew the undelivered {', '.join(sorted(withdrawn))}"
        if tried:
            said += f"; already tried, so it may still arrive: {', '.join(tried)}"
        append_event(wf.conn, wf.id, None, "workflow_cancelled", said)
    raise Ended(f"workflow {wf.id!r}: {reason}")


def compensation_failed(wf, name: str, error: Exception, retry: RetryPolicy | None) -> str | None:
    """Inside a failed compensation's write: None if it is retried, else why the workflow pauses.

    A compensation must happen, and older ones run only after it, so no failure of one ends the workflow:
    once its policy would not retry, the workflow is *paused* for a person. A ``resume`` continues from this
    compensation; from then on each failed attempt pauses it again.
    """
    if wf not in _CANCELLING:
        return None
    row = wf.conn.execute(
        "SELECT s.attempts, w.retry_budget - w.retries_used AS budget_left FROM steps s"
        " JOIN workflows w ON w.id = s.workflow_id WHERE s.workflow_id = ? AND s.name = ?", (wf.id, name)).fetchone()
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


def report_too_late(wf, status: str) -> None:
    """Inside the write that ended the workflow: a cancellation asked for meanwhile took no effect; say so."""
    request = _request(wf)
    if request is not None:
        append_event(wf.conn, wf.id, None, "cancel_too_late", too_late(status, request))


def _request(wf) -> dict | None:
    # The cancellation asked for (who and why), or None.
    row = wf.conn.execute("SELECT cancel_requested FROM workflows WHERE id = ?", (wf.id,)).fetchone()
    return None if row["cancel_requested"] is None else json.loads(row["cancel_requested"])


EXTENSIONS["boundary"].append(stop_if_cancelled)
EXTENSIONS["failed"].append(compensation_failed)
EXTENSIONS["ended"].append(report_too_late)


def cancel(journal: Journal, workflow_id: str, by: str, reason: str) -> dict:
    """Ask a workflow to stop at its next step boundary and compensate; return its row.

    Cooperative: a running replay stops before its next new step or wait
    (a wait already decided counts, where no later step was recorded, and
    so does an error its code raises past its recorded steps), so an
    activity already running finishes first; a workflow whose code has
    no boundary left completes, and its history and ``status`` say it
    completed before the cancellation took effect. A waiting, pending,
    paused, failed or escalated workflow is made runnable so that a worker
    runs its compensations (an escalated one is how a person gives it up).
    Who and why are recorded. Any other final workflow is refused,
    and so is a blocked one (its compensations come from code that replays
    its history, which it does not have); either way nothing changes.
    Cancelling again keeps the first request. An outbox delivery of the
    workflow that no dispatcher has tried is withdrawn and never sent; one
    already tried may have reached its destination, so it stays pending and
    is sent again with its key, and the history says so.
    """
    for value, what in ((by, "who cancels"), (reason, "the reason")):
        check_text(value, what, f"workflow {workflow_id!r}")
    if not by.strip() or not reason.strip():
        raise WorkflowError(f"workflow {workflow_id!r}: say who cancels and why; nothing was changed.")
    with immediate(journal.conn):
        row = journal.row_for_update(workflow_id)
        if row["status"] in state.FINAL_STATUSES and row["status"] != "escalated":
            raise WorkflowError(f"workflow {workflow_id!r} is already {row['status']}; nothing was changed.")
        if row["status"] == "blocked":
            raise WorkflowError(
                f"workflow {workflow_id!r} is blocked: its code no longer replays its recorded history, so the "
                "compensations of its steps cannot be found. Deploy code that replays it (for example behind "
                "patched), resume it, then cancel it. Nothing was changed.")
        if row["cancel_requested"] is None:
            request = to_json({"by": by, "reason": reason}, workflow_id, None, "cancellation")
            state.request_cancel(journal.conn, workflow_id, request, running=row["status"] == "running")
            append_event(journal.conn, workflow_id, None, "cancel_requested", f"by {by}: {reason}")
    return journal.workflow(workflow_id)


def fork(journal: Journal, workflow_id: str, new_id: str, up_to: str, by: str, input: dict | None = None) -> str:
    """Start ``new_id`` from ``workflow_id``'s journal: its completed steps up to and including ``up_to``.

    The new workflow reuses those outputs and the decisions recorded before
    that step: people's decisions, ended timers and deadlines, and the patch
    decisions (``patched``) taken before it, so its replay follows the
    original's path. An outbox step (``send_via_outbox``) up to and including
    ``up_to`` is reused with its delivery: its key stays the original's and
    nothing is sent again; while that delivery is not sent yet the fork is
    refused and nothing changes. The fork records its origin and the code
    version it starts under, and runs every later step again, under its own
    id: its effects carry its own keys, so an effect the original already
    made is made again. The original is not touched. ``input`` replaces the input.
    A fork never reuses an output a compensation undid: up to a step of a
    cancelled workflow that a compensation undid (or up to a compensation)
    it is refused, and nothing changes.
    """
    for value, what in ((new_id, "the new id"), (up_to, "the step to fork up to"), (by, "who forks it")):
        if not check_text(value, what, f"workflow {workflow_id!r}").strip():
            raise WorkflowError(f"workflow {workflow_id!r}: {what} is empty; give it. Nothing was changed.")
    conn = journal.conn
    with immediate(conn):
        original = journal.row_for_update(workflow_id)
        if conn.execute("SELECT 1 FROM workflows WHERE id = ?", (new_id,)).fetchone():
            raise WorkflowError(f"workflow {new_id!r} already exists; pick a new id for the fork. Nothing was changed.")
        last = conn.execute("SELECT position, completed_at FROM steps WHERE workflow_id = ? AND name = ?"
                            " AND status = 'complete' AND position IS NOT NULL", (workflow_id, up_to)).fetchone()
        if up_to.startswith(COMPENSATION):
            raise WorkflowError(
                f"workflow {workflow_id!r}: {up_to!r} is a compensation, not a step a fork can continue from. Fork up "
                f"to a step before {up_to[len(COMPENSATION):]!r} (the fork runs it again), or start a new workflow. "
                "Nothing was changed.")
        if last is None:
            done = [r["name"] for r in conn.execute(
                "SELECT name FROM steps WHERE workflow_id = ? AND status = 'complete' AND position IS NOT NULL"
                " ORDER BY position", (workflow_id,))]
            raise WorkflowError(f"workflow {workflow_id!r} has no completed step {up_to!r} to fork from; "
                                f"its completed steps, in order: {done}. Nothing was changed.")
        undone = conn.execute(  # a compensation recorded at all (even one not finished) may have undone its step
            "SELECT s.name FROM steps s WHERE s.workflow_id = ?1 AND s.position <= ?2 AND EXISTS (SELECT 1 FROM steps c"
            f"   WHERE c.workflow_id = ?1 AND c.name = '{COMPENSATION}' || s.name) ORDER BY s.position LIMIT 1",
            (workflow_id, last["position"])).fetchone()
        if undone is not None:
            raise WorkflowError(
                f"workflow {workflow_id!r}: step {undone['name']!r} was undone by its compensation "
                f"({COMPENSATION}{undone['name']}), so a fork up to {up_to!r} would reuse an output that no longer "
                f"holds. Fork up to a step before {undone['name']!r} (the fork runs it again), or start a new "
                "workflow. Nothing was changed.")
        undelivered = conn.execute(
            "SELECT o.action, o.key, o.status FROM outbox o"
            " JOIN steps s ON s.workflow_id = o.workflow_id AND s.name = o.action"
            " WHERE o.workflow_id = ? AND s.position <= ? AND NOT EXISTS (SELECT 1 FROM waits w"
            "   WHERE w.workflow_id = o.workflow_id AND w.name = o.action || ':receipt' AND w.status = 'resolved')"
            " ORDER BY s.position LIMIT 1", (workflow_id, last["position"])).fetchone()
        if undelivered is not None:
            action = undelivered["action"]
            if undelivered["status"] == "withdrawn":
                raise WorkflowError(
                    f"workflow {workflow_id!r}: the outbox delivery of step {action!r} (key {undelivered['key']}) was "
                    f"withdrawn by its cancellation and will never be sent. Fork up to a step before {action!r} (the "
                    f"fork then sends its own). Nothing was changed.")
            raise WorkflowError(
                f"workflow {workflow_id!r}: the outbox delivery of step {action!r} (key {undelivered['key']}) is not "
                f"sent yet, so a fork up to {up_to!r} would wait for it for ever. Fork once a worker has sent it, or "
                f"up to a step before {action!r} (the fork then sends its own). Nothing was changed.")
        input_json = original["input"] if input is None else to_json(input, new_id, None, "workflow input")
        origin = json.dumps({"workflow": workflow_id, "up_to": up_to, "by": by})
        state.create_workflow(conn, new_id, original["kind"], input_json, original["retry_budget"],
                              VERSIONS.get(original["kind"], original["version"]), origin=origin)
        copied = state.copy_steps(conn, workflow_id, new_id, last["position"], last["completed_at"])
        # Decisions and timers resolved before the fork point (by place; one recorded before waits had a place:
        # by time), and the receipt of every outbox step copied above.
        conn.execute(
            "INSERT INTO waits (workflow_id, name, kind, request, status, decision, wake_at, created_at, resolved_at,"
            " position) SELECT ?1, name, kind, request, status, decision, wake_at, created_at, resolved_at, position"
            " FROM waits w WHERE workflow_id = ?2 AND status = 'resolved'"
            "   AND (COALESCE(position <= ?3, resolved_at <= ?4) OR kind = 'delivery' AND EXISTS (SELECT 1 FROM steps s"
            "     WHERE s.workflow_id = ?2 AND s.name || ':receipt' = w.name AND s.status = 'complete'"
            "     AND s.position <= ?3))",
            (new_id, workflow_id, last["position"], last["completed_at"]))
        append_event(conn, new_id, None, "workflow_forked",
                     f"from {workflow_id} up to {up_to} by {by}: {copied} completed steps reused")
    return new_id
