"""The engine: failure classes, durable retry schedules, repair, fallback, escalation and stop."""
from __future__ import annotations

import json
import random
import time

import pytest

import durable_kit
from durable_kit import Journal, resume, run_workflow
from durable_kit.core.journal import FINAL_STATUSES, Ended, Suspended
from durable_kit.core.retries import (AmbiguousEffect, Decision, FormatFailure, InvalidRequest, PolicyDenied,
                                 RateLimited, RetryPolicy, Transient, decide)
from durable_kit.harness.faults import InjectedFailure, arm

from conftest import dump, make_due

FAST = RetryPolicy(max_attempts=3, base_delay=0.2, max_delay=1.0)


class Script:
    """An activity that plays its outcomes in order (the last one repeats) and records every call."""

    def __init__(self, *outcomes):
        self.outcomes, self.calls, self.args = list(outcomes), 0, []

    def __call__(self, *args):
        self.calls += 1
        self.args.append(args)
        outcome = self.outcomes[min(self.calls, len(self.outcomes)) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


@pytest.fixture
def journal(db):
    return Journal(db)


@pytest.fixture
def one_step(journal, kinds):
    """Start a workflow whose only step is ``activity`` with the given retry options; return its id."""
    def make(activity, workflow_id="wf-1", **options):
        kind = kinds(workflow_id)

        @durable_kit.workflow(kind)
        def single(wf):
            return {"result": wf.execute_step("call", activity, {"n": 1}, **options)}

        journal.start(kind, {}, workflow_id)
        return workflow_id
    return make


def step(journal, workflow_id, name="call") -> dict:
    (row,) = [s for s in journal.steps(workflow_id) if s["name"] == name]
    return row


def events(journal, workflow_id) -> list[str]:
    return [e["event"] for e in journal.history(workflow_id)]


def escalation(journal, workflow_id) -> dict:
    (row,) = journal.conn.execute("SELECT * FROM escalations WHERE workflow_id = ?", (workflow_id,)).fetchall()
    return {**dict(row), "attempts": json.loads(row["attempts"])}


# --- decide: one path per failure class ---

def test_transient_retries_with_exponential_backoff_capped_at_max_delay():
    policy = RetryPolicy(max_attempts=10, base_delay=1.0, max_delay=4.0)
    paths = [decide(Transient("503"), attempt, policy, budget_left=10) for attempt in (1, 2, 3, 4, 5)]
    assert [d.path for d in paths] == ["retry"] * 5
    assert [d.delay for d in paths] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert [policy.delay(a) for a in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 4.0]
    assert "Transient" in paths[0].reason and "503" in paths[0].reason


def test_rate_limited_retries_after_the_time_the_provider_gave():
    policy = RetryPolicy(max_attempts=3, base_delay=1.0, max_delay=2.0)
    decision = decide(RateLimited("429 slow down", retry_after=7.5), 1, policy, budget_left=10)
    assert (decision.path, decision.delay) == ("retry", 7.5)
    assert "RateLimited" in decision.reason


def test_injected_failure_is_a_transient_failure():
    assert issubclass(InjectedFailure, Transient)
    assert decide(InjectedFailure("boom"), 1, FAST, 10) == Decision("retry", "InjectedFailure: boom", 0.2)


@pytest.mark.parametrize("error", [Transient("timeout"), RateLimited("429", retry_after=1.0)])
def test_exhausted_attempts_escalate(error):
    policy = RetryPolicy(max_attempts=3)
    assert decide(error, 2, policy, 10).path == "retry"
    decision = decide(error, 3, policy, 10)
    assert (decision.path, decision.delay) == ("escalate", 0.0)
    assert "attempt 3 of 3" in decision.reason


@pytest.mark.parametrize("error", [Transient("timeout"), RateLimited("429", retry_after=1.0)])
def test_a_spent_budget_escalates(error):
    assert decide(error, 1, FAST, budget_left=1).path == "retry"
    for budget in (0, -1):
        decision = decide(error, 1, FAST, budget_left=budget)
        assert decision.path == "escalate"
        assert "budget is spent" in decision.reason


@pytest.mark.parametrize("attempt", [1, 2, 5])
def test_invalid_request_is_never_retried_unchanged(attempt):
    decision = decide(InvalidRequest("reference 12 was not returned by retrieval"), attempt, FAST, 10)
    assert decision.path == "escalate"
    assert "reference 12 was not returned by retrieval" in decision.reason


def test_format_failure_escalates():
    decision = decide(FormatFailure("expected a list of claims"), 1, FAST, 10)
    assert decision.path == "escalate"
    assert "expected a list of claims" in decision.reason


def test_ambiguous_effect_reconciles_before_retrying():
    decision = decide(AmbiguousEffect("payment API timed out after sending"), 1, FAST, 10)
    assert decision.path == "reconcile"
    assert "destination" in decision.reason and "payment API timed out" in decision.reason


def test_policy_denied_stops_even_with_attempts_and_budget_left():
    decision = decide(PolicyDenied("export of personal data is not allowed"), 1, FAST, 10)
    assert decision.path == "stop"
    assert decision.reason == "policy denied: export of personal data is not allowed"


@pytest.mark.parametrize("error", [ValueError("bad"), KeyError("x"), TypeError("t")])
def test_any_other_exception_fails(error):
    decision = decide(error, 1, FAST, 10)
    assert decision.path == "fail"
    assert type(error).__name__ in decision.reason


def test_jitter_stays_within_half_to_full_delay():
    rng_state = random.getstate()
    try:
        random.seed(7)
        policy = RetryPolicy(max_attempts=10, base_delay=1.0, max_delay=4.0, jitter=True)
        for attempt, full in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 4.0)]:
            samples = [policy.delay(attempt) for _ in range(200)]
            assert all(full / 2 <= s <= full for s in samples), attempt
            assert len(set(samples)) > 100  # really jittered, not a constant
            decision = decide(Transient("x"), attempt, policy, 10)
            assert full / 2 <= decision.delay <= full
    finally:
        random.setstate(rng_state)


