"""Notebook 00: a research agent that keeps everything in memory.

It does real work (model calls, counted in the ledger) and saves nothing. A
crash at any point loses every result, and the next process starts over.
"""
from __future__ import annotations

from pathlib import Path

from ... import Journal
from ...harness.faults import trip
from ...world.llm import FakeLLM
from ...world.ledger import Ledger


def research_in_memory(db_path: str | Path, topic: str) -> dict:
    """Plan, research, analyze, recommend and report; results live only in local variables.

    The database is used for one thing: to read armed crash points
    (``after:plan``, ``after:research:<subtopic>``, ``after:analyze``, ...).
    """
    conn = Journal(db_path).conn
    llm = FakeLLM(Ledger.beside(db_path), workflow_id="fragile")

    def boundary(name: str) -> None:
        trip(conn, f"after:{name}", "fragile")

    plan = llm.plan(topic)
    boundary("plan")
    findings = []
    for subtopic in plan["subtopics"]:
        findings.append(llm.research(topic, subtopic))
        boundary(f"research:{subtopic}")
    analysis = llm.analyze(topic, findings)
    boundary("analyze")
    recommendation = llm.recommend(topic, analysis)
    boundary("recommend")
    report = llm.report(topic, analysis, recommendation)
    boundary("report")
    return report
