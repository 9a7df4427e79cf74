"""The table of status changes, written once in ``core/state.py``: every change it lists is made, every other refused.

Each write function is tried from every status a row can have; the row changes exactly when the table lists the
move, and is left as it was otherwise. A last check reads the package's source: no module but ``core/state.py``
writes a workflow's or a step's row.
"""
from __future__ import annotations

import re
import time

import pytest

from durable_kit import Journal
from durable_kit.core import state

from conftest import ROOT, dump

WORKFLOW_STATUSES = sorted(state.WORKFLOW_MOVES)
STEP_STATUSES = sorted(state.STEP_MOVES)


@pytest.fixture
def journal(tmp_path):
    journal = Journal(tmp_path / "state.db")
    yield journal
    journal.close()


def workflow_in(journal: Journal, status: str) -> str:
    """A workflow in ``status``, due long ago; its id."""
    workflow_id = f"w-{status}"
    state.create_workflow(journal.conn, workflow_id, "k", "{}", 10, None)
    journal.conn.execute("UPDATE workflows SET status = ?, next_run_at = 0 WHERE id = ?", (status, workflow_id))
    return workflow_id


def status_of(journal: Journal, workflow_id: str) -> str:
    return journal.conn.execute("SELECT status FROM workflows WHERE id = ?", (workflow_id,)).fetchone()[0]


def test_the_tables_name_only_statuses_the_schema_allows(journal):
    workflow_id = workflow_in(journal, "pending")
    for status in WORKFLOW_STATUSES:
        journal.conn.execute("UPDATE workflows SET status = ? WHERE id = ?", (status, workflow_id))
    for froms in state.WORKFLOW_MOVES.values():
        assert set(froms) <= set(WORKFLOW_STATUSES)
    for froms in state.STEP_MOVES.values():
        assert set(froms) <= set(STEP_STATUSES) | {None}
    assert set(state.FINAL_STATUSES) < set(WORKFLOW_STATUSES)
    assert not any(final in state.WORKFLOW_MOVES["running"] for final in state.FINAL_STATUSES)  # never run again


@pytest.mark.parametrize("to", WORKFLOW_STATUSES)
def test_move_makes_each_listed_change_and_refuses_every_other(journal, to):
    for status in WORKFLOW_STATUSES:
        workflow_id = workflow_in(journal, status)
        before = journal.workflow(workflow_id)
        moved = state.move(journal.conn, workflow_id, to, {"error": "why"})
        if status in state.WORKFLOW_MOVES[to]:
            assert moved is not None and status_of(journal, workflow_id) == to, (status, to)
            assert journal.workflow(workflow_id)["error"] == "why"
        else:
            assert moved is None, f"{status} -> {to} is not in the table, yet it was written"
            assert journal.workflow(workflow_id) == before
        journal.conn.execute("DELETE FROM workflows WHERE id = ?", (workflow_id,))


def test_move_refuses_a_status_that_does_not_exist(journal):
    workflow_id = workflow_in(journal, "running")
    with pytest.raises(ValueError, match="no workflow status 'done'"):
        state.move(journal.conn, workflow_id, "done")
    assert status_of(journal, workflow_id) == "running"


def test_stay_also_writes_a_workflow_already_there(journal):
    workflow_id = workflow_in(journal, "pending")
    assert state.move(journal.conn, workflow_id, "pending", {"error": "again"}) is None
    assert state.move(journal.conn, workflow_id, "pending", {"error": "again"}, stay=True) is not None
    assert journal.workflow(workflow_id)["error"] == "again"


@pytest.mark.parametrize("only_if_due", [False, True])
def test_a_grant_takes_only_what_the_table_lets_run(journal, only_if_due):
    for status in WORKFLOW_STATUSES:
        workflow_id = workflow_in(journal, status)
        row = state.grant(journal.conn, workflow_id, "me:1:x", 5.0, only_if_due)
        due = status in ("pending", "waiting", "paused")
        if status in state.WORKFLOW_MOVES["running"] and (due or not only_if_due):
            assert row is not None and status_of(journal, workflow_id) == "running", status
        else:
            assert row is None and status_of(journal, workflow_id) == status, status


def test_completion_statements_leave_every_status_but_running_alone(journal):
    for status in WORKFLOW_STATUSES:
        workflow_id = workflow_in(journal, status)
        journal.conn.execute("UPDATE workflows SET fencing_token = 3 WHERE id = ?", (workflow_id,))
        done = journal.conn.execute(state.COMPLETE, (workflow_id, '"out"', time.time(), 1, 3)).rowcount
        assert done == (status == "running"), status
        if status != "running":
            assert journal.conn.execute(state.COMPLETE_IN_TRANSACTION,
                                        (workflow_id, '"out"', time.time(), 1)).rowcount == 0


