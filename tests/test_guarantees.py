"""Each stated guarantee tried the way the world breaks it, in real processes, with exact counts.

Paused owners (SIGSTOP past a lease), repeated and late decisions, two
processes racing, a lock held by a paused process, crash loops.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import durable_kit
from durable_kit import Journal
from durable_kit.core.journal import run_workflow
from durable_kit.world.payments import Payments
from durable_kit.harness.faults import arm

from conftest import ROOT, dump, run_python, wait_until


def kit(*args: str, expect: int | None = 0, timeout: float = 60) -> subprocess.CompletedProcess:
    done = run_python("-m", "durable_kit", *args, timeout=timeout)
    if expect is not None:
        assert done.returncode == expect, (done.stdout, done.stderr)
    return done


def popen_kit(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "durable_kit", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def events(db: Path, workflow_id: str) -> list[tuple]:
    return [(e["step"], e["event"], e["detail"]) for e in Journal(db).history(workflow_id)]


def stopped(pid: int) -> bool:
    """The process has stopped itself (a ``stop`` fault: SIGSTOP) and waits for SIGCONT."""
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout
    return state.strip().startswith("T")


def fired(db: Path, workflow_id: str, point: str) -> bool:
    return any(event == "fault_fired" and detail.startswith(point) for _, event, detail in events(db, workflow_id))


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --- 1. A decision lands on the wait it was meant for ---

TWO_GATES = '''
from pathlib import Path
import durable_kit


@durable_kit.workflow("two_gates")
def two_gates(wf):
    wf.wait_for_approval("plan", {"plan": "refund 89 EUR on A-1001"})
    wf.execute_step("draft_payment", lambda: {"amount": 89})
    wf.wait_for_approval("payment", {"amount": 89})
    paid = Path(wf.db_path).with_suffix(".paid")
    return wf.execute_step("pay", lambda: paid.open("a").write("paid\\n") and "paid")
'''


def test_a_repeated_approval_never_decides_a_later_wait(tmp_path):
    module, db = tmp_path / "gates.py", tmp_path / "journal.db"
    module.write_text(TWO_GATES)
    paid = db.with_suffix(".paid")
    common = ("--db", str(db), "--workflow", "g1")
    kit("start", "--db", str(db), "--kind", "two_gates", "--input", "{}", "--id", "g1", "--module", str(module))
    kit("worker", "--db", str(db), "--until-idle", "--module", str(module))

    first = kit("approve", *common, "--by", "Dana", "--comment", "plan is fine")
    assert first.stdout == "g1, wait 'plan': saved: approved by Dana: plan is fine; status pending\n"
    kit("worker", "--db", str(db), "--until-idle", "--module", str(module))
    assert Journal(db).workflow("g1")["status"] == "waiting"
    before = dump(db)

    # The same command again (a double click, a retried script): it must not become the payment's approval.
    repeat = kit("approve", *common, "--by", "Dana", "--comment", "plan is fine", expect=2)
    assert "has had 2 approval waits ('plan': approved by Dana: plan is fine; 'payment': open)" in repeat.stderr
    assert "name the one you decide (--wait NAME); nothing was changed" in repeat.stderr
    # A late rejection meant for the plan is refused; it must not reject the payment either.
    late = kit("reject", *common, "--by", "Eli", "--wait", "plan", expect=2)
    assert "wait 'plan': the decision saved first (approved by Dana: plan is fine) is final" in late.stderr
    # Named, the repeat is answered with the first decision and saves nothing.
    named = kit("approve", *common, "--by", "Dana", "--wait", "plan")
    assert named.stdout.startswith("g1, wait 'plan': already approved by Dana at ")
    assert named.stdout.endswith("; nothing saved; status waiting\n")
    assert dump(db) == before
    payment = Journal(db).conn.execute("SELECT status, decision FROM waits WHERE name = 'payment'").fetchone()
    assert tuple(payment) == ("waiting", None)
    assert lines(paid) == []

    kit("approve", *common, "--by", "Sam", "--wait", "payment")
    kit("worker", "--db", str(db), "--until-idle", "--module", str(module))
    assert Journal(db).workflow("g1")["status"] == "complete"
    assert lines(paid) == ["paid"]


def test_a_decision_for_a_wait_not_reached_yet_is_refused_and_changes_nothing(tmp_path):
    module, db = tmp_path / "gates.py", tmp_path / "journal.db"
    module.write_text(TWO_GATES)
    kit("start", "--db", str(db), "--kind", "two_gates", "--input", "{}", "--id", "g1", "--module", str(module))
    kit("worker", "--db", str(db), "--until-idle", "--module", str(module))
    before = dump(db)
    early = kit("approve", "--db", str(db), "--workflow", "g1", "--by", "Sam", "--wait", "payment", expect=2)
    assert "has no approval wait named 'payment' (its status is 'waiting'); nothing was changed" in early.stderr
    assert dump(db) == before


# --- 2. Fencing reaches the destination: a paused owner's late payment ---

def pause_before_payment(tmp_path: Path, strategy: str) -> dict:
    """Worker A pauses (SIGSTOP) just before paying; B takes over after A's lease expires; then A resumes."""
    db = tmp_path / f"{strategy}.db"
    journal = Journal(db)
    journal.start("refund", {"order_id": "A-1001", "strategy": strategy}, "refund-A-1001")
    arm(journal.conn, "before_send:refund", "stop")  # A stops itself there: SIGSTOP, however slow the machine
    worker = ("worker", "--db", str(db), "--until-idle", "--lease-seconds", "1", "--expiry-only")
    a = popen_kit(*worker)
    try:
        wait_until(lambda: stopped(a.pid), what="A to reach the payment and pause")
        time.sleep(1.3)  # A's lease (1 s) expires while it is stopped
        b = popen_kit(*worker)
        b_out, b_err = b.communicate(timeout=60)
        assert b.returncode == 0, b_err
    finally:
        a.send_signal(signal.SIGCONT)
    a_out, a_err = a.communicate(timeout=60)
    assert a.returncode == 0 and "Traceback" not in a_err, a_err
    payments = Payments.beside(db)
    history = events(db, "refund-A-1001")
    result = {"refunds": len(payments.refunds()), "calls": payments.request_count(),
              "status": journal.workflow("refund-A-1001")["status"],
              "journal_write_refused": any(e == "stale_write_refused" for _, e, _ in history)}
    payments.close()
    return result


