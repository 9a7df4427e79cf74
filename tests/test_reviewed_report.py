"""The reviewed research agent: approval and clarification waits, at-most-once notification, crashes, CLI."""
from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter

import pytest

import durable_kit.workshop.agents  # noqa: F401  (registers reviewed_report for in-process runs)
from durable_kit import Journal, run_workflow
from durable_kit.admin import open_wait
from durable_kit.world.llm import load_topics
from durable_kit.world.notifier import Notifier
from durable_kit.harness.faults import CRASH_EXIT_CODE
from durable_kit.world.ledger import Ledger

from conftest import plain, dump, run_python

TOPIC = "supplier concentration risk"
KNOWN = load_topics()[TOPIC]
BEFORE_APPROVAL = ["plan", *(f"research:{s}" for s in KNOWN["subtopics"]), "analyze", "recommend"]
AFTER_APPROVAL = ["report", "notify"]
EVIDENCE = [{"subtopic": s, "finding": KNOWN["notes"][s]} for s in KNOWN["subtopics"]]
REQUEST = {"recommendation": KNOWN["recommendation"], "confidence": 0.8, "evidence": EVIDENCE}
MESSAGE = f"Report: {TOPIC} is ready (approved by ana)"
NOT_SENT = "not sent by this attempt: an earlier attempt reserved the key and may or may not have sent it"
BROAD = "our suppliers"
QUESTION = load_topics()[BROAD]["question"]


def cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m durable_kit ARGS`` in a new process."""
    return run_python("-m", "durable_kit", *args, timeout=60)


def worker(db, expect: int = 0) -> list[str]:
    """One ``worker --until-idle`` process; its log lines (the process has exited when this returns)."""
    done = cli("worker", "--db", str(db), "--until-idle")
    assert done.returncode == expect, done.stderr
    return done.stdout.splitlines()


def decide(db, command: str, workflow_id: str, *options: str, expect: int = 0) -> dict:
    """approve / reject / answer with --json; the JSON it printed."""
    done = cli(command, "--db", str(db), "--workflow", workflow_id, *options, "--json")
    assert done.returncode == expect, (done.stdout, done.stderr)
    printed = json.loads(done.stdout)
    if "decision" in printed:  # where it landed and whether it was saved, beside the decision itself
        result = printed.pop("decision")
        printed.update(decision=plain(result), wait=result["wait"], saved=result["saved"])
    return printed


def at_approval(db, workflow_id: str = "r1", topic: str = TOPIC) -> Journal:
    """Start a reviewed report and run it in this process up to its approval wait."""
    journal = Journal(db)
    journal.start("reviewed_report", {"topic": topic}, workflow_id)
    assert run_workflow(journal, workflow_id) is None
    assert open_wait(journal, workflow_id)["kind"] == "approval"
    return journal


def model_calls(db, workflow_id: str = "r1") -> int:
    return Ledger.beside(db).count("model", workflow_id)


def operations(db, workflow_id: str = "r1") -> Counter:
    return Counter(c["operation"] for c in Ledger.beside(db).calls("model", workflow_id))


def attempts(journal: Journal, workflow_id: str = "r1") -> dict:
    return {s["name"]: s["attempts"] for s in journal.steps(workflow_id)}


def events(journal: Journal, workflow_id: str = "r1") -> list[str]:
    return [e["event"] for e in journal.history(workflow_id)]


# --- the approval wait ---

def test_the_approval_wait_holds_no_worker(db):
    journal = Journal(db)
    journal.start("reviewed_report", {"topic": TOPIC}, "r1")
    assert worker(db) == ["r1: waiting", "worker stopped"]  # the worker exited while the workflow waits

    wf = journal.workflow("r1")
    assert (wf["status"], wf["next_run_at"], wf["output"]) == ("waiting", None, None)
    wait = open_wait(journal, "r1")
    assert (wait["name"], wait["kind"], wait["status"], wait["decision"]) == ("approval", "approval", "waiting", None)
    assert wait["request"] == REQUEST
    assert [s["name"] for s in journal.steps("r1")] == BEFORE_APPROVAL
    assert model_calls(db) == 6
    assert events(journal)[-1] == "waiting_for_approval"

    # Restarted workers find nothing to do and change nothing.
    before = dump(db)
    assert worker(db) == ["worker stopped"]
    done = cli("worker", "--db", str(db), "--once")
    assert (done.returncode, done.stdout.splitlines()) == (0, ["worker stopped"])
    assert dump(db) == before
    assert model_calls(db) == 6
    assert Notifier.beside(db).count() == 0


def test_approve_then_a_worker_writes_the_report_and_notifies_once(db):
    journal = at_approval(db)
    saved = decide(db, "approve", "r1", "--by", "ana", "--comment", "ship it")
    assert saved == {"workflow_id": "r1", "decision": {"approved": True, "by": "ana", "comment": "ship it"},
                     "status": "pending", "wait": "approval", "saved": True}
    assert model_calls(db) == 6

    assert worker(db) == ["r1: complete", "worker stopped"]
    wf = journal.workflow("r1")
    assert wf["status"] == "complete"
    assert wf["output"] == {"title": f"Report: {TOPIC}", "recommendation": KNOWN["recommendation"],
                            "approved_by": "ana", "notification": "sent"}
    assert attempts(journal) == {name: 1 for name in BEFORE_APPROVAL + AFTER_APPROVAL}
    # Six calls before the wait, one report after it: nothing before the wait was asked twice.
    assert model_calls(db) == 7
    assert operations(db) == {"plan": 1, "research": 3, "analyze": 1, "recommend": 1, "report": 1}
    assert Notifier.beside(db).deliveries() == [
        {"seq": 1, "key": "r1:notify", "recipient": "research-team@example.com", "message": MESSAGE}]

    history = journal.history("r1")
    resumed = max(i for i, e in enumerate(history) if e["event"] == "replay_started")
    later = history[resumed:]
    assert [e["step"] for e in later if e["event"] == "step_reused"] == BEFORE_APPROVAL
    assert [e["step"] for e in later if e["event"] == "step_started"] == AFTER_APPROVAL
    assert [e["event"] for e in later if e["step"] == "notify"] == ["step_started", "key_reserved", "step_completed"]

    before = dump(db)
    assert worker(db) == ["worker stopped"]
    assert dump(db) == before
    assert Notifier.beside(db).count() == 1


def test_a_second_decision_returns_the_first_or_is_refused_and_changes_nothing(db):
    at_approval(db)
    first = {"approved": True, "by": "ana", "comment": "ship it"}
    assert decide(db, "approve", "r1", "--by", "ana", "--comment", "ship it")["decision"] == first

    before = dump(db)
    assert decide(db, "approve", "r1", "--by", "bob", "--comment", "me too") == {
        "workflow_id": "r1", "decision": first, "status": "pending", "wait": "approval", "saved": False}
    repeat = cli("approve", "--db", str(db), "--workflow", "r1", "--by", "bob")
    assert repeat.returncode == 0
    assert repeat.stdout.startswith("r1, wait 'approval': already approved by ana at ")
    assert repeat.stdout.endswith("; nothing saved; status pending\n")
    refused = decide(db, "reject", "r1", "--by", "bob", expect=2)
    assert list(refused) == ["error"]
    assert "workflow 'r1'" in refused["error"] and "the decision saved first (approved by ana: ship it) is final" in refused["error"]
    plain = cli("reject", "--db", str(db), "--workflow", "r1", "--by", "bob")
    assert (plain.returncode, plain.stdout) == (2, "")
    assert plain.stderr.startswith("error: workflow 'r1'")
    assert dump(db) == before

    worker(db)
    before = dump(db)
    assert decide(db, "approve", "r1", "--by", "cy")["decision"] == first
    assert decide(db, "approve", "r1", "--by", "cy")["status"] == "complete"
    assert "the decision saved first" in decide(db, "reject", "r1", "--by", "cy", expect=2)["error"]
    assert dump(db) == before
    assert Notifier.beside(db).count() == 1


def test_approving_what_does_not_wait_for_approval_is_refused_and_changes_nothing(db):
    journal = Journal(db)
    journal.start("reviewed_report", {"topic": TOPIC}, "fresh")
    journal.start("research_report", {"topic": "a one-part question"}, "plain")
    assert run_workflow(journal, "plain")["recommendation"] == "Proceed."
    journal.start("reviewed_report", {"topic": BROAD}, "broad")
    assert run_workflow(journal, "broad") is None

    before = dump(db)
    for workflow_id, expected in [("fresh", "'fresh' is not waiting for approval (its status is 'pending')"),
                                  ("plain", "'plain' is not waiting for approval (its status is 'complete')"),
                                  ("broad", "'broad' is not waiting for approval (its status is 'waiting')"),
                                  ("nope", "no workflow 'nope' in journal.db; check the id")]:
        for command in ("approve", "reject"):
            refused = decide(db, command, workflow_id, "--by", "ana", expect=2)
            assert expected in refused["error"], refused
    assert dump(db) == before
    assert model_calls(db, "fresh") == 0


def test_a_decision_without_a_name_is_refused_and_changes_nothing(db):
    at_approval(db)
    before = dump(db)
    for command, text in [("approve", ()), ("reject", ()), ("answer", ("--text", TOPIC))]:
        refused = decide(db, command, "r1", *text, "--by", "", expect=2)
        assert refused == {"error": "workflow 'r1': say who decides (a name); nothing was changed."}
    assert dump(db) == before


def test_reject_ends_the_workflow_with_no_report_and_no_notification(db):
    journal = at_approval(db)
    saved = decide(db, "reject", "r1", "--by", "bob", "--comment", "evidence too thin")
    assert saved == {"workflow_id": "r1", "decision": {"approved": False, "by": "bob", "comment": "evidence too thin"},
                     "status": "pending", "wait": "approval", "saved": True}
    assert worker(db) == ["r1: rejected", "worker stopped"]

    wf = journal.workflow("r1")
    assert (wf["status"], wf["error"], wf["output"]) == ("rejected", "rejected by bob: evidence too thin", None)
    assert [s["name"] for s in journal.steps("r1")] == BEFORE_APPROVAL
    assert model_calls(db) == 6
    assert operations(db)["report"] == 0
    assert Notifier.beside(db).count() == 0
    assert dump(db)["reservations"] == []
    last = journal.history("r1")[-1]
    assert (last["event"], last["detail"]) == ("workflow_rejected", "rejected by bob: evidence too thin")

    before = dump(db)
    assert worker(db) == ["worker stopped"]
    assert dump(db) == before
    assert Notifier.beside(db).count() == 0

    # Without a comment the reason names who rejected, and nothing more.
    at_approval(db, "r2")
    decide(db, "reject", "r2", "--by", "bob")
    assert worker(db) == ["r2: rejected", "worker stopped"]
    assert journal.workflow("r2")["error"] == "rejected by bob"


# --- the clarifying question ---

def test_a_broad_topic_asks_first_then_researches_the_answer(db):
    journal = Journal(db)
    journal.start("reviewed_report", {"topic": BROAD}, "q1")
    assert worker(db) == ["q1: waiting", "worker stopped"]
    assert journal.workflow("q1")["next_run_at"] is None
    status = json.loads(cli("status", "--db", str(db), "--workflow", "q1", "--json").stdout)
    assert status["workflow"]["status"] == "waiting"
    assert status["waiting_for"] == {"name": "clarify", "kind": "clarification", "request": {"question": QUESTION},
                                     "wake_at": None}
    assert [s["name"] for s in status["steps"]] == ["plan"]
    assert model_calls(db, "q1") == 1

    before = dump(db)
    for empty in ("", "   "):
        refused = decide(db, "answer", "q1", "--text", empty, "--by", "ana", expect=2)
        assert "the answer is empty" in refused["error"]
    assert "not waiting for approval" in decide(db, "approve", "q1", "--by", "ana", expect=2)["error"]
    assert dump(db) == before

    first = {"answer": TOPIC, "by": "ana"}
    assert decide(db, "answer", "q1", "--text", TOPIC, "--by", "ana") == {
        "workflow_id": "q1", "decision": first, "status": "pending", "wait": "clarify", "saved": True}
    before = dump(db)
    assert decide(db, "answer", "q1", "--text", TOPIC, "--by", "bob")["decision"] == first
    conflict = decide(db, "answer", "q1", "--text", "something else", "--by", "bob", expect=2)
    assert "'q1', wait 'clarify': the decision saved first (answered by ana: supplier concentration risk) is final" in conflict["error"]
    assert dump(db) == before

    assert worker(db) == ["q1: waiting", "worker stopped"]
    wait = open_wait(journal, "q1")
    assert (wait["name"], wait["kind"], wait["request"]) == ("approval", "approval", REQUEST)
    steps = {s["name"]: s for s in journal.steps("q1")}
    assert list(steps) == ["plan", "plan:clarified", *BEFORE_APPROVAL[1:]]
    assert steps["plan"]["output"] == {"subtopics": [], "question": QUESTION}
    assert steps["plan:clarified"]["input"] == {"topic": TOPIC}
    assert steps["plan:clarified"]["output"] == {"subtopics": KNOWN["subtopics"]}
    assert model_calls(db, "q1") == 7

    decide(db, "approve", "q1", "--by", "ana")
    assert worker(db) == ["q1: complete", "worker stopped"]
    assert journal.workflow("q1")["output"]["title"] == f"Report: {TOPIC}"
    assert model_calls(db, "q1") == 8
    assert operations(db, "q1") == {"plan": 2, "research": 3, "analyze": 1, "recommend": 1, "report": 1}
    assert attempts(journal, "q1") == {name: 1 for name in steps.keys() | set(AFTER_APPROVAL)}
    assert Notifier.beside(db).count() == 1
    assert decide(db, "answer", "q1", "--text", TOPIC, "--by", "cy")["status"] == "complete"


# --- crashes around the notification ---

def test_a_crash_after_the_notification_does_not_send_it_again(db):
    journal = at_approval(db)
    decide(db, "approve", "r1", "--by", "ana")
    armed = cli("fault", "crash-after-notify", "--db", str(db))
    assert "armed after_activity:notify (exit)" in armed.stdout

    assert worker(db, expect=CRASH_EXIT_CODE) == []
    assert journal.workflow("r1")["status"] == "running"
    assert {s["name"]: s["status"] for s in journal.steps("r1")}["notify"] == "running"
    assert Notifier.beside(db).count() == 1  # the message went out before the process died

    assert worker(db) == ["r1: recovered", "r1: complete", "worker stopped"]
    wf = journal.workflow("r1")
    assert wf["status"] == "complete"
    assert wf["output"]["notification"] == NOT_SENT
    assert Notifier.beside(db).deliveries() == [
        {"seq": 1, "key": "r1:notify", "recipient": "research-team@example.com", "message": MESSAGE}]
    assert attempts(journal) == {**{name: 1 for name in BEFORE_APPROVAL}, "report": 1, "notify": 2}
    assert model_calls(db) == 7
    history = events(journal)
    assert history.count("key_reserved") == 1 and history.count("key_already_reserved") == 1
    assert [e["detail"] for e in journal.history("r1") if e["event"] == "fault_fired"] == [
        "after_activity:notify (exit)"]


def test_a_crash_after_reserving_loses_the_notification_and_says_so(db):
    journal = at_approval(db)
    decide(db, "approve", "r1", "--by", "ana")
    armed = cli("fault", "crash-after-reserve", "--db", str(db))  # the point's name is the kit's business
    assert (armed.returncode, armed.stdout.startswith("armed "), "(exit)" in armed.stdout) == (0, True, True)

    assert worker(db, expect=CRASH_EXIT_CODE) == []
    assert events(journal).count("fault_fired") == 1
    assert Notifier.beside(db).count() == 0
    assert [r for r in dump(db)["reservations"] if "r1:notify" in r]

    assert worker(db) == ["r1: recovered", "r1: complete", "worker stopped"]
    wf = journal.workflow("r1")
    assert wf["status"] == "complete"
    assert wf["output"]["notification"].startswith("not sent")
    assert Notifier.beside(db).count() == 0  # at most once: the loss window, made visible
    assert attempts(journal)["notify"] == 2
    assert journal.steps("r1")[-1]["output"]["sent"] is False
    assert events(journal).count("key_already_reserved") == 1


def test_sigkill_after_the_report_repeats_only_the_report(db):
    journal = at_approval(db)
    decide(db, "approve", "r1", "--by", "ana")
    armed = cli("arm", "--db", str(db), "--point", "after_activity:report", "--action", "kill")
    assert armed.returncode == 0, armed.stderr

    assert worker(db, expect=-signal.SIGKILL) == []
    assert journal.workflow("r1")["status"] == "running"
    assert model_calls(db) == 7  # the report was asked for, its output never stored
    assert Notifier.beside(db).count() == 0

    assert worker(db) == ["r1: recovered", "r1: complete", "worker stopped"]
    assert journal.workflow("r1")["output"]["notification"] == "sent"
    assert model_calls(db) == 8
    assert operations(db) == {"plan": 1, "research": 3, "analyze": 1, "recommend": 1, "report": 2}
    assert attempts(journal) == {**{name: 1 for name in BEFORE_APPROVAL}, "report": 2, "notify": 1}
    assert Notifier.beside(db).count() == 1


# --- status on the command line ---

def test_status_shows_what_the_workflow_waits_for(db):
    at_approval(db)
    status = json.loads(cli("status", "--db", str(db), "--workflow", "r1", "--json").stdout)
    assert (status["workflow"]["status"], status["workflow"]["next_run_at"]) == ("waiting", None)
    assert status["waiting_for"] == {"name": "approval", "kind": "approval", "request": REQUEST, "wake_at": None}
    assert [s["name"] for s in status["steps"]] == BEFORE_APPROVAL
    lines = cli("status", "--db", str(db), "--workflow", "r1").stdout.splitlines()
    assert lines[:2] == ["r1 (reviewed_report, version reviewed-report-1): waiting", "  waiting for approval 'approval'"]
    assert "    confidence: 0.8" in lines

    decide(db, "approve", "r1", "--by", "ana")
    status = json.loads(cli("status", "--db", str(db), "--workflow", "r1", "--json").stdout)
    assert (status["workflow"]["status"], status["waiting_for"]) == ("pending", None)


# --- a plan with one subtopic ---

def test_a_one_part_question_runs_to_the_end_after_approval(db):
    journal = Journal(db)
    journal.start("reviewed_report", {"topic": "a one-part question"}, "one")
    assert worker(db) == ["one: waiting", "worker stopped"]
    request = open_wait(journal, "one")["request"]
    assert request["evidence"] == [{"subtopic": "the only subtopic",
                                    "finding": load_topics()["a one-part question"]["notes"]["the only subtopic"]}]
    assert request["recommendation"] == "Proceed."
    assert model_calls(db, "one") == 4

    decide(db, "approve", "one", "--by", "ana")
    assert worker(db) == ["one: complete", "worker stopped"]
    assert journal.workflow("one")["output"] == {"title": "Report: a one-part question", "recommendation": "Proceed.",
                                                 "approved_by": "ana", "notification": "sent"}
    assert [s["name"] for s in journal.steps("one")] == [
        "plan", "research:the only subtopic", "analyze", "recommend", "report", "notify"]
    assert model_calls(db, "one") == 5
    assert Notifier.beside(db).count("one:notify") == 1


def test_an_answer_that_is_still_too_broad_stops_the_workflow_with_a_reason(db):
    journal = Journal(db)
    journal.start("reviewed_report", {"topic": BROAD}, "c2")
    assert run_workflow(journal, "c2") is None
    assert open_wait(journal, "c2")["kind"] == "clarification"
    decide(db, "answer", "c2", "--text", BROAD, "--by", "sam")
    worker(db)

    wf = journal.workflow("c2")
    assert wf["status"] == "stopped"
    assert wf["error"] == ("the answer 'our suppliers' is still too broad to plan: start a new workflow "
                           "with a narrower topic")
    assert [s["name"] for s in journal.steps("c2")] == ["plan", "plan:clarified"]


def test_status_and_history_of_an_unknown_workflow_are_clear_errors(db):
    at_approval(db)
    for command in ("status", "history"):
        done = run_python("-m", "durable_kit", command, "--db", str(db), "--workflow", "nope")
        assert done.returncode == 2
        assert done.stderr == "error: no workflow 'nope' in journal.db: start it first, or check the id.\n"


@pytest.mark.parametrize("fault", ["slow-next-step", "fail-next-step", "crash-after-notify", "crash-after-reserve"])
def test_every_demo_fault_fires_in_the_reviewed_workflow(db, fault):
    from durable_kit.__main__ import DEMO_FAULTS

    journal = at_approval(db)
    decide(db, "approve", "r1", "--by", "ana")
    armed = cli("fault", fault, "--db", str(db), "--seconds", "0.1", "--json")
    assert armed.returncode == 0 and json.loads(armed.stdout)["point"] == DEMO_FAULTS[fault][0]
    crashes = fault.startswith("crash")
    worker(db, expect=CRASH_EXIT_CODE if crashes else 0)

    fired = [e["detail"] for e in journal.history("r1") if e["event"] == "fault_fired"]
    assert fired == [f"{DEMO_FAULTS[fault][0]} ({DEMO_FAULTS[fault][1]})"]
    assert journal.conn.execute("SELECT COUNT(*) FROM faults").fetchone()[0] == 0  # one-shot
