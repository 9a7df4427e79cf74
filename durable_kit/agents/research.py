"""The research-report agent on the step journal: every model call is a step.

plan -> research each subtopic the plan names -> analyze -> recommend -> report
"""
from __future__ import annotations

from ..fakes.llm import FakeLLM
from ..journal import Workflow, workflow
from ..ledger import Ledger
from ..retries import RetryPolicy

MODEL_RETRY = RetryPolicy(max_attempts=3, base_delay=1.0, max_delay=30.0)


@workflow("research_report")
def research_report(wf: Workflow) -> dict:
    """Replayable from the first line: only ``execute_step`` touches the model."""
    topic = wf.input["topic"]
    llm = FakeLLM(Ledger.beside(wf.db_path), wf.id)

    plan = wf.execute_step("plan", lambda: llm.plan(topic), {"topic": topic}, retry=MODEL_RETRY)
    findings = [
        wf.execute_step(f"research:{subtopic}", lambda s=subtopic: llm.research(topic, s), {"subtopic": subtopic},
                        retry=MODEL_RETRY)
        for subtopic in plan["subtopics"]
    ]
    analysis = wf.execute_step("analyze", lambda: llm.analyze(topic, findings), retry=MODEL_RETRY)
    recommendation = wf.execute_step("recommend", lambda: llm.recommend(topic, analysis), retry=MODEL_RETRY)
    report = wf.execute_step("report", lambda: llm.report(topic, analysis, recommendation), retry=MODEL_RETRY)
    return {"title": report["title"], "recommendation": recommendation["recommendation"]}