@pytest.mark.parametrize("strategy, refunds, calls, status", [
    ("naive", 2, 2, "complete"),                # no key, no token: the paused owner pays again
    ("destination_key", 1, 2, "complete"),      # the key deduplicates (and the token is checked)
    ("reconciliation", 1, 2, "complete"),       # "list, then charge" is safe only because the token is checked
    ("outbox", 1, 2, "complete"),               # the key deduplicates; the first receipt stays the receipt
    ("reservation", 1, 1, "escalated"),         # B finds the key reserved and escalates; A's late send is the one
])
def test_a_paused_owner_that_lost_its_lease_pays_once_where_the_destination_checks(tmp_path, strategy, refunds,
                                                                                    calls, status):
    result = pause_before_payment(tmp_path, strategy)
    assert (result["refunds"], result["calls"], result["status"]) == (refunds, calls, status)
    if strategy != "outbox":  # the outbox is sent by a dispatcher, which writes nothing under a lease
        assert result["journal_write_refused"] is True


def test_the_stale_token_is_refused_at_the_payment_service_in_the_reconciliation_run(tmp_path):
    pause_before_payment(tmp_path, "reconciliation")
    requests = sqlite3.connect(tmp_path / "reconciliation.payments.db").execute(
        "SELECT key FROM requests ORDER BY seq").fetchall()
    assert requests == [("refund-A-1001:refund",)] * 2
    fence = sqlite3.connect(tmp_path / "reconciliation.payments.db").execute("SELECT key, token FROM fences").fetchall()
    # A paid with token 1 after B paid with token 3 (the takeover's revocation took 2): A was refused.
    assert fence == [("refund-A-1001:refund", 3)]


# --- 3. A final workflow never runs again ---

ESCALATES = '''
from pathlib import Path
import durable_kit


@durable_kit.workflow("counted")
def counted(wf):
    calls = Path(wf.db_path).with_suffix(".calls")
    return wf.execute_step("work", lambda: calls.open("a").write("call\\n") and "done")
'''


ESCALATE = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1], timeout=float(sys.argv[2]));"
            "c.execute(\"UPDATE workflows SET status = 'escalated', error = 'by a person' WHERE id = 'c1'\");"
            " c.commit()")


