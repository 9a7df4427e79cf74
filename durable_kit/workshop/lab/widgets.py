"""Notebook panels for people in the loop: approve or reject, answer a question, inspect a workflow.

Each panel calls the same functions as the command line (``decisions.approve``,
``decisions.reject``, ``decisions.answer``, ``Journal.steps`` and ``Journal.history``)
and shows every result in a widget's ``value``, never by printing, so a
notebook (or a test) can drive it with ``Button.click()`` and read the outcome.
Importing this module imports ipywidgets and pandas; ``import durable_kit`` does not.
"""
from __future__ import annotations

import html
import json
import threading
import time
from pathlib import Path

import ipywidgets as widgets
import pandas as pd

from ...errors import WorkflowError
from ...core.journal import Journal
from ... import answer, approve, named_wait, open_wait, reject, waits


def _bound_wait(journal: Journal, workflow_id: str, kind: str, name: str | None) -> str | None:
    # The wait a panel is bound to: the one named, or else the workflow's open wait of this kind, or else its
    # only wait of this kind. A panel never moves to another wait: each decision belongs to what was shown.
    if name is not None:
        return name
    of_kind = [w for w in waits(journal, workflow_id) if w["kind"] == kind]
    open_ones = [w for w in of_kind if w["status"] == "waiting"]
    if open_ones:
        return open_ones[0]["name"]
    return of_kind[0]["name"] if len(of_kind) == 1 else None


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _describe_evidence(item) -> str:
    if isinstance(item, dict) and {"subtopic", "finding"} <= item.keys():
        return f"<b>{html.escape(item['subtopic'])}</b>: {html.escape(item['finding'])}"
    return html.escape(_text(item))


class _DecisionPanel(widgets.VBox):
    """What approval and clarification panels share: one wait, its state, and the controls that still apply."""

    kind = ""

    def __init__(self, db_path: str | Path, workflow_id: str, wait: str | None, children: list):
        self.journal, self.workflow_id = Journal(db_path), workflow_id
        self.wait = _bound_wait(self.journal, workflow_id, self.kind, wait)
        self.request = widgets.HTML()
        self.result = widgets.HTML(value="")
        super().__init__([self.request, *children, self.result])
        self.refresh()

    def _controls(self) -> list:
        raise NotImplementedError

    def refresh(self) -> None:
        """Read the bound wait again: show its request, or its saved decision with the controls disabled."""
        wait = named_wait(self.journal, self.workflow_id, self.wait) if self.wait else None
        self.request.value = self._render(wait)
        decided = wait is not None and wait["status"] == "resolved"
        for control in self._controls():
            control.disabled = wait is None or decided
        if decided:
            self.result.value = html.escape(f"Decided: {self._says(wait['decision'])}.", quote=False)

    def _save(self, decide, who: str, **kwargs) -> None:
        if not who.strip():
            self.result.value = "Nothing saved: type your name first."
            return
        try:
            outcome = decide(self.journal, self.workflow_id, by=who, wait=self.wait, **kwargs)
        except WorkflowError as error:
            self.result.value = html.escape(f"Nothing saved: {error}", quote=False)
            return
        status = self.journal.workflow(self.workflow_id)["status"]
        self.refresh()
        said = "Saved" if outcome["saved"] else "Already decided, nothing saved"
        self.result.value = html.escape(f"{said}: {self._says(outcome)}. Workflow status: {status}.", quote=False)


class ApprovalPanel(_DecisionPanel):
    """One approval wait of a workflow: its recommendation and evidence, and Approve / Reject.

    ``panel.approver.value = "Dana"; panel.approve_button.click()`` saves an
    approval of exactly this wait, like ``python -m durable_kit approve --wait
    NAME``; ``panel.result.value`` says what was saved, or why nothing was.
    Once the wait is decided the panel shows the decision and its buttons are
    disabled. ``wait`` names the wait; without it the panel binds, once, to
    the workflow's open approval wait (or its only one).
    """

    kind = "approval"

    def __init__(self, db_path: str | Path, workflow_id: str, wait: str | None = None):
        self.approver = widgets.Text(description="Approver", placeholder="your name")
        self.comment = widgets.Textarea(description="Comment", placeholder="optional")
        self.approve_button = widgets.Button(description="Approve", button_style="success")
        self.reject_button = widgets.Button(description="Reject", button_style="danger")
        self.approve_button.on_click(lambda _: self._save(approve, self.approver.value, comment=self.comment.value))
        self.reject_button.on_click(lambda _: self._save(reject, self.approver.value, comment=self.comment.value))
        super().__init__(db_path, workflow_id, wait, [self.approver, self.comment,
                                                      widgets.HBox([self.approve_button, self.reject_button])])

    def _controls(self) -> list:
        return [self.approver, self.comment, self.approve_button, self.reject_button]

    @staticmethod
    def _says(decision: dict) -> str:
        verdict = "approved" if decision["approved"] else "rejected"
        return f"{verdict} by {decision['by']}" + (f" ({decision['comment']})" if decision.get("comment") else "")

    def _render(self, wait: dict | None) -> str:
        who = f"Workflow <code>{html.escape(self.workflow_id)}</code>"
        if wait is None:
            named = f" {html.escape(repr(self.wait))}" if self.wait else ""
            return f"<p>{who} has not reached approval{named} yet.</p>"
        request = dict(wait["request"])
        recommendation = request.pop("recommendation", None)
        if isinstance(recommendation, dict):  # a structured recommendation: its fields become the request's
            request = {**recommendation, **request}
            recommendation = request.pop("rationale", "")
        evidence = "".join(f"<li>{_describe_evidence(e)}</li>" for e in request.pop("evidence", []))
        details = "".join(f"<li><b>{html.escape(str(key))}</b>: {html.escape(_text(value))}</li>"
                          for key, value in request.items())
        state = "asks for approval" if wait["status"] == "waiting" else "was decided"
        return (f"<h4>{who}, approval {html.escape(repr(wait['name']))}: {state}</h4>"
                f"<p><b>Recommendation</b>: {html.escape(_text(recommendation))}</p>"
                f"<ul>{details}</ul><p><b>Evidence</b></p><ul>{evidence}</ul>")


