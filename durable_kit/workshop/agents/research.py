"""The research-report agent on the step journal: every model call is a step.

``research_report`` (notebook 02): plan -> research each subtopic -> analyze -> recommend -> report.

``reviewed_report`` (notebook 04), the same agent with people in the loop:
plan (asking a clarifying question if the topic is too broad) -> research ->
analyze -> recommend -> **wait for approval** -> report -> notify, the
notification sent at most once under a key reserved before sending.
A rejection ends the workflow as *rejected*: no report, no notification.
"""
from __future__ import annotations

from ... import NOT_SENT, RetryPolicy, Workflow, send_at_most_once, workflow
from ...world.llm import FakeLLM
from ...world.notifier import Notifier
from ...world.ledger import Ledger

MODEL_RETRY = RetryPolicy(max_attempts=3, base_delay=1.0, max_delay=30.0)


def research_and_recommend(wf: Workflow, llm: FakeLLM, topic: str) -> tuple[str, list[dict], dict, dict]:
    """The steps both agents share; returns the topic researched, the findings, the analysis, the recommendation."""
    plan = wf.execute_step("plan", lambda: llm.plan(topic), {"topic": topic}, retry=MODEL_RETRY)
    if plan.get("question"):  # too broad to plan: a person narrows it
        topic = wf.ask("clarify", plan["question"])
        plan = wf.execute_step("plan:clarified", lambda: llm.plan(topic), {"topic": topic}, retry=MODEL_RETRY)
        if plan.get("question"):
            wf.end("stopped", f"the answer {topic!r} is still too broad to plan: start a new workflow "
                              "with a narrower topic")
    findings = [
        wf.execute_step(f"research:{subtopic}", lambda s=subtopic: llm.research(topic, s), {"subtopic": subtopic},
                        retry=MODEL_RETRY)
        for subtopic in plan["subtopics"]
    ]
    analysis = wf.execute_step("analyze", lambda: llm.analyze(topic, findings), retry=MODEL_RETRY)
    recommendation = wf.execute_step("recommend", lambda: llm.recommend(topic, analysis), retry=MODEL_RETRY)
    return topic, findings, analysis, recommendation


@workflow("research_report", version="research-report-1", inputs={"topic": str})
def research_report(wf: Workflow) -> dict:
    """Replayable from the first line: only ``execute_step`` touches the model."""
    llm = FakeLLM(Ledger.beside(wf.db_path), wf.id)
    topic, _, analysis, recommendation = research_and_recommend(wf, llm, wf.input["topic"])
    report = wf.execute_step("report", lambda: llm.report(topic, analysis, recommendation), retry=MODEL_RETRY)
    return {"title": report["title"], "recommendation": recommendation["recommendation"]}


@workflow("reviewed_report", version="reviewed-report-1", inputs={"topic": str})
def reviewed_report(wf: Workflow) -> dict:
    """The research agent with an approval before the report and a notification after it."""
    llm = FakeLLM(Ledger.beside(wf.db_path), wf.id)
    topic, findings, analysis, recommendation = research_and_recommend(wf, llm, wf.input["topic"])

    decision = wf.wait_for_approval("approval", {"recommendation": recommendation["recommendation"],
                                                 "confidence": recommendation["confidence"],
                                                 "evidence": findings})
    if not decision["approved"]:
        because = f": {decision['comment']}" if decision["comment"] else ""
        wf.end("rejected", f"rejected by {decision['by']}{because}")

    report = wf.execute_step("report", lambda: llm.report(topic, analysis, recommendation), retry=MODEL_RETRY)
    recipient = wf.input.get("notify", "research-team@example.com")
    notifier = Notifier.beside(wf.db_path)
    notification = wf.execute_step(
        "notify", lambda: send_at_most_once(
            wf, "notify",
            lambda key: notifier.send(recipient, f"{report['title']} is ready (approved by {decision['by']})", key)))
    return {"title": report["title"], "recommendation": recommendation["recommendation"],
            "approved_by": decision["by"],
            "notification": "sent" if notification["sent"] else NOT_SENT}