def test_decide_is_pure(db):
    journal = Journal(db)
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    before = dump(db)
    for error in (Transient("a"), PolicyDenied("b"), AmbiguousEffect("c"), InvalidRequest("d"), ValueError("e")):
        decide(error, 1, FAST, 10)
    assert dump(db) == before


# --- execute_step with a retry policy: a durable schedule ---

def test_transient_failure_commits_a_retry_schedule(journal, one_step):
    activity = Script(Transient("connection reset"), {"ok": True})
    wid = one_step(activity, retry=FAST)
    before = time.time()
    assert run_workflow(journal, wid) is None
    after = time.time()

    assert activity.calls == 1
    s = step(journal, wid)
    assert (s["status"], s["attempts"], s["error"]) == ("retrying", 1, "Transient: connection reset")
    assert before + 0.2 <= s["next_attempt_at"] <= after + 0.2
    wf = journal.workflow(wid)
    assert (wf["status"], wf["retries_used"], wf["next_run_at"]) == ("pending", 1, s["next_attempt_at"])
    history = journal.history(wid)
    scheduled = [e for e in history if e["event"] == "retry_scheduled"]
    assert len(scheduled) == 1
    assert scheduled[0]["step"] == "call"
    assert scheduled[0]["detail"] == "in 0.2 s: Transient: connection reset"
    assert [e["event"] for e in history][-3:] == ["step_started", "step_failed", "retry_scheduled"]


def test_a_retry_does_not_run_early(journal, one_step, db):
    activity = Script(Transient("503"), {"ok": True})
    wid = one_step(activity, retry=RetryPolicy(max_attempts=3, base_delay=30.0))
    run_workflow(journal, wid)
    scheduled_at = journal.workflow(wid)["next_run_at"]

    assert run_workflow(journal, wid) is None  # before the time
    assert activity.calls == 1
    s = step(journal, wid)
    assert (s["status"], s["attempts"], s["next_attempt_at"]) == ("retrying", 1, scheduled_at)
    wf = journal.workflow(wid)
    assert (wf["status"], wf["next_run_at"], wf["retries_used"]) == ("pending", scheduled_at, 1)
    assert events(journal, wid)[-2:] == ["replay_started", "replay_suspended"]


def test_after_the_time_the_retry_runs_and_completes(journal, one_step):
    activity = Script(Transient("503"), {"ok": True})
    wid = one_step(activity, retry=FAST)
    run_workflow(journal, wid)
    time.sleep(0.25)  # longer than base_delay=0.2

    assert run_workflow(journal, wid) == {"result": {"ok": True}}
    assert activity.calls == 2
    s = step(journal, wid)
    assert (s["status"], s["attempts"], s["output"], s["error"], s["next_attempt_at"]) == (
        "complete", 2, {"ok": True}, None, None)
    wf = journal.workflow(wid)
    assert (wf["status"], wf["retries_used"], wf["output"]) == ("complete", 1, {"result": {"ok": True}})
    assert [e["detail"] for e in journal.history(wid) if e["event"] == "step_started"] == ["attempt 1", "attempt 2"]


