"""The harness: named crash points armed in the database."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_kit import Journal, RetryPolicy, Suspended, Transient
from durable_kit.core import store
from durable_kit.core.store import connect
from durable_kit.harness import faults
from durable_kit.harness.faults import InjectedFailure, arm, disarm_all, trip

from conftest import dump


def armed(conn) -> dict:
    return {r["point"]: r["action"] for r in conn.execute("SELECT point, action FROM faults")}


def test_arm_and_disarm_all(db):
    conn = connect(db)
    arm(conn, "after_commit:plan")
    arm(conn, "after_activity:report", "kill")
    arm(conn, "after_commit:plan", "fail")  # arming again replaces the action
    assert armed(conn) == {"after_commit:plan": "fail", "after_activity:report": "kill"}
    assert disarm_all(conn) == ["after_activity:report", "after_commit:plan"]
    assert armed(conn) == {}
    assert disarm_all(conn) == []


def open_files(path) -> int:
    """How many of this process's file descriptors point at ``path`` (Linux's /proc)."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == os.path.realpath(path))


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc to count open files")
def test_arm_takes_the_journal_by_its_path_and_leaves_no_connection_open(db):
    arm(db, "after:analyze", "exit")
    arm(str(db), "after:recommend", "kill")
    assert open_files(db) == 0
    with pytest.raises(ValueError, match="fault action must be one of"):
        arm(db, "after:analyze", "explode")
    conn = connect(db)
    assert open_files(db) == 1  # the count sees a connection that is open
    assert armed(conn) == {"after:analyze": "exit", "after:recommend": "kill"}


def test_arm_rejects_an_unknown_action(db):
    conn = connect(db)
    before = dump(db)
    with pytest.raises(ValueError, match="'explode'"):
        arm(conn, "after_commit:plan", "explode")
    assert dump(db) == before


def test_trip_on_an_unarmed_point_does_nothing(db):
    conn = connect(db)
    arm(conn, "other", "fail")
    before = dump(db)
    assert trip(conn, "after_commit:plan", "wf-1") is None
    assert dump(db) == before


def test_fail_raises_records_and_is_consumed(db):
    journal = Journal(db)
    arm(journal.conn, "after_commit:plan", "fail")
    with pytest.raises(InjectedFailure, match="after_commit:plan"):
        trip(journal.conn, "after_commit:plan", "wf-1")
    (event,) = journal.history("wf-1")
    assert (event["event"], event["detail"]) == ("fault_fired", "after_commit:plan (fail)")
    assert armed(journal.conn) == {}
    trip(journal.conn, "after_commit:plan", "wf-1")  # fired once: now a no-op
    assert len(journal.history("wf-1")) == 1


def test_fail_after_commit_keeps_the_committed_step(db):
    journal = Journal(db)
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    arm(journal.conn, "after_commit:plan", "fail")
    with pytest.raises(InjectedFailure):
        journal.open("wf-1").execute_step("plan", lambda: {"subtopics": ["a"]})
    runs = []
    assert journal.open("wf-1").execute_step("plan", lambda: runs.append(1)) == {"subtopics": ["a"]}
    assert runs == []
    assert [e["event"] for e in journal.history("wf-1") if e["event"] != "replay_started"][-2:] == [
        "step_completed", "fault_fired"]


def test_fail_after_activity_loses_the_output_and_the_step_runs_again(db):
    journal = Journal(db)
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    arm(journal.conn, "after_activity:plan", "fail")
    with pytest.raises(InjectedFailure):
        journal.open("wf-1").execute_step("plan", lambda: "first")
    assert journal.open("wf-1").execute_step("plan", lambda: "second") == "second"
    (step,) = journal.steps("wf-1")
    assert (step["status"], step["attempts"], step["output"]) == ("complete", 2, "second")


def test_the_fault_table_is_the_harness_s_and_the_core_runs_without_it(db, monkeypatch):
    """The core reads armed points only through its boundary hook: with the hook's defaults and no fault table,
    steps still start, fail, retry and complete; with the harness's hook, the same journal gets the table."""
    assert "EXISTS faults" not in store.SCHEMA  # declared by the harness, beside the engine's tables
    monkeypatch.setattr(store, "FEATURE_TABLES", [t for t in store.FEATURE_TABLES if "faults" not in t])
    for key, default in store.NO_HOOK.items():  # the core's own, without the harness
        monkeypatch.setitem(store.BOUNDARY_HOOK, key, default)
    journal = Journal(db)
    tables = {r[0] for r in journal.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "faults" not in tables and {"workflows", "steps", "history", "waits"} <= tables
    journal.start("k", {}, "wf-1", registered_elsewhere=True)
    failures = []

    def flaky():
        if not failures:
            failures.append(1)
            raise Transient("once")
        return "ok"

    wf = journal.open("wf-1")
    assert wf.execute_step("first", lambda: 1) == 1  # the one-statement first attempt, with no fault table
    with pytest.raises(Suspended):  # a retry scheduled
        wf.execute_step("second", flaky, retry=RetryPolicy(base_delay=0))
    again = journal.open("wf-1")  # the replay: the first step reused, the second retried
    assert again.execute_step("first", lambda: 2) == 1
    assert again.execute_step("second", flaky, retry=RetryPolicy(base_delay=0)) == "ok"
    assert [s["status"] for s in journal.steps("wf-1")] == ["complete", "complete"]
    journal.close()
    monkeypatch.undo()  # the harness's hook and table again: opening the journal creates the table
    conn = connect(db)
    arm(conn, "after_commit:third", "fail")
    assert armed(conn) == {"after_commit:third": "fail"}
    assert faults.armed(conn, ("next_step", "after_commit:third")) == {"after_commit:third"}
