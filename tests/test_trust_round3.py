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


@durable_kit.workflow("renewed")
def renewed(wf):
    """One step that ends once its lease was renewed three times after a file named ``raised`` appeared."""
    def watch():
        conn = sqlite3.connect(wf.db_path)
        raised = Path(wf.db_path).with_name("raised")
        seen, deadline = set(), time.monotonic() + 60
        while len(seen) < 4:
            assert time.monotonic() < deadline, "the lease was not renewed"
            if raised.exists():
                seen.add(conn.execute("SELECT lease_expires_at FROM workflows WHERE id = ?", (wf.id,)).fetchone()[0])
            time.sleep(0.02)
        conn.close()
        return "renewed"

    return wf.execute_step("watch", watch)


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


# --- 2: a fork never reuses what a cancellation undid ----------------------------------------------------------


def cancelled_trip(db: Path, module: Path) -> None:
    """Trip t1 holds its seat, waits, is cancelled: the hold is released."""
    start(db, module, "trip", "t1")
    until_idle(db, module)
    assert row(db, "t1")["status"] == "waiting"
    assert kit("cancel", "--db", db, "--workflow", "t1", "--by", "ann", "--reason", "plans changed").returncode == 0
    until_idle(db, module)
    assert row(db, "t1")["status"] == "cancelled"
    assert activity(db) == ["t1: hold", "t1: release hold-t1"]


@pytest.mark.parametrize("up_to", ["hold", "compensate:hold"])
def test_a_fork_of_a_cancelled_workflow_at_a_compensated_step_is_refused_and_creates_nothing(lab, up_to):
    db, module = lab
    cancelled_trip(db, module)
    before = Journal(db).conn.execute("SELECT COUNT(*) FROM workflows").fetchone()[0]
    done = kit("fork", "--db", db, "--workflow", "t1", "--up-to", up_to, "--new-id", "t2", "--by", "ann",
               "--module", module)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    if up_to == "hold":
        assert done.stderr == (
            "error: workflow 't1': step 'hold' was undone by its compensation (compensate:hold), so a fork up to "
            "'hold' would reuse an output that no longer holds. Fork up to a step before 'hold' (the fork runs it "
            "again), or start a new workflow. Nothing was changed.\n")
    else:
        assert done.stderr == (
            "error: workflow 't1': 'compensate:hold' is a compensation, not a step a fork can continue from. Fork up "
            "to a step before 'hold' (the fork runs it again), or start a new workflow. Nothing was changed.\n")
    assert Journal(db).conn.execute("SELECT COUNT(*) FROM workflows").fetchone()[0] == before
    until_idle(db, module)
    assert activity(db) == ["t1: hold", "t1: release hold-t1"]  # no ticket for the released hold


# --- 4: a decision on a finished workflow is refused -----------------------------------------------------------


@pytest.mark.parametrize("command", ["approve", "reject"])
def test_a_decision_on_a_cancelled_workflow_or_one_being_cancelled_is_refused_and_saves_nothing(lab, command):
    db, module = lab
    start(db, module, "trip", "t1")
    until_idle(db, module)
    assert kit("cancel", "--db", db, "--workflow", "t1", "--by", "ann", "--reason", "plans changed").returncode == 0
    before = events(db, "t1")
    decide = [command, "--db", db, "--workflow", "t1", "--wait", "go", "--by", "bob"]
    done = kit(*decide)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("error: workflow 't1' is being cancelled (requested by ann: plans changed); its wait "
                           "'go' takes no decision now and nothing was saved.\n")
    until_idle(db, module)
    assert row(db, "t1")["status"] == "cancelled"
    after_cancel = events(db, "t1")
    done = kit(*decide)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("error: workflow 't1' is cancelled and its wait 'go' was never decided; nothing was saved. "
                           "A finished workflow takes no decision: start a new workflow to decide again.\n")
    assert events(db, "t1") == after_cancel and len(after_cancel) > len(before)
    assert [w["status"] for w in __import__("durable_kit").waits(Journal(db), "t1")] == ["waiting"]
    assert not [e for e in after_cancel if e["event"] in ("approved", "rejected")]


def test_a_repeated_decision_after_the_workflow_completed_still_returns_the_first(lab):
    db, module = lab
    start(db, module, "trip", "t1")
    until_idle(db, module)
    decide = ["approve", "--db", db, "--workflow", "t1", "--wait", "go", "--by", "bob"]
    assert kit(*decide).returncode == 0
    until_idle(db, module)
    assert row(db, "t1")["status"] == "complete"
    again = kit(*decide)
    assert again.returncode == 0 and again.stdout.endswith("; nothing saved; status complete\n"), again
    other = kit("reject", *decide[1:])
    assert other.returncode == 2 and "the decision saved first (approved by bob) is final" in other.stderr