def test_a_restart_keeps_the_schedule(journal, one_step, db):
    activity = Script(Transient("503"), {"ok": True})
    wid = one_step(activity, retry=RetryPolicy(max_attempts=3, base_delay=30.0))
    run_workflow(journal, wid)
    scheduled_at = journal.workflow(wid)["next_run_at"]
    del journal

    restarted = Journal(db)  # a new process would open the file exactly like this
    assert run_workflow(restarted, wid) is None
    assert activity.calls == 1
    assert restarted.workflow(wid)["next_run_at"] == scheduled_at
    assert step(restarted, wid)["next_attempt_at"] == scheduled_at

    make_due(restarted.path, wid)
    again = Journal(db)
    assert run_workflow(again, wid) == {"result": {"ok": True}}
    assert activity.calls == 2
    assert step(again, wid)["attempts"] == 2


def test_rate_limited_schedules_its_retry_after(journal, one_step):
    activity = Script(RateLimited("429", retry_after=45.0), {"ok": True})
    wid = one_step(activity, retry=FAST)
    before = time.time()
    run_workflow(journal, wid)
    after = time.time()
    s = step(journal, wid)
    assert s["status"] == "retrying"
    assert before + 45.0 <= s["next_attempt_at"] <= after + 45.0


def test_max_attempts_reached_escalates_with_every_attempts_error(journal, one_step):
    activity = Script(Transient("timeout 1"), Transient("timeout 2"), Transient("timeout 3"), {"ok": True})
    wid = one_step(activity, retry=FAST)
    assert run_workflow(journal, wid) is None
    make_due(journal.path, wid)
    assert run_workflow(journal, wid) is None
    assert journal.workflow(wid)["status"] == "pending"
    make_due(journal.path, wid)
    assert run_workflow(journal, wid) is None

    assert activity.calls == 3
    wf = journal.workflow(wid)
    assert wf["status"] == "escalated"
    assert wf["retries_used"] == 2
    assert "attempt 3 of 3" in wf["error"]
    s = step(journal, wid)
    assert (s["status"], s["attempts"]) == ("failed", 3)
    esc = escalation(journal, wid)
    assert esc["step"] == "call"
    assert esc["reason"] == wf["error"]
    assert esc["attempts"] == [{"attempt": 1, "error": "Transient: timeout 1"},
                               {"attempt": 2, "error": "Transient: timeout 2"},
                               {"attempt": 3, "error": "Transient: timeout 3"}]
    assert events(journal, wid)[-1] == "workflow_escalated"
    assert events(journal, wid).count("retry_scheduled") == 2

    # A final status: replaying runs nothing and changes nothing.
    assert "escalated" in FINAL_STATUSES
    assert run_workflow(journal, wid) is None
    assert activity.calls == 3
    assert journal.workflow(wid)["status"] == "escalated"


def test_a_spent_retry_budget_escalates_on_the_next_transient_failure(journal, one_step):
    activity = Script(Transient("blip 1"), Transient("blip 2"), {"ok": True})
    wid = one_step(activity, retry=RetryPolicy(max_attempts=5, base_delay=0.2))
    journal.conn.execute("UPDATE workflows SET retry_budget = 1 WHERE id = ?", (wid,))
    run_workflow(journal, wid)
    assert journal.workflow(wid)["status"] == "pending"
    make_due(journal.path, wid)
    run_workflow(journal, wid)

    assert activity.calls == 2
    wf = journal.workflow(wid)
    assert (wf["status"], wf["retries_used"], wf["retry_budget"]) == ("escalated", 1, 1)
    assert "retry budget is spent" in wf["error"] and "blip 2" in wf["error"]
    assert [a["error"] for a in escalation(journal, wid)["attempts"]] == ["Transient: blip 1", "Transient: blip 2"]


def test_a_budget_spent_before_the_first_failure_escalates_at_once(journal, one_step):
    activity = Script(Transient("blip"), {"ok": True})
    wid = one_step(activity, retry=FAST)
    journal.conn.execute("UPDATE workflows SET retry_budget = 3, retries_used = 3 WHERE id = ?", (wid,))
    run_workflow(journal, wid)
    assert activity.calls == 1
    assert journal.workflow(wid)["status"] == "escalated"
    assert "retry_scheduled" not in events(journal, wid)


