"""Where the newest features meet, in real processes: an activity that outruns its lease, a fork of what a
cancellation undid, decisions on finished workflows, giving up an escalated workflow, `run` on a stopped one, inputs
that must be refused, journal files changed behind a worker's back, and a lease renewer that meets any exception."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from durable_kit import Journal
from durable_kit.admin import read_only

from conftest import ROOT, wait_until

KIT = [sys.executable, "-m", "durable_kit"]

# Workflows for these tests, loaded by every worker with --module.
MODULE = '''
import os
import sqlite3
import time
from pathlib import Path

import durable_kit
import durable_kit.core.leases
from durable_kit.world.ledger import Ledger


def record(wf, operation):
    ledger = Ledger.beside(wf.db_path)
    ledger.record("activity", operation, wf.id)
    ledger.close()


@durable_kit.workflow("outruns_lease")
def outruns_lease(wf):
    """One step whose activity holds what the lease's heartbeat needs (as a call that keeps Python's GIL does)
    until its lease has expired (``until: expired``) or another owner has taken the workflow (``taken_over``)."""
    def hold():
        token = wf.fencing_token
        record(wf, "hold")
        conn = sqlite3.connect(wf.db_path)
        query = ("SELECT fencing_token > ? OR lease_expires_at < (julianday('now') - 2440587.5) * 86400.0"
                 if wf.input["until"] == "expired" else "SELECT fencing_token > ?")
        with durable_kit.core.leases._renewer().wake:  # the renewer thread cannot run meanwhile
            deadline = time.monotonic() + 120
            while not conn.execute(f"{query} FROM workflows WHERE id = ?", (token, wf.id)).fetchone()[0]:
                assert time.monotonic() < deadline, "nobody took the workflow over"
                time.sleep(0.02)
        conn.close()
        return "held"

    return wf.execute_step("hold", hold)


@durable_kit.workflow("trip")
def trip(wf):
    """A seat held (undone by releasing it), a ticket wait, then the ticket."""
    def book(kind):
        record(wf, kind)
        return f"{kind}-{wf.id}"

    seat = wf.execute_step("hold", lambda: book("hold"), compensate=lambda seat: record(wf, f"release {seat}"))
    wf.wait_for_approval("go", {"seat": seat})
    return wf.execute_step("ticket", lambda: book(f"ticket {seat}"))


@durable_kit.workflow("gives_up")
def gives_up(wf):
    """Two completed steps with compensations, then a step that fails until a file named ``fixed`` exists."""
    first = wf.execute_step("first", lambda: record(wf, "first") or "one",
                            compensate=lambda out: record(wf, "undo first"))
    second = wf.execute_step("second", lambda: record(wf, "second") or "two",
                             compensate=lambda out: record(wf, "undo second"))

    def flaky():
        record(wf, "flaky")
        if not Path(wf.db_path).with_name("fixed").exists():
            raise durable_kit.Transient("the service is down")
        return "three"

    return [first, second, wf.execute_step("flaky", flaky, retry=durable_kit.RetryPolicy(2, base_delay=0))]


@durable_kit.workflow("pauses")
def pauses(wf):
    wf.execute_step("first", lambda: record(wf, "first") or 1)
    if not Path(wf.db_path).with_name("go").exists():
        wf.pause("waiting for a go-ahead")
    return wf.execute_step("second", lambda: record(wf, "second") or 2)


@durable_kit.workflow("breaks")
def breaks(wf):
    wf.execute_step("first", lambda: record(wf, "first") or 1)
    if not Path(wf.db_path).with_name("fixed").exists():
        raise KeyError("a bug")
    return wf.execute_step("second", lambda: record(wf, "second") or 2)
'''


def kit(*args, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*KIT, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def popen_kit(*args, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*KIT, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})


def stop(*workers: subprocess.Popen) -> list[tuple[str, str]]:
    """SIGTERM each worker (a clean stop) and collect its output."""
    outputs = []
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGCONT)
            worker.terminate()
        try:
            outputs.append(worker.communicate(timeout=30))
        except subprocess.TimeoutExpired:  # still inside an activity: the test has failed already
            worker.kill()
            outputs.append(worker.communicate())
    return outputs


@pytest.fixture
def lab(tmp_path: Path):
    """(journal path, module path), the module written beside it."""
    module = tmp_path / "round3.py"
    module.write_text(MODULE)
    return tmp_path / "journal.db", module


def start(db: Path, module: Path, kind: str, workflow_id: str, workflow_input: dict | None = None) -> None:
    done = kit("start", "--db", db, "--module", module, "--kind", kind, "--input", json.dumps(workflow_input or {}),
               "--id", workflow_id)
    assert done.returncode == 0, done.stderr


def row(db: Path, workflow_id: str) -> dict:
    journal = read_only(db)
    try:
        return journal.workflow(workflow_id)
    finally:
        journal.close()


def events(db: Path, workflow_id: str) -> list[dict]:
    journal = read_only(db)
    try:
        return journal.history(workflow_id)
    finally:
        journal.close()


def named(db: Path, workflow_id: str, event: str) -> list[dict]:
    return [e for e in events(db, workflow_id) if e["event"] == event]


def activity(db: Path) -> list[str]:
    """Every activity call the ledger beside the journal recorded, oldest first: (workflow, operation)."""
    from durable_kit.world.ledger import Ledger

    ledger = Ledger.beside(db)
    try:
        return [f"{c['workflow_id']}: {c['operation']}" for c in ledger.calls("activity")]
    finally:
        ledger.close()


def until_idle(db: Path, module: Path) -> subprocess.CompletedProcess:
    done = kit("worker", "--db", db, "--module", module, "--until-idle", "--poll", "0.05")
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    return done


# --- 1: an activity that outruns its lease ------------------------------------------------------------------


def test_a_step_that_keeps_outrunning_its_lease_with_two_workers_escalates_after_three_takeovers(lab):
    db, module = lab
    start(db, module, "outruns_lease", "o1", {"until": "taken_over"})
    workers = [popen_kit("worker", "--db", db, "--module", module, "--lease-seconds", "1", "--poll", "0.05")
               for _ in range(2)]
    try:
        wait_until(lambda: row(db, "o1")["status"] == "escalated", timeout=120, what="the escalation")
        wait_until(lambda: len(named(db, "o1", "stale_write_refused")) == 3, timeout=60,
                   what="the third owner's refused write")
    finally:
        outputs = stop(*workers)
    assert all("Traceback" not in err for _, err in outputs), outputs
    final = row(db, "o1")
    assert final["error"].startswith("the activity outran its lease: 3 attempts of step 'hold' in a row were taken "
                                     "over while their process lived")
    assert "Raise the lease (--lease-seconds) or let the activity yield" in final["error"]
    assert len(named(db, "o1", "attempt_taken_over")) == 3
    assert activity(db) == ["o1: hold"] * 3  # three attempts, none a fourth
    steps = Journal(db).steps("o1")
    assert [(s["name"], s["status"], s["attempts"]) for s in steps] == [("hold", "failed", 3)]


def test_a_step_that_outruns_its_lease_with_one_worker_completes_with_no_takeover(lab):
    db, module = lab
    start(db, module, "outruns_lease", "o1", {"until": "expired"})
    done = kit("worker", "--db", db, "--module", module, "--lease-seconds", "1", "--poll", "0.05", "--until-idle")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert row(db, "o1")["status"] == "complete"
    assert named(db, "o1", "attempt_taken_over") == []
    assert activity(db) == ["o1: hold"]
