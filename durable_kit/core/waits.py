"""The engine: waiting for people and for time, with no worker held.

A wait is a row. When a replay reaches ``wait_for``, the row says what the
workflow waits for (an approval, an answer, a time), the workflow's status
becomes *waiting*, and the replay stops: no process sleeps until a person
answers, for minutes or for days.

A decision (``approve``, ``reject``, ``answer``) names the wait it answers
and is saved in the same transaction that makes the workflow runnable again,
so a worker can never run it without the decision. The next replay finds the
decision and goes on. Decisions are final: the same decision again on the
same wait returns the first one and saves nothing; a different one is
refused. A decision that names no wait is taken only while the workflow has
had exactly one wait of that kind, so a repeated click or command can never
land on a later wait that nobody has looked at.

A timer uses the same row: its end is computed once, when the workflow first
reaches it, and stored, so every replay agrees on it.
"""
from __future__ import annotations

import json
import time
from typing import Any

from ..errors import Suspended, WorkflowError
from . import state
from .store import append_event, boundary, from_json, immediate, now, to_json

KINDS = ("approval", "clarification", "timer", "delivery")


class NotWaiting(WorkflowError):
    """The workflow is not waiting for this kind of decision; nothing was changed."""


class DecisionConflict(WorkflowError):
    """A different decision was already saved; decisions are final and nothing was changed."""


class WhichWait(WorkflowError):
    """The decision names no wait and the workflow has had several of that kind; nothing was changed."""


def wait_for(wf, name: str, kind: str, request: Any = None, seconds: float | None = None,
             deadline: float | None = None) -> Any:
    """Return the saved decision of wait ``name``, or save the wait and stop this replay.

    Called by ``Workflow.wait_for_approval``, ``Workflow.ask`` and
    ``Workflow.sleep``. For an approval or a clarification the workflow
    becomes *waiting* with no run time: only a decision makes it runnable,
    or, with a ``deadline``, the deadline: whichever comes first is saved for
    good (``{"timed_out": True, "deadline": ...}`` for the deadline). For a
    timer it becomes *waiting* until ``now + seconds``. Either time is fixed
    the first time the line is reached, so every replay agrees on it. A
    deadline or a timer's seconds that is not a finite number from 0 to 100
    years is refused (``check_seconds``) before the wait is saved.
    A wait is a step boundary (``Workflow.at_boundary``): before it waits,
    and, not as a new one, before a saved decision is returned.
    """
    if kind not in KINDS:
        raise ValueError(f"a wait's kind is one of {KINDS}, not {kind!r}")
    check_seconds(wf.id, name, "timer's seconds" if kind == "timer" else "deadline",
                  seconds if kind == "timer" else deadline, optional=kind != "timer")
    position = wf.place(name, None, wait=True)  # steps and waits share one order, checked on every replay
    conn = wf.conn
    select = "SELECT * FROM waits WHERE workflow_id = ? AND name = ?"
    row = _check_kind(wf, name, kind, conn.execute(select, (wf.id, name)).fetchone())
    if row is not None and row["status"] == "resolved":  # a decision never changes: no lock needed
        wf.at_boundary(new=False)
        return from_json(row["decision"])
    wf.at_boundary()
    request_json = to_json(request, wf.id, name, f"{kind} request")
    after = seconds if kind == "timer" else deadline

    with wf.write():  # the reuse events pending come first
        row = conn.execute(select, (wf.id, name)).fetchone()  # again, under the lock: a decision may have landed
        if row is not None and row["status"] == "resolved":
            return from_json(row["decision"])
        if row is None:
            wake_at = None if after is None else now() + after
            conn.execute("INSERT INTO waits (workflow_id, name, kind, request, status, wake_at, created_at, position)"
                         " VALUES (?, ?, ?, ?, 'waiting', ?, ?, ?)",
                         (wf.id, name, kind, request_json, wake_at, now(), position))
            append_event(conn, wf.id, name, f"waiting_for_{kind}", None if after is None else f"for {after:g} s")
        else:
            wake_at = row["wake_at"]  # fixed when first reached: a replay never moves it
        if wake_at is not None and wake_at <= now():
            decision = None if kind == "timer" else {"timed_out": True, "deadline": wake_at}
            _resolve_at_time(conn, wf.id, name, kind, decision)
            return decision
        state.move(conn, wf.id, "waiting", {"next_run_at": wake_at})
        wf.let_go(conn)  # this replay stops here: no worker is held while it waits
    boundary(conn, f"after_wait:{name}", wf.id)
    raise Suspended(f"workflow {wf.id!r} waits for {kind} {name!r}")


