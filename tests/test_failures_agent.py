"""Notebook 03's failure_demo workflow: every failure class takes its own path, in real worker processes.

Each test starts a workflow here, runs ``python -m durable_kit worker`` in
child processes, and reads what the journal, the escalation record and the
provider's ledger hold afterwards. Waits are skipped by moving the schedule
into the past, after its delay has been checked.
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from durable_kit import Journal, immediate
from durable_kit.workshop.agents.failures import ANSWER, CASES, describe, start_demo, work_until_settled
from durable_kit.harness.faults import arm
from durable_kit.world.ledger import Ledger

from conftest import make_due, run_python


def worker(db: Path, mode: str = "--until-idle") -> tuple[int, list[str]]:
    """One worker in a new process: its exit code and the lines it printed."""
    done = run_python("-m", "durable_kit", "worker", "--db", str(db), mode, timeout=60)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.returncode, done.stdout.splitlines()


def scheduled_delay(journal: Journal, workflow_id: str, step: str = "answer") -> float:
    """Seconds between the step's last failure and the time its retry is scheduled for."""
    failed_at = max(e["at"] for e in journal.history(workflow_id) if e["event"] == "step_failed" and e["step"] == step)
    (row,) = [s for s in journal.steps(workflow_id) if s["name"] == step]
    assert row["next_attempt_at"] == journal.workflow(workflow_id)["next_run_at"]
    return row["next_attempt_at"] - failed_at


def calls(db: Path, workflow_id: str) -> list[str]:
    return [c["operation"] for c in Ledger.beside(db).calls("model", workflow_id)]


def escalation(journal: Journal, workflow_id: str) -> dict:
    (row,) = journal.conn.execute("SELECT step, reason, attempts FROM escalations WHERE workflow_id = ?",
                                  (workflow_id,)).fetchall()
    return {"step": row["step"], "reason": row["reason"], "errors": [a["error"] for a in json.loads(row["attempts"])]}


def one_step(journal: Journal, workflow_id: str) -> dict:
    (row,) = journal.steps(workflow_id)
    return row


@pytest.fixture
def journal(db) -> Journal:
    return Journal(db)


def test_transient_retries_after_the_backoff_and_never_early(db, journal):
    start_demo(journal, "t", failure="transient", fail_times=1)
    assert worker(db) == (0, ["t: pending", "worker stopped"])
    step = one_step(journal, "t")
    assert (step["status"], step["attempts"], step["error"]) == (
        "retrying", 1, "Transient: 503 service unavailable (request 1)")
    # Two clock readings in one process (the failure, then its schedule): a loaded machine may pause the process
    # between them, so a quarter second either way; still far from the 2 s a second failure would wait.
    assert 0.75 <= scheduled_delay(journal, "t") <= 1.25
    assert calls(db, "t") == ["answer"]

    make_due(db, "t", hours=-1)  # the retry an hour away, so a slow start of the next process cannot reach it
    assert worker(db) == (0, ["worker stopped"])  # started before the time: nothing runs, nothing changes
    assert {k: v for k, v in one_step(journal, "t").items() if k != "next_attempt_at"} == (
        {k: v for k, v in step.items() if k != "next_attempt_at"})
    assert calls(db, "t") == ["answer"]

    make_due(db, "t", hours=2)
    assert worker(db) == (0, ["t: complete", "worker stopped"])
    wf = journal.workflow("t")
    assert (wf["status"], wf["retries_used"]) == ("complete", 1)
    assert wf["output"] == {"answers": [{"text": ANSWER, "references": [3, 7], "written_by": "model"}]}
    assert one_step(journal, "t")["attempts"] == 2
    assert calls(db, "t") == ["answer", "answer"]
    assert describe(journal, "t")["path"] == "retry after 1 s"


def test_a_provider_that_stays_down_backs_off_exponentially_then_escalates(db, journal):
    start_demo(journal, "down", failure="transient", fail_times=None)
    delays = []
    for _ in range(2):
        assert worker(db) == (0, ["down: pending", "worker stopped"])
        delays.append(round(scheduled_delay(journal, "down"), 1))
        make_due(db, "down")
    assert delays == [1.0, 2.0]
    assert worker(db) == (0, ["down: escalated", "worker stopped"])

    wf = journal.workflow("down")
    assert (wf["status"], wf["retries_used"]) == ("escalated", 2)
    assert escalation(journal, "down") == {
        "step": "answer",
        "reason": "Transient on attempt 3 of 3: 503 service unavailable (request 3)",
        "errors": [f"Transient: 503 service unavailable (request {n})" for n in (1, 2, 3)]}
    assert calls(db, "down") == ["answer"] * 3
    assert worker(db) == (0, ["worker stopped"])  # escalated is final
    assert len(calls(db, "down")) == 3


