"""Notebook panels for people in the loop: approve or reject, answer a question, inspect a workflow.

Each panel calls the same functions as the command line (``waits.approve``,
``waits.reject``, ``waits.answer``, ``Journal.steps`` and ``Journal.history``)
and shows every result in a widget's ``value``, never by printing, so a
notebook (or a test) can drive it with ``Button.click()`` and read the outcome.
Importing this module imports ipywidgets and pandas; ``import durable_kit`` does not.
"""
from __future__ import annotations

import html
import json
import time
from pathlib import Path

import ipywidgets as widgets
import pandas as pd

from ..journal import Journal, WorkflowError
from ..waits import answer, approve, open_wait, reject, waits


def _latest_wait(journal: Journal, workflow_id: str, kind: str) -> dict | None:
    # The open wait of this kind, or else the last one decided (so a panel can show what was decided).
    of_kind = [w for w in waits(journal, workflow_id) if w["kind"] == kind]
    return next((w for w in of_kind if w["status"] == "waiting"), of_kind[-1] if of_kind else None)


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _describe_evidence(item) -> str:
    if isinstance(item, dict) and {"subtopic", "finding"} <= item.keys():
        return f"<b>{html.escape(item['subtopic'])}</b>: {html.escape(item['finding'])}"
    return html.escape(_text(item))


class ApprovalPanel(widgets.VBox):
    """The recommendation a workflow waits on, its evidence, and Approve / Reject.

    ``panel.approver.value = "Dana"; panel.approve_button.click()`` saves an
    approval exactly like ``python -m durable_kit approve``; ``panel.result.value``
    says what was saved, or why nothing was.
    """

    def __init__(self, db_path: str | Path, workflow_id: str):
        self.journal, self.workflow_id = Journal(db_path), workflow_id
        wait = _latest_wait(self.journal, workflow_id, "approval")
        self.request = widgets.HTML(value=self._render(wait))
        self.approver = widgets.Text(description="Approver", placeholder="your name")
        self.comment = widgets.Textarea(description="Comment", placeholder="optional")
        self.approve_button = widgets.Button(description="Approve", button_style="success")
        self.reject_button = widgets.Button(description="Reject", button_style="danger")
        self.result = widgets.HTML(value="")
        self.approve_button.on_click(lambda _: self._decide(approve))
        self.reject_button.on_click(lambda _: self._decide(reject))
        super().__init__([self.request, self.approver, self.comment,
                          widgets.HBox([self.approve_button, self.reject_button]), self.result])

    def _render(self, wait: dict | None) -> str:
        if wait is None:
            return f"<p>Workflow <code>{html.escape(self.workflow_id)}</code> has not asked for an approval.</p>"
        request = dict(wait["request"])
        recommendation = request.pop("recommendation", None)
        if isinstance(recommendation, dict):  # a structured recommendation: its fields become the request's
            request = {**recommendation, **request}
            recommendation = request.pop("rationale", "")
        evidence = "".join(f"<li>{_describe_evidence(e)}</li>" for e in request.pop("evidence", []))
        details = "".join(f"<li><b>{html.escape(str(key))}</b>: {html.escape(_text(value))}</li>"
                          for key, value in request.items())
        return (f"<h4>Workflow {html.escape(self.workflow_id)} asks for approval</h4>"
                f"<p><b>Recommendation</b>: {html.escape(_text(recommendation))}</p>"
                f"<ul>{details}</ul><p><b>Evidence</b></p><ul>{evidence}</ul>")

    def _decide(self, decide) -> None:
        try:
            decision = decide(self.journal, self.workflow_id, self.approver.value, self.comment.value)
        except WorkflowError as error:
            self.result.value = html.escape(f"Nothing saved: {error}", quote=False)
            return
        verdict = "approved" if decision["approved"] else "rejected"
        status = self.journal.workflow(self.workflow_id)["status"]
        self.result.value = html.escape(f"Saved: {verdict} by {decision['by']}. Workflow status: {status}.",
                                        quote=False)


class ClarificationPanel(widgets.VBox):
    """The question a workflow waits on, a box for the answer, and Submit (``waits.answer``)."""

    def __init__(self, db_path: str | Path, workflow_id: str):
        self.journal, self.workflow_id = Journal(db_path), workflow_id
        wait = _latest_wait(self.journal, workflow_id, "clarification")
        question = wait["request"]["question"] if wait else "(this workflow has not asked a question)"
        self.question = widgets.HTML(value=f"<p><b>Question:</b> {html.escape(question)}</p>")
        self.answer = widgets.Text(description="Answer")
        self.person = widgets.Text(description="Your name")
        self.submit_button = widgets.Button(description="Submit", button_style="primary")
        self.result = widgets.HTML(value="")
        self.submit_button.on_click(lambda _: self._submit())
        super().__init__([self.question, self.answer, self.person, self.submit_button, self.result])

    def _submit(self) -> None:
        try:
            decision = answer(self.journal, self.workflow_id, self.answer.value, self.person.value)
        except WorkflowError as error:
            self.result.value = html.escape(f"Nothing saved: {error}", quote=False)
            return
        status = self.journal.workflow(self.workflow_id)["status"]
        self.result.value = html.escape(f"Saved: {decision['answer']!r} from {decision['by']}. "
                                        f"Workflow status: {status}.", quote=False)


class WorkflowInspector(widgets.VBox):
    """A workflow's status, what it waits for, its steps table and its history; Refresh reads them again."""

    def __init__(self, db_path: str | Path, workflow_id: str):
        self.journal, self.workflow_id = Journal(db_path), workflow_id
        self.summary = widgets.HTML()
        self.steps = widgets.HTML()
        self.history = widgets.HTML()
        self.refresh_button = widgets.Button(description="Refresh")
        self.refresh_button.on_click(lambda _: self.refresh())
        super().__init__([self.summary, self.refresh_button, widgets.HTML("<b>Steps</b>"), self.steps,
                          widgets.HTML("<b>History</b>"), self.history])
        self.refresh()

    def refresh(self) -> None:
        """Read the workflow, its steps and its history from the database again."""
        wf = self.journal.workflow(self.workflow_id)
        waiting = open_wait(self.journal, self.workflow_id)
        line = f"{wf['id']} ({wf['kind']}): {wf['status']}"
        if wf["error"]:
            line += f" - {wf['error']}"
        if waiting:
            line += f"; waiting for {waiting['kind']} {waiting['name']!r}"
        self.summary.value = f"<p><b>{html.escape(line)}</b></p>"
        self.steps.value = self.steps_table().to_html(index=False)
        self.history.value = self.history_table().to_html(index=False)

    def steps_table(self) -> pd.DataFrame:
        """Name, status, attempts, last error and seconds until the next attempt, one row per step."""
        rows = [{"name": s["name"], "status": s["status"], "attempts": s["attempts"], "last error": s["error"] or "",
                 "next attempt": (f"in {max(0.0, s['next_attempt_at'] - time.time()):.0f} s"
                                  if s["next_attempt_at"] else "")}
                for s in self.journal.steps(self.workflow_id)]
        return pd.DataFrame(rows, columns=["name", "status", "attempts", "last error", "next attempt"])

    def history_table(self) -> pd.DataFrame:
        """The workflow's events in order (without process ids and times, which differ on every run)."""
        rows = [{"seq": e["seq"], "event": e["event"], "step": e["step"] or "", "detail": e["detail"] or ""}
                for e in self.journal.history(self.workflow_id)]
        return pd.DataFrame(rows, columns=["seq", "event", "step", "detail"])