MAX_SECONDS = 3_155_760_000  # 100 years: the longest timer or deadline, so every time stays a date


def check_seconds(workflow_id: str, name: str, what: str, value: Any, optional: bool) -> None:
    """Raise ``WorkflowError`` unless ``value`` is a finite number of seconds from 0 to ``MAX_SECONDS``.

    Checked before the wait is saved: NaN, an infinity or a time past any date
    is refused, and nothing about the wait is written.
    """
    if value is None and optional:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not 0 <= value <= MAX_SECONDS:  # NaN fails every comparison
        raise WorkflowError(
            f"workflow {workflow_id!r}, wait {name!r}: the {what} must be a finite number of seconds from 0 to "
            f"{MAX_SECONDS} (100 years), not {value!r}. Give a number in that range"
            + (", or no deadline at all" if optional else "") + ", then `resume` it.")


def _resolve_at_time(conn, workflow_id: str, name: str, kind: str, decision: dict | None) -> None:
    # Inside the caller's transaction: a timer's end or a decision's deadline has come.
    conn.execute("UPDATE waits SET status = 'resolved', decision = ?, resolved_at = ? WHERE workflow_id = ? AND name = ?",
                 (json.dumps(decision), now(), workflow_id, name))
    append_event(conn, workflow_id, name, "timer_fired" if kind == "timer" else "deadline_passed")


def _check_kind(wf, name: str, kind: str, row):
    if row is not None and row["kind"] != kind:
        raise WorkflowError(
            f"workflow {wf.id!r}: wait {name!r} was saved with kind {row['kind']!r}, not {kind!r}. "
            "Wait names identify waits for good: give this one its own name.")
    return row


def approve(journal, workflow_id: str, by: str, comment: str = "", wait: str | None = None) -> dict:
    """Approve the approval wait ``wait`` and make the workflow runnable; return the decision (see ``_decide``)."""
    return _decide(journal, workflow_id, wait, "approval", {"approved": True, "by": by, "comment": comment}, "approved")


def reject(journal, workflow_id: str, by: str, comment: str = "", wait: str | None = None) -> dict:
    """Reject the approval wait ``wait`` and make the workflow runnable; return the decision (see ``_decide``)."""
    return _decide(journal, workflow_id, wait, "approval", {"approved": False, "by": by, "comment": comment},
                   "approved")


def answer(journal, workflow_id: str, text: str, by: str, wait: str | None = None) -> dict:
    """Answer the question ``wait`` and make the workflow runnable; return the decision (see ``_decide``)."""
    if not text.strip():
        raise WorkflowError(f"workflow {workflow_id!r}: the answer is empty; write the answer, then submit.")
    return _decide(journal, workflow_id, wait, "clarification", {"answer": text, "by": by}, "answer")