def test_rate_limited_waits_the_providers_time_not_the_policys(db, journal):
    start_demo(journal, "rl", failure="rate_limited", fail_times=1, retry_after=2.0)
    assert worker(db) == (0, ["rl: pending", "worker stopped"])
    assert 1.75 <= scheduled_delay(journal, "rl") <= 2.25  # the policy alone would say 1 s (margin: as above)
    assert one_step(journal, "rl")["error"] == "RateLimited: 429 too many requests (request 1)"
    make_due(db, "rl")
    assert worker(db) == (0, ["rl: complete", "worker stopped"])
    assert (journal.workflow("rl")["retries_used"], calls(db, "rl")) == (1, ["answer", "answer"])


def test_an_invalid_request_is_repaired_once_with_the_validation_message(db, journal):
    start_demo(journal, "inv", failure="invalid_request", fail_times=1)
    assert worker(db) == (0, ["inv: complete", "worker stopped"])  # no schedule: repair is immediate
    wf = journal.workflow("inv")
    assert (wf["status"], wf["retries_used"]) == ("complete", 0)
    assert wf["output"]["answers"] == [{"text": ANSWER, "references": [3, 7], "written_by": "repair",
                                        "feedback": "reference 12 was not returned by retrieval"}]
    assert one_step(journal, "inv")["attempts"] == 2
    assert calls(db, "inv") == ["answer", "repair answer"]
    assert describe(journal, "inv")["path"] == "repair"


def test_an_invalid_request_that_repair_cannot_fix_escalates(db, journal):
    start_demo(journal, "inv", failure="invalid_request", fail_times=None)
    assert worker(db) == (0, ["inv: escalated", "worker stopped"])
    assert (journal.workflow("inv")["retries_used"], one_step(journal, "inv")["attempts"]) == (0, 2)
    assert escalation(journal, "inv") == {
        "step": "answer",
        "reason": "invalid request, not repeated unchanged: reference 12 is still cited",
        "errors": ["InvalidRequest: reference 12 was not returned by retrieval",
                   "InvalidRequest: reference 12 is still cited"]}
    assert calls(db, "inv") == ["answer", "repair answer"]  # the fallback is for format failures only


def test_a_format_failure_repairs_once_then_falls_back_and_never_loops(db, journal):
    start_demo(journal, "fmt", failure="format_failure", fail_times=None)
    assert worker(db) == (0, ["fmt: complete", "worker stopped"])
    wf = journal.workflow("fmt")
    assert (wf["status"], wf["retries_used"]) == ("complete", 0)
    assert wf["output"]["answers"][0]["written_by"] == "fallback"
    assert one_step(journal, "fmt")["attempts"] == 3
    assert calls(db, "fmt") == ["answer", "repair answer"]  # the fallback calls no model
    assert [e["detail"] for e in journal.history("fmt") if e["event"] == "step_failed"] == [
        "FormatFailure: expected JSON with 'text' and 'references', got prose",
        "FormatFailure: the repaired answer is still prose"]
    assert describe(journal, "fmt")["path"] == "repair → fallback"


def test_a_format_failure_fixed_by_the_repair_needs_no_fallback(db, journal):
    start_demo(journal, "fmt", failure="format_failure", fail_times=1)
    assert worker(db) == (0, ["fmt: complete", "worker stopped"])
    assert journal.workflow("fmt")["output"]["answers"][0]["written_by"] == "repair"
    assert calls(db, "fmt") == ["answer", "repair answer"]


def test_an_ambiguous_effect_is_escalated_for_reconciliation_without_a_retry(db, journal):
    start_demo(journal, "amb", failure="ambiguous_effect")
    assert worker(db) == (0, ["amb: escalated", "worker stopped"])
    assert (journal.workflow("amb")["retries_used"], one_step(journal, "amb")["attempts"]) == (0, 1)
    record = escalation(journal, "amb")
    assert record["reason"].startswith("outcome unknown, ask the destination before retrying: ")
    assert record["errors"] == ["AmbiguousEffect: the connection dropped after the request was sent; "
                                "it may have run and been billed"]
    assert calls(db, "amb") == ["answer"]
    assert describe(journal, "amb")["path"] == "escalate to reconcile"


