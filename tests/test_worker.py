"""The engine: the worker claims due workflows, replays them, survives SIGKILL and stops on SIGTERM."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import durable_kit
import durable_kit.workshop.agents  # noqa: F401  (registers research_report for in-process runs)
from durable_kit import Journal
from durable_kit.core.retries import PolicyDenied, RateLimited, RetryPolicy, Transient
from durable_kit.core.leases import new_owner, revoke_abandoned
from durable_kit.core.worker import due_workflows, run_due, run_worker
from durable_kit.harness.faults import arm
from durable_kit.world.ledger import Ledger
from durable_kit.world.ledger import ledger_path

from conftest import ROOT, grant, make_due, run_python, wait_until

TOPIC = "supplier concentration risk"
STEPS = 7  # plan, three subtopics, analyze, recommend, report: one model call each


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    done = run_python("-m", "durable_kit", *args, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done


def popen_worker(db: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "durable_kit", "worker", "--db", str(db), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, timeout: float = 15.0, what: str = "condition"):
    return wait_until(condition, timeout, what)


def steps(journal: Journal, workflow_id: str) -> dict:
    return {s["name"]: s for s in journal.steps(workflow_id)}


def model_calls(db: Path, workflow_id: str) -> int:
    return Ledger.beside(db).count("model", workflow_id)


def step_status(db: Path, workflow_id: str, name: str):
    row = Journal(db).conn.execute("SELECT status FROM steps WHERE workflow_id = ? AND name = ?",
                                   (workflow_id, name)).fetchone()
    return row and row["status"]


def fault_fired(db: Path, workflow_id: str) -> bool:
    return any(e["event"] == "fault_fired" for e in Journal(db).history(workflow_id))


def catches_sigterm(pid: int) -> bool:
    """True once the process has installed a SIGTERM handler (Linux: the SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))


# --- claim, due_workflows, revoke_abandoned: one database, plain functions ---

def test_claim_is_atomic_across_connections(db):
    first, second = Journal(db), Journal(db)
    first.start("research_report", {"topic": "t"}, "wf-1")
    assert due_workflows(first) == due_workflows(second) == ["wf-1"]
    assert grant(first.conn, "wf-1", new_owner()).token == 1
    assert grant(second.conn, "wf-1", new_owner()) is None
    assert grant(first.conn, "wf-1", new_owner()) is None
    assert second.workflow("wf-1")["status"] == "running"
    assert due_workflows(second) == []


def test_claim_refuses_a_workflow_that_is_not_due(db):
    journal = Journal(db)
    journal.start("research_report", {"topic": "t"}, "later")
    journal.conn.execute("UPDATE workflows SET next_run_at = ? WHERE id = 'later'", (time.time() + 3600,))
    assert grant(journal.conn, "later", new_owner()) is None
    assert grant(journal.conn, "no-such-workflow", new_owner()) is None
    assert journal.workflow("later")["status"] == "pending"


def test_due_workflows_lists_pending_workflows_whose_time_has_come_soonest_first(db):
    journal = Journal(db)
    at = time.time()
    for workflow_id, status, next_run_at in [("b", "pending", at - 10), ("a", "pending", at - 5),
                                             ("c", "pending", at - 10), ("future", "pending", at + 3600),
                                             ("busy", "running", 0), ("done", "complete", 0),
                                             ("bad", "failed", 0), ("asked", "escalated", 0),
                                             ("no", "stopped", 0)]:
        journal.start("research_report", {"topic": "t"}, workflow_id)
        journal.conn.execute("UPDATE workflows SET status = ?, next_run_at = ? WHERE id = ?",
                             (status, next_run_at, workflow_id))
    assert due_workflows(journal) == ["b", "c", "a"]