def test_wake_moves_only_a_waiting_workflow(journal):
    for status in WORKFLOW_STATUSES:
        workflow_id = workflow_in(journal, status)
        assert state.wake(journal.conn, workflow_id) == (status == "waiting")
        assert status_of(journal, workflow_id) == ("pending" if status == "waiting" else status)


def test_take_back_moves_only_a_running_workflow(journal):
    for status in WORKFLOW_STATUSES:
        workflow_id = workflow_in(journal, status)
        assert state.take_back(journal.conn, workflow_id) == (status == "running")
        assert status_of(journal, workflow_id) == ("pending" if status == "running" else status)


def step_in(journal: Journal, status: str | None) -> tuple[str, str]:
    workflow_id = workflow_in(journal, "running") if not journal.conn.execute(
        "SELECT 1 FROM workflows WHERE id = 'w-running'").fetchone() else "w-running"
    name = f"s-{status}"
    if status is not None:
        journal.conn.execute("INSERT INTO steps (workflow_id, name, status, attempts) VALUES (?, ?, ?, 1)",
                             (workflow_id, name, status))
    return workflow_id, name


def step_status(journal: Journal, workflow_id: str, name: str) -> str | None:
    row = journal.conn.execute("SELECT status FROM steps WHERE workflow_id = ? AND name = ?",
                               (workflow_id, name)).fetchone()
    return None if row is None else row[0]


STEP_WRITES = {
    "running": lambda conn, w, n: state.start_attempt(conn, w, n, "null", None, 1, None, 1) is not None,
    "complete": lambda conn, w, n: conn.execute(state.COMMIT_OUTPUT, (w, n, '"out"', time.time(), 1, None)).rowcount
    > 0 if step_status_here(conn, w, n) else state.record_step(conn, w, n, None, '"out"', None),
    "failed": lambda conn, w, n: state.fail_step(conn, w, n, "boom"),
    "retrying": lambda conn, w, n: state.schedule_step(conn, w, n, time.time() + 60),
}


def step_status_here(conn, workflow_id, name):
    return conn.execute("SELECT 1 FROM steps WHERE workflow_id = ? AND name = ?", (workflow_id, name)).fetchone()


@pytest.mark.parametrize("to", STEP_STATUSES)
def test_each_step_write_makes_each_listed_change_and_refuses_every_other(journal, to):
    for status in [None, *STEP_STATUSES]:
        workflow_id, name = step_in(journal, status)
        written = STEP_WRITES[to](journal.conn, workflow_id, name)
        if status in state.STEP_MOVES[to]:
            assert written and step_status(journal, workflow_id, name) == to, (status, to)
        else:
            assert not written, f"step {status} -> {to} is not in the table, yet it was written"
            assert step_status(journal, workflow_id, name) == status
        journal.conn.execute("DELETE FROM steps WHERE name = ?", (name,))


def test_a_step_recorded_whole_is_written_once(journal):
    workflow_id, name = step_in(journal, None)
    assert state.record_step(journal.conn, workflow_id, name, None, '"first"', 1)
    before = dump(journal.path)
    assert not state.record_step(journal.conn, workflow_id, name, None, '"second"', 1)
    assert dump(journal.path) == before


ROW_WRITE = re.compile(r"(UPDATE|INSERT INTO|INSERT OR REPLACE INTO|REPLACE INTO|DELETE FROM)\s+(workflows|steps)\b",
                       re.IGNORECASE)


def row_writers(sources: dict[str, str]) -> list[str]:
    """The files that write a workflow's or a step's row themselves: every one but ``core/state.py``."""
    return sorted(name for name, text in sources.items() if ROW_WRITE.search(text) and name != "durable_kit/core/state.py")


def test_the_writer_check_sees_a_write_elsewhere():
    assert row_writers({"durable_kit/effects.py": 'conn.execute("UPDATE workflows SET status = ...")'}) == [
        "durable_kit/effects.py"]
    assert row_writers({"durable_kit/core/state.py": "INSERT INTO steps ...", "x.py": "SELECT * FROM steps"}) == []


def test_only_the_state_module_writes_workflow_and_step_rows():
    sources = {str(path.relative_to(ROOT)): path.read_text() for path in (ROOT / "durable_kit").rglob("*.py")}
    sources.pop("durable_kit/bench.py")  # its docstring quotes a statement, to name the commit it labels
    # The engine in one file has tables of its own (its writers are move, mark and the inserts beside them), and the
    # checks of its parts prepare its rows: neither touches the kit's journal.
    sources.pop("durable_kit/mini.py")
    sources.pop("durable_kit/workshop/lab/parts.py")
    assert row_writers(sources) == []
