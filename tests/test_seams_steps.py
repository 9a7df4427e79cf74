"""Where a step's options meet the other features, in real processes: timeouts with guarded sends; waits in the replay check.

Every workflow here writes what it sends into a file beside the journal, one
line per call (``kind key``), so a count of lines is a count of calls at the
destination.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from durable_kit import Journal, approve
from durable_kit.harness.faults import arm

from conftest import kit


def worker(db: Path, module: Path, expect: int | None = 0):
    return kit("worker", "--db", str(db), "--until-idle", "--module", str(module), expect=expect)


def calls(db: Path) -> list[str]:
    log = db.with_suffix(".sent")
    return log.read_text().splitlines() if log.exists() else []


# --- a step under a time limit whose activity sends through send_guarded ---

GUARDED = '''
from pathlib import Path
import durable_kit
from durable_kit import effect_key, send_guarded


def book(wf):
    key = effect_key(wf.id, "book")
    with Path(wf.db_path).with_suffix(".sent").open("a") as log:
        log.write(f"book {key}\\n")
    return {"booked": key}


@durable_kit.workflow("timed_booking")
def timed_booking(wf):
    return wf.execute_step("book", durable_kit.time_limit(30, lambda: send_guarded(wf, "book", lambda: book(wf))))
'''


@pytest.fixture
def guarded(tmp_path: Path) -> tuple[Path, Path]:
    db, module = tmp_path / "journal.db", tmp_path / "booking.py"
    module.write_text(GUARDED)
    kit("start", "--db", str(db), "--kind", "timed_booking", "--input", "{}", "--id", "b1", "--module", str(module))
    return db, module


def test_a_step_with_a_timeout_sends_through_send_guarded_and_completes(guarded):
    db, module = guarded
    worker(db, module)
    journal = Journal(db)
    assert journal.workflow("b1")["status"] == "complete"
    assert journal.workflow("b1")["output"] == {"booked": "b1:book"}
    assert calls(db) == ["book b1:book"]
    (step,) = journal.steps("b1")
    assert step["attempts"] == 1


def test_a_crash_at_a_guarded_send_inside_a_timed_step_ends_the_process_there(guarded):
    db, module = guarded
    arm(Journal(db).conn, "after_send:book", "exit")
    assert worker(db, module, expect=None).returncode == 13  # the fault fired on the activity's thread
    assert calls(db) == ["book b1:book"]
    journal = Journal(db)
    assert [e["detail"] for e in journal.history("b1") if e["event"] == "fault_fired"] == ["after_send:book (exit)"]
    worker(db, module)
    assert journal.workflow("b1")["status"] == "complete"
    assert calls(db) == ["book b1:book"] * 2  # at-least-once: the attempt that died had sent


# --- the replay check covers waits, by name and position ---

TRIP = '''
from pathlib import Path
import durable_kit


def send(wf, action):
    with Path(wf.db_path).with_suffix(".sent").open("a") as log:
        log.write(f"{{action}} {{wf.id}}:{{action}}\\n")
    return action


@durable_kit.workflow("trip")
def trip(wf):
{body}
    return "done"
'''

V1 = '''    wf.execute_step("quote", lambda: {"price": 10})
    decision = wf.wait_for_approval("approve_plan", {"price": 10})
    wf.execute_step("book", lambda: send(wf, "book"))
    wf.execute_step("notify", lambda: send(wf, "notify"))'''

CHANGES = {
    "renamed": (V1.replace('"approve_plan"', '"plan_ok"'),
                "at position 2 the journal recorded wait 'approve_plan', but the code asked for wait 'plan_ok' "
                "(renamed, inserted or removed)"),
    "moved after a step": ('''    wf.execute_step("quote", lambda: {"price": 10})
    wf.execute_step("book", lambda: send(wf, "book"))
    decision = wf.wait_for_approval("approve_plan", {"price": 10})
    wf.execute_step("notify", lambda: send(wf, "notify"))''',
                           "at position 2 the journal recorded wait 'approve_plan', but the code asked for step 'book' "
                           "(removed, or reordered)"),
    "a wait inserted": (V1.replace('    decision = wf.wait_for_approval', '    wf.sleep("cool_off", 60)\n'
                                                                           '    decision = wf.wait_for_approval'),
                        "at position 2 the journal recorded wait 'approve_plan', but the code asked for wait 'cool_off' "
                        "(renamed, inserted or removed)"),
    "removed": (V1.replace('    decision = wf.wait_for_approval("approve_plan", {"price": 10})\n', ''),
                "at position 2 the journal recorded wait 'approve_plan', but the code asked for step 'book' "
                "(removed, or reordered)"),
}


def write_trip(module: Path, body: str) -> Path:
    module.write_text(TRIP.format(body=body))
    return module


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_wait_changed_after_the_workflow_passed_it_blocks_the_replay(tmp_path, change):
    db, module = tmp_path / "journal.db", write_trip(tmp_path / "trip.py", V1)
    kit("start", "--db", str(db), "--kind", "trip", "--input", "{}", "--id", "t1", "--module", str(module))
    worker(db, module)
    approve(Journal(db), "t1", by="Dana", wait="approve_plan")
    arm(Journal(db).conn, "after_commit:book", "exit")
    assert worker(db, module, expect=None).returncode == 13  # passed the wait, booked, then died
    assert calls(db) == ["book t1:book"]

    body, problem = CHANGES[change]
    write_trip(module, body)
    worker(db, module)
    journal = Journal(db)
    row = journal.workflow("t1")
    assert row["status"] == "blocked"
    assert problem in row["error"]
    assert calls(db) == ["book t1:book"]  # nothing after the divergence ran
    assert [w["name"] for w in journal.conn.execute("SELECT name FROM waits WHERE workflow_id = 't1'")] \
        == ["approve_plan"]  # no new wait was opened


def test_a_decided_wait_the_new_code_no_longer_reaches_blocks_at_the_end(tmp_path):
    signed = V1 + '\n    wf.wait_for_approval("sign_off", {"trip": wf.id})'
    db, module = tmp_path / "journal.db", write_trip(tmp_path / "trip.py", signed)
    kit("start", "--db", str(db), "--kind", "trip", "--input", "{}", "--id", "t1", "--module", str(module))
    worker(db, module)
    approve(Journal(db), "t1", by="Dana", wait="approve_plan")
    worker(db, module)  # books, notifies, then waits for the sign-off
    approve(Journal(db), "t1", by="Dana", wait="sign_off")
    write_trip(module, V1)
    worker(db, module)
    row = Journal(db).workflow("t1")
    assert row["status"] == "blocked"
    assert "the journal recorded what the code no longer asks for: wait 'sign_off' (position 5)" in row["error"]
    assert calls(db) == ["book t1:book", "notify t1:notify"]


def test_an_unchanged_workflow_with_waits_replays_to_complete(tmp_path):
    db, module = tmp_path / "journal.db", write_trip(tmp_path / "trip.py", V1)
    kit("start", "--db", str(db), "--kind", "trip", "--input", "{}", "--id", "t1", "--module", str(module))
    worker(db, module)
    approve(Journal(db), "t1", by="Dana", wait="approve_plan")
    arm(Journal(db).conn, "after_commit:book", "exit")
    worker(db, module, expect=None)
    worker(db, module)
    assert Journal(db).workflow("t1")["status"] == "complete"
    assert calls(db) == ["book t1:book", "notify t1:notify"]
