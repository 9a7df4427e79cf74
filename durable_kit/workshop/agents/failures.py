"""Notebook 03: one model step, six ways to fail, six paths.

The ``failure_demo`` workflow asks a fake provider for a cited answer, once
per section. The provider fails each section's first ``fail_times`` requests
with the failure class named in the input, then answers. Every request it
receives, failed or not, is counted in the ledger, as a real provider would
bill it. What the demo shows is that the *class* picks the path, not the
workflow: every step passes the same retry policy, repair and fallback, and

* ``transient`` is retried with exponential backoff (1 s, 2 s, ...);
* ``rate_limited`` is retried after the provider's ``retry_after``;
* ``invalid_request`` gets one repair, told the validation message, or escalates;
* ``format_failure`` gets one repair, then a deterministic fallback: it never loops;
* ``ambiguous_effect`` is escalated at once for reconciliation;
* ``policy_denied`` stops the workflow.

Input: ``{"failure": CLASS, "fail_times": N or None (always), "sections": 1,
"base_delay": 1.0, "retry_after": 2.0}``. Everything is deterministic: no jitter.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from ... import (AmbiguousEffect, FormatFailure, InvalidRequest, Journal, PolicyDenied, RateLimited, RetryPolicy,
                Transient, Workflow, workflow)
from ...world.ledger import Ledger

QUESTION = "How concentrated is Northwind's supplier base?"
ANSWER = "One supplier provided 38% of Northwind's component spend in fiscal 2025."
REFERENCES = [3, 7]  # what retrieval returned; the failing draft cites 12 as well

# Class name -> the error for request number n of a step (n = 2 is a repair's request, when there is one).
FAILURES = {
    "transient": lambda n, s: Transient(f"503 service unavailable (request {n})"),
    "rate_limited": lambda n, s: RateLimited(f"429 too many requests (request {n})", retry_after=s["retry_after"]),
    "invalid_request": lambda n, s: InvalidRequest(
        "reference 12 was not returned by retrieval" if n == 1 else "reference 12 is still cited"),
    "format_failure": lambda n, s: FormatFailure(
        "expected JSON with 'text' and 'references', got prose" if n == 1 else "the repaired answer is still prose"),
    "ambiguous_effect": lambda n, s: AmbiguousEffect(
        "the connection dropped after the request was sent; it may have run and been billed"),
    "policy_denied": lambda n, s: PolicyDenied("the request asks for a customer's home address"),
}

# The eight cases notebook 03 runs side by side: workflow id -> input.
CASES = {
    "transient-once": {"failure": "transient", "fail_times": 1},
    "transient-down": {"failure": "transient", "fail_times": None},
    "rate-limited": {"failure": "rate_limited", "fail_times": 1},
    "invalid-repaired": {"failure": "invalid_request", "fail_times": 1},
    "invalid-unrepaired": {"failure": "invalid_request", "fail_times": None},
    "format-fallback": {"failure": "format_failure", "fail_times": None},
    "ambiguous": {"failure": "ambiguous_effect", "fail_times": 1},
    "policy-denied": {"failure": "policy_denied", "fail_times": 1},
}


class FlakyProvider:
    """A fake model API that fails each step's first ``fail_times`` requests, then answers."""

    def __init__(self, ledger: Ledger, workflow_id: str, settings: dict):
        self.ledger, self.workflow_id, self.settings = ledger, workflow_id, settings

    def answer(self, step: str, feedback: str | None = None) -> dict:
        """One request, recorded before anything else; ``feedback`` is the message a repair passes on."""
        earlier = [c for c in self.ledger.calls("model", self.workflow_id)
                   if c["operation"] in (step, f"repair {step}")]
        self.ledger.record("model", f"repair {step}" if feedback else step, self.workflow_id)
        fail_times = self.settings["fail_times"]
        if fail_times is None or len(earlier) < fail_times:
            raise FAILURES[self.settings["failure"]](len(earlier) + 1, self.settings)
        answer = {"text": ANSWER, "references": REFERENCES, "written_by": "repair" if feedback else "model"}
        return {**answer, "feedback": feedback} if feedback else answer


