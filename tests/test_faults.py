"""The harness: named crash points armed in the database."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_kit import Journal
from durable_kit.core.store import connect
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