def test_revoke_abandoned_makes_running_workflows_pending(db):
    journal = Journal(db)
    for workflow_id in ("wf-2", "wf-1", "wf-3"):
        journal.start("research_report", {"topic": "t"}, workflow_id)
    journal.conn.execute("UPDATE workflows SET status = 'running' WHERE id IN ('wf-1', 'wf-2')")
    assert [w for w, _ in revoke_abandoned(journal.conn)] == ["wf-1", "wf-2"]
    assert {w: journal.workflow(w)["status"] for w in ("wf-1", "wf-2", "wf-3")} == {
        "wf-1": "pending", "wf-2": "pending", "wf-3": "pending"}
    assert [e["event"] for e in journal.history("wf-1")][-1] == "recovered"
    assert "recovered" not in [e["event"] for e in journal.history("wf-3")]
    assert revoke_abandoned(journal.conn) == []


# --- run_due and run_worker in this process ---

def test_run_due_runs_each_due_workflow_once(db, kinds):
    journal = Journal(db)
    calls = {"ok": 0, "flaky": 0, "bug": 0}
    kind = kinds()

    @durable_kit.workflow(kind)
    def flaky(wf):
        def activity():
            calls[wf.id] += 1
            if wf.id == "flaky":
                raise RateLimited("429", retry_after=0)  # due again at once
            if wf.id == "bug":
                raise ValueError("a bug")
            return wf.id
        return wf.execute_step("call", activity, retry=RetryPolicy(max_attempts=5, base_delay=0.2))

    for workflow_id in ("bug", "flaky", "ok"):
        journal.start(kind, {}, workflow_id)
    log = []
    assert run_due(journal, log.append) == 3
    assert calls == {"ok": 1, "flaky": 1, "bug": 1}
    assert log == ["bug: failed: ValueError: a bug", "bug: failed", "flaky: pending", "ok: complete"]
    assert journal.workflow("ok")["output"] == "ok"
    assert journal.workflow("flaky")["status"] == "pending"

    # The failed workflow is not picked up again; the rate-limited one is due again.
    assert run_due(journal, log.append) == 1
    assert calls == {"ok": 1, "flaky": 2, "bug": 1}


def test_run_worker_once_and_until_idle(db, kinds):
    journal = Journal(db)
    calls = []
    kind = kinds()

    @durable_kit.workflow(kind)
    def limited(wf):
        def activity():
            calls.append(wf.id)
            if len(calls) < 3:
                raise RateLimited("429", retry_after=0)
            return "done"
        return wf.execute_step("call", activity, retry=RetryPolicy(max_attempts=5))

    journal.start(kind, {}, "wf-1")
    handler_before = signal.getsignal(signal.SIGTERM)
    log = []
    assert run_worker(db, once=True, log=log.append) == 1
    assert calls == ["wf-1"]  # due again at once, but --once is one pass
    assert journal.workflow("wf-1")["status"] == "pending"
    assert log == ["wf-1: pending", "worker stopped"]

    log.clear()
    assert run_worker(db, until_idle=True, log=log.append) == 2
    assert len(calls) == 3
    assert journal.workflow("wf-1")["status"] == "complete"
    assert log == ["wf-1: pending", "wf-1: complete", "worker stopped"]
    assert signal.getsignal(signal.SIGTERM) is handler_before  # the worker put the old handler back


def test_run_worker_until_idle_leaves_final_and_future_workflows_alone(db, kinds):
    journal = Journal(db)
    calls = []
    kind = kinds()

    @durable_kit.workflow(kind)
    def denied(wf):
        def activity():
            calls.append(wf.id)
            raise PolicyDenied("not allowed") if wf.id == "deny" else Transient("503")
        return wf.execute_step("call", activity, retry=RetryPolicy(max_attempts=3, base_delay=30))

    journal.start(kind, {}, "deny")
    journal.start(kind, {}, "slow")
    assert run_worker(db, until_idle=True, log=lambda _: None) == 2
    assert run_worker(db, until_idle=True, log=lambda _: None) == 0
    assert calls == ["deny", "slow"]
    assert journal.workflow("deny")["status"] == "stopped"
    assert journal.workflow("slow")["status"] == "pending"


