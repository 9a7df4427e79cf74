"""The notebook panels: buttons call the same functions as the command line and answer through widget values."""
from __future__ import annotations

import pytest

from durable_kit import Journal, run_workflow
from durable_kit.agents import research  # noqa: F401  (registers reviewed_report)
from durable_kit.fakes.notifier import Notifier
from durable_kit.waits import approve

from conftest import dump

widgets = pytest.importorskip("durable_kit.lab.widgets")

TOPIC = "supplier concentration risk"


def waiting_workflow(db, topic=TOPIC, workflow_id="r1") -> str:
    journal = Journal(db)
    journal.start("reviewed_report", {"topic": topic}, workflow_id)
    assert run_workflow(journal, workflow_id) is None
    return workflow_id


def test_the_approval_panel_shows_the_recommendation_and_its_evidence(db):
    panel = widgets.ApprovalPanel(db, waiting_workflow(db))
    assert "Rank Harbor Lane highest" in panel.request.value
    for subtopic in ("single sourcing", "regional clustering", "mitigation"):
        assert f"<b>{subtopic}</b>" in panel.request.value
    assert panel.result.value == ""


def test_approve_button_saves_the_decision_and_the_workflow_runs_on(db, capsys):
    wid = waiting_workflow(db)
    panel = widgets.ApprovalPanel(db, wid)
    panel.approver.value, panel.comment.value = "Dana", "evidence is sound"
    panel.approve_button.click()

    assert panel.result.value == "Saved: approved by Dana. Workflow status: pending."
    assert capsys.readouterr() == ("", "")  # results go to widget values, never to stdout
    output = run_workflow(Journal(db), wid)
    assert output["approved_by"] == "Dana" and output["notification"] == "sent"
    assert Notifier.beside(db).count() == 1


def test_a_second_click_returns_the_first_decision_and_a_conflicting_one_is_refused(db):
    wid = waiting_workflow(db)
    panel = widgets.ApprovalPanel(db, wid)
    panel.approver.value = "Dana"
    panel.approve_button.click()
    before = dump(db)

    panel.approver.value = "Eve"
    panel.approve_button.click()
    assert panel.result.value == "Saved: approved by Dana. Workflow status: pending."
    panel.reject_button.click()
    assert panel.result.value.startswith("Nothing saved: workflow 'r1', wait 'approval': approved by Dana")
    assert dump(db) == before


def test_reject_button_ends_the_workflow_without_report_or_notification(db):
    wid = waiting_workflow(db)
    panel = widgets.ApprovalPanel(db, wid)
    panel.approver.value, panel.comment.value = "Dana", "sources too thin"
    panel.reject_button.click()
    assert panel.result.value == "Saved: rejected by Dana. Workflow status: pending."

    journal = Journal(db)
    assert run_workflow(journal, wid) is None
    wf = journal.workflow(wid)
    assert (wf["status"], wf["error"]) == ("rejected", "rejected by Dana: sources too thin")
    assert "report" not in [s["name"] for s in journal.steps(wid)]
    assert Notifier.beside(db).count() == 0


def test_a_panel_without_an_approver_name_saves_nothing(db):
    wid = waiting_workflow(db)
    panel = widgets.ApprovalPanel(db, wid)
    before = dump(db)
    panel.approve_button.click()
    assert panel.result.value.startswith("Nothing saved: workflow 'r1': say who decides")
    assert dump(db) == before


def test_a_panel_for_a_workflow_that_is_not_waiting_says_so_and_saves_nothing(db):
    journal = Journal(db)
    journal.start("reviewed_report", {"topic": TOPIC}, "not-yet")
    panel = widgets.ApprovalPanel(db, "not-yet")
    assert "has not asked for an approval" in panel.request.value
    before = dump(db)
    panel.approver.value = "Dana"
    panel.approve_button.click()
    assert panel.result.value.startswith("Nothing saved: workflow 'not-yet' is not waiting for approval")
    assert dump(db) == before


def test_the_clarification_panel_saves_the_answer_and_the_workflow_replans(db):
    wid = waiting_workflow(db, topic="our suppliers", workflow_id="c1")
    panel = widgets.ClarificationPanel(db, wid)
    assert "Which question about our suppliers" in panel.question.value

    panel.person.value = "Sam"
    panel.submit_button.click()
    assert panel.result.value.startswith("Nothing saved: workflow 'c1': the answer is empty")
    panel.answer.value = TOPIC
    panel.submit_button.click()
    assert panel.result.value == "Saved: 'supplier concentration risk' from Sam. Workflow status: pending."

    journal = Journal(db)
    assert run_workflow(journal, wid) is None  # now it waits for approval of the re-planned research
    names = [s["name"] for s in journal.steps(wid)]
    assert names[:3] == ["plan", "plan:clarified", "research:single sourcing"]
    assert journal.workflow(wid)["status"] == "waiting"


def test_the_inspector_shows_steps_waits_and_history_and_refreshes(db):
    wid = waiting_workflow(db)
    inspector = widgets.WorkflowInspector(db, wid)
    assert "r1 (reviewed_report): waiting; waiting for approval &#x27;approval&#x27;" in inspector.summary.value
    steps = inspector.steps_table()
    assert list(steps["name"]) == ["plan", "research:single sourcing", "research:regional clustering",
                                   "research:mitigation", "analyze", "recommend"]
    assert set(steps["status"]) == {"complete"} and set(steps["attempts"]) == {1}
    assert list(inspector.history_table().columns) == ["seq", "event", "step", "detail"]
    assert inspector.history_table()["event"].iloc[-1] == "waiting_for_approval"

    approve(Journal(db), wid, "Dana")  # what `python -m durable_kit approve` does
    run_workflow(Journal(db), wid)
    assert "waiting" in inspector.summary.value  # nothing changes until Refresh
    inspector.refresh_button.click()
    assert inspector.summary.value == "<p><b>r1 (reviewed_report): complete</b></p>"
    assert "notify" in inspector.steps.value


def test_the_approval_panel_shows_a_structured_refund_recommendation(db):
    journal = Journal(db)
    journal.start("refund", {"order_id": "A-1002"}, "refund-1")
    assert run_workflow(journal, "refund-1") is None
    panel = widgets.ApprovalPanel(db, "refund-1")
    assert "<li><b>why</b>: amount 420 is above 100</li>" in panel.request.value
    assert "<li>order:A-1002</li><li>policy:defective</li>" in panel.request.value
    panel.approver.value = "Priya"
    panel.approve_button.click()
    assert panel.result.value == "Saved: approved by Priya. Workflow status: pending."
    assert run_workflow(journal, "refund-1")["approved_by"] == "Priya"
