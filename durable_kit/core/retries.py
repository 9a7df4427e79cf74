"""The engine: failure classes and durable retry schedules.

An activity says how it failed by the class it raises; ``decide`` (pure) turns the failure, the attempt number
and the workflow's remaining retry budget into a path. The journal records the failed attempt and its path in
one transaction, so a schedule outlives every process: no worker sleeps through a backoff, none retries early.
"""
from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import dataclass

from ..redact import redact
from . import state
from .store import append_event, now

# An attempt ended by another owner taking its lease while its process lived (``leases.note_taken_over``): not a
# crash, never counted toward ``max_attempts``. TAKEN_OVER_BY_STEP, per step of workflow ?1: ``attempts`` taken
# over in all, and ``in_a_row``, those whose lease expired (``EXPIRED``, not a person's take-over) since the step's
# last recorded failure: each an attempt that outran its lease.
TAKEN_OVER = "attempt_taken_over"
EXPIRED = "its lease expired"
TAKEN_OVER_BY_STEP = (
    f"SELECT step, COUNT(*) AS attempts, SUM(detail LIKE '%{EXPIRED}%' AND seq > COALESCE((SELECT MAX(f.seq)"
    "   FROM history f WHERE f.workflow_id = ?1 AND f.step = h.step AND f.event = 'step_failed'), 0)) AS in_a_row"
    f" FROM history h WHERE workflow_id = ?1 AND event = '{TAKEN_OVER}' GROUP BY step")


class Transient(Exception):
    """Infrastructure failed (timeout, connection reset, 503): retry with backoff."""


class Crashed(Transient):
    """The process running an attempt died; counted like a transient failure (an attempt taken over is not)."""


class OutranLease(Exception):
    """A step's attempts kept losing their lease while their process lived: the activity outran its lease.

    A live owner whose heartbeat cannot renew in time (an activity that holds the process or Python's GIL longer
    than the lease) is taken over again and again; no retry of the same attempt can end that.
    """


class RateLimited(Exception):
    """The provider asked us to slow down: retry after the time it gave (seconds, from 0 to 100 years)."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = seconds_in_range(retry_after, "RateLimited: retry_after")


class InvalidRequest(Exception):
    """The request itself is wrong: the same request will fail the same way, so never repeat it unchanged."""


class FormatFailure(Exception):
    """The model's answer did not have the required shape."""


class AmbiguousEffect(Exception):
    """A side effect may or may not have happened: find out before trying again."""


class PolicyDenied(Exception):
    """A rule said no. This is an outcome, not an outage: retrying cannot change it."""


MAX_SECONDS = 3_155_760_000  # 100 years: the longest delay, timer or deadline, so every time stays a date


