"""Change and time, in real processes: divergence blocks, patches, cancellation with compensation, deadlines, forks.

Every workflow here writes what it sends to the outside world into a file
beside the journal, one line per call: ``kind key``. A keyed destination
keeps one effect per key, so "effects" counts distinct keys and "calls" lines.
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

import durable_kit
from durable_kit import Journal
from durable_kit.harness.faults import arm

from conftest import dump, run_python


def kit(*args: str, expect: int | None = 0) -> "subprocess.CompletedProcess":
    done = run_python("-m", "durable_kit", *args)
    if expect is not None:
        assert done.returncode == expect, (done.stdout, done.stderr)
    return done


def worker(db: Path, module: Path, expect: int | None = 0):
    return kit("worker", "--db", str(db), "--until-idle", "--module", str(module), expect=expect)


def calls(db: Path, kind: str) -> list[str]:
    log = db.with_suffix(".sent")
    return [line.split()[1] for line in log.read_text().splitlines() if line.split()[0] == kind] if log.exists() else []


def effects(db: Path, kind: str) -> int:
    return len(set(calls(db, kind)))


CHECKOUT = '''
from pathlib import Path
import durable_kit
from durable_kit import effect_key


def send(wf, kind, action):
    key = effect_key(wf.id, action)
    with Path(wf.db_path).with_suffix(".sent").open("a") as log:
        log.write(f"{{kind}} {{key}}\\n")
    return {{"key": key}}


@durable_kit.workflow("checkout", version="{version}")
def checkout(wf):
{body}
    return "done"
'''

V1 = '''    wf.execute_step("quote", lambda: {"price": 10}, {"price": 10})
    wf.execute_step("reserve", lambda: send(wf, "reserve", "reserve"))
    wf.execute_step("charge", lambda: send(wf, "charge", "charge"))
    wf.execute_step("notify", lambda: send(wf, "notify", "notify"))'''

V2 = {
    "renamed": V1.replace('"reserve", lambda', '"hold", lambda'),
    "reordered": '''    wf.execute_step("reserve", lambda: send(wf, "reserve", "reserve"))
    wf.execute_step("quote", lambda: {"price": 10}, {"price": 10})
    wf.execute_step("charge", lambda: send(wf, "charge", "charge"))
    wf.execute_step("notify", lambda: send(wf, "notify", "notify"))''',
    "inserted": V1.replace('    wf.execute_step("reserve"', '    wf.execute_step("fraud_check", lambda: "ok")\n'
                                                             '    wf.execute_step("reserve"'),
    "changed input": V1.replace('lambda: {"price": 10}, {"price": 10}', 'lambda: {"price": 12}, {"price": 12}'),
}

PROBLEMS = {
    "renamed": "at position 2 the journal recorded step 'reserve', but the code asked for 'hold' "
               "(a step renamed, inserted or removed)",
    "reordered": "at position 1 the journal recorded step 'quote', but the code asked for 'reserve' "
                 "(a step removed, or steps reordered)",
    "inserted": "at position 2 the journal recorded step 'reserve', but the code asked for 'fraud_check' "
                "(a step renamed, inserted or removed)",
    "changed input": "step 'quote' completed with input {\"price\":10}, but the code now gives {\"price\":12} "
                     "(its stored output belongs to the old input)",
}


def write(module: Path, body: str, version: str) -> Path:
    module.write_text(CHECKOUT.format(body=body, version=version))
    return module


def crashed_v1(tmp_path: Path, crash_after: str = "reserve") -> tuple[Path, Path]:
    """v1 of the checkout, killed right after step ``crash_after`` committed."""
    db, module = tmp_path / "journal.db", write(tmp_path / "checkout.py", V1, "v1")
    kit("start", "--db", str(db), "--kind", "checkout", "--input", "{}", "--id", "c1", "--module", str(module))
    arm(Journal(db).conn, f"after_commit:{crash_after}", "exit")
    assert worker(db, module, expect=None).returncode == 13
    return db, module


@pytest.mark.parametrize("change", sorted(V2))
def test_a_replay_that_diverges_blocks_the_workflow_before_any_effect(tmp_path, change):
    db, module = crashed_v1(tmp_path)
    assert (effects(db, "reserve"), effects(db, "charge")) == (1, 0)
    write(module, V2[change], "v2")
    worker(db, module)

    journal = Journal(db)
    wf = journal.workflow("c1")
    assert wf["status"] == "blocked"
    assert wf["error"] == (f"workflow 'c1': non-deterministic replay: {PROBLEMS[change]}. Nothing after it ran. "
                           "Deploy code that replays the recorded history (for example behind durable_kit.patched), then "
                           "resume it, or fork it.")
    assert (effects(db, "reserve"), effects(db, "charge"), effects(db, "notify")) == (1, 0, 0)
    before = dump(db)
    worker(db, module)  # blocked is not due: nothing runs, nothing changes
    assert dump(db) == before
    assert wf["version"] == "v1"


def test_a_completed_step_the_new_code_no_longer_asks_for_blocks_at_the_end(tmp_path):
    db, module = crashed_v1(tmp_path, crash_after="notify")
    write(module, V1.replace('    wf.execute_step("notify", lambda: send(wf, "notify", "notify"))', ''), "v2")
    worker(db, module)
    wf = Journal(db).workflow("c1")
    assert wf["status"] == "blocked"
    assert "completed steps the code no longer asks for: 'notify' (position 4) (steps removed)" in wf["error"]
    assert (effects(db, "charge"), effects(db, "notify")) == (1, 1)


PATCHED = V1.replace('    wf.execute_step("reserve"', '''    if durable_kit.patched(wf, "fraud-check"):
        wf.execute_step("fraud_check", lambda: send(wf, "fraud_check", "fraud_check"))
    wf.execute_step("reserve"''')


def test_a_patch_lets_a_running_workflow_replay_the_old_path_and_new_ones_take_the_new(tmp_path):
    db, module = crashed_v1(tmp_path)
    write(module, V2["inserted"], "v2-unpatched")
    worker(db, module)
    assert Journal(db).workflow("c1")["status"] == "blocked"

    write(module, PATCHED, "v2")
    kit("resume", "--db", str(db), "--workflow", "c1", "--by", "ops")
    kit("start", "--db", str(db), "--kind", "checkout", "--input", "{}", "--id", "c2", "--module", str(module))
    worker(db, module)
    journal = Journal(db)
    assert [journal.workflow(w)["status"] for w in ("c1", "c2")] == ["complete", "complete"]
    assert [journal.workflow(w)["version"] for w in ("c1", "c2")] == ["v1", "v2"]
    assert calls(db, "fraud_check") == ["c2:fraud_check"]  # only the new workflow took the new path
    assert sorted(calls(db, "charge")) == ["c1:charge", "c2:charge"]
    decided = {s["workflow_id"]: s["output"] for w in ("c1", "c2") for s in journal.steps(w)
               if s["name"] == "patched:fraud-check"}
    assert decided == {"c1": False, "c2": True}
    worker(db, module)  # every later replay agrees
    assert calls(db, "fraud_check") == ["c2:fraud_check"]


# --- cancellation with compensation ---

# A workflow module's first lines: ``send`` writes one line per call to the file beside the journal.
SENDER = '''
from pathlib import Path
import durable_kit
from durable_kit import effect_key


def send(wf, kind, action):
    key = effect_key(wf.id, action)
    with Path(wf.db_path).with_suffix(".sent").open("a") as log:
        log.write(f"{kind} {key}\\n")
    return {"key": key}
'''

BOOKING = SENDER + '''

@durable_kit.workflow("booking")
def booking(wf):
    wf.execute_step("hold_seat", lambda: send(wf, "hold", "hold_seat"),
                    compensate=lambda hold: send(wf, "release", "compensate:hold_seat"))
    wf.execute_step("charge_card", lambda: send(wf, "charge", "charge_card"),
                    compensate=lambda charge: send(wf, "refund", "compensate:charge_card"))
    wf.execute_step("quote_hotel", lambda: {"price": 120})  # nothing to undo
    wf.wait_for_approval("itinerary", {"flight": "LH 123"})
    wf.execute_step("issue_ticket", lambda: send(wf, "ticket", "issue_ticket"))
    return "booked"
'''


def booked_and_waiting(tmp_path: Path) -> tuple[Path, Path]:
    db, module = tmp_path / "journal.db", tmp_path / "booking.py"
    module.write_text(BOOKING)
    kit("start", "--db", str(db), "--kind", "booking", "--input", "{}", "--id", "b1", "--module", str(module))
    worker(db, module)
    assert Journal(db).workflow("b1")["status"] == "waiting"
    return db, module


@pytest.mark.parametrize("crash", ["none", "after_activity", "after_commit"])
def test_cancelling_a_waiting_workflow_undoes_each_effect_once_newest_first_even_across_a_crash(tmp_path, crash):
    db, module = booked_and_waiting(tmp_path)
    saved = kit("cancel", "--db", str(db), "--workflow", "b1", "--by", "Dana", "--reason", "trip called off")
    assert saved.stdout.startswith("b1: cancellation saved (pending)")
    if crash != "none":  # the worker dies in the middle of compensating: after the refund, before the release
        arm(Journal(db).conn, f"{crash}:compensate:charge_card", "exit")
        assert worker(db, module, expect=None).returncode == 13
    worker(db, module)

    journal = Journal(db)
    wf = journal.workflow("b1")
    assert (wf["status"], wf["error"]) == ("cancelled", "cancelled by Dana: trip called off")
    assert (effects(db, "refund"), effects(db, "release")) == (1, 1)  # each effect undone exactly once
    assert len(calls(db, "refund")) == (2 if crash == "after_activity" else 1)  # the key kept the repeat harmless
    assert (effects(db, "ticket"), effects(db, "hold"), effects(db, "charge")) == (0, 1, 1)
    compensations = [s["name"] for s in journal.steps("b1") if s["name"].startswith("compensate:")]
    assert compensations == ["compensate:charge_card", "compensate:hold_seat"]  # newest first
    last = journal.history("b1")[-1]
    assert (last["event"], last["detail"]) == (
        "workflow_cancelled", "cancelled by Dana: trip called off; compensated charge_card, hold_seat")
    refused = kit("cancel", "--db", str(db), "--workflow", "b1", "--by", "Eli", "--reason", "again", expect=2)
    assert "is already cancelled; nothing was changed" in refused.stderr


# A workflow module's lines for an activity that runs until someone cancels its workflow (no timing involved).
AWAIT_CANCEL = '''
import sqlite3
import time


def wait_for_the_cancellation(wf):
    conn = sqlite3.connect(str(wf.db_path))
    deadline = time.monotonic() + 60
    while conn.execute("SELECT cancel_requested FROM workflows WHERE id = ?", (wf.id,)).fetchone()[0] is None:
        assert time.monotonic() < deadline, "no cancellation came"
        time.sleep(0.02)
    conn.close()
    return "sent"
'''


def test_a_running_workflow_stops_at_its_next_step_boundary_when_cancelled(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT, wait_until
    db, module = tmp_path / "journal.db", tmp_path / "booking.py"
    charge = 'lambda: send(wf, "charge", "charge_card")'
    assert charge in BOOKING
    module.write_text(AWAIT_CANCEL + BOOKING.replace(
        charge, 'lambda: (wait_for_the_cancellation(wf), send(wf, "charge", "charge_card"))[1]'))
    kit("start", "--db", str(db), "--kind", "booking", "--input", "{}", "--id", "b1", "--module", str(module))
    running = subprocess.Popen([sys.executable, "-m", "durable_kit", "worker", "--db", str(db), "--until-idle",
                                "--module", str(module)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    wait_until(lambda: any(s["name"] == "charge_card" for s in Journal(db).steps("b1")), 60, "the charge to start")
    kit("cancel", "--db", str(db), "--workflow", "b1", "--by", "Dana", "--reason", "changed plans")
    out, err = running.communicate(timeout=120)
    assert running.returncode == 0, err
    journal = Journal(db)
    assert journal.workflow("b1")["status"] == "cancelled"
    names = [s["name"] for s in journal.steps("b1")]
    assert "quote_hotel" not in names  # it stopped at the next boundary, after the charge it was running
    assert (effects(db, "charge"), effects(db, "refund"), effects(db, "release")) == (1, 1, 1)


# --- deadlines ---

DEADLINE = '''
import durable_kit


@durable_kit.workflow("deadline")
def deadline(wf):
    wf.execute_step("draft", lambda: "draft")
    decision = wf.wait_for_approval("approval", {{"draft": "draft"}}, deadline={seconds})
    if decision.get("timed_out"):
        wf.execute_step("remind_manager", lambda: "reminded")
        wf.end("escalated", "no decision before the deadline: a manager was reminded")
    return "approved by " + decision["by"]
'''


def deadline_workflow(tmp_path: Path, seconds: float) -> tuple[Path, Path]:
    db, module = tmp_path / "journal.db", tmp_path / "deadline.py"
    module.write_text(DEADLINE.format(seconds=seconds))
    kit("start", "--db", str(db), "--kind", "deadline", "--input", "{}", "--id", "d1", "--module", str(module))
    worker(db, module)
    return db, module


def test_a_deadline_that_passes_while_no_worker_runs_wins_durably_even_across_a_crash(tmp_path):
    db, module = deadline_workflow(tmp_path, 1.0)
    journal = Journal(db)
    assert journal.workflow("d1")["status"] == "waiting"
    time.sleep(1.2)  # nobody runs: the deadline passes
    late = kit("approve", "--db", str(db), "--workflow", "d1", "--by", "Dana", expect=2)
    assert "its deadline passed at" in late.stderr and "nothing was saved" in late.stderr
    arm(journal.conn, "after_commit:remind_manager", "kill")
    assert worker(db, module, expect=None).returncode == -signal.SIGKILL
    worker(db, module)
    wf = journal.workflow("d1")
    assert (wf["status"], wf["error"]) == ("escalated", "no decision before the deadline: a manager was reminded")
    assert [e["event"] for e in journal.history("d1")].count("deadline_passed") == 1
    assert {s["name"]: s["attempts"] for s in journal.steps("d1")} == {"draft": 1, "remind_manager": 1}


def test_a_decision_before_the_deadline_wins(tmp_path):
    db, module = deadline_workflow(tmp_path, 30.0)
    kit("approve", "--db", str(db), "--workflow", "d1", "--by", "Dana")
    worker(db, module)
    journal = Journal(db)
    assert journal.workflow("d1")["output"] == "approved by Dana"
    assert "deadline_passed" not in [e["event"] for e in journal.history("d1")]


TIMEOUT = '''
import time
from pathlib import Path
import durable_kit
from durable_kit import RetryPolicy, time_limit


@durable_kit.workflow("slow_call")
def slow_call(wf):
    first = Path(wf.db_path).with_suffix(".first")

    def call():
        if not first.exists():
            first.touch()
            time.sleep(2)  # the first attempt hangs
            return "late"
        return "on time"

    return wf.execute_step("call", time_limit(0.3, call), retry=RetryPolicy(max_attempts=3, base_delay=0))
'''


def test_a_step_timeout_fails_the_attempt_and_the_retry_succeeds(tmp_path):
    db, module = tmp_path / "journal.db", tmp_path / "slow.py"
    module.write_text(TIMEOUT)
    kit("start", "--db", str(db), "--kind", "slow_call", "--input", "{}", "--id", "s1", "--module", str(module))
    worker(db, module)
    journal = Journal(db)
    assert journal.workflow("s1")["output"] == "on time"
    (step,) = journal.steps("s1")
    assert step["attempts"] == 2
    failed = [e["detail"] for e in journal.history("s1") if e["event"] == "step_failed"]
    assert failed == ["StepTimeout: no result after 0.3 s"]



@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), True, "1"])
def test_a_time_limit_that_is_not_a_finite_number_above_zero_is_refused_before_any_step(seconds):
    with pytest.raises(ValueError, match="time_limit: seconds must be a finite number above 0"):
        durable_kit.time_limit(seconds, lambda: "never run")


def test_a_time_limit_returns_the_result_or_raises_the_error_of_an_activity_in_time():
    assert durable_kit.time_limit(5, lambda: {"ok": 1})() == {"ok": 1}
    with pytest.raises(KeyError, match="missing"):
        durable_kit.time_limit(5, lambda: {}["missing"])()

# --- fork ---

def test_a_fork_reuses_steps_up_to_the_given_one_and_leaves_the_original_untouched(tmp_path):
    db, module = tmp_path / "journal.db", write(tmp_path / "checkout.py", V1, "v1")
    kit("start", "--db", str(db), "--kind", "checkout", "--input", "{}", "--id", "c1", "--module", str(module))
    worker(db, module)
    journal = Journal(db)
    original = {t: [r for r in rows if "'c1'" in r] for t, rows in dump(db).items()}

    write(module, V1, "v1.1")  # for example a fixed prompt
    forked = kit("fork", "--db", str(db), "--workflow", "c1", "--up-to", "reserve", "--new-id", "c1-retry",
                 "--by", "Dana", "--module", str(module))
    assert forked.stdout == "c1-retry: forked from c1 up to reserve; a worker runs the rest\n"
    worker(db, module)
    assert {t: [r for r in rows if "'c1'" in r] for t, rows in dump(db).items()} == original
    fork = journal.workflow("c1-retry")
    assert (fork["status"], fork["version"]) == ("complete", "v1.1")
    assert json.loads(fork["origin"]) == {"workflow": "c1", "up_to": "reserve", "by": "Dana"}
    assert calls(db, "reserve") == ["c1:reserve"]  # reused, not sent again
    assert calls(db, "charge") == ["c1:charge", "c1-retry:charge"]  # after the fork point: a new task, new keys
    assert {s["name"]: s["attempts"] for s in journal.steps("c1-retry")} == {
        "quote": 0, "reserve": 0, "charge": 1, "notify": 1}

    missing = kit("fork", "--db", str(db), "--workflow", "c1", "--up-to", "pay", "--new-id", "x", "--by", "D",
                  "--module", str(module), expect=2)
    assert "has no completed step 'pay' to fork from; its completed steps, in order: " \
           "['quote', 'reserve', 'charge', 'notify']" in missing.stderr
    taken = kit("fork", "--db", str(db), "--workflow", "c1", "--up-to", "quote", "--new-id", "c1-retry", "--by", "D",
                "--module", str(module), expect=2)
    assert "workflow 'c1-retry' already exists" in taken.stderr


def test_status_shows_the_version_and_each_steps_versions(tmp_path):
    db = tmp_path / "journal.db"
    kit("start", "--db", str(db), "--kind", "refund", "--input", '{"order_id": "A-1001"}', "--id", "r1")
    kit("worker", "--db", str(db), "--until-idle")
    status = json.loads(kit("status", "--db", str(db), "--workflow", "r1", "--json").stdout)
    assert status["workflow"]["version"] == "refund-agent-1"
    recommend = next(s for s in status["steps"] if s["name"] == "recommend")
    assert recommend["versions"] == {"model": "fake-llm-1", "policy": "refund-policy-2026-03",
                                     "prompt": "refund-recommendation-2",
                                     "workflow": "refund-agent-1"}
    text = kit("status", "--db", str(db), "--workflow", "r1").stdout
    assert text.startswith("r1 (refund, version refund-agent-1): complete")