def test_no_escalation_slips_between_the_status_read_and_the_grant_and_an_escalated_workflow_is_not_run(
        tmp_path, monkeypatch):
    module, db = tmp_path / "counted.py", tmp_path / "journal.db"
    module.write_text(ESCALATES)
    import importlib.util
    spec = importlib.util.spec_from_file_location("counted_module", module)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    journal = Journal(db)
    journal.start("counted", {}, "c1")

    import durable_kit.core.leases as leases_module
    real_grant, tried = leases_module.grant, []

    def grant_while_a_person_escalates(*args, **kwargs):
        # Between run_workflow's status read and its grant, another process tries to escalate the workflow.
        tried.append(run_python("-c", ESCALATE, str(db), "0.2"))
        return real_grant(*args, **kwargs)

    monkeypatch.setattr(leases_module, "grant", grant_while_a_person_escalates)
    assert run_workflow(journal, "c1") == "done"
    assert tried[0].returncode != 0 and "database is locked" in tried[0].stderr  # it had to wait for the commit
    assert lines(db.with_suffix(".calls")) == ["call"]

    journal.start("counted", {}, "c2")
    monkeypatch.setattr(leases_module, "grant", real_grant)
    done = run_python("-c", ESCALATE.replace("'c1'", "'c2'"), str(db), "5")
    assert done.returncode == 0, done.stderr
    assert run_workflow(journal, "c2") is None  # escalated before the run: the grant never happens
    assert lines(db.with_suffix(".calls")) == ["call"]  # its activity was not called
    assert journal.workflow("c2")["status"] == "escalated"
    assert [e for _, e, _ in events(db, "c2")] == ["workflow_created"]  # nothing was written by the run


# --- 4. A failure and its retry decision commit together ---

RATE_LIMITED = '''
from pathlib import Path
import durable_kit
from durable_kit.core.retries import RateLimited, RetryPolicy


@durable_kit.workflow("rate_limited")
def rate_limited(wf):
    calls = Path(wf.db_path).with_suffix(".calls")

    def call():
        calls.open("a").write("call\\n")
        raise RateLimited("slow down", retry_after=30)

    return wf.execute_step("call", call, retry=RetryPolicy(max_attempts=3))
'''


def test_a_process_killed_right_after_a_failure_keeps_its_retry_schedule(tmp_path):
    module, db = tmp_path / "limited.py", tmp_path / "journal.db"
    module.write_text(RATE_LIMITED)
    journal = Journal(db)
    journal.start("rate_limited", {}, "r1", registered_elsewhere=True)
    arm(journal.conn, "after_failure:call", "kill")
    before = time.time()
    killed = kit("worker", "--db", str(db), "--until-idle", "--module", str(module), expect=None)
    after = time.time()
    assert killed.returncode == -signal.SIGKILL

    step = journal.steps("r1")[0]
    wf = journal.workflow("r1")
    assert (step["status"], step["attempts"], wf["status"], wf["retries_used"]) == ("retrying", 1, "pending", 1)
    # 30 s after the failure, which happened while the worker ran: however slowly it started and died.
    assert before + 30 <= step["next_attempt_at"] <= after + 30
    assert wf["next_run_at"] == step["next_attempt_at"]
    kit("worker", "--db", str(db), "--until-idle", "--module", str(module))  # nothing is due for 30 s
    assert lines(db.with_suffix(".calls")) == ["call"]
    assert journal.steps("r1")[0]["attempts"] == 1


# --- 5. Outbox receipts are final: two dispatchers send the same row ---

TWO_DISPATCHERS = '''
from pathlib import Path
import durable_kit
from durable_kit.effects import destination, send_via_outbox


@destination("probe.deliver")
def deliver(journal_path, payload, key):
    sent = Path(journal_path).with_suffix(".sent")
    with sent.open("a") as log:
        log.write(key + "\\n")
    return {"delivery": len(sent.read_text().splitlines())}  # each send answers differently


@durable_kit.workflow("outboxed")
def outboxed(wf):
    return send_via_outbox(wf, "deliver", "probe.deliver", {"to": "ops@example.com"})
'''