def test_policy_denied_stops_the_workflow(journal, one_step):
    activity = Script(PolicyDenied("sending customer data outside the region"), {"ok": True})
    wid = one_step(activity, retry=FAST)
    assert run_workflow(journal, wid) is None

    assert activity.calls == 1
    wf = journal.workflow(wid)
    assert (wf["status"], wf["retries_used"], wf["error"]) == (
        "stopped", 0, "policy denied: sending customer data outside the region")
    assert "stopped" in FINAL_STATUSES
    s = step(journal, wid)
    assert (s["status"], s["attempts"], s["next_attempt_at"]) == ("failed", 1, None)
    assert "retry_scheduled" not in events(journal, wid)
    assert events(journal, wid)[-1] == "workflow_stopped"
    assert run_workflow(journal, wid) is None
    assert activity.calls == 1


def test_ambiguous_effect_escalates_without_a_retry(journal, one_step):
    activity = Script(AmbiguousEffect("the email API timed out after the send"), {"ok": True})
    wid = one_step(activity, retry=FAST)
    run_workflow(journal, wid)

    assert activity.calls == 1
    wf = journal.workflow(wid)
    assert (wf["status"], wf["retries_used"]) == ("escalated", 0)
    assert "destination" in wf["error"] and "the email API timed out after the send" in wf["error"]
    assert "destination" in escalation(journal, wid)["reason"]
    assert "retry_scheduled" not in events(journal, wid)
    assert run_workflow(journal, wid) is None
    assert activity.calls == 1


def test_invalid_request_is_repaired_with_the_exact_validation_message(journal, one_step):
    activity = Script(InvalidRequest("reference 12 was not returned by retrieval"))
    repair = Script({"claims": ["supported"], "references": [3, 7]})
    wid = one_step(activity, retry=FAST, repair=repair)
    assert run_workflow(journal, wid) == {"result": {"claims": ["supported"], "references": [3, 7]}}

    assert activity.calls == 1
    assert repair.args == [("reference 12 was not returned by retrieval",)]
    s = step(journal, wid)
    assert (s["status"], s["attempts"], s["output"]) == ("complete", 2, {"claims": ["supported"], "references": [3, 7]})
    assert journal.workflow(wid)["status"] == "complete"
    assert journal.workflow(wid)["retries_used"] == 0
    failed = [e["detail"] for e in journal.history(wid) if e["event"] == "step_failed"]
    assert failed == ["InvalidRequest: reference 12 was not returned by retrieval"]


def test_invalid_request_without_repair_escalates_after_one_attempt(journal, one_step):
    activity = Script(InvalidRequest("reference 12 was not returned by retrieval"), {"ok": True})
    wid = one_step(activity, retry=FAST)
    run_workflow(journal, wid)

    assert activity.calls == 1
    wf = journal.workflow(wid)
    assert (wf["status"], wf["retries_used"]) == ("escalated", 0)
    assert "reference 12 was not returned by retrieval" in wf["error"]
    assert step(journal, wid)["attempts"] == 1
    assert escalation(journal, wid)["attempts"] == [
        {"attempt": 1, "error": "InvalidRequest: reference 12 was not returned by retrieval"}]


def test_a_failed_repair_of_an_invalid_request_escalates(journal, one_step):
    activity = Script(InvalidRequest("reference 12 was not returned by retrieval"))
    repair = Script(InvalidRequest("reference 12 is still cited"))
    fallback = Script({"unused": True})
    wid = one_step(activity, retry=FAST, repair=repair, fallback=fallback)
    run_workflow(journal, wid)

    assert (activity.calls, repair.calls, fallback.calls) == (1, 1, 0)  # fallback answers format failures only
    assert journal.workflow(wid)["status"] == "escalated"
    assert [a["error"] for a in escalation(journal, wid)["attempts"]] == [
        "InvalidRequest: reference 12 was not returned by retrieval", "InvalidRequest: reference 12 is still cited"]


def test_a_retry_after_a_transient_failure_of_the_repair_repeats_the_repair_not_the_request(journal, one_step, db):
    activity = Script(InvalidRequest("reference 12 was not returned by retrieval"))
    repair = Script(Transient("503 during repair"), {"references": [3, 7]})
    wid = one_step(activity, retry=FAST, repair=repair)
    assert run_workflow(journal, wid) is None
    assert step(journal, wid)["repair_message"] == "reference 12 was not returned by retrieval"
    make_due(journal.path, wid)

    assert run_workflow(Journal(db), wid) == {"result": {"references": [3, 7]}}  # a new replay, as after a restart
    assert activity.calls == 1
    assert repair.args == [("reference 12 was not returned by retrieval",)] * 2
    assert (step(journal, wid)["attempts"], journal.workflow(wid)["retries_used"]) == (3, 1)