class ClarificationPanel(_DecisionPanel):
    """One question a workflow waits on, a box for the answer, and Submit (``decisions.answer`` on that wait)."""

    kind = "clarification"

    def __init__(self, db_path: str | Path, workflow_id: str, wait: str | None = None):
        self.answer = widgets.Text(description="Answer")
        self.person = widgets.Text(description="Your name")
        self.submit_button = widgets.Button(description="Submit", button_style="primary")
        self.submit_button.on_click(lambda _: self._submit())
        super().__init__(db_path, workflow_id, wait, [self.answer, self.person, self.submit_button])
        self.question = self.request  # the HTML that shows the question

    def _controls(self) -> list:
        return [self.answer, self.person, self.submit_button]

    def _submit(self) -> None:
        if not self.answer.value.strip():
            self.result.value = "Nothing saved: write the answer first."
            return
        self._save(lambda journal, workflow_id, **kw: answer(journal, workflow_id, self.answer.value, **kw),
                   self.person.value)

    @staticmethod
    def _says(decision: dict) -> str:
        return f"{decision['answer']!r} from {decision['by']}"

    def _render(self, wait: dict | None) -> str:
        if wait is None:
            return "<p><b>Question:</b> (this workflow has not asked it yet)</p>"
        return f"<p><b>Question:</b> {html.escape(wait['request']['question'])}</p>"


class WorkflowInspector(widgets.VBox):
    """A workflow's status, what it waits for, its steps table and its history, read from the database.

    Refresh reads them once; Follow re-reads them every ``every`` seconds on a
    background thread while it is on, so the panel moves while workers run
    (and die) in other processes. ``refreshes`` counts the reads.
    """

    def __init__(self, db_path: str | Path, workflow_id: str, every: float = 1.0):
        self.db_path, self.workflow_id, self.every = Path(db_path), workflow_id, every
        self.journal = Journal(db_path)
        self.refreshes = 0
        self.summary = widgets.HTML()
        self.steps = widgets.HTML()
        self.history = widgets.HTML()
        self.refresh_button = widgets.Button(description="Refresh")
        self.refresh_button.on_click(lambda _: self.refresh())
        self.follow = widgets.ToggleButton(description="Follow", value=False, tooltip="refresh every second")
        self.follow.observe(lambda change: self._follow(change["new"]), names="value")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        super().__init__([self.summary, widgets.HBox([self.refresh_button, self.follow]), widgets.HTML("<b>Steps</b>"),
                          self.steps, widgets.HTML("<b>History</b>"), self.history])
        self.refresh()

    def _follow(self, on: bool) -> None:
        if on and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"inspector {self.workflow_id}", daemon=True)
            self._thread.start()
        elif not on and self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        journal = Journal(self.db_path)  # a connection of this thread's own
        while not self._stop.wait(self.every):
            try:
                self.refresh(journal)
            except Exception as error:  # the database is busy or gone: say so in the panel, keep following
                self.summary.value = html.escape(f"(could not read the workflow: {error})", quote=False)
        journal.close()

    def refresh(self, journal: Journal | None = None) -> None:
        """Read the workflow, its steps and its history from the database again."""
        journal = journal or self.journal
        wf = journal.workflow(self.workflow_id)
        waiting = open_wait(journal, self.workflow_id)
        line = f"{wf['id']} ({wf['kind']}): {wf['status']}"
        if wf["error"]:
            line += f" - {wf['error']}"
        if waiting:
            line += f"; waiting for {waiting['kind']} {waiting['name']!r}"
        self.summary.value = f"<p><b>{html.escape(line)}</b></p>"
        self.steps.value = self.steps_table(journal).to_html(index=False)
        self.history.value = self.history_table(journal).to_html(index=False)
        self.refreshes += 1

    def steps_table(self, journal: Journal | None = None) -> pd.DataFrame:
        """Name, status, attempts, last error and seconds until the next attempt, one row per step."""
        journal = journal or self.journal
        rows = [{"name": s["name"], "status": s["status"], "attempts": s["attempts"], "last error": s["error"] or "",
                 "next attempt": (f"in {max(0.0, s['next_attempt_at'] - time.time()):.0f} s"
                                  if s["next_attempt_at"] else "")}
                for s in journal.steps(self.workflow_id)]
        return pd.DataFrame(rows, columns=["name", "status", "attempts", "last error", "next attempt"])

    def history_table(self, journal: Journal | None = None) -> pd.DataFrame:
        """The workflow's events in order (without process ids and times, which differ on every run)."""
        journal = journal or self.journal
        rows = [{"seq": e["seq"], "event": e["event"], "step": e["step"] or "", "detail": e["detail"] or ""}
                for e in journal.history(self.workflow_id)]
        return pd.DataFrame(rows, columns=["seq", "event", "step", "detail"])

