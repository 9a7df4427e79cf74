"""The notebook panels: buttons call the same functions as the command line and answer through widget values."""
from __future__ import annotations

import pytest

from durable_kit import Journal, run_workflow
from durable_kit.workshop.agents import research  # noqa: F401  (registers reviewed_report)
from durable_kit.decisions import approve
from durable_kit.world.notifier import Notifier

from conftest import dump

widgets = pytest.importorskip("durable_kit.workshop.lab.widgets")

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

    assert panel.result.value == "Saved: approved by Dana (evidence is sound). Workflow status: pending."
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

    # Once decided, the panel shows the decision and its controls no longer apply.
    assert panel.result.value == "Saved: approved by Dana. Workflow status: pending."
    assert "approval &#x27;approval&#x27;: was decided" in panel.request.value
    assert all(c.disabled for c in (panel.approver, panel.comment, panel.approve_button, panel.reject_button))
    # A second panel for the same wait (another person's screen) opens decided and disabled too.
    other = widgets.ApprovalPanel(db, wid)
    assert other.result.value == "Decided: approved by Dana."
    assert other.approve_button.disabled and other.reject_button.disabled
    # Driven anyway (a stale screen, a script), a repeat saves nothing and a conflicting decision is refused.
    panel.approver.value = "Eve"
    panel._save(approve, "Eve")
    assert panel.result.value == "Already decided, nothing saved: approved by Dana. Workflow status: pending."
    panel._save(widgets.reject, "Eve")
    assert panel.result.value.startswith("Nothing saved: workflow 'r1', wait 'approval': the decision saved first (approved by Dana)")
    assert dump(db) == before


def test_reject_button_ends_the_workflow_without_report_or_notification(db):
    wid = waiting_workflow(db)
    panel = widgets.ApprovalPanel(db, wid)
    panel.approver.value, panel.comment.value = "Dana", "sources too thin"
    panel.reject_button.click()
    assert panel.result.value == "Saved: rejected by Dana (sources too thin). Workflow status: pending."

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
    assert panel.result.value == "Nothing saved: type your name first."  # the panel's words, not a flag
    assert dump(db) == before


def test_a_panel_for_a_workflow_that_is_not_waiting_says_so_and_saves_nothing(db):
    journal = Journal(db)
    journal.start("reviewed_report", {"topic": TOPIC}, "not-yet")
    panel = widgets.ApprovalPanel(db, "not-yet")
    assert "has not reached approval yet" in panel.request.value
    assert panel.approve_button.disabled and panel.reject_button.disabled
    before = dump(db)
    panel.approver.value = "Dana"
    panel._save(approve, "Dana")  # driven anyway
    assert panel.result.value.startswith("Nothing saved: workflow 'not-yet' is not waiting for approval")
    assert dump(db) == before
    # Bound by name to a wait not reached yet, it enables itself on refresh once the workflow gets there.
    named = widgets.ApprovalPanel(db, "not-yet", wait="approval")
    assert "has not reached approval &#x27;approval&#x27; yet" in named.request.value and named.approve_button.disabled
    run_workflow(journal, "not-yet")
    named.refresh()
    assert "asks for approval" in named.request.value and not named.approve_button.disabled


def test_the_clarification_panel_saves_the_answer_and_the_workflow_replans(db):
    wid = waiting_workflow(db, topic="our suppliers", workflow_id="c1")
    panel = widgets.ClarificationPanel(db, wid)
    assert "Which question about our suppliers" in panel.question.value

    panel.person.value = "Sam"
    panel.submit_button.click()
    assert panel.result.value == "Nothing saved: write the answer first."
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


TWO_GATES = """
import durable_kit


@durable_kit.workflow("widget_two_gates")
def two_gates(wf):
    wf.wait_for_approval("plan", {"recommendation": "refund 89 EUR"})
    wf.wait_for_approval("payment", {"recommendation": "pay 89 EUR"})
    return "paid"
"""


def test_each_panel_is_bound_to_one_wait_and_never_decides_a_later_one(db, tmp_path):
    module = tmp_path / "gates.py"
    module.write_text(TWO_GATES)
    from durable_kit.__main__ import load_module
    load_module(str(module))
    journal = Journal(db)
    journal.start("widget_two_gates", {}, "g1")
    run_workflow(journal, "g1")
    plan_panel = widgets.ApprovalPanel(db, "g1")
    assert plan_panel.wait == "plan"
    plan_panel.approver.value = "Dana"
    plan_panel.approve_button.click()
    run_workflow(journal, "g1")  # now the payment waits
    before = dump(db)
    plan_panel._save(approve, "Dana")  # the plan's panel clicked again: stays on the plan
    assert plan_panel.result.value.startswith("Already decided, nothing saved: approved by Dana")
    assert dump(db) == before
    payment_panel = widgets.ApprovalPanel(db, "g1")
    assert payment_panel.wait == "payment" and not payment_panel.approve_button.disabled
    payment_panel.approver.value = "Sam"
    payment_panel.approve_button.click()
    assert run_workflow(journal, "g1") == "paid"


LIVE = """
import time
import durable_kit


@durable_kit.workflow("widget_live")
def live(wf):
    for name in ("one", "two", "three"):
        wf.execute_step(name, lambda: time.sleep(0.2) or name)
    return "done"
"""


def test_the_inspector_follows_a_workflow_run_by_a_worker_in_another_process(db, tmp_path):
    import subprocess
    import sys
    import time

    module = tmp_path / "live.py"
    module.write_text(LIVE)
    journal = Journal(db)
    journal.start("widget_live", {}, "l1", registered_elsewhere=True)
    inspector = widgets.WorkflowInspector(db, "l1", every=0.05)
    assert inspector.summary.value == "<p><b>l1 (widget_live): pending</b></p>"
    inspector.follow.value = True  # what clicking Follow does
    worker = subprocess.run([sys.executable, "-m", "durable_kit", "worker", "--db", str(db), "--until-idle",
                             "--module", str(module)], capture_output=True, text=True, timeout=60)
    assert worker.returncode == 0, worker.stderr
    deadline = time.monotonic() + 5
    while "complete" not in inspector.summary.value and time.monotonic() < deadline:
        time.sleep(0.02)
    inspector.follow.value = False
    assert inspector.summary.value == "<p><b>l1 (widget_live): complete</b></p>"
    assert inspector.refreshes > 1
    assert inspector.steps.value.count("<td>complete</td>") == 3
    after = inspector.refreshes
    time.sleep(0.2)
    assert inspector.refreshes == after  # Follow off: no more reads
