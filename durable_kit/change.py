"""Floor 8: change and time. Versions, the determinism check, cancellation, step timeouts and forks.

A durable workflow outlives the code that started it. Replay is only safe if
the new code asks for the same steps and waits, in the same order, steps with
the same inputs, as the journal recorded; so every replay checks each step's
and wait's name at its position and, for a completed step, its input, and
blocks the workflow at the
first difference, before anything after it runs (``Workflow._place``). A
change that must reach running workflows goes behind ``Workflow.patched``.

The other ways a long task changes course: a person cancels it (its completed
effects are undone by their compensations, newest first, each a durable step
of its own; one that keeps failing pauses the workflow before any older one
runs, and ``resume`` continues from it); a step takes too long
(``StepTimeout``); a fixed prompt is tried again from a given step (``fork``,
which follows the original's recorded decisions up to that step), leaving
the original untouched.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import threading
from typing import TYPE_CHECKING, Any, Callable

from .errors import WorkflowError
from .core.leases import FINAL_STATUSES
from .core.retries import RetryPolicy, Transient
from .core.store import append_event, from_json, immediate, now, to_json

if TYPE_CHECKING:
    from .core.journal import Journal

# A compensation is retried like a flaky call; it must happen, so once its tries are spent it pauses the
# workflow for a person (``Workflow._compensation_failed``), never ends it.
COMPENSATION_RETRY = RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=30.0)


class StepTimeout(Transient):
    """An attempt took longer than its step's ``timeout``; its late result is discarded."""