def fallback_answer() -> dict:
    """The deterministic answer when the model cannot produce the shape: sources only, no model call."""
    return {"text": "No structured answer; the retrieved sources are listed for a person to read.",
            "references": REFERENCES, "written_by": "fallback"}


@workflow("failure_demo")
def failure_demo(wf: Workflow) -> dict:
    """Answer each section in its own step; the same policy, repair and fallback for every class."""
    settings = {"fail_times": 1, "sections": 1, "base_delay": 1.0, "retry_after": 2.0, **wf.input}
    provider = FlakyProvider(Ledger.beside(wf.db_path), wf.id, settings)
    policy = RetryPolicy(max_attempts=3, base_delay=settings["base_delay"], max_delay=4.0)
    answers = []
    for section in range(1, settings["sections"] + 1):
        step = "answer" if settings["sections"] == 1 else f"answer:{section}"
        answers.append(wf.execute_step(
            step, lambda s=step: provider.answer(s), {"question": QUESTION, "section": section},
            retry=policy, repair=lambda message, s=step: provider.answer(s, feedback=message),
            fallback=fallback_answer))
    return {"answers": answers}


def start_demo(journal: Journal, workflow_id: str, retry_budget: int = 10, **settings) -> str:
    """Start a ``failure_demo`` workflow; ``retry_budget`` caps its retries (10 by default)."""
    if settings.get("failure") not in FAILURES:
        raise ValueError(f"failure must be one of {sorted(FAILURES)}, not {settings.get('failure')!r}")
    return journal.start("failure_demo", settings, workflow_id, retry_budget)


def work_until_settled(db_path: str | Path, timeout: float = 60.0, poll: float = 0.1) -> int:
    """Run one worker in a child process until no workflow is pending or running; SIGTERM it, return its exit code."""
    journal = Journal(db_path)
    worker = subprocess.Popen([sys.executable, "-m", "durable_kit", "worker", "--db", str(db_path),
                               "--poll", str(poll)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    try:
        while journal.conn.execute("SELECT 1 FROM workflows WHERE status IN ('pending', 'running')").fetchone():
            if worker.poll() is not None:
                raise RuntimeError(f"the worker in {db_path} ended with exit code {worker.returncode} before every "
                                   f"workflow settled:\n{worker.stderr.read()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workflows in {db_path} were still pending after {timeout:g} s; "
                                   "run `python -m durable_kit status` on them to see why.")
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
        journal.close()
    return worker.returncode


def describe(journal: Journal, workflow_id: str) -> dict:
    """One row for a table: the class, the path the history records, attempts, calls and outcome."""
    wf = journal.workflow(workflow_id)
    path, previous, second_tries = [], None, {}
    for event in journal.history(workflow_id):
        kind, detail = event["event"], event["detail"] or ""
        if kind == "retry_scheduled":  # detail: "in 2 s: RateLimited: ..."
            path.append("retry after " + detail.split(":")[0].removeprefix("in "))
        elif kind == "step_started" and previous == "step_failed":  # another try inside the same replay
            second_tries[event["step"]] = second_tries.get(event["step"], 0) + 1
            path.append("repair" if second_tries[event["step"]] == 1 else "fallback")
        elif kind == "workflow_stopped":
            path.append("stop")
        elif kind == "workflow_escalated":
            path.append("escalate to reconcile" if "ask the destination" in detail else "escalate")
        previous = kind
    steps = journal.steps(workflow_id)
    ledger = Ledger.beside(journal.path)
    calls = ledger.count("model", workflow_id)
    ledger.close()
    fail_times = wf["input"].get("fail_times", 1)
    return {
        "case": workflow_id,
        "class": wf["input"]["failure"],
        "provider fails": "always" if fail_times is None else f"{fail_times}x",
        "path": " → ".join(path) or "first try",
        "attempts": sum(s["attempts"] for s in steps),
        "calls": calls,
        "retries charged": wf["retries_used"],
        "stored": sum(s["status"] == "complete" for s in steps),
        "final status": wf["status"],
    }

