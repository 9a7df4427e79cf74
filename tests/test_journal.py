"""The engine: workflows, steps, replay and history in the step journal."""
from __future__ import annotations

import datetime

import pytest

from durable_kit import Journal, NotJSON, WorkflowError, resume, run_workflow, workflow
from durable_kit.core.journal import WORKFLOWS

from conftest import dump


class Counter:
    """An activity that counts its runs and returns ``value``."""

    def __init__(self, value):
        self.value, self.runs = value, 0

    def __call__(self):
        self.runs += 1
        return self.value


def events(journal: Journal, workflow_id: str) -> list[tuple]:
    return [(e["event"], e["step"]) for e in journal.history(workflow_id)]


def step_row(journal: Journal, workflow_id: str, name: str) -> dict:
    (row,) = [s for s in journal.steps(workflow_id) if s["name"] == name]
    return row


@pytest.fixture
def journal(db):
    return Journal(db)


@pytest.fixture
def kinds():
    """Register workflows for one test only."""
    registered = []

    def register(kind, fn):
        workflow(kind)(fn)
        registered.append(kind)
        return fn

    yield register
    for kind in registered:
        WORKFLOWS.pop(kind, None)


# --- start ---

def test_start_creates_a_pending_workflow(journal):
    wf_id = journal.start("k", {"topic": "t"}, "wf-1", registered_elsewhere=True)
    assert wf_id == "wf-1"
    row = journal.workflow("wf-1")
    assert (row["kind"], row["input"], row["status"], row["output"]) == ("k", {"topic": "t"}, "pending", None)
    assert events(journal, "wf-1") == [("workflow_created", None)]


def test_start_without_an_id_makes_distinct_ids(journal):
    assert journal.start("k", {}, registered_elsewhere=True) != journal.start("k", {}, registered_elsewhere=True)


def test_start_is_idempotent_for_the_same_id_and_input(journal, db):
    journal.start("k", {"topic": "t", "n": 1}, "wf-1", registered_elsewhere=True)
    before = dump(db)
    assert journal.start("k", {"n": 1, "topic": "t"}, "wf-1", registered_elsewhere=True) == "wf-1"  # key order does not matter
    assert dump(db) == before


@pytest.mark.parametrize("kind, data", [("k", {"topic": "other"}), ("other_kind", {"topic": "t"})])
def test_start_with_a_different_task_raises_and_writes_nothing(journal, db, kind, data):
    journal.start("k", {"topic": "t"}, "wf-1", registered_elsewhere=True)
    before = dump(db)
    with pytest.raises(WorkflowError, match="wf-1"):
        journal.start(kind, data, "wf-1", registered_elsewhere=True)
    assert dump(db) == before


def test_start_refuses_a_kind_no_module_registered_and_writes_nothing(journal, db):
    before = dump(db)
    with pytest.raises(WorkflowError, match="no module in this process registered the workflow kind 'refnud'"):
        journal.start("refnud", {"order_id": "A-1001"}, "r1")  # a misspelt kind would wait for ever
    assert dump(db) == before


def test_start_with_non_json_input_raises_and_writes_nothing(journal, db):
    before = dump(db)
    with pytest.raises(NotJSON, match="workflow 'wf-1'"):
        journal.start("k", {"when": datetime.date(2025, 1, 1)}, "wf-1", registered_elsewhere=True)
    assert dump(db) == before


def test_unknown_workflow_id_raises(journal):
    with pytest.raises(WorkflowError, match="no workflow 'missing'"):
        journal.open("missing")


# --- execute_step: run once, replay returns the stored output ---