def test_format_failure_twice_repairs_once_then_falls_back(journal, one_step):
    activity = Script(FormatFailure("expected JSON, got prose"))
    repair = Script(FormatFailure("still prose"))
    fallback = Script({"summary": "fallback template"})
    wid = one_step(activity, retry=FAST, repair=repair, fallback=fallback)
    assert run_workflow(journal, wid) == {"result": {"summary": "fallback template"}}

    assert (activity.calls, repair.calls, fallback.calls) == (1, 1, 1)
    assert repair.args == [("expected JSON, got prose",)]
    assert fallback.args == [()]
    s = step(journal, wid)
    assert (s["status"], s["attempts"], s["output"]) == ("complete", 3, {"summary": "fallback template"})
    assert journal.workflow(wid)["status"] == "complete"
    assert run_workflow(journal, wid) == {"result": {"summary": "fallback template"}}
    assert (activity.calls, repair.calls, fallback.calls) == (1, 1, 1)


def test_format_failure_everywhere_escalates_and_never_loops(journal, one_step):
    activity = Script(FormatFailure("shape 1"))
    repair = Script(FormatFailure("shape 2"))
    fallback = Script(FormatFailure("shape 3"))
    wid = one_step(activity, retry=FAST, repair=repair, fallback=fallback)
    assert run_workflow(journal, wid) is None

    assert (activity.calls, repair.calls, fallback.calls) == (1, 1, 1)
    wf = journal.workflow(wid)
    assert (wf["status"], wf["retries_used"]) == ("escalated", 0)
    assert [a["error"] for a in escalation(journal, wid)["attempts"]] == [
        "FormatFailure: shape 1", "FormatFailure: shape 2", "FormatFailure: shape 3"]


def test_format_failure_with_fallback_only_uses_the_fallback(journal, one_step):
    activity = Script(FormatFailure("shape"))
    fallback = Script({"fallback": 1})
    wid = one_step(activity, retry=FAST, fallback=fallback)
    assert run_workflow(journal, wid) == {"result": {"fallback": 1}}
    assert (activity.calls, fallback.calls) == (1, 1)


def test_an_unexpected_exception_with_retry_fails_the_workflow(journal, one_step):
    activity = Script(ValueError("a bug"), {"ok": True})
    wid = one_step(activity, retry=FAST)
    with pytest.raises(ValueError, match="a bug"):
        run_workflow(journal, wid)
    assert activity.calls == 1
    wf = journal.workflow(wid)
    assert (wf["status"], wf["error"], wf["retries_used"]) == ("failed", "ValueError: a bug", 0)
    assert step(journal, wid)["status"] == "failed"
    assert "retry_scheduled" not in events(journal, wid)


@pytest.mark.parametrize("error", [Transient("503"), PolicyDenied("no"), InvalidRequest("bad"),
                                   FormatFailure("shape"), AmbiguousEffect("unknown")])
def test_without_retry_a_failure_fails_the_step_and_the_workflow(journal, one_step, error):
    activity = Script(error, {"ok": True})
    repair = Script({"repaired": True})
    wid = one_step(activity, repair=repair, fallback=Script({"fallback": True}))
    with pytest.raises(type(error)):
        run_workflow(journal, wid)

    assert (activity.calls, repair.calls) == (1, 0)
    s = step(journal, wid)
    assert (s["status"], s["attempts"], s["next_attempt_at"]) == ("failed", 1, None)
    wf = journal.workflow(wid)
    assert (wf["status"], wf["error"], wf["retries_used"]) == ("failed", f"{type(error).__name__}: {error}", 0)
    assert events(journal, wid)[-1] == "workflow_failed"
    assert journal.conn.execute("SELECT COUNT(*) FROM escalations").fetchone()[0] == 0
    # Failed is not final: a resume makes it runnable again, and the next replay retries the step.
    assert "failed" not in FINAL_STATUSES
    resume(journal, wid, by="ops")
    assert run_workflow(journal, wid) == {"result": {"ok": True}}
    assert activity.calls == 2