def seconds_in_range(value, what: str):
    """``value`` if it is a finite number of seconds from 0 to ``MAX_SECONDS``; else a ``ValueError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SECONDS:
        raise ValueError(f"{what} must be a finite number of seconds from 0 to {MAX_SECONDS} (100 years), "
                         f"not {value!r}")
    return value


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff: ``base * 2**(attempt-1)``, capped, optionally jittered."""
    max_attempts: int = 3
    base_delay: float = 1.0
    max_delay: float = 60.0
    jitter: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise ValueError(f"RetryPolicy: max_attempts must be a whole number of at least 1 (the first attempt "
                             f"counts), not {self.max_attempts!r}")
        for name in ("base_delay", "max_delay"):
            seconds_in_range(getattr(self, name), f"RetryPolicy: {name}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        delay = min(self.base_delay * 2.0 ** min(attempt - 1, 64), self.max_delay)  # no float overflow
        return random.uniform(delay / 2, delay) if self.jitter else delay


@dataclass(frozen=True)
class Decision:
    """After a failed attempt: ``retry`` (after ``delay``), ``stop``, ``reconcile``, ``escalate`` or ``fail``."""
    path: str
    reason: str
    delay: float = 0.0


def decide(error: BaseException, attempt: int, policy: RetryPolicy, budget_left: int) -> Decision:
    """Choose the path for a failed attempt. Pure: reads nothing, writes nothing."""
    kind = type(error).__name__
    if isinstance(error, PolicyDenied):
        return Decision("stop", f"policy denied: {error}")
    if isinstance(error, AmbiguousEffect):
        return Decision("reconcile", f"outcome unknown, ask the destination before retrying: {error}")
    if isinstance(error, OutranLease):
        return Decision("escalate", f"the activity outran its lease: {error}")
    if isinstance(error, (Transient, RateLimited)):
        if attempt >= policy.max_attempts:
            return Decision("escalate", f"{kind} on attempt {attempt} of {policy.max_attempts}: {error}")
        if budget_left <= 0:
            return Decision("escalate", f"the workflow's retry budget is spent; last error {kind}: {error}")
        delay = error.retry_after if isinstance(error, RateLimited) else policy.delay(attempt)
        return Decision("retry", f"{kind}: {error}", delay)
    if isinstance(error, InvalidRequest):
        return Decision("escalate", f"invalid request, not repeated unchanged: {error}")
    if isinstance(error, FormatFailure):
        return Decision("escalate", f"the model's answer kept the wrong shape: {error}")
    return Decision("fail", f"unexpected {kind} (a bug to fix, not a failure class): {error}")


def record_failure(conn: sqlite3.Connection, workflow_id: str, step: str, error: BaseException,
                   policy: RetryPolicy | None) -> Decision | None:
    """Inside the caller's write transaction: the failed attempt, its path (``decide``) and what the path writes.

    ``retry``: a schedule, one retry charged; ``stop`` (*stopped*), ``escalate``, ``reconcile`` (*escalated*): an
    escalation record; ``fail`` (or no ``policy``): the failure only. None, nothing written, if the step is complete."""
    detail = redact(f"{type(error).__name__}: {error}")
    if not state.fail_step(conn, workflow_id, step, detail):
        return None
    append_event(conn, workflow_id, step, "step_failed", detail)
    if policy is None:
        return Decision("fail", detail)
    row = conn.execute(  # attempts taken over by another owner do not count (TAKEN_OVER)
        "SELECT s.attempts - (SELECT COUNT(*) FROM history h WHERE h.workflow_id = s.workflow_id AND h.step = s.name"
        f" AND h.event = '{TAKEN_OVER}') AS attempts, w.retry_budget - w.retries_used AS budget_left FROM steps s"
        " JOIN workflows w ON w.id = s.workflow_id WHERE s.workflow_id = ? AND s.name = ?",
        (workflow_id, step)).fetchone()
    decision = decide(error, row["attempts"], policy, row["budget_left"])
    if decision.path == "retry":  # nothing waits in memory: any worker runs it once the time has come, none before
        run_at = now() + decision.delay
        state.schedule_step(conn, workflow_id, step, run_at)
        state.move(conn, workflow_id, "pending", {"next_run_at": run_at}, "retries_used = retries_used + 1")
        append_event(conn, workflow_id, step, "retry_scheduled", f"in {decision.delay:g} s: {decision.reason}")
    elif decision.path != "fail":  # every attempt's error goes to the person; no worker picks it up again
        status = "stopped" if decision.path == "stop" else "escalated"
        attempts = [{"attempt": number, "error": r["detail"]} for number, r in enumerate(conn.execute(
            "SELECT detail FROM history WHERE workflow_id = ? AND step = ? AND event = 'step_failed' ORDER BY seq",
            (workflow_id, step)), start=1)]
        reason = redact(decision.reason)
        conn.execute("INSERT OR REPLACE INTO escalations (workflow_id, step, reason, attempts, created_at)"
                     " VALUES (?, ?, ?, ?, ?)", (workflow_id, step, reason, json.dumps(attempts), now()))
        state.move(conn, workflow_id, status, {"error": reason})
        append_event(conn, workflow_id, step, f"workflow_{status}", decision.reason)
    return decision