def test_a_policy_denial_stops_the_workflow(db, journal):
    start_demo(journal, "deny", failure="policy_denied")
    assert worker(db) == (0, ["deny: stopped", "worker stopped"])
    wf = journal.workflow("deny")
    assert (wf["status"], wf["retries_used"], wf["error"]) == (
        "stopped", 0, "policy denied: the request asks for a customer's home address")
    assert calls(db, "deny") == ["answer"]
    assert worker(db) == (0, ["worker stopped"])
    assert calls(db, "deny") == ["answer"]


def test_the_retry_budget_escalates_the_step_that_finds_it_spent(db, journal):
    start_demo(journal, "budget", retry_budget=3, failure="transient", fail_times=2, sections=3)
    lines = []
    for _ in range(10):
        code, printed = worker(db)
        lines.append(printed[0])
        if journal.workflow("budget")["status"] != "pending":
            break
        make_due(db, "budget")
    assert lines == ["budget: pending"] * 3 + ["budget: escalated"]

    wf = journal.workflow("budget")
    assert (wf["status"], wf["retries_used"], wf["retry_budget"]) == ("escalated", 3, 3)
    assert [(s["name"], s["status"], s["attempts"]) for s in journal.steps("budget")] == [
        ("answer:1", "complete", 3), ("answer:2", "failed", 2)]
    assert escalation(journal, "budget") == {
        "step": "answer:2",
        "reason": "the workflow's retry budget is spent; last error Transient: 503 service unavailable (request 2)",
        "errors": ["Transient: 503 service unavailable (request 1)", "Transient: 503 service unavailable (request 2)"]}
    assert calls(db, "budget") == ["answer:1"] * 3 + ["answer:2"] * 2


def test_a_crash_during_a_retry_is_not_a_failure(db, journal):
    start_demo(journal, "crash", failure="transient", fail_times=1)
    assert worker(db) == (0, ["crash: pending", "worker stopped"])
    make_due(db, "crash")
    arm(journal.conn, "after_activity:answer", "kill")
    assert worker(db) == (-signal.SIGKILL, [])
    assert (journal.workflow("crash")["status"], one_step(journal, "crash")["status"]) == ("running", "running")
    assert calls(db, "crash") == ["answer", "answer"]  # the provider answered; the answer died with the process

    assert worker(db) == (0, ["crash: recovered", "crash: complete", "worker stopped"])
    wf = journal.workflow("crash")
    assert (wf["status"], wf["retries_used"]) == ("complete", 1)  # the crash charged no retry
    assert one_step(journal, "crash")["attempts"] == 3
    assert calls(db, "crash") == ["answer"] * 3


def test_every_case_settles_under_one_long_running_worker(tmp_path):
    db = tmp_path / "classes.db"
    journal = Journal(db)
    for workflow_id, settings in CASES.items():
        start_demo(journal, workflow_id, **settings)
    began = time.monotonic()
    assert work_until_settled(db) == 0  # stopped cleanly by SIGTERM
    assert time.monotonic() - began >= 3.0  # transient-down waited 1 s, then 2 s
    rows = {row["case"]: (row["path"], row["attempts"], row["calls"], row["retries charged"], row["stored"],
                          row["final status"]) for row in (describe(journal, w) for w in CASES)}
    assert rows == {
        "transient-once": ("retry after 1 s", 2, 2, 1, 1, "complete"),
        "transient-down": ("retry after 1 s → retry after 2 s → escalate", 3, 3, 2, 0, "escalated"),
        "rate-limited": ("retry after 2 s", 2, 2, 1, 1, "complete"),
        "invalid-repaired": ("repair", 2, 2, 0, 1, "complete"),
        "invalid-unrepaired": ("repair → escalate", 2, 2, 0, 0, "escalated"),
        "format-fallback": ("repair → fallback", 3, 2, 0, 1, "complete"),
        "ambiguous": ("escalate to reconcile", 1, 1, 0, 0, "escalated"),
        "policy-denied": ("stop", 1, 1, 0, 0, "stopped"),
    }


def test_start_demo_refuses_an_unknown_failure_class_and_writes_nothing(db, journal):
    with pytest.raises(ValueError, match="failure must be one of"):
        start_demo(journal, "x", failure="flaky")
    assert journal.conn.execute("SELECT COUNT(*) FROM workflows").fetchone()[0] == 0
