"""Kill the research-report workflow in a real child process at every step boundary, then restart it."""
from __future__ import annotations

import pytest

import durable_kit.workshop.agents  # noqa: F401  (registers research_report)
from durable_kit import Journal
from durable_kit.world.llm import load_topics
from durable_kit.harness.faults import CRASH_EXIT_CODE
from durable_kit.world.ledger import Ledger
from durable_kit.harness.runner import run_in_child

TOPIC = "supplier concentration risk"
SUBTOPICS = load_topics()[TOPIC]["subtopics"]
STEPS = ["plan", *(f"research:{s}" for s in SUBTOPICS), "analyze", "recommend", "report"]
KILL_POINTS = {"after_activity:plan", f"after_commit:research:{SUBTOPICS[1]}",
               "after_activity:analyze", "after_commit:report"}
CASES = [(f"{boundary}:{step}", "exit") for step in STEPS for boundary in ("after_activity", "after_commit")]
CASES += [(point, "kill") for point, _ in CASES if point in KILL_POINTS]


def start(db, topic=TOPIC, workflow_id="wf-1") -> Journal:
    journal = Journal(db)
    journal.start("research_report", {"topic": topic}, workflow_id)
    return journal


def second_run_events(journal: Journal, workflow_id: str = "wf-1") -> list[dict]:
    history = journal.history(workflow_id)
    last_start = max(i for i, e in enumerate(history) if e["event"] == "replay_started")
    return history[last_start:]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """One uncrashed run: the outputs every recovered run must match."""
    db = tmp_path_factory.mktemp("clean") / "clean.db"
    journal = start(db)
    report = run_in_child(db, "wf-1")
    assert report.exit_code == 0, report.stderr
    return {"report": report, "workflow": journal.workflow("wf-1"),
            "steps": {s["name"]: s["output"] for s in journal.steps("wf-1")},
            "model_calls": Ledger.beside(db).count("model", "wf-1")}


def test_the_topic_plans_three_subtopics():
    assert len(SUBTOPICS) == 3
    assert len(STEPS) == 7


def test_clean_run_makes_one_model_call_per_step(clean_run):
    report = clean_run["report"]
    assert (report.status, report.crashed, report.calls_made) == ("complete", False, 7)
    assert clean_run["model_calls"] == 7
    assert list(clean_run["steps"]) == STEPS
    assert clean_run["steps"]["plan"] == {"subtopics": SUBTOPICS}
    assert clean_run["workflow"]["output"]["title"] == f"Report: {TOPIC}"


@pytest.mark.parametrize("point, action", CASES, ids=[f"{p}-{a}" for p, a in CASES])
def test_crash_and_restart_repeats_at_most_the_interrupted_step(tmp_path, clean_run, point, action):
    boundary, step = point.split(":", 1)
    position = STEPS.index(step)
    committed_before_crash = STEPS[:position + (boundary == "after_commit")]
    db = tmp_path / "wf.db"
    journal = start(db)

    crashed = run_in_child(db, "wf-1", crash_at=point, action=action)
    assert crashed.exit_code == (CRASH_EXIT_CODE if action == "exit" else -9), crashed.stderr
    assert crashed.status == "running"
    assert crashed.steps_completed == committed_before_crash
    assert crashed.calls_made == position + 1
    fired = [e["detail"] for e in journal.history("wf-1") if e["event"] == "fault_fired"]
    assert fired == [f"{point} ({action})"]

    restarted = run_in_child(db, "wf-1")
    assert restarted.exit_code == 0, restarted.stderr
    assert restarted.status == "complete"
    repeats = boundary == "after_activity"
    assert Ledger.beside(db).count("model", "wf-1") == (8 if repeats else 7)
    assert restarted.calls_made == len(STEPS) - len(committed_before_crash)

    steps = {s["name"]: s for s in journal.steps("wf-1")}
    assert list(steps) == STEPS
    assert {name: s["attempts"] for name, s in steps.items()} == {
        name: 2 if (repeats and name == step) else 1 for name in STEPS}
    assert all(s["status"] == "complete" for s in steps.values())
    # The recovered run stored exactly what an uncrashed run stores.
    assert {name: s["output"] for name, s in steps.items()} == clean_run["steps"]
    assert journal.workflow("wf-1")["output"] == clean_run["workflow"]["output"]

    later = second_run_events(journal)
    assert [e["step"] for e in later if e["event"] == "step_reused"] == committed_before_crash
    assert [e["step"] for e in later if e["event"] == "step_started"] == STEPS[len(committed_before_crash):]
    assert later[-1]["event"] == "workflow_completed"
    assert not [e for e in journal.history("wf-1") if e["event"] in ("step_failed", "workflow_failed")]


def test_a_crash_point_the_run_never_reaches_is_disarmed(tmp_path):
    db = tmp_path / "wf.db"
    journal = start(db)
    report = run_in_child(db, "wf-1", crash_at="after_commit:no-such-step")
    assert (report.exit_code, report.status) == (0, "complete"), report.stderr
    assert journal.conn.execute("SELECT COUNT(*) FROM faults").fetchone()[0] == 0


def test_restarting_a_complete_workflow_calls_nothing(tmp_path):
    db = tmp_path / "wf.db"
    start(db)
    assert run_in_child(db, "wf-1").exit_code == 0
    again = run_in_child(db, "wf-1")
    assert (again.exit_code, again.status, again.calls_made) == (0, "complete", 0)


def test_a_one_part_question_runs_five_steps(tmp_path):
    db = tmp_path / "wf.db"
    journal = start(db, topic="a one-part question")
    report = run_in_child(db, "wf-1")
    assert report.exit_code == 0, report.stderr
    assert report.status == "complete"
    assert report.steps_completed == ["plan", "research:the only subtopic", "analyze", "recommend", "report"]
    assert Ledger.beside(db).count("model", "wf-1") == 5
    assert journal.steps("wf-1")[2]["output"]["subtopics_covered"] == 1


def test_run_in_child_imports_a_workflow_module_by_path(tmp_path):
    module = tmp_path / "greeting.py"
    module.write_text(
        "from durable_kit import workflow\n\n"
        "@workflow('greeting')\n"
        "def greeting(wf):\n"
        "    name = wf.execute_step('name', lambda: wf.input['name'].title())\n"
        "    return {'text': 'Hello, ' + name}\n"
    )
    db = tmp_path / "wf.db"
    journal = Journal(db)
    journal.start("greeting", {"name": "ada"}, "wf-1", registered_elsewhere=True)

    without = run_in_child(db, "wf-1")
    assert without.exit_code != 0
    assert "known kinds" in without.stderr and "research_report" in without.stderr
    assert journal.workflow("wf-1")["status"] == "pending"

    report = run_in_child(db, "wf-1", module=module)
    assert (report.exit_code, report.status, report.steps_completed) == (0, "complete", ["name"]), report.stderr
    assert journal.workflow("wf-1")["output"] == {"text": "Hello, Ada"}