def test_two_dispatchers_sending_one_row_leave_the_first_saved_receipt(tmp_path):
    module, db = tmp_path / "outboxed.py", tmp_path / "journal.db"
    module.write_text(TWO_DISPATCHERS)
    journal = Journal(db)
    journal.start("outboxed", {}, "o1", registered_elsewhere=True)
    kit("run", "--db", str(db), "--workflow", "o1", "--module", str(module))  # enqueues, then waits for the receipt
    arm(journal.conn, "after_send:deliver", "stop")  # the first pauses after sending, until the second is done
    once = ("worker", "--db", str(db), "--once", "--module", str(module))
    slow = popen_kit(*once)
    wait_until(lambda: stopped(slow.pid), what="the first dispatcher to send and pause")
    kit(*once)  # the second dispatcher sends too, saves its answer and runs the workflow on
    os.kill(slow.pid, signal.SIGCONT)
    out, err = slow.communicate(timeout=30)
    assert slow.returncode == 0 and "Traceback" not in err, err

    assert lines(db.with_suffix(".sent")) == ["o1:deliver", "o1:deliver"]
    (outbox,) = journal.conn.execute("SELECT status, result, attempts FROM outbox").fetchall()
    receipt = journal.conn.execute("SELECT decision FROM waits WHERE name = 'deliver:receipt'").fetchone()[0]
    assert (outbox["status"], json.loads(outbox["result"]), outbox["attempts"]) == ("sent", {"delivery": 2}, 2)
    assert json.loads(receipt) == {"delivery": 2}
    assert journal.workflow("o1")["output"] == {"delivery": 2}
    assert [e for _, e, _ in events(db, "o1")].count("outbox_answer_dropped") == 1
    # Replayed again, the workflow sees the same receipt.
    replay = kit("run", "--db", str(db), "--workflow", "o1", "--module", str(module))
    assert json.loads(replay.stdout) == {"delivery": 2}


# --- 6. "Never replaced" holds without a lease: two unleased replays race ---

RACE = '''
import os, time
from pathlib import Path
import durable_kit
from durable_kit.core.retries import RetryPolicy, Transient


@durable_kit.workflow("race")
def race(wf):
    runs = Path(wf.db_path).with_suffix(".runs")

    def step():
        who = os.environ["WHO"]
        runs.open("a").write(who + "\\n")
        if who == "A":
            time.sleep(0.5)
            return {"by": "A"}
        time.sleep(1.5)  # B fails after A committed
        raise Transient("B's attempt failed")

    return wf.execute_step("s", step, retry=RetryPolicy(max_attempts=3, base_delay=60))
'''

UNLEASED_RUN = """
import sys, importlib.util
spec = importlib.util.spec_from_file_location('race_module', sys.argv[2])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
from durable_kit.core.journal import Journal, run_workflow
print(run_workflow(Journal(sys.argv[1]), 'x1', fenced=False))
"""