# --- the command line in real processes ---

def test_start_status_and_history_as_json(tmp_path):
    db = tmp_path / "wf.db"
    assert cli("start", "--db", str(db), "--kind", "research_report", "--topic", TOPIC, "--id", "r1").stdout.strip() == "r1"
    assert json.loads(cli("start", "--db", str(db), "--kind", "research_report", "--topic", TOPIC, "--id", "r1", "--json").stdout) == {
        "workflow_id": "r1"}
    fresh = cli("start", "--db", str(tmp_path / "other.db"), "--topic", TOPIC).stdout.strip()
    assert fresh != "r1" and len(fresh) == 12

    status = json.loads(cli("status", "--db", str(db), "--workflow", "r1", "--json").stdout)
    assert set(status) == {"workflow", "waiting_for", "steps"}
    assert status["steps"] == []
    assert status["workflow"]["id"] == "r1" and status["workflow"]["status"] == "pending"
    assert status["workflow"]["kind"] == "research_report"

    arm(Journal(db).conn, "next_step", "fail")
    cli("worker", "--db", str(db), "--once")
    status = json.loads(cli("status", "--db", str(db), "--workflow", "r1", "--json").stdout)
    assert set(status["workflow"]) == {"id", "kind", "status", "error", "next_run_at", "retries_used",
                                       "retry_budget", "output", "version", "origin", "cancel_requested"}
    assert (status["workflow"]["status"], status["workflow"]["retries_used"]) == ("pending", 1)
    (plan,) = status["steps"]
    assert set(plan) == {"name", "status", "attempts", "error", "next_attempt_at", "position", "versions"}
    assert (plan["name"], plan["status"], plan["attempts"]) == ("plan", "retrying", 1)
    assert plan["error"].startswith("InjectedFailure:")
    assert plan["next_attempt_at"] == status["workflow"]["next_run_at"]

    events = json.loads(cli("history", "--db", str(db), "--workflow", "r1", "--json").stdout)
    assert isinstance(events, list)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert set(events[0]) == {"seq", "step", "event", "detail", "pid", "at"}
    assert [e["event"] for e in events] == ["workflow_created", "replay_started", "step_started", "fault_fired",
                                            "step_failed", "retry_scheduled"]

    text = cli("status", "--db", str(db), "--workflow", "r1").stdout
    assert "r1 (research_report, version research-report-1): pending" in text and "next attempt in" in text


def test_worker_once_runs_each_due_workflow_once(tmp_path):
    db = tmp_path / "wf.db"
    for workflow_id in ("r1", "r2"):
        cli("start", "--db", str(db), "--kind", "research_report", "--topic", TOPIC, "--id", workflow_id)
    cli("arm", "--db", str(db), "--point", "next_step", "--action", "fail")
    done = cli("worker", "--db", str(db), "--once")
    assert done.stdout.splitlines() == ["r1: pending", "r2: complete", "worker stopped"]
    assert (model_calls(db, "r1"), model_calls(db, "r2")) == (0, STEPS)

    make_due(db, "r1")
    done = cli("worker", "--db", str(db), "--once")
    assert done.stdout.splitlines() == ["r1: complete", "worker stopped"]
    assert model_calls(db, "r1") == STEPS
    assert cli("worker", "--db", str(db), "--once").stdout.splitlines() == ["worker stopped"]