# --- 5: an escalated workflow can be given up ------------------------------------------------------------------


@pytest.mark.parametrize("worker_running", [False, True])
def test_cancelling_an_escalated_workflow_runs_its_compensations_newest_first_once_each(lab, worker_running):
    db, module = lab
    start(db, module, "gives_up", "e1")
    until_idle(db, module)
    assert row(db, "e1")["status"] == "escalated"
    assert activity(db) == ["e1: first", "e1: second", "e1: flaky", "e1: flaky"]
    worker = popen_kit("worker", "--db", db, "--module", module, "--poll", "0.05") if worker_running else None
    try:
        done = kit("cancel", "--db", db, "--workflow", "e1", "--by", "ann", "--reason", "give up")
        assert done.returncode == 0, done.stderr
        if worker is None:
            until_idle(db, module)
        else:
            wait_until(lambda: row(db, "e1")["status"] == "cancelled", timeout=60, what="the cancellation")
    finally:
        if worker is not None:
            stop(worker)
    assert row(db, "e1")["status"] == "cancelled"
    assert activity(db) == ["e1: first", "e1: second", "e1: flaky", "e1: flaky", "e1: undo second", "e1: undo first"]
    cancelled = named(db, "e1", "workflow_cancelled")
    assert len(cancelled) == 1 and cancelled[0]["detail"] == "cancelled by ann: give up; compensated second, first"
    until_idle(db, module)  # nothing more runs
    assert len(activity(db)) == 6


# --- 6: `run` never resumes a stopped workflow without a record ----------------------------------------------


@pytest.mark.parametrize("kind,status", [("pauses", "paused"), ("breaks", "failed")])
def test_run_on_a_paused_or_failed_workflow_is_refused_and_resume_records_who_resumed_it(lab, kind, status):
    db, module = lab
    start(db, module, kind, "s1")
    until_idle(db, module)
    assert row(db, "s1")["status"] == status
    before = events(db, "s1")
    done = kit("run", "--db", db, "--workflow", "s1", "--module", module)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: workflow 's1' is {status}; nothing was changed. Resume it first (`resume`: the "
                           "history records who resumed it, and from what), then run it or let a worker run it.\n")
    assert events(db, "s1") == before and activity(db) == ["s1: first"]
    (db.parent / ("go" if kind == "pauses" else "fixed")).touch()
    assert kit("resume", "--db", db, "--workflow", "s1", "--by", "ann").returncode == 0
    run = kit("run", "--db", db, "--workflow", "s1", "--module", module)
    assert (run.returncode, run.stdout, run.stderr) == (0, "2\n", "")
    assert [e["detail"] for e in named(db, "s1", "workflow_resumed")] == [f"from {status} by ann"]
    assert activity(db) == ["s1: first", "s1: second"]


def test_a_worker_that_resumes_a_pause_whose_time_came_records_it(tmp_path, kinds):
    import durable_kit
    from durable_kit.core.worker import run_worker

    kind = kinds("paused_briefly")

    @durable_kit.workflow(kind)
    def paused_briefly(wf):
        marker = Path(f"{wf.db_path}.paused")
        if not marker.exists():  # the first replay only
            marker.touch()
            wf.pause("a provider outage", until=0)
        return "done"

    db = tmp_path / "journal.db"
    journal = Journal(db)
    journal.start(kind, {}, "p1")
    run_worker(db, until_idle=True, poll=0.01, log=lambda line: None)
    assert journal.workflow("p1")["status"] == "complete"
    resumed = [e for e in journal.history("p1") if e["event"] == "workflow_resumed"]
    assert [e["detail"] for e in resumed] == ["from paused by a worker: the pause's time came"]


# --- 9: journal files changed behind a worker's back -------------------------------------------------------------


def test_a_worker_whose_write_ahead_log_is_removed_stops_with_the_cause(lab):
    db, module = lab
    start(db, module, "pauses", "s1")
    worker = popen_kit("worker", "--db", db, "--module", module, "--poll", "0.05")
    try:
        wait_until(lambda: row(db, "s1")["status"] == "paused", timeout=60, what="the first replay")
        Path(f"{db}-wal").unlink()
        code = worker.wait(timeout=60)
    finally:
        out, err = stop(worker)[0]
    assert code == 3 and "Traceback" not in err, (out, err)
    assert err == (f"error: {db}: its write-ahead log (journal.db-wal) was removed or replaced while a process had "
                   "the journal open (by hand, a clean-up or sync tool, a restore?), so writes made since may be in a "
                   "file no other process reads; this process stops and writes nothing more. Stop every process that "
                   "uses the journal, then check it (`status`, `history`) or restore it from a copy before starting "
                   "workers again.\n")


