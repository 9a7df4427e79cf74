"""A feature on the engine: a person decides a wait. Approvals, rejections and answers.

A decision names the wait it answers and is saved in the transaction that
makes the workflow runnable, so no worker runs it without the decision.
Decisions are final: the same one again saves nothing, a different one is
refused. A decision on an open wait of a finished workflow, or of one being
cancelled, is refused and saves nothing. A decision that names no wait is
taken only while the workflow has had exactly one wait of that kind. What
comes back is the decision as stored, secrets redacted. The waiting itself is
the engine's (``core/waits.py``).
"""
from __future__ import annotations

import json
import time

from .core import state
from .core.store import append_event, encode, from_json, immediate, now
from .errors import WorkflowError, check_text


class NotWaiting(WorkflowError):
    """The workflow is not waiting for this kind of decision; nothing was changed."""


class DecisionConflict(WorkflowError):
    """A different decision was already saved; decisions are final and nothing was changed."""


class WhichWait(WorkflowError):
    """The decision names no wait and the workflow has had several of that kind; nothing was changed."""


def approve(journal, workflow_id: str, by: str, comment: str = "", wait: str | None = None) -> dict:
    """Approve the approval wait ``wait`` and make the workflow runnable; the decision (see ``decide_wait``)."""
    return decide_wait(journal, workflow_id, wait, "approval", {"approved": True, "by": by, "comment": comment})


def reject(journal, workflow_id: str, by: str, comment: str = "", wait: str | None = None) -> dict:
    """Reject the approval wait ``wait`` and make the workflow runnable; the decision (see ``decide_wait``)."""
    return decide_wait(journal, workflow_id, wait, "approval", {"approved": False, "by": by, "comment": comment})


def answer(journal, workflow_id: str, text: str, by: str, wait: str | None = None) -> dict:
    """Answer the question ``wait`` and make the workflow runnable; the decision (see ``decide_wait``)."""
    if not check_text(text, "the answer", f"workflow {workflow_id!r}").strip():
        raise WorkflowError(f"workflow {workflow_id!r}: the answer is empty; write the answer, then submit.")
    return decide_wait(journal, workflow_id, wait, "clarification", {"answer": text, "by": by})


def decide_wait(journal, workflow_id: str, wait: str | None, kind: str, decision: dict) -> dict:
    """Save ``decision`` on one wait, in one ``BEGIN IMMEDIATE``; return it as stored (secrets redacted) with
    ``wait``, ``saved`` and ``decided_at``.

    The same decision again returns the first with ``saved`` False and writes nothing. Refused, changing
    nothing: a different decision or one after the deadline (``DecisionConflict``), a wait not reached, or an
    open wait of a finished workflow or of one being cancelled (``NotWaiting``), no ``wait`` named while the
    workflow has had several of this kind (``WhichWait``).
    """
    where = f"workflow {workflow_id!r}" + ("" if wait is None else f", wait {wait!r}")
    for what in ("by", "comment"):
        if what in decision:
            check_text(decision[what], f"the decision's {what!r}", where)
    if not decision["by"].strip():
        raise WorkflowError(f"workflow {workflow_id!r}: say who decides (a name); nothing was changed.")
    deciding = "answer" if kind == "clarification" else "approved"
    conn = journal.conn
    with immediate(conn):
        workflow = journal.row_for_update(workflow_id)
        status = workflow["status"]
        name = wait if wait is not None else _only_wait(conn, workflow_id, kind, status)
        row = conn.execute("SELECT * FROM waits WHERE workflow_id = ? AND name = ?", (workflow_id, name)).fetchone()
        if row is not None and row["status"] == "waiting" and row["wake_at"] is not None and row["wake_at"] <= now():
            row = {**dict(row), "status": "resolved",  # the deadline came first; the next replay records it
                   "decision": json.dumps({"timed_out": True, "deadline": row["wake_at"]})}
        if row is None or row["kind"] != kind:
            raise NotWaiting(
                f"workflow {workflow_id!r} has no {kind} wait named {name!r} (its status is {status!r}); nothing "
                f"was changed. Run `status` to see what it waits for, or try again once it reaches {name!r}.")
        if row["status"] == "waiting" and status in state.FINAL_STATUSES:
            raise NotWaiting(f"workflow {workflow_id!r} is {status} and its wait {name!r} was never decided; nothing "
                             "was saved. A finished workflow takes no decision: start a new workflow to decide again.")
        if row["status"] == "waiting" and workflow["cancel_requested"] is not None:
            request = from_json(workflow["cancel_requested"])
            raise NotWaiting(f"workflow {workflow_id!r} is being cancelled (requested by {request['by']}: "
                             f"{request['reason']}); its wait {name!r} takes no decision now and nothing was saved.")
        decision_json, decision = encode(decision, workflow_id, name, f"{kind} decision")  # as stored: redacted
        if row["status"] == "resolved":
            first = from_json(row["decision"])
            if first.get("timed_out"):
                raise DecisionConflict(f"workflow {workflow_id!r}, wait {name!r}: its deadline passed at "
                                       f"{utc(first['deadline'])}, before this decision; the workflow went on "
                                       "without it and nothing was saved.")
            if first[deciding] != decision[deciding]:
                raise DecisionConflict(f"workflow {workflow_id!r}, wait {name!r}: the decision saved first "
                                       f"({describe(first)}) is final; nothing was changed. Start a new workflow to "
                                       "decide differently.")
            return {**first, "wait": name, "saved": False, "decided_at": row["resolved_at"]}
        decided_at = now()
        conn.execute("UPDATE waits SET status = 'resolved', decision = ?, resolved_at = ? WHERE workflow_id = ?"
                     " AND name = ?", (decision_json, decided_at, workflow_id, name))
        state.wake(conn, workflow_id)  # a replay already running finds the decision under the lock instead
        append_event(conn, workflow_id, name, event_name(decision), describe(decision))
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
        seen = "; ".join(f"{r['name']!r}: " + ("open" if r["status"] == "waiting" else describe(from_json(r["decision"])))
                         for r in rows)
        raise WhichWait(f"workflow {workflow_id!r} has had {len(rows)} {kind} waits ({seen}); name the one you decide "
                        "(--wait NAME); nothing was changed.")
    return rows[0]["name"]


def utc(at: float) -> str:
    """A time for people: ``2026-03-01 09:30:00 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def event_name(decision: dict) -> str:
    """``answered``, ``approved`` or ``rejected``: a decision's history event."""
    return "answered" if "answer" in decision else "approved" if decision["approved"] else "rejected"


def describe(decision: dict) -> str:
    """A decision in a few words, for the history and for people."""
    if decision.get("timed_out"):
        return "no decision before the deadline"
    if "answer" in decision:
        return f"answered by {decision['by']}: {decision['answer']}"
    return f"{event_name(decision)} by {decision['by']}" + (f": {decision['comment']}" if decision.get("comment") else "")