def test_a_scheduled_retry_survives_worker_restarts(tmp_path):
    db = tmp_path / "wf.db"
    cli("start", "--db", str(db), "--kind", "research_report", "--topic", TOPIC, "--id", "r1")
    armed = cli("arm", "--db", str(db), "--point", "next_step", "--action", "fail")
    assert "armed next_step (fail)" in armed.stdout

    first = cli("worker", "--db", str(db), "--until-idle")
    assert first.stdout.splitlines() == ["r1: pending", "worker stopped"]
    journal = Journal(db)
    wf = journal.workflow("r1")
    plan = steps(journal, "r1")["plan"]
    assert (wf["status"], plan["status"], plan["attempts"]) == ("pending", "retrying", 1)
    assert plan["next_attempt_at"] == wf["next_run_at"] > time.time()
    assert model_calls(db, "r1") == 0

    # A restarted worker before the time: nothing runs, nothing changes. The retry is moved an hour away first,
    # so a slow start of the next process cannot reach it.
    make_due(db, "r1", hours=-1)
    plan, wf = steps(journal, "r1")["plan"], journal.workflow("r1")
    second = cli("worker", "--db", str(db), "--until-idle")
    assert second.stdout.splitlines() == ["worker stopped"]
    assert steps(journal, "r1")["plan"] == plan
    assert journal.workflow("r1") == wf
    assert model_calls(db, "r1") == 0

    make_due(db, "r1", hours=2)
    third = cli("worker", "--db", str(db), "--until-idle")
    assert third.stdout.splitlines() == ["r1: complete", "worker stopped"]
    by_name = steps(journal, "r1")
    assert by_name["plan"]["attempts"] == 2
    assert all(s["status"] == "complete" and (s["attempts"] == 1 or name == "plan") for name, s in by_name.items())
    assert len(by_name) == STEPS
    # The injected failure fired before the activity: the model was asked once per step.
    assert model_calls(db, "r1") == STEPS
    assert journal.workflow("r1")["retries_used"] == 1
    assert journal.workflow("r1")["output"]["title"] == f"Report: {TOPIC}"


def test_sigkill_mid_step_then_a_new_worker_finishes_it(tmp_path):
    db = tmp_path / "wf.db"
    journal = Journal(db)
    journal.start("research_report", {"topic": TOPIC}, "r1")
    arm(journal.conn, "next_step", "delay", 30)

    worker = popen_worker(db)
    try:
        wait_for(lambda: step_status(db, "r1", "plan") == "running" and fault_fired(db, "r1"),
                 what="plan to be running with the delay fault fired")
    finally:
        worker.kill()
        worker.communicate(timeout=10)
    assert worker.returncode == -signal.SIGKILL
    assert journal.workflow("r1")["status"] == "running"
    assert model_calls(db, "r1") == 0

    done = cli("worker", "--db", str(db), "--until-idle")
    assert done.stdout.splitlines() == ["r1: recovered", "r1: complete", "worker stopped"]
    wf = journal.workflow("r1")
    assert (wf["status"], wf["retries_used"]) == ("complete", 0)
    by_name = steps(journal, "r1")
    assert by_name["plan"]["attempts"] == 2
    assert all(s["status"] == "complete" for s in by_name.values())
    assert model_calls(db, "r1") == STEPS  # the killed attempt never reached the model
    assert "recovered" in [e["event"] for e in journal.history("r1")]


def test_sigkill_after_a_committed_step_repeats_nothing(tmp_path):
    db = tmp_path / "wf.db"
    journal = Journal(db)
    journal.start("research_report", {"topic": TOPIC}, "r1")
    arm(journal.conn, "after_commit:plan", "delay", 30)

    worker = popen_worker(db)
    try:
        wait_for(lambda: fault_fired(db, "r1"), what="the after_commit:plan delay to fire")
    finally:
        worker.kill()
        worker.communicate(timeout=10)
    assert step_status(db, "r1", "plan") == "complete"
    assert model_calls(db, "r1") == 1

    cli("worker", "--db", str(db), "--until-idle")
    assert journal.workflow("r1")["status"] == "complete"
    assert {name: s["attempts"] for name, s in steps(journal, "r1").items()} == {
        name: 1 for name in steps(journal, "r1")}
    assert model_calls(db, "r1") == STEPS
    events = [e["event"] for e in journal.history("r1")]
    assert "recovered" in events and "step_reused" in events


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc")
def test_sigterm_stops_an_idle_worker_cleanly(tmp_path):
    db = tmp_path / "empty.db"
    worker = popen_worker(db, "--poll", "0.05")
    try:
        wait_for(lambda: worker.poll() is not None or catches_sigterm(worker.pid), timeout=15,
                 what="the worker to install its SIGTERM handler")
        assert worker.poll() is None, worker.stderr.read()
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=5)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, err
    assert out.splitlines() == ["worker stopped (SIGTERM)"]