def test_step_runs_once_and_replay_returns_the_stored_output(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    first = Counter({"subtopics": ["a", "b"]})
    assert journal.open("wf-1").execute_step("plan", first, {"topic": "t"}) == {"subtopics": ["a", "b"]}
    assert first.runs == 1

    replay = Counter({"subtopics": ["something else"]})
    assert journal.open("wf-1").execute_step("plan", replay, {"topic": "t"}) == {"subtopics": ["a", "b"]}
    assert replay.runs == 0

    row = step_row(journal, "wf-1", "plan")
    assert (row["status"], row["attempts"], row["input"], row["output"]) == (
        "complete", 1, {"topic": "t"}, {"subtopics": ["a", "b"]})


def test_replay_sees_steps_completed_by_another_journal_on_the_same_file(db):
    first = Journal(db)
    first.start("k", {}, "wf-1", registered_elsewhere=True)
    first.open("wf-1").execute_step("plan", Counter([1, 2]))
    replay = Counter("not this")
    assert Journal(db).open("wf-1").execute_step("plan", replay) == [1, 2]
    assert replay.runs == 0


def test_returned_values_are_json_round_tripped_on_first_run_and_replay(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    value = {"pair": (1, 2), "nested": [("a", 3.5)]}
    first = journal.open("wf-1").execute_step("s", Counter(value))
    again = journal.open("wf-1").execute_step("s", Counter(value))
    assert first == again == {"pair": [1, 2], "nested": [["a", 3.5]]}
    assert isinstance(first["pair"], list) and isinstance(again["pair"], list)


def test_each_call_returns_a_fresh_copy(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    first = journal.open("wf-1").execute_step("s", Counter({"items": [1]}))
    first["items"].append(2)  # mutating what a step returned must not change what is stored
    assert journal.open("wf-1").execute_step("s", Counter(None)) == {"items": [1]}


def test_history_records_started_completed_and_reused(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    wf = journal.open("wf-1")
    wf.execute_step("a", Counter(1))
    wf.execute_step("b", Counter(2))
    assert events(journal, "wf-1") == [
        ("workflow_created", None), ("replay_started", None),
        ("step_started", "a"), ("step_completed", "a"),
        ("step_started", "b"), ("step_completed", "b"),
    ]
    assert [e["detail"] for e in journal.history("wf-1") if e["event"] == "step_started"] == ["attempt 1"] * 2

    replay = journal.open("wf-1")  # a replay without a lease marks itself running, and says so
    replay.execute_step("a", Counter(1))
    replay.execute_step("b", Counter(2))
    # Reuse events are batched: nothing is written until the next write.
    assert events(journal, "wf-1")[6:] == [("replay_started", None)]
    replay.execute_step("c", Counter(3))
    assert events(journal, "wf-1")[7:] == [
        ("step_reused", "a"), ("step_reused", "b"), ("step_started", "c"), ("step_completed", "c")]
    assert [e["seq"] for e in journal.history("wf-1")] == list(range(1, 12))


def test_reuse_events_are_written_at_finish(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    journal.open("wf-1").execute_step("a", Counter(1))
    replay = journal.open("wf-1")
    replay.execute_step("a", Counter(1))
    replay.finish({"done": True})
    assert events(journal, "wf-1")[-2:] == [("step_reused", "a"), ("workflow_completed", None)]
    row = journal.workflow("wf-1")
    assert (row["status"], row["output"]) == ("complete", {"done": True})


def test_duplicate_step_name_in_one_run_raises_naming_workflow_and_step(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    wf = journal.open("wf-1")
    wf.execute_step("research", Counter(1))
    second = Counter(2)
    with pytest.raises(WorkflowError) as info:
        wf.execute_step("research", second)
    assert "'wf-1'" in str(info.value) and "'research'" in str(info.value)
    assert second.runs == 0
    assert step_row(journal, "wf-1", "research")["output"] == 1


def test_duplicate_name_of_a_reused_step_also_raises(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    journal.open("wf-1").execute_step("a", Counter(1))
    replay = journal.open("wf-1")
    replay.execute_step("a", Counter(1))
    with pytest.raises(WorkflowError, match="'a'"):
        replay.execute_step("a", Counter(1))


def test_non_json_step_input_raises_before_anything_is_written(journal, db):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    wf = journal.open("wf-1")
    wf.execute_step("a", Counter(1))
    replay = journal.open("wf-1")
    replay.execute_step("a", Counter(1))  # a pending reuse event must not be written either
    before = dump(db)
    activity = Counter(1)
    with pytest.raises(NotJSON) as info:
        replay.execute_step("b", activity, {"ids": {1, 2}})
    assert "step 'b'" in str(info.value) and "$.ids is a set" in str(info.value)
    assert activity.runs == 0
    assert dump(db) == before


def test_non_json_activity_output_stores_no_output_and_fails_the_step(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    with pytest.raises(NotJSON) as info:
        journal.open("wf-1").execute_step("score", Counter({"scores": [1.0, float("nan")]}))
    message = str(info.value)
    assert "workflow 'wf-1'" in message and "step 'score'" in message and "$.scores[1]" in message
    assert "not stored" in message
    row = step_row(journal, "wf-1", "score")
    assert row["status"] == "failed"
    assert row["output"] is None
    assert row["error"].startswith("NotJSON:") and "$.scores[1]" in row["error"]
    assert events(journal, "wf-1")[-1] == ("step_failed", "score")


def test_failed_activity_is_recorded_and_runs_again_on_replay(journal):
    journal.start("k", {}, "wf-1", registered_elsewhere=True)

    def flaky():
        raise ConnectionError("provider timed out")

    with pytest.raises(ConnectionError):
        journal.open("wf-1").execute_step("fetch", flaky)
    row = step_row(journal, "wf-1", "fetch")
    assert (row["status"], row["attempts"], row["output"]) == ("failed", 1, None)
    assert row["error"] == "ConnectionError: provider timed out"

    retry = Counter({"ok": True})
    assert journal.open("wf-1").execute_step("fetch", retry) == {"ok": True}
    assert retry.runs == 1
    row = step_row(journal, "wf-1", "fetch")
    assert (row["status"], row["attempts"], row["error"]) == ("complete", 2, None)
    assert [e["detail"] for e in journal.history("wf-1") if e["event"] == "step_started"] == [
        "attempt 1", "attempt 2"]


# --- one recorded outcome per step ---

def test_a_handle_opened_earlier_adopts_the_output_another_handle_committed(db):
    journal_a, journal_b = Journal(db), Journal(db)
    journal_a.start("k", {}, "wf-1", registered_elsewhere=True)
    handle_b = journal_b.open("wf-1")  # opened before A completes "x"
    handle_a = journal_a.open("wf-1")
    assert handle_a.execute_step("x", Counter("from A")) == "from A"

    activity_b = Counter("from B")
    assert handle_b.execute_step("x", activity_b) == "from A"
    assert activity_b.runs == 0
    row = step_row(journal_a, "wf-1", "x")
    assert (row["output"], row["attempts"]) == ("from A", 1)


def test_an_activity_that_finishes_second_does_not_replace_the_first_outcome(db):
    journal_a, journal_b = Journal(db), Journal(db)
    journal_a.start("k", {}, "wf-1", registered_elsewhere=True)
    handle_b = journal_b.open("wf-1")

    def slow_b():
        # While B's activity runs, A runs and commits the same step.
        assert journal_a.open("wf-1").execute_step("x", Counter("from A")) == "from A"
        return "from B"

    assert handle_b.execute_step("x", slow_b) == "from A"
    row = step_row(journal_a, "wf-1", "x")
    assert (row["status"], row["output"], row["attempts"]) == ("complete", "from A", 2)
    assert [e for e in events(journal_a, "wf-1") if e[0] == "step_completed"] == [("step_completed", "x")]


# --- run_workflow ---

def test_run_workflow_with_an_unknown_kind_lists_known_kinds(journal, db, kinds):
    kinds("known_kind", lambda wf: None)
    journal.start("no_such_kind", {}, "wf-1", registered_elsewhere=True)
    before = dump(db)
    with pytest.raises(WorkflowError) as info:
        run_workflow(journal, "wf-1")
    assert "'no_such_kind'" in str(info.value)
    assert "known_kind" in str(info.value)
    assert dump(db) == before


def test_run_workflow_runs_to_completion_and_then_returns_the_stored_output(journal, kinds):
    body_runs = []

    def two_steps(wf):
        body_runs.append(1)
        a = wf.execute_step("a", lambda: {"n": wf.input["n"]})
        b = wf.execute_step("b", lambda: (a["n"] * 2,))
        return {"a": a, "b": b}

    kinds("two_steps", two_steps)
    journal.start("two_steps", {"n": 21}, "wf-1")
    assert run_workflow(journal, "wf-1") == {"a": {"n": 21}, "b": [42]}
    row = journal.workflow("wf-1")
    assert (row["status"], row["output"], row["error"]) == ("complete", {"a": {"n": 21}, "b": [42]}, None)

    assert run_workflow(journal, "wf-1") == {"a": {"n": 21}, "b": [42]}
    assert body_runs == [1]
    assert events(journal, "wf-1")[-1] == ("workflow_completed", None)


def test_workflow_failure_is_recorded_and_raised(journal, kinds):
    def broken(wf):
        wf.execute_step("a", lambda: 1)
        raise LookupError("no such filing")

    kinds("broken", broken)
    journal.start("broken", {}, "wf-1")
    with pytest.raises(LookupError):
        run_workflow(journal, "wf-1")
    row = journal.workflow("wf-1")
    assert (row["status"], row["error"]) == ("failed", "LookupError: no such filing")
    assert events(journal, "wf-1")[-1] == ("workflow_failed", None)
    assert step_row(journal, "wf-1", "a")["status"] == "complete"


def test_a_failed_workflow_resumes_from_its_completed_steps(journal, kinds):
    calls = {"a": 0, "b": 0}
    fail_b = [True]

    def resumable(wf):
        def a():
            calls["a"] += 1
            return "a"

        def b():
            calls["b"] += 1
            if fail_b[0]:
                raise TimeoutError("slow")
            return "b"

        return [wf.execute_step("a", a), wf.execute_step("b", b)]

    kinds("resumable", resumable)
    journal.start("resumable", {}, "wf-1")
    with pytest.raises(TimeoutError):
        run_workflow(journal, "wf-1")
    fail_b[0] = False
    resume(journal, "wf-1", by="ops")
    assert run_workflow(journal, "wf-1") == ["a", "b"]
    assert calls == {"a": 1, "b": 2}
    assert journal.workflow("wf-1")["status"] == "complete"


# --- durability settings ---

def test_journal_keeps_its_synchronous_level_after_a_marker_commit(db):
    journal = Journal(db)
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    journal.open("wf-1").execute_step("a", Counter(1))
    assert journal.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL

    relaxed = Journal(db.with_name("normal.db"), synchronous="normal")
    relaxed.start("k", {}, "wf-1", registered_elsewhere=True)
    relaxed.open("wf-1").execute_step("a", Counter(1))
    assert relaxed.conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
