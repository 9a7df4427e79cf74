"""Evaluation apart from recovery: deterministic checks, support checks, and a perfectly recovered wrong finding."""
from __future__ import annotations

import copy

from durable_kit import Journal, run_workflow
from durable_kit.workshop.agents.loop import load_case
from durable_kit.workshop.evaluation import (check_answer, check_support, curated_rows, load_eval_cases, model_judge,
                                    numbers_in, support_rows)
from durable_kit.world.scripted import ScriptedModel
from durable_kit.world.ledger import Ledger
from durable_kit.harness.runner import run_in_child

SCOPE = load_case("three_companies_fy2025")


def test_the_support_checker_agrees_with_every_curated_case():
    rows = curated_rows()
    assert [(r["case"], r["checker"]) for r in rows] == [(r["case"], r["expected"]) for r in rows]
    assert [r["case"] for r in rows if r["checker"] == "unsupported"] == ["over-claim", "wrong-number"]
    over_claim = next(r for r in rows if r["case"] == "over-claim")
    assert "says something happened" in over_claim["problems"] and "could halt" in over_claim["problems"]
    assert numbers_in("FY2025: 38% of spend, 9 months") == ["38%", "9"]


def test_a_perfectly_recovered_run_can_still_fail_evaluation(db):
    """Crashed at three turns and recovered exactly; track one passes; track two flags the over-claim."""
    Journal(db).start("agent_loop", {"case": "three_companies_fy2025"}, "r1")
    for point in ("after_activity:turn:2", "after_commit:turn:3:note_finding", "after_activity:turn:6"):
        assert run_in_child(db, "r1", point).exit_code == 13
    assert run_in_child(db, "r1").status == "complete"
    recovered = Journal(db).workflow("r1")["output"]
    clean_db = db.with_name("clean.db")
    Journal(clean_db).start("agent_loop", {"case": "three_companies_fy2025"}, "r1")
    assert recovered == run_workflow(Journal(clean_db), "r1")  # recovery lost and changed nothing

    track_one = check_answer(recovered, SCOPE)
    assert len(track_one) == 4 * 2 + 3 and all(row["passed"] for row in track_one)
    track_two = support_rows(recovered)
    assert [(r["finding"], r["supported"]) for r in track_two] == [
        ("f-northwind", True), ("f-harbor-lane", True), ("f-tallis", True), ("f-northwind-interruption", False)]


def test_track_one_catches_a_missing_reference_a_wrong_period_and_a_missing_comparison(db):
    Journal(db).start("agent_loop", {"case": "three_companies_fy2025"}, "t1")
    answer = run_workflow(Journal(db), "t1")
    broken = copy.deepcopy(answer)
    broken["findings"][0]["cites"].append("northwind-fy2026-rf-07")
    broken["findings"][1]["period"] = "FY2024"
    broken["findings"] = [f for f in broken["findings"] if f["id"] != "f-tallis"]
    failed = [(r["check"], r["subject"]) for r in check_answer(broken, SCOPE) if not r["passed"]]
    assert failed == [("references exist", "f-northwind"), ("company and period", "f-harbor-lane"),
                      ("comparison covered", "tallis FY2025")]


def test_a_judge_is_recorded_beside_the_rules_never_instead(db):
    data = load_eval_cases()
    case = next(c for c in data["cases"] if c["id"] == "over-claim")
    passages = [data["passages"][p] for p in case["cites"]]
    lenient = check_support(case["claim"], passages, judge=lambda claim, cited: {"supported": True, "reason": "ok"})
    assert lenient["supported"] is False and lenient["judge"] == {"supported": True, "reason": "ok"}

    script = [{"when": {}, "action": {"tool": "finish", "args": {"supported": False, "reason": "only a risk"}}}]
    judge = model_judge(ScriptedModel(script, db, "judge-1"))
    assert check_support(case["claim"], passages, judge=judge)["judge"] == {"supported": False,
                                                                            "reason": "only a risk"}
    assert [c["operation"] for c in Ledger.beside(db).calls("model", "judge-1")] == ["judge"]
