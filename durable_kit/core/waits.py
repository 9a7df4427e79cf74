"""The engine: waiting for people and for time, with no worker held.

A wait is a row. A replay that reaches one saves what it waits for (an
approval, an answer, a time), makes the workflow *waiting* and stops; a
decision (``durable_kit.decisions``) wakes it. A timer's end and a deadline
are fixed when the wait is first reached, so every replay agrees on them.
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import Suspended, WorkflowError
from . import state
from .retries import MAX_SECONDS
from .store import append_event, boundary, from_json, now, to_json

KINDS = ("approval", "clarification", "timer", "delivery")


def wait_for(wf, name: str, kind: str, request: Any = None, seconds: float | None = None,
             deadline: float | None = None) -> Any:
    """Return wait ``name``'s saved decision, or save the wait and stop this replay (``Suspended``).

    An approval or a clarification waits with no run time, so only its decision makes the workflow runnable,
    or the ``deadline``, whichever comes first, for good (``{"timed_out": True, "deadline": ...}``). A timer
    waits until ``seconds`` have passed. A time that is not a finite number of seconds from 0 to 100 years is
    refused before anything is saved. A wait is a step boundary (``Workflow.at_boundary``).
    """
    if kind not in KINDS:
        raise ValueError(f"a wait's kind is one of {KINDS}, not {kind!r}")
    after, what = (seconds, "timer's seconds") if kind == "timer" else (deadline, "deadline")
    if not (after is None and kind != "timer") and (isinstance(after, bool) or not isinstance(after, (int, float))
                                                    or not 0 <= after <= MAX_SECONDS):  # NaN fails every comparison
        raise WorkflowError(
            f"workflow {wf.id!r}, wait {name!r}: the {what} must be a finite number of seconds from 0 to {MAX_SECONDS}"
            f" (100 years), not {after!r}. Give a number in that range"
            + (", or no deadline at all" if kind != "timer" else "") + ", then `resume` it.")
    position = wf.place(name, None, wait=True)  # steps and waits share one order, checked on every replay
    select = "SELECT * FROM waits WHERE workflow_id = ? AND name = ?"
    row = wf.conn.execute(select, (wf.id, name)).fetchone()
    if row is not None and row["kind"] != kind:
        raise WorkflowError(f"workflow {wf.id!r}: wait {name!r} was saved with kind {row['kind']!r}, not {kind!r}. "
                            "Wait names identify waits for good: give this one its own name.")
    if row is not None and row["status"] == "resolved":  # a decision never changes: no lock needed
        wf.at_boundary(new=False)
        return from_json(row["decision"])
    wf.at_boundary()
    request_json = to_json(request, wf.id, name, f"{kind} request")
    with wf.write():
        row = wf.conn.execute(select, (wf.id, name)).fetchone()  # again, under the lock: a decision may have landed
        if row is not None and row["status"] == "resolved":
            return from_json(row["decision"])
        wake_at = row["wake_at"] if row is not None else None if after is None else now() + after
        if row is None:
            wf.conn.execute("INSERT INTO waits (workflow_id, name, kind, request, status, wake_at, created_at,"
                            " position) VALUES (?, ?, ?, ?, 'waiting', ?, ?, ?)",
                            (wf.id, name, kind, request_json, wake_at, now(), position))
            append_event(wf.conn, wf.id, name, f"waiting_for_{kind}", None if after is None else f"for {after:g} s")
        if wake_at is not None and wake_at <= now():  # the timer ended, or the deadline passed
            decision = None if kind == "timer" else {"timed_out": True, "deadline": wake_at}
            wf.conn.execute("UPDATE waits SET status = 'resolved', decision = ?, resolved_at = ? WHERE workflow_id = ?"
                            " AND name = ?", (json.dumps(decision), now(), wf.id, name))
            append_event(wf.conn, wf.id, name, "timer_fired" if kind == "timer" else "deadline_passed")
            return decision
        state.move(wf.conn, wf.id, "waiting", {"next_run_at": wake_at})
        wf.let_go(wf.conn)  # no worker is held while it waits
    boundary(wf.conn, f"after_wait:{name}", wf.id)
    raise Suspended(f"workflow {wf.id!r} waits for {kind} {name!r}")