def source_version(fn: Callable) -> str:
    """A version for code that names none: ``src-`` and the first 12 hex digits of a hash of its source."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):  # defined where no source file is kept: fall back to its compiled code
        source = repr(fn.__code__.co_code)
    return "src-" + hashlib.sha256(source.encode()).hexdigest()[:12]


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


def within(seconds: float, activity: Callable[[], Any], workflow_id: str, step: str) -> Any:
    """Run ``activity`` on a thread and wait at most ``seconds``; raise ``StepTimeout`` if it is not done.

    What a timeout cannot do: stop the thread. A late activity keeps running
    in this process and anything it sends meanwhile is still sent; only its
    result is thrown away. Only ending the process stops it.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = activity()
        except BaseException as error:  # handed to the caller's thread below
            outcome["error"] = error

    thread = threading.Thread(target=run, name=f"{workflow_id}:{step}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise StepTimeout(f"workflow {workflow_id!r}, step {step!r}: no result after {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


COMPENSATION = "compensate:"  # a compensation's step name: this prefix and the name of the step it undoes

# What a workflow that ended while a cancellation was asked for did instead, by its final status.
ENDED_INSTEAD = {"complete": "completed", "escalated": "escalated", "stopped": "stopped", "rejected": "was rejected"}


def too_late(status: str, request: dict) -> str:
    """What ``status`` and ``history`` say of a cancellation that came after the workflow's last boundary."""
    return (f"{ENDED_INSTEAD.get(status, status)} before the cancellation took effect "
            f"(requested by {request['by']}: {request['reason']})")


def cancel(journal: "Journal", workflow_id: str, by: str, reason: str) -> dict:
    """Ask a workflow to stop at its next step boundary and compensate; return its row.

    Cooperative: a running replay stops before its next new step or wait
    (a wait already decided counts, where no later step was recorded, and
    so does an error its code raises past its recorded steps), so an
    activity already running finishes first; a workflow whose code has
    no boundary left completes, and its history and ``status`` say it
    completed before the cancellation took effect. A waiting, pending,
    paused or failed workflow is made runnable so that a worker runs its
    compensations. Who and why are recorded. A final workflow is refused,
    and so is a blocked one (its compensations come from code that replays
    its history, which it does not have); either way nothing changes.
    Cancelling again keeps the first request. An outbox delivery of the
    workflow that no dispatcher has tried is withdrawn and never sent; one
    already tried may have reached its destination, so it stays pending and
    is sent again with its key, and the history says so.
    """
    if not by.strip() or not reason.strip():
        raise WorkflowError(f"workflow {workflow_id!r}: say who cancels and why; nothing was changed.")
    with immediate(journal.conn):
        row = journal.row_for_update(workflow_id)
        if row["status"] in FINAL_STATUSES:
            raise WorkflowError(f"workflow {workflow_id!r} is already {row['status']}; nothing was changed.")
        if row["status"] == "blocked":
            raise WorkflowError(
                f"workflow {workflow_id!r} is blocked: its code no longer replays its recorded history, so the "
                "compensations of its steps cannot be found. Deploy code that replays it (for example behind "
                "wf.patched), resume it, then cancel it. Nothing was changed.")
        if row["cancel_requested"] is None:
            request = to_json({"by": by, "reason": reason}, workflow_id, None, "cancellation")
            journal.conn.execute(
                "UPDATE workflows SET cancel_requested = ?, updated_at = ?,"
                " status = CASE status WHEN 'running' THEN 'running' ELSE 'pending' END,"
                " next_run_at = CASE status WHEN 'running' THEN next_run_at ELSE ? END WHERE id = ?",
                (request, now(), now(), workflow_id))
            append_event(journal.conn, workflow_id, None, "cancel_requested", f"by {by}: {reason}")
    return journal.workflow(workflow_id)


def patch_input(position: int) -> str:
    """A patch decision's stored input: how many steps its replay had placed when it was decided (for ``fork``)."""
    return json.dumps({"after_position": position})


def fork(journal: "Journal", workflow_id: str, new_id: str, up_to: str, by: str, versions: dict[str, str],
         input: dict | None = None) -> str:
    """Start ``new_id`` from ``workflow_id``'s journal: its completed steps up to and including ``up_to``.

    The new workflow reuses those outputs and the decisions recorded before
    that step: people's decisions, ended timers and deadlines, and the patch
    decisions (``wf.patched``) taken before it, so its replay follows the
    original's path. An outbox step (``send_via_outbox``) up to and including
    ``up_to`` is reused with its delivery: its key stays the original's and
    nothing is sent again; while that delivery is not sent yet the fork is
    refused and nothing changes. The fork records its origin and the code
    version it starts under, and runs every later step again, under its own
    id: its effects carry its own keys, so an effect the original already
    made is made again. The original is not touched. ``input`` replaces the input.
    """
    conn = journal.conn
    with immediate(conn):
        original = journal.row_for_update(workflow_id)
        if conn.execute("SELECT 1 FROM workflows WHERE id = ?", (new_id,)).fetchone():
            raise WorkflowError(f"workflow {new_id!r} already exists; pick a new id for the fork. Nothing was changed.")
        last = conn.execute("SELECT position, completed_at FROM steps WHERE workflow_id = ? AND name = ?"
                            " AND status = 'complete' AND position IS NOT NULL", (workflow_id, up_to)).fetchone()
        if last is None:
            done = [r["name"] for r in conn.execute(
                "SELECT name FROM steps WHERE workflow_id = ? AND status = 'complete' AND position IS NOT NULL"
                " ORDER BY position", (workflow_id,))]
            raise WorkflowError(f"workflow {workflow_id!r} has no completed step {up_to!r} to fork from; "
                                f"its completed steps, in order: {done}. Nothing was changed.")
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
        conn.execute("INSERT INTO workflows (id, kind, input, status, retry_budget, version, origin, created_at,"
                     " updated_at) VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?)",
                     (new_id, original["kind"], input_json, original["retry_budget"],
                      versions.get(original["kind"], original["version"]), origin, now(), now()))
        copied = conn.execute(
            "INSERT INTO steps (workflow_id, name, status, input, output, attempts, position, versions, started_at,"
            " completed_at) SELECT ?, name, status, input, output, 0, position, versions, started_at, completed_at"
            " FROM steps WHERE workflow_id = ? AND status = 'complete' AND position IS NOT NULL AND position <= ?",
            (new_id, workflow_id, last["position"])).rowcount
        # Patch decisions taken before the fork point (one recorded before their input said where: by time).
        conn.execute(
            "INSERT INTO steps (workflow_id, name, status, input, output, attempts, started_at, completed_at)"
            " SELECT ?, name, status, input, output, 0, started_at, completed_at FROM steps"
            " WHERE workflow_id = ? AND status = 'complete' AND position IS NULL AND name LIKE 'patched:%'"
            "   AND COALESCE(json_extract(input, '$.after_position') < ?, completed_at <= ?)",
            (new_id, workflow_id, last["position"], last["completed_at"]))
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


def describe_origin(origin_json: str | None) -> str | None:
    """``forked from W up to STEP`` for a forked workflow's ``origin``, or None."""
    origin = from_json(origin_json)
    return origin and f"forked from {origin['workflow']} up to {origin['up_to']}"