def test_two_unleased_replays_racing_keep_the_first_committed_output(tmp_path):
    module, db = tmp_path / "race.py", tmp_path / "journal.db"
    module.write_text(RACE)
    journal = Journal(db)
    journal.start("race", {}, "x1", registered_elsewhere=True)
    racers = {who: subprocess.Popen([sys.executable, "-c", UNLEASED_RUN, str(db), str(module)], cwd=ROOT,
                                    env={**os.environ, "WHO": who}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for who in ("A", "B")}
    results = {who: p.communicate(timeout=30) for who, p in racers.items()}
    assert all(p.returncode == 0 for p in racers.values()), results

    step = journal.steps("x1")[0]
    assert (step["status"], step["output"], step["attempts"]) == ("complete", {"by": "A"}, 2)
    assert journal.workflow("x1")["status"] == "complete"
    assert journal.workflow("x1")["retries_used"] == 0  # B's failure scheduled nothing
    assert sorted(lines(db.with_suffix(".runs"))) == ["A", "B"]
    # A third replay reuses A's output: nothing runs.
    assert kit("run", "--db", str(db), "--workflow", "x1", "--module", str(module)).stdout == '{"by": "A"}\n'
    assert sorted(lines(db.with_suffix(".runs"))) == ["A", "B"]


# --- 7. An owner whose lease lapsed starts no new activity under it ---

THREE_STEPS = '''
from pathlib import Path
import durable_kit


@durable_kit.workflow("three_steps")
def three_steps(wf):
    runs = Path(wf.db_path).with_suffix(".runs")
    for name in ("one", "two", "three"):
        wf.execute_step(name, lambda name=name: runs.open("a").write(name + "\\n") and name)
    return "done"
'''

HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute('BEGIN IMMEDIATE')
print('held', flush=True)
time.sleep(float(sys.argv[2]))
conn.execute('COMMIT')
"""


def test_an_owner_whose_lease_lapsed_under_a_held_lock_starts_nothing_until_it_has_a_new_lease(tmp_path):
    module, db = tmp_path / "three.py", tmp_path / "journal.db"
    module.write_text(THREE_STEPS)
    journal = Journal(db)
    journal.start("three_steps", {}, "t1", registered_elsewhere=True)
    arm(journal.conn, "next_step", "delay", 1.0)  # step one's activity takes a second
    worker = popen_kit("worker", "--db", str(db), "--until-idle", "--lease-seconds", "1", "--expiry-only",
                       "--module", str(module))
    wait_until(lambda: fired(db, "t1", "next_step"), what="step one to start")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db), "2.5"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"  # no heartbeat can renew for 2.5 s: the 1 s lease lapses
    holder.wait(timeout=30)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0 and "Traceback" not in err, err

    assert lines(db.with_suffix(".runs")) == ["one", "two", "three"]  # every activity once
    history = events(db, "t1")
    refused = [d for _, e, d in history if e == "stale_write_refused"]
    assert len(refused) == 1
    assert "expired before it was renewed" in refused[0] or "heartbeat could not renew its lease" in refused[0]
    order = [(s, e) for s, e, _ in history if e in ("step_completed", "stale_write_refused", "recovered",
                                                     "step_started")]
    assert order == [("one", "step_started"), ("one", "step_completed"), (None, "stale_write_refused"),
                     (None, "recovered"), ("two", "step_started"), ("two", "step_completed"),
                     ("three", "step_started"), ("three", "step_completed")]
    assert journal.workflow("t1")["status"] == "complete"


# --- 8. A worker never dies of a busy database ---

PAUSED_HOLDER = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute('BEGIN IMMEDIATE')
print('held', flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # paused while holding the write lock
conn.execute('COMMIT')
"""


def test_a_lock_held_by_a_paused_process_delays_the_worker_but_loses_nothing(tmp_path):
    module, db = tmp_path / "three.py", tmp_path / "journal.db"
    module.write_text(THREE_STEPS)
    journal = Journal(db)
    journal.start("three_steps", {}, "t1", registered_elsewhere=True)
    arm(journal.conn, "after_activity:two", "stop")  # step two ran; its output waits until the lock is held
    # A lease long enough that the pause and the held lock cannot end it: this test is about the lock.
    worker = popen_kit("worker", "--db", str(db), "--until-idle", "--lease-seconds", "120", "--module", str(module))
    wait_until(lambda: stopped(worker.pid), what="step two's activity to finish")
    holder = subprocess.Popen([sys.executable, "-c", PAUSED_HOLDER, str(db)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    os.kill(worker.pid, signal.SIGCONT)
    time.sleep(22)  # longer than every busy timeout and retry of BEGIN IMMEDIATE (4 x 5 s)
    assert worker.poll() is None, worker.communicate()  # still alive
    os.kill(holder.pid, signal.SIGCONT)
    holder.wait(timeout=10)
    out, err = worker.communicate(timeout=90)

    assert worker.returncode == 0 and "Traceback" not in err, err
    assert "storage fault in journal.db: database is locked; nothing was lost, trying again in" in out
    assert journal.workflow("t1")["status"] == "complete"
    # Step two's output could not be committed while the lock was held: its activity ran again, nothing else did.
    assert lines(db.with_suffix(".runs")) == ["one", "two", "two", "three"]
    assert {s["name"]: s["attempts"] for s in journal.steps("t1")} == {"one": 1, "two": 2, "three": 1}


# --- 9. Crash loops end, with or without a retry policy ---

CRASH_LOOP = '''
import os
import durable_kit


@durable_kit.workflow("crash_loop")
def crash_loop(wf):
    wf.execute_step("poison", lambda: os._exit(13))  # no retry policy
    return "unreachable"
'''


def test_a_step_without_a_retry_policy_that_kills_its_process_escalates_after_three_attempts(tmp_path):
    module, db = tmp_path / "loop.py", tmp_path / "journal.db"
    module.write_text(CRASH_LOOP)
    Journal(db).start("crash_loop", {}, "p1", registered_elsewhere=True)
    worker = ("worker", "--db", str(db), "--until-idle", "--module", str(module))
    exit_codes = [kit(*worker, expect=None).returncode for _ in range(4)]
    assert exit_codes == [13, 13, 13, 0]
    journal = Journal(db)
    wf = journal.workflow("p1")
    assert (wf["status"], wf["error"]) == ("escalated",
                                           "Crashed on attempt 3 of 3: the process died during the attempt")
    assert journal.steps("p1")[0]["attempts"] == 3
    assert kit(*worker).returncode == 0 and journal.steps("p1")[0]["attempts"] == 3  # and it stays escalated


# --- fan-out: a crash mid-fan-out reruns only the unfinished branches ---

FAN_OUT = '''
import time
from pathlib import Path
import durable_kit


@durable_kit.workflow("fan_out")
def fan_out(wf):
    runs = Path(wf.db_path).with_suffix(".runs")

    def read(source, seconds):
        def activity():
            time.sleep(seconds)
            with runs.open("a") as log:
                log.write(source + "\\n")
            return {"source": source}
        return activity

    found = durable_kit.execute_parallel(wf, {f"read:{s}": read(s, t) for s, t in [("a", 0.1), ("b", 0.3), ("c", 0.6)]})
    return sorted(v["source"] for v in found.values())
'''


def test_a_crash_mid_fan_out_reruns_only_the_unfinished_branch(tmp_path):
    module, db = tmp_path / "fan.py", tmp_path / "journal.db"
    module.write_text(FAN_OUT)
    journal = Journal(db)
    journal.start("fan_out", {}, "f1", registered_elsewhere=True)
    arm(journal.conn, "after_activity:read:c", "exit")  # c finishes last; a and b are already committed
    crashed = kit("run", "--db", str(db), "--workflow", "f1", "--module", str(module), expect=None)
    assert crashed.returncode == 13
    assert {s["name"]: s["status"] for s in journal.steps("f1")} == {
        "read:a": "complete", "read:b": "complete", "read:c": "running"}
    done = kit("run", "--db", str(db), "--workflow", "f1", "--module", str(module))
    assert json.loads(done.stdout) == ["a", "b", "c"]
    assert sorted(lines(db.with_suffix(".runs"))) == ["a", "b", "c", "c"]
    assert {s["name"]: s["attempts"] for s in journal.steps("f1")} == {"read:a": 1, "read:b": 1, "read:c": 2}


def test_each_branch_keeps_its_own_place_so_a_later_replay_follows_the_fan_out_in_any_name_order(tmp_path):
    @durable_kit.workflow("fan_out_unsorted")
    def fan_out_unsorted(wf):
        found = durable_kit.execute_parallel(wf, {"read:b": lambda: "B", "read:a": lambda: "A", "read:c": lambda: "C"})
        wf.wait_for_approval("go", found)  # the next replay passes the fan-out again
        return found

    journal = Journal(tmp_path / "journal.db")
    journal.start("fan_out_unsorted", {}, "f1")
    assert run_workflow(journal, "f1") is None
    assert {s["name"]: s["position"] for s in journal.steps("f1")} == {"read:b": 1, "read:a": 2, "read:c": 3}
    durable_kit.approve(journal, "f1", by="Ana")
    assert run_workflow(journal, "f1") == {"read:b": "B", "read:a": "A", "read:c": "C"}
    assert journal.workflow("f1")["status"] == "complete"


# --- pause and resume: a provider outage holds nothing ---

PAUSES = '''
from pathlib import Path
import durable_kit


@durable_kit.workflow("pauses")
def pauses(wf):
    first = wf.execute_step("first", lambda: "kept")
    if not Path(wf.db_path).with_suffix(".up").exists():
        wf.pause("the provider is down")
    return [first, wf.execute_step("second", lambda: "after the outage")]
'''


def test_a_paused_workflow_is_never_due_until_resumed_and_then_reuses_its_steps(tmp_path):
    module, db = tmp_path / "pauses.py", tmp_path / "journal.db"
    module.write_text(PAUSES)
    journal = Journal(db)
    journal.start("pauses", {}, "p1", registered_elsewhere=True)
    worker = ("worker", "--db", str(db), "--until-idle", "--module", str(module))
    kit(*worker)
    assert (journal.workflow("p1")["status"], journal.workflow("p1")["next_run_at"]) == ("paused", None)
    before = dump(db)
    kit(*worker)  # nothing is due
    assert dump(db) == before
    refused = kit("resume", "--db", str(db), "--workflow", "missing", "--by", "ops", expect=2)
    assert "no workflow 'missing'" in refused.stderr

    db.with_suffix(".up").touch()
    assert kit("resume", "--db", str(db), "--workflow", "p1", "--by", "ops").stdout.startswith("p1: pending")
    kit(*worker)
    assert journal.workflow("p1")["output"] == ["kept", "after the outage"]
    assert {s["name"]: s["attempts"] for s in journal.steps("p1")} == {"first": 1, "second": 1}
    again = kit("resume", "--db", str(db), "--workflow", "p1", "--by", "ops", expect=2)
    assert "is 'complete', not paused, failed, blocked or escalated; nothing was changed" in again.stderr