# Another process that keeps the journal open and writes a line at a time, on request.
WRITER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute('PRAGMA journal_mode = WAL')
print('ready', flush=True)
while sys.stdin.readline():
    conn.execute('UPDATE workflows SET updated_at = updated_at + 1')
    print('wrote', flush=True)
"""


def test_a_worker_that_opens_a_journal_whose_log_another_process_still_writes_stops_with_the_cause(lab):
    db, module = lab
    start(db, module, "pauses", "s1")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert writer.stdout.readline() == "ready\n"
        for unlink in (False, True):  # a write; the log removed; a write to the log only that process still has
            if unlink:
                Path(f"{db}-wal").unlink()
            writer.stdin.write("write\n")
            writer.stdin.flush()
            assert writer.stdout.readline() == "wrote\n"
        done = kit("worker", "--db", db, "--module", module, "--poll", "0.05", timeout=60)  # no --until-idle
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
    assert done.returncode == 3 and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    assert done.stderr == (f"error: {db}: its write-ahead log (journal.db-wal) was removed or replaced while a "
                           "process had the journal open (by hand, a clean-up or sync tool, a restore?), so writes "
                           "made since may be in a file no other process reads; this process stops and writes "
                           "nothing more. Stop every process that uses the journal, then check it (`status`, "
                           "`history`) or restore it from a copy before starting workers again.\n")
    assert "the disk refused a write" not in done.stdout


# --- 10: the lease renewer survives any exception -------------------------------------------------------------

RENEWER_RAISES = '''
import os
from pathlib import Path

import durable_kit.core.leases

real = durable_kit.core.leases._Renewer._renew_all


def renew_all(self, conns, path, due):  # the whole renewal routine meets an exception it does not expect, once
    marker = Path(os.environ["RENEWER_RAISES_ONCE"])
    if not marker.exists():
        marker.write_text("raised")
        raise RuntimeError("a bug in the renewer")
    return real(self, conns, path, due)


if os.environ.get("RENEWER_RAISES_ONCE"):
    durable_kit.core.leases._Renewer._renew_all = renew_all
'''


def test_a_renewer_whose_whole_renewal_raises_goes_on_renewing_and_says_so(lab):
    db, module = lab
    (db.parent / "raises.py").write_text(RENEWER_RAISES)
    module.write_text(module.read_text() + "\nimport raises  # noqa: E402,F401\n")
    start(db, module, "renewed", "r1")
    done = kit("worker", "--db", db, "--module", module, "--lease-seconds", "1", "--poll", "0.05", "--until-idle",
               env={"RENEWER_RAISES_ONCE": str(db.parent / "raised")})
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    assert "lease renewals: RuntimeError: a bug in the renewer; the renewer goes on" in done.stderr
    assert row(db, "r1")["status"] == "complete"
    assert named(db, "r1", "stale_write_refused") == [] and named(db, "r1", "attempt_taken_over") == []


# --- 7: inputs refused before anything is written; terminal output never raw ----------------------------------


def test_delays_and_waits_past_a_hundred_years_are_refused():
    import durable_kit

    for field in ("base_delay", "max_delay"):
        with pytest.raises(ValueError) as refused:
            durable_kit.RetryPolicy(**{field: 1e308})
        assert str(refused.value) == (f"RetryPolicy: {field} must be a finite number of seconds from 0 to 3155760000 "
                                      "(100 years), not 1e+308")
    with pytest.raises(ValueError, match=r"^RateLimited: retry_after must be a finite number of seconds from 0"):
        durable_kit.RateLimited("slow down", float("nan"))
    assert durable_kit.RetryPolicy(5, base_delay=3e9, max_delay=3e9).delay(5_000) == 3e9  # no overflow either


@pytest.mark.parametrize("flag,value", [("--lease-seconds", "1e308"), ("--lease-seconds", "3601"),
                                        ("--poll", "inf")])
def test_a_worker_with_a_lease_or_poll_past_an_hour_is_refused(db, flag, value):
    done = kit("worker", "--db", db, flag, value, "--until-idle")
    assert done.returncode == 2 and not db.exists()
    assert done.stderr.splitlines()[-1].endswith(f"argument {flag}: {value} seconds: give a number from "
                                                 f"{'0.3' if flag == '--lease-seconds' else '0.01'} to 3600")


def test_run_worker_refuses_a_lease_past_an_hour_before_opening_anything(db):
    from durable_kit import run_worker
    from durable_kit.errors import SettingError

    with pytest.raises(SettingError, match=r"^run_worker: lease_seconds must be a number of seconds above 0 and at "
                                           r"most 3600, not 1e\+308; nothing was run\.$"):
        run_worker(db, lease_seconds=1e308, until_idle=True)
    assert not db.exists()


def test_an_input_with_a_lone_surrogate_is_refused_and_nothing_is_started(db, kinds):
    import durable_kit

    kind = kinds()
    durable_kit.workflow(kind)(lambda wf: None)
    journal = Journal(db)
    with pytest.raises(durable_kit.NotJSON) as refused:
        journal.start(kind, {"topic": "caf\udce9"}, "w1")
    assert str(refused.value) == (
        "workflow 'w1': the workflow input cannot be stored as JSON (it holds a lone surrogate, '\\udce9'). Give text "
        "in UTF-8 (a lone surrogate is usually a byte that was not UTF-8). Nothing was written.")
    assert journal.conn.execute("SELECT COUNT(*) FROM workflows").fetchone()[0] == 0
    assert journal.start(kind, {"topic": "caf\u00e9 \U0001F600"}, "w2") == "w2"  # real text outside the BMP is fine


def undecodable(*args: str) -> subprocess.CompletedProcess:
    """``python -m durable_kit ARGS`` with every ``\\xff`` in ARGS passed as that raw byte (not UTF-8)."""
    raw = [os.fsencode(a).replace(b"\\xff", b"\xff") for a in map(str, args)]
    return subprocess.run([os.fsencode(sys.executable), b"-m", b"durable_kit", *raw], cwd=ROOT, capture_output=True,
                          timeout=60)


def test_command_line_arguments_that_are_not_utf8_are_refused_in_one_line(lab):
    from conftest import dump

    db, module = lab
    start(db, module, "trip", "t1")
    until_idle(db, module)
    before = dump(db)
    for args, flag in ((("start", "--db", db, "--module", module, "--kind", "trip", "--input", "{}", "--id", "t\\xff"),
                        "--id"),
                       (("approve", "--db", db, "--workflow", "t1", "--by", "bob", "--comment", "fine\\xff"),
                        "--comment"),
                       (("start", "--db", db, "--kind", "reviewed_report", "--topic", "a\\xff"), "--topic")):
        done = undecodable(*args)
        assert (done.returncode, done.stdout) == (2, b""), done
        assert done.stderr == (f"error: {flag} is not valid UTF-8 text (it holds the byte 0xff); nothing was "
                               "changed. Give it in UTF-8.\n").encode()
    assert dump(db) == before


@pytest.mark.parametrize("by,comment,what", [(None, "", "'by' must be text (a str), not NoneType"),
                                             ("bob", 5, "'comment' must be text (a str), not int"),
                                             ("b\udcffb", "", "'by' is not valid text")])
def test_a_decision_whose_fields_are_not_text_is_refused_and_saves_nothing(lab, by, comment, what):
    import durable_kit
    from conftest import dump

    db, module = lab
    start(db, module, "trip", "t1")
    until_idle(db, module)
    before = dump(db)
    with pytest.raises(durable_kit.WorkflowError) as refused:
        durable_kit.approve(Journal(db), "t1", by, comment, wait="go")
    assert str(refused.value).startswith(f"workflow 't1', wait 'go': the decision's {what}")
    assert str(refused.value).count("\n") == 0 and "nothing was changed" in str(refused.value)
    assert dump(db) == before


def test_bidirectional_and_control_characters_never_reach_the_terminal_raw(lab):
    db, module = lab
    tricky = "t\u202e1\x1b[2J"
    start(db, module, "trip", tricky)
    until_idle(db, module)
    approved = kit("approve", "--db", db, "--workflow", tricky, "--by", "bob\u2066", "--comment", "ok\rno")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout == ("t\\u202e1\\x1b[2J, wait 'go': saved: approved by bob\\u2066: ok\\x0dno; "
                               "status pending\n")
    for command in ("status", "history"):
        shown = kit(command, "--db", db, "--workflow", tricky)
        assert shown.returncode == 0, shown.stderr
        for raw in ("\u202e", "\x1b", "\u2066", "\r"):
            assert raw not in shown.stdout + shown.stderr, (command, shown.stdout)
    assert "\\u202e" in kit("status", "--db", db, "--workflow", tricky).stdout
    missing = kit("status", "--db", db, "--workflow", "x\u202ey")
    assert missing.returncode == 2 and "\u202e" not in missing.stderr and "x\\u202ey" in missing.stderr