def test_a_workflow_of_an_unknown_kind_is_left_pending_for_a_worker_that_knows_it(db):
    journal = Journal(db)
    journal.start("test_worker.kind_nobody_registered", {}, "wf-1", registered_elsewhere=True)
    log = []
    assert run_due(journal, log.append) == 0
    assert run_worker(db, until_idle=True, log=log.append) == 0  # idle: it does not spin on it
    assert journal.workflow("wf-1")["status"] == "pending"
    said = ("wf-1: its kind 'test_worker.kind_nobody_registered' is registered by no module in this worker; "
            "left pending for a worker that knows it (pass --module FILE)")
    assert log == [said, said, "worker stopped"]  # once per pass of run_due, once per worker


CRASH_EVERY_TIME = """
import os
import durable_kit
from durable_kit.core.retries import RetryPolicy


@durable_kit.workflow("crash_every_time")
def crash_every_time(wf):
    wf.execute_step("poison", lambda: os._exit(13), retry=RetryPolicy(max_attempts=3, base_delay=0))
    return "unreachable"
"""


def test_a_step_that_kills_its_process_every_time_escalates_after_max_attempts(tmp_path):
    module, db = tmp_path / "poison.py", tmp_path / "journal.db"
    module.write_text(CRASH_EVERY_TIME)
    Journal(db).start("crash_every_time", {}, "p1", registered_elsewhere=True)
    worker = ("-m", "durable_kit", "worker", "--db", str(db), "--until-idle", "--module", str(module))
    exit_codes = [run_python(*worker).returncode for _ in range(4)]

    assert exit_codes == [13, 13, 13, 0]  # three attempts died; the fourth worker escalates instead of running it
    journal = Journal(db)
    wf = journal.workflow("p1")
    assert wf["status"] == "escalated"
    assert wf["error"] == "Crashed on attempt 3 of 3: the process died during the attempt"
    assert steps(journal, "p1")["poison"]["attempts"] == 3


COUNT_FILES = """
import os, sys
import durable_kit.workshop.agents
from durable_kit.workshop.agents.shared_work import start_work
from durable_kit.core.worker import run_worker
start_work(sys.argv[1], 300, 1, 0)
before = len(os.listdir('/proc/self/fd'))
run_worker(sys.argv[1], until_idle=True, log=lambda message: None)
print(before, len(os.listdir('/proc/self/fd')))
"""


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="counts open files in /proc")
def test_a_worker_running_hundreds_of_workflows_keeps_no_files_open_behind_them(tmp_path):
    done = run_python("-c", COUNT_FILES, str(tmp_path / "journal.db"))
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    # The worker's own journal (file, log, index) may stay open; nothing per workflow does.
    assert after - before <= 3, (before, after)


def test_the_shared_work_ledger_is_opened_once_per_process_and_again_after_its_file_is_replaced(tmp_path):
    from durable_kit.workshop.agents.shared_work import ledger_beside

    db = tmp_path / "journal.db"
    first = ledger_beside(db)
    assert ledger_beside(db) is first  # one connection for every replay in this process
    first.record("activity", "work:1", "w001")
    first.close()
    ledger_path(db).unlink()  # a folder reset
    again = ledger_beside(db)
    assert again is not first
    assert again.calls() == []  # the new, empty file: not the deleted one
    again.record("activity", "work:1", "w002")
    assert [c["workflow_id"] for c in Ledger.beside(db).calls()] == ["w002"]
