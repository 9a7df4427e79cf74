"""The research-report agent on the step journal: every model call is a step.

plan -> research each subtopic the plan names -> analyze -> recommend -> report
"""
from __future__ import annotations

from ..fakes.llm import FakeLLM
from ..journal import Workflow, workflow
from ..ledger import Ledger


@workflow("research_report")
def research_report(wf: Workflow) -> dict:
    """Replayable from the first line: only ``execute_step`` touches the model."""
    topic = wf.input["topic"]
    llm = FakeLLM(Ledger.beside(wf.db_path), wf.id)

    plan = wf.execute_step("plan", lambda: llm.plan(topic), {"topic": topic})
    findings = [
        wf.execute_step(f"research:{subtopic}", lambda s=subtopic: llm.research(topic, s), {"subtopic": subtopic})
        for subtopic in plan["subtopics"]
    ]
    analysis = wf.execute_step("analyze", lambda: llm.analyze(topic, findings))
    recommendation = wf.execute_step("recommend", lambda: llm.recommend(topic, analysis))
    report = wf.execute_step("report", lambda: llm.report(topic, analysis, recommendation))
    return {"title": report["title"], "recommendation": recommendation["recommendation"]}