def _decide(journal, workflow_id: str, wait: str | None, kind: str, decision: dict,
            deciding_field: str) -> dict:
    """Save ``decision`` on one wait; return it with ``wait``, ``saved`` and ``decided_at``.

    ``saved`` is False when the wait was already decided the same way: the
    first decision is returned and nothing is written. A different decision
    raises ``DecisionConflict``; a wait not reached yet raises ``NotWaiting``;
    no ``wait`` while the workflow has had several of this kind raises ``WhichWait``.
    """
    # Read-then-write in one BEGIN IMMEDIATE: two people deciding at once cannot both win.
    if not decision["by"].strip():
        raise WorkflowError(f"workflow {workflow_id!r}: say who decides (a name); nothing was changed.")
    conn = journal.conn
    with immediate(conn):
        workflow = journal.row_for_update(workflow_id)
        name = wait if wait is not None else _only_wait(conn, workflow_id, kind, workflow["status"])
        row = conn.execute("SELECT * FROM waits WHERE workflow_id = ? AND name = ?", (workflow_id, name)).fetchone()
        if row is not None and row["status"] == "waiting" and row["wake_at"] is not None and row["wake_at"] <= now():
            row = {**dict(row), "status": "resolved",  # the deadline came first; the next replay records it
                   "decision": json.dumps({"timed_out": True, "deadline": row["wake_at"]})}
        if row is None or row["kind"] != kind:
            raise NotWaiting(
                f"workflow {workflow_id!r} has no {kind} wait named {name!r} (its status is {workflow['status']!r}); "
                f"nothing was changed. Run `status` to see what it waits for, or try again once it reaches {name!r}.")
        if row["status"] == "resolved":
            first = from_json(row["decision"])
            if first.get("timed_out"):
                raise DecisionConflict(
                    f"workflow {workflow_id!r}, wait {name!r}: its deadline passed at {_utc(first['deadline'])}, "
                    "before this decision; "
                    "the workflow went on without it and nothing was saved.")
            if first[deciding_field] != decision[deciding_field]:
                raise DecisionConflict(
                    f"workflow {workflow_id!r}, wait {name!r}: {_describe(first)} was already saved and is final; "
                    "nothing was changed. Start a new workflow to decide differently.")
            return {**first, "wait": name, "saved": False, "decided_at": row["resolved_at"]}
        decision_json = to_json(decision, workflow_id, name, f"{kind} decision")
        decided_at = now()
        conn.execute("UPDATE waits SET status = 'resolved', decision = ?, resolved_at = ?"
                     " WHERE workflow_id = ? AND name = ?", (decision_json, decided_at, workflow_id, name))
        # Runnable now. A replay already running (a manual `run`) finds the decision under the lock instead.
        state.wake(conn, workflow_id)
        append_event(conn, workflow_id, name, _event_name(decision), _describe(decision))
    return {**decision, "wait": name, "saved": True, "decided_at": decided_at}


def _only_wait(conn, workflow_id: str, kind: str, status: str) -> str:
    # Unambiguous only while the workflow has had exactly one wait of this kind, open or decided.
    rows = conn.execute("SELECT name, status, decision FROM waits WHERE workflow_id = ? AND kind = ?"
                        " ORDER BY created_at, name", (workflow_id, kind)).fetchall()
    if not rows:
        raise NotWaiting(
            f"workflow {workflow_id!r} is not waiting for {kind} (its status is {status!r}); nothing was changed. "
            f"Run `status` to see what it waits for, or try again once it reaches the {kind} wait.")
    if len(rows) > 1:
        seen = "; ".join(f"{r['name']!r}: " + ("open" if r["status"] == "waiting" else _describe(from_json(r["decision"])))
                         for r in rows)
        raise WhichWait(
            f"workflow {workflow_id!r} has had {len(rows)} {kind} waits ({seen}); name the one you decide "
            "(--wait NAME); nothing was changed.")
    return rows[0]["name"]


def describe_outcome(workflow_id: str, result: dict) -> str:
    """One line for a person: what was saved, or that an earlier identical decision stands and nothing was saved."""
    decided = {k: v for k, v in result.items() if k not in ("wait", "saved", "decided_at")}
    if result["saved"]:
        return f"{workflow_id}, wait {result['wait']!r}: saved: {_describe(decided)}"
    return (f"{workflow_id}, wait {result['wait']!r}: already {_event_name(decided)} by {decided['by']} "
            f"at {_utc(result['decided_at'])}; nothing saved")


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _event_name(decision: dict) -> str:
    if "answer" in decision:
        return "answered"
    return "approved" if decision["approved"] else "rejected"


def _describe(decision: dict) -> str:
    if decision.get("timed_out"):
        return "no decision before the deadline"
    said = f": {decision['comment']}" if decision.get("comment") else ""
    if "answer" in decision:
        return f"answered by {decision['by']}: {decision['answer']}"
    return f"{_event_name(decision)} by {decision['by']}{said}"


def waits(journal, workflow_id: str) -> list[dict]:
    """The workflow's waits, oldest first, request and decision decoded."""
    rows = journal.conn.execute("SELECT * FROM waits WHERE workflow_id = ? ORDER BY created_at, name", (workflow_id,))
    return [{**dict(r), "request": from_json(r["request"]), "decision": from_json(r["decision"])} for r in rows]


def open_wait(journal, workflow_id: str) -> dict | None:
    """What the workflow waits for now (its open wait), or None."""
    return next((w for w in waits(journal, workflow_id) if w["status"] == "waiting"), None)


def named_wait(journal, workflow_id: str, name: str) -> dict | None:
    """One wait of the workflow by name, request and decision decoded; None if it was not reached yet."""
    return next((w for w in waits(journal, workflow_id) if w["name"] == name), None)