def test_suspended_and_ended_pass_through_except_exception(journal, kinds):
    assert issubclass(Suspended, BaseException) and not issubclass(Suspended, Exception)
    assert issubclass(Ended, BaseException) and not issubclass(Ended, Exception)
    calls, caught = Script(Transient("503"), {"ok": True}), []
    kind = kinds()

    @durable_kit.workflow(kind)
    def careless(wf):
        try:
            return {"result": wf.execute_step("call", calls, retry=FAST)}
        except Exception as error:  # workflow code that swallows every error
            caught.append(error)
            return {"result": "swallowed"}

    journal.start(kind, {}, "wf-1")
    assert run_workflow(journal, "wf-1") is None
    assert caught == []
    assert journal.workflow("wf-1")["status"] == "pending"
    run_workflow(journal, "wf-1")  # not due: suspends again, still through the except
    assert caught == [] and calls.calls == 1

    denied = Script(PolicyDenied("no"))
    kind2 = kinds("ended")

    @durable_kit.workflow(kind2)
    def careless_too(wf):
        try:
            return wf.execute_step("call", denied, retry=FAST)
        except Exception as error:
            caught.append(error)
            return "swallowed"

    journal.start(kind2, {}, "wf-2")
    assert run_workflow(journal, "wf-2") is None
    assert caught == []
    assert journal.workflow("wf-2")["status"] == "stopped"


def test_a_retry_replays_completed_steps_without_running_them(journal, kinds):
    first, second = Script("one"), Script(Transient("503"), "two")
    kind = kinds()

    @durable_kit.workflow(kind)
    def two_steps(wf):
        a = wf.execute_step("a", first, retry=FAST)
        b = wf.execute_step("b", second, retry=FAST)
        return [a, b]

    journal.start(kind, {}, "wf-1")
    assert run_workflow(journal, "wf-1") is None
    make_due(journal.path, "wf-1")
    assert run_workflow(journal, "wf-1") == ["one", "two"]
    assert (first.calls, second.calls) == (1, 2)
    assert [(s["name"], s["attempts"]) for s in journal.steps("wf-1")] == [("a", 1), ("b", 2)]
    assert events(journal, "wf-1").count("step_reused") == 1


# --- faults: next_step fail and delay ---

def test_next_step_fail_raises_an_injected_transient_failure_once(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    arm(journal.conn, "next_step", "fail")
    activity = Script("done")
    with pytest.raises(InjectedFailure, match="next_step"):
        journal.open("wf-1").execute_step("plan", activity)
    assert activity.calls == 0  # the failure fires before the activity
    s = step(journal, "wf-1", "plan")
    assert (s["status"], s["attempts"]) == ("failed", 1)
    assert s["error"].startswith("InjectedFailure: injected failure at 'next_step'")
    assert journal.conn.execute("SELECT COUNT(*) FROM faults").fetchone()[0] == 0
    fired = [e["detail"] for e in journal.history("wf-1") if e["event"] == "fault_fired"]
    assert fired == ["next_step (fail)"]

    assert journal.open("wf-1").execute_step("plan", activity) == "done"
    assert activity.calls == 1
    assert step(journal, "wf-1", "plan")["attempts"] == 2


def test_next_step_fail_under_a_retry_policy_schedules_a_retry(journal, one_step):
    activity = Script({"ok": True})
    wid = one_step(activity, retry=FAST)
    arm(journal.conn, "next_step", "fail")
    assert run_workflow(journal, wid) is None
    assert activity.calls == 0
    assert step(journal, wid)["status"] == "retrying"
    assert journal.workflow(wid)["status"] == "pending"
    make_due(journal.path, wid)
    assert run_workflow(journal, wid) == {"result": {"ok": True}}
    assert activity.calls == 1


def test_next_step_delay_sleeps_then_the_step_runs(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    arm(journal.conn, "next_step", "delay", 0.1)
    assert journal.conn.execute("SELECT seconds FROM faults WHERE point = 'next_step'").fetchone()[0] == 0.1
    activity = Script("done")
    began = time.monotonic()
    assert journal.open("wf-1").execute_step("plan", activity) == "done"
    assert time.monotonic() - began >= 0.1
    assert activity.calls == 1
    assert journal.conn.execute("SELECT COUNT(*) FROM faults").fetchone()[0] == 0
    fired = [e["detail"] for e in journal.history("wf-1") if e["event"] == "fault_fired"]
    assert fired == ["next_step (delay)"]
    s = step(journal, "wf-1", "plan")
    assert (s["status"], s["attempts"]) == ("complete", 1)
