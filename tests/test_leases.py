"""The engine: leases, heartbeats and fencing tokens. One owner at a time, and a stale owner writes nothing.

In-process tests use plain functions on one database (a second ``Journal``
stands for a second process); the last sections run real worker processes.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from durable_kit.admin import read_only
import durable_kit
from durable_kit import Ended, Journal, RetryPolicy, Suspended, Transient, run_workflow
from durable_kit.workshop.agents.shared_work import (activity_runs, all_complete, contention, finish, popen_worker, run_all,
                                            start_work, wait_until)
from durable_kit.core.leases import (Heartbeat, LeaseLost, machine, new_owner, owner_is_gone, release, renew,
                                     revoke_abandoned)
from durable_kit.core.state import FINAL_STATUSES
from durable_kit.core.store import BEGIN_ATTEMPTS, DB_NOW, connect, immediate
from durable_kit.core.worker import claim_next
from durable_kit.effects import send_at_most_once, send_via_outbox
from durable_kit.world.ledger import Ledger

from conftest import dump, grant, run_python

THIEF = "thief:1:abcdef"  # a second owner; not host:pid:nonce of this machine, so never "gone"


def lease_row(conn: sqlite3.Connection, workflow_id: str = "w") -> dict:
    """The workflow's lease columns, and how many seconds its lease has left by the database's clock."""
    return dict(conn.execute(
        f"SELECT status, owner, fencing_token, lease_expires_at, lease_expires_at - {DB_NOW} AS left"
        " FROM workflows WHERE id = ?", (workflow_id,)).fetchone())


def db_now(conn: sqlite3.Connection) -> float:
    return conn.execute(f"SELECT {DB_NOW}").fetchone()[0]


def leased(journal: Journal, workflow_id: str = "w", seconds: float = 30.0):
    """A started workflow, a lease on it (token 1) and a replay under that lease."""
    journal.start("test_leases.none", {}, workflow_id, registered_elsewhere=True)
    lease = grant(journal.conn, workflow_id, new_owner(), seconds)
    assert lease.token == 1
    return journal.open(workflow_id, lease)


def dead_pid() -> int:
    """The pid of a process of this machine that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)
    return child.pid


def history(db: Path, workflow_id: str) -> list[dict]:
    journal = Journal(db)
    try:
        return journal.history(workflow_id)
    finally:
        journal.close()


def step_events(db: Path) -> dict[tuple[str, str], list[dict]]:
    """(workflow, step) -> its step_started and step_completed events, oldest first."""
    journal = read_only(db)
    try:
        found = defaultdict(list)
        for (workflow_id,) in journal.conn.execute("SELECT id FROM workflows ORDER BY id"):
            for e in journal.history(workflow_id):
                if e["event"] in ("step_started", "step_completed"):
                    found[(workflow_id, e["step"])].append(e)
        return dict(found)
    finally:
        journal.close()


def all_events(db: Path) -> Counter:
    """How many times each event occurs in every workflow's history."""
    journal = read_only(db)
    try:
        return Counter(e["event"] for (workflow_id,) in journal.conn.execute("SELECT id FROM workflows").fetchall()
                       for e in journal.history(workflow_id))
    finally:
        journal.close()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    done = run_python("-m", "durable_kit", *args, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done


# --- grant: status, owner, expiry by the database's clock, a token that only grows ---

def test_grant_marks_running_with_owner_and_an_expiry_by_the_database_clock(db, monkeypatch):
    journal = Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    # A process whose own clock is an hour fast: the expiry still follows the database's clock.
    monkeypatch.setattr(durable_kit.core.state, "now", lambda: time.time() + 3600)
    before = db_now(journal.conn)
    lease = grant(journal.conn, "w", "me:1:aaaaaa", 5.0)
    after = db_now(journal.conn)
    assert (lease.workflow_id, lease.owner, lease.token, lease.seconds) == ("w", "me:1:aaaaaa", 1, 5.0)
    row = lease_row(journal.conn)
    assert (row["status"], row["owner"], row["fencing_token"]) == ("running", "me:1:aaaaaa", 1)
    assert before + 5.0 <= row["lease_expires_at"] <= after + 5.0  # five seconds from the grant, by the database
    assert journal.workflow("w")["updated_at"] > time.time() + 3000  # the fast clock was in use
    # The database's clock is the machine's, not the process's fast one (a millisecond for SQLite's resolution).
    earlier = time.time()
    said = db_now(journal.conn)
    assert earlier - 0.001 <= said <= time.time() + 0.001


def test_every_grant_and_every_revocation_bumps_the_token_by_one(db):
    journal = Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    tokens = [grant(journal.conn, "w", "a:1:x").token]
    tokens.append(grant(journal.conn, "w", "b:1:x", only_if_due=False).token)  # a re-grant fences out a
    tokens.append(grant(journal.conn, "w", "b:1:x", only_if_due=False).token)  # even to the same owner
    assert revoke_abandoned(journal.conn, assume_dead=True) == [("w", "assumed abandoned (no leases)")]
    tokens.append(lease_row(journal.conn)["fencing_token"])
    tokens.append(grant(journal.conn, "w", "c:1:x").token)  # pending again after the revocation: due
    assert tokens == [1, 2, 3, 4, 5]
    assert lease_row(journal.conn)["fencing_token"] == 5


@pytest.mark.parametrize("status, next_run_at", [
    ("pending", "future"), ("waiting", None), ("complete", 0), ("running", 0), ("failed", 0), ("escalated", 0)],
    ids=["future-run-time", "waits-for-a-person", "complete", "running", "failed", "escalated"])
def test_grant_only_if_due_refuses_a_workflow_that_is_not_due_and_changes_nothing(db, status, next_run_at):
    journal = Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    run_at = time.time() + 3600 if next_run_at == "future" else next_run_at
    journal.conn.execute("UPDATE workflows SET status = ?, next_run_at = ? WHERE id = 'w'", (status, run_at))
    before = dump(db)
    assert grant(journal.conn, "w", "me:1:x") is None
    assert dump(db) == before
    if status in FINAL_STATUSES:  # a final workflow is never granted, so it never runs again
        assert grant(journal.conn, "w", "me:1:x", only_if_due=False) is None
        assert dump(db) == before
    else:
        assert grant(journal.conn, "w", "me:1:x", only_if_due=False).token == 1  # a person's `run` takes it anyway


def test_grant_takes_a_waiting_workflow_whose_timer_ended_and_refuses_an_unknown_id(db):
    journal = Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    journal.conn.execute("UPDATE workflows SET status = 'waiting', next_run_at = ? WHERE id = 'w'", (time.time() - 1,))
    assert grant(journal.conn, "w", "me:1:x").token == 1
    assert grant(journal.conn, "nobody", "me:1:x") is None
    assert grant(journal.conn, "nobody", "me:1:x", only_if_due=False) is None


# --- fencing: after a second grant, the first lease's replay writes nothing ---

def _failed_step(wf):
    with pytest.raises(Transient):
        wf.execute_step("s", lambda: (_ for _ in ()).throw(Transient("503")))


def _scheduled_retry(wf):
    with pytest.raises(Suspended):
        wf.execute_step("s", lambda: (_ for _ in ()).throw(Transient("503")), retry=RetryPolicy(base_delay=60))


def _replay_before_the_retry_time(wf, calls):
    replay = wf.journal.open(wf.id, wf.lease)
    replay.execute_step("s", lambda: calls.append("activity"), retry=RetryPolicy(base_delay=60))


# name -> (what to do under the valid lease first, the write under test)
WRITES = {
    "suspend-until-retry": (_scheduled_retry, _replay_before_the_retry_time),
    "step-marker": (None, lambda wf, calls: wf.execute_step("s", lambda: calls.append("activity") or "out")),
    "begin": (None, lambda wf, calls: wf.begin()),
    "finish": (None, lambda wf, calls: wf.finish({"ok": True})),
    "fail": (None, lambda wf, calls: wf.fail(ValueError("boom"))),
    "end": (None, lambda wf, calls: wf.end("stopped", "no longer needed")),
    "retry-decision": (_failed_step, lambda wf, calls: wf._after_failure("s", Transient("503"),
                                                                          RetryPolicy(max_attempts=3))),
    "wait-for-approval": (None, lambda wf, calls: wf.wait_for_approval("ok", {"amount": 10})),
    "ask": (None, lambda wf, calls: wf.ask("question", "which year?")),
    "sleep": (None, lambda wf, calls: wf.sleep("nap", 60)),
    "send-at-most-once": (None, lambda wf, calls: send_at_most_once(wf, "notify", calls.append)),
    "send-via-outbox": (None, lambda wf, calls: send_via_outbox(wf, "refund", "payments", {"amount": 10})),
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_superseded_lease_writes_nothing(db, name):
    prepare, write = WRITES[name]
    journal, thief = Journal(db), Journal(db)
    wf = leased(journal)
    if prepare:
        prepare(wf)
    grant(thief.conn, "w", THIEF, only_if_due=False)
    before, calls = dump(db), []
    superseded = r"'w': this process's lease \(token 1\) was superseded by token 2; the write was refused"
    with pytest.raises(LeaseLost, match=superseded):
        write(wf, calls)
    assert dump(db) == before
    assert calls == []  # no activity ran, nothing was sent
    assert lease_row(thief.conn)["owner"] == THIEF


@pytest.mark.parametrize("name", sorted(WRITES))
def test_the_current_lease_writes(db, name):
    """The control for the test above: the same write under the current lease changes the database."""
    prepare, write = WRITES[name]
    journal = Journal(db)
    wf = leased(journal)
    if prepare:
        prepare(wf)
    before, calls = dump(db), []
    with contextlib.suppress(Suspended, Ended):
        write(wf, calls)
    assert dump(db) != before
    if name in ("step-marker", "send-at-most-once"):
        assert len(calls) == 1


@pytest.mark.parametrize("outcome", ["returns", "raises"])
def test_a_lease_taken_over_while_the_activity_runs_records_no_outcome(db, outcome):
    journal, thief = Journal(db), Journal(db)
    wf = leased(journal)
    during = {}

    def activity():
        grant(thief.conn, "w", THIEF, only_if_due=False)
        during["dump"] = dump(db)
        if outcome == "raises":
            raise Transient("503")
        return {"answer": 42}

    with pytest.raises(LeaseLost, match=r"token 1\) was superseded by token 2"):
        wf.execute_step("s", activity, retry=RetryPolicy(max_attempts=3))
    assert dump(db) == during["dump"]
    (step,) = journal.steps("w")
    assert (step["status"], step["attempts"], step["output"], step["error"]) == ("running", 1, None, None)
    assert [e["event"] for e in journal.history("w")] == [  # the thief's grant recorded its own replay's start
        "workflow_created", "replay_started", "step_started", "replay_started"]


def test_lease_lost_is_not_an_exception_so_workflow_code_cannot_swallow_it():
    assert issubclass(LeaseLost, BaseException)
    assert not issubclass(LeaseLost, Exception)


def test_run_workflow_whose_lease_is_taken_over_returns_none_and_records_one_refusal(db, kinds):
    journal, thief = Journal(db), Journal(db)
    kind, swallowed, after = kinds(), [], []

    @durable_kit.workflow(kind)
    def careless(wf):
        try:
            wf.execute_step("s", lambda: grant(thief.conn, wf.id, THIEF, only_if_due=False).token)
        except Exception as error:  # must not catch LeaseLost
            swallowed.append(error)
        after.append("went on")
        return "done"

    journal.start(kind, {}, "w")
    assert run_workflow(journal, "w") is None
    assert (swallowed, after) == ([], [])
    refusals = [e for e in journal.history("w") if e["event"] == "stale_write_refused"]
    assert len(refusals) == 1
    assert "(token 1) was superseded by token 2; the write was refused" in refusals[0]["detail"]
    assert refusals[0]["pid"] == os.getpid()
    row = lease_row(journal.conn)
    # The new owner keeps its lease: the stale owner's release touched nothing.
    assert (row["status"], row["owner"], row["fencing_token"]) == ("running", THIEF, 2)
    assert row["left"] > 5
    assert [s["status"] for s in journal.steps("w")] == ["running"]
    assert journal.workflow("w")["output"] is None


def test_run_workflow_under_an_already_superseded_lease_changes_nothing_but_the_refusal(db, kinds):
    journal = Journal(db)
    kind, ran = kinds(), []
    durable_kit.workflow(kind)(lambda wf: ran.append(wf.id))
    journal.start(kind, {}, "w")
    stale = grant(journal.conn, "w", "old:1:x")
    grant(journal.conn, "w", THIEF, only_if_due=False)
    before = dump(db)
    assert run_workflow(journal, "w", stale) is None
    assert ran == []
    after = dump(db)
    assert {t: rows for t, rows in after.items() if t != "history"} == {
        t: rows for t, rows in before.items() if t != "history"}
    assert len(after["history"]) == len(before["history"]) + 1
    added = journal.history("w")[-1]
    assert added["event"] == "stale_write_refused"
    assert "(token 1) was superseded by token 2" in added["detail"]


def test_run_workflow_takes_a_lease_itself_and_releases_it(db, kinds):
    journal = Journal(db)
    kind, tokens = kinds(), []

    @durable_kit.workflow(kind)
    def observe(wf):
        tokens.append((wf.lease.token, lease_row(wf.conn)["owner"] == wf.lease.owner))
        return wf.execute_step("s", lambda: "ok")

    journal.start(kind, {}, "w")
    assert run_workflow(journal, "w") == "ok"
    assert tokens == [(1, True)]
    row = lease_row(journal.conn)
    assert (row["status"], row["owner"], row["lease_expires_at"], row["fencing_token"]) == ("complete", None, None, 1)


@pytest.mark.parametrize("stop", ["wait", "retry", "end"])
def test_the_write_that_stops_a_replay_gives_its_lease_up_in_the_same_commit(db, kinds, stop):
    journal = Journal(db)
    kind = kinds()

    @durable_kit.workflow(kind)
    def stops(wf):
        if stop == "wait":
            wf.wait_for_approval("ok", {"amount": 10})
        elif stop == "retry":
            wf.execute_step("s", lambda: (_ for _ in ()).throw(Transient("503")), retry=RetryPolicy(base_delay=60))
        else:
            wf.end("stopped", "no longer needed")

    journal.start(kind, {}, "w")
    statements = []
    journal.conn.set_trace_callback(statements.append)
    assert run_workflow(journal, "w") is None
    journal.conn.set_trace_callback(None)
    row = lease_row(journal.conn)
    assert (row["owner"], row["lease_expires_at"]) == (None, None)
    assert row["status"] == {"wait": "waiting", "retry": "pending", "end": "stopped"}[stop]
    transactions, current = [], []
    for statement in statements:
        current.append(statement)
        if statement == "COMMIT":
            transactions.append(current)
            current = []
    (letting_go,) = [t for t in transactions if any("owner = NULL" in s for s in t)]
    assert any(s.startswith("UPDATE workflows SET status") for s in letting_go)  # with the stop, not after it


def test_one_thread_renews_every_lease_of_the_process(db):
    journal, other = Journal(db), Journal(db)
    leases = []
    for workflow_id in ("a", "b", "c"):
        journal.start("test_leases.none", {}, workflow_id, registered_elsewhere=True)
        leases.append(grant(journal.conn, workflow_id, new_owner(), 0.3))
    first = {w: lease_row(other.conn, w)["lease_expires_at"] for w in "abc"}
    with contextlib.ExitStack() as stack:
        beats = [stack.enter_context(Heartbeat(db, lease)) for lease in leases]
        time.sleep(1.0)  # more than three lease lengths
        renewers = [t for t in threading.enumerate() if t.name == "lease renewals"]
        assert len(renewers) == 1
        for w in "abc":
            row = lease_row(other.conn, w)
            assert row["left"] > 0 and row["lease_expires_at"] > first[w] + 0.6
        assert not any(beat.gave_up for beat in beats)
        assert revoke_abandoned(other.conn) == []


# --- renew, release and the heartbeat ---

def renewed(conn, lease):
    with immediate(conn):
        return renew(conn, lease)


def test_renew_pushes_the_expiry_and_refuses_a_stale_lease(db):
    journal = Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    lease = grant(journal.conn, "w", "me:1:x", 5.0)
    journal.conn.execute(f"UPDATE workflows SET lease_expires_at = {DB_NOW} + 1 WHERE id = 'w'")
    before = db_now(journal.conn)
    assert renewed(journal.conn, lease) is True
    assert before + 5.0 <= lease_row(journal.conn)["lease_expires_at"] <= db_now(journal.conn) + 5.0

    newer = grant(journal.conn, "w", THIEF, 60.0, only_if_due=False)
    held = lease_row(journal.conn)
    assert renewed(journal.conn, lease) is False
    assert lease_row(journal.conn)["lease_expires_at"] == held["lease_expires_at"]
    assert renewed(journal.conn, newer) is True


def test_release_clears_owner_and_expiry_only_for_the_current_token(db):
    journal = Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    old = grant(journal.conn, "w", "old:1:x")
    current = grant(journal.conn, "w", THIEF, only_if_due=False)
    before = dump(db)
    release(journal.conn, old)
    assert dump(db) == before
    release(journal.conn, current)
    row = lease_row(journal.conn)
    assert (row["status"], row["owner"], row["lease_expires_at"], row["fencing_token"]) == ("running", None, None, 2)


def test_a_heartbeat_keeps_a_short_lease_alive(db):
    journal, other = Journal(db), Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    lease = grant(journal.conn, "w", new_owner(), 1.0)  # short, yet renewals a third of it apart survive a busy machine
    first_expiry = lease_row(journal.conn)["lease_expires_at"]
    with Heartbeat(db, lease) as heartbeat:
        time.sleep(3.5)  # more than three lease lengths
        row = lease_row(other.conn)
        assert row["left"] > 0  # still valid
        assert row["lease_expires_at"] > first_expiry + 2.0
        assert revoke_abandoned(other.conn) == []
        assert heartbeat.gave_up is False
    assert row["fencing_token"] == 1


def test_a_heartbeat_notices_a_takeover_and_stops_renewing(db):
    journal, thief = Journal(db), Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    lease = grant(journal.conn, "w", new_owner(), 0.3)
    with Heartbeat(db, lease) as heartbeat:
        grant(thief.conn, "w", THIEF, 60.0, only_if_due=False)
        taken = lease_row(thief.conn)["lease_expires_at"]
        deadline = time.monotonic() + 30  # beats every 0.1 s; the wait is only a bound for a broken heartbeat
        while not heartbeat.gave_up and time.monotonic() < deadline:
            time.sleep(0.02)
        assert heartbeat.gave_up is True
        time.sleep(0.3)  # three more beats of a live lease
    assert lease_row(thief.conn)["lease_expires_at"] == taken  # the old heartbeat never touched the new lease


# --- revoke_abandoned: expired leases, owners whose process is gone, and assume_dead ---

def test_an_expired_lease_is_revoked(db):
    journal = Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    grant(journal.conn, "w", new_owner(), 0.1)  # this process: alive, so only the expiry can count
    assert revoke_abandoned(journal.conn) == []
    time.sleep(0.15)
    assert revoke_abandoned(journal.conn) == [("w", "its lease expired")]
    row = lease_row(journal.conn)
    assert (row["status"], row["owner"], row["lease_expires_at"], row["fencing_token"]) == ("pending", None, None, 2)
    last = journal.history("w")[-1]
    assert (last["event"], last["step"], last["detail"]) == ("recovered", None, "its lease expired")
    assert revoke_abandoned(journal.conn) == []


def test_a_live_owner_with_an_unexpired_lease_is_left_alone(db):
    journal = Journal(db)
    for workflow_id in ("w", "other-host"):
        journal.start("test_leases.none", {}, workflow_id, registered_elsewhere=True)
    grant(journal.conn, "w", new_owner(), 30)
    grant(journal.conn, "other-host", f"not-{socket.gethostname()}:{dead_pid()}:abcdef", 30)
    before = dump(db)
    assert revoke_abandoned(journal.conn) == []
    assert dump(db) == before


def test_an_owner_whose_process_is_gone_is_revoked_at_once_unless_pids_are_not_trusted(db):
    journal = Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    grant(journal.conn, "w", f"{machine()}:{dead_pid()}:abcdef", 30)
    before = dump(db)
    assert revoke_abandoned(journal.conn, trust_pids=False) == []
    assert dump(db) == before
    assert revoke_abandoned(journal.conn) == [("w", "its owner's process is gone")]
    row = lease_row(journal.conn)
    assert (row["status"], row["owner"], row["fencing_token"]) == ("pending", None, 2)
    assert journal.history("w")[-1]["detail"] == "its owner's process is gone"


def test_assume_dead_revokes_every_running_workflow_and_nothing_else(db):
    journal = Journal(db)
    for workflow_id in ("a", "b", "c", "d"):
        journal.start("test_leases.none", {}, workflow_id, registered_elsewhere=True)
    grant(journal.conn, "a", new_owner(), 30)
    grant(journal.conn, "b", THIEF, 30)
    journal.conn.execute("UPDATE workflows SET status = 'complete' WHERE id = 'c'")
    assert revoke_abandoned(journal.conn, assume_dead=True) == [
        ("a", "assumed abandoned (no leases)"), ("b", "assumed abandoned (no leases)")]
    assert {w: (lease_row(journal.conn, w)["status"], lease_row(journal.conn, w)["fencing_token"])
            for w in "abcd"} == {"a": ("pending", 2), "b": ("pending", 2), "c": ("complete", 0), "d": ("pending", 0)}


def test_a_running_workflow_with_no_owner_counts_as_expired(db):
    journal = Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    journal.conn.execute("UPDATE workflows SET status = 'running' WHERE id = 'w'")
    assert revoke_abandoned(journal.conn) == [("w", "its lease expired")]


def test_owner_is_gone_only_for_a_dead_process_of_this_machine():
    host, pid = machine(), dead_pid()
    assert owner_is_gone(f"{host}:{pid}:abcdef") is True
    assert owner_is_gone(f"some-other-{host}:{pid}:abcdef") is False
    # The same host name from another boot or another PID namespace (a container): its pids mean other processes.
    assert owner_is_gone(f"{socket.gethostname()}/0123456789:{pid}:abcdef") is False
    assert owner_is_gone(f"{socket.gethostname()}:{pid}:abcdef") is False  # no machine identity: never by pid
    assert owner_is_gone(new_owner()) is False
    assert owner_is_gone(f"{host}:{os.getpid()}:abcdef") is False
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as alive:
        try:
            assert owner_is_gone(f"{host}:{alive.pid}:abcdef") is False
        finally:
            alive.kill()
    for malformed in (None, "", "no-colons", f"{host}:{pid}", f"{host}:abc:x", f"{host}:-{pid}:x", f"{host}::x"):
        assert owner_is_gone(malformed) is False, malformed


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process state from /proc")
def test_a_killed_owner_not_yet_collected_by_its_parent_counts_as_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        owner = f"{machine()}:{child.pid}:abcdef"
        assert owner_is_gone(owner) is False
        child.kill()
        deadline = time.monotonic() + 30  # a zombie until waited for (a bound, not a measure)
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.01)
        os.kill(child.pid, 0)  # the pid still exists...
        assert owner_is_gone(owner) is True  # ...but its process is dead
    finally:
        child.kill()
        child.wait()


def test_looking_for_abandoned_workflows_takes_no_lock_when_there_are_none(db):
    journal = Journal(db)
    journal.start("test_leases.none", {}, "w", registered_elsewhere=True)
    grant(journal.conn, "w", new_owner(), 30)
    conn = connect(db, busy_timeout_ms=50)
    statements = []
    conn.set_trace_callback(statements.append)
    release = threading.Event()
    holder = hold_write_lock(db, release)  # an idle worker's poll must not wait for it
    try:
        assert revoke_abandoned(conn) == []  # taking the lock would raise: it is held until the poll returns
    finally:
        release.set()
        holder.join()
    assert "BEGIN IMMEDIATE" not in statements


# --- claim_next: the soonest due workflow, one claimant each ---

def test_claim_next_takes_the_soonest_due_workflow_of_a_known_kind(db, kinds):
    journal = Journal(db)
    kind = kinds()
    durable_kit.workflow(kind)(lambda wf: None)
    at = time.time()
    for workflow_id, status, run_at, of_kind in [
            ("b", "pending", at - 10, kind), ("a", "pending", at - 5, kind), ("c", "pending", at - 10, kind),
            ("unknown", "pending", at - 100, "test_leases.nobody_registered"),
            ("future", "pending", at + 3600, kind), ("person", "waiting", None, kind),
            ("timer", "waiting", at - 1, kind), ("done", "complete", 0, kind), ("busy", "running", 0, kind)]:
        journal.start(of_kind, {}, workflow_id, registered_elsewhere=True)
        journal.conn.execute("UPDATE workflows SET status = ?, next_run_at = ? WHERE id = ?",
                             (status, run_at, workflow_id))
    claimed = []
    while (lease := claim_next(journal, "me:1:x", 7.0)) is not None:
        claimed.append((lease.workflow_id, lease.owner, lease.token, lease.seconds))
    assert claimed == [("b", "me:1:x", 1, 7.0), ("c", "me:1:x", 1, 7.0), ("a", "me:1:x", 1, 7.0),
                       ("timer", "me:1:x", 1, 7.0)]
    assert {w: lease_row(journal.conn, w)["status"] for w in ("unknown", "future", "person", "done", "busy")} == {
        "unknown": "pending", "future": "pending", "person": "waiting", "done": "complete", "busy": "running"}


def test_claim_next_skips_the_workflows_in_skip(db, kinds):
    journal = Journal(db)
    kind = kinds()
    durable_kit.workflow(kind)(lambda wf: None)
    for workflow_id in ("a", "b", "c"):
        journal.start(kind, {}, workflow_id)
        journal.conn.execute("UPDATE workflows SET next_run_at = 0 WHERE id = ?", (workflow_id,))
    assert claim_next(journal, "me:1:x", skip={"a", "b"}).workflow_id == "c"
    assert claim_next(journal, "me:1:x", skip={"a", "b"}) is None
    assert claim_next(journal, "me:1:x", skip={"b"}).workflow_id == "a"


def test_two_journals_claiming_in_turn_never_share_a_workflow(db, kinds):
    kind = kinds()
    durable_kit.workflow(kind)(lambda wf: None)
    journals = [Journal(db), Journal(db)]
    for n in range(20):
        journals[0].start(kind, {}, f"w{n:02d}")
    leases, turn = [], 0
    while (lease := claim_next(journals[turn % 2], f"owner-{turn % 2}:1:x")) is not None:
        leases.append(lease)
        turn += 1
    assert len(leases) == 20
    assert sorted(lease.workflow_id for lease in leases) == [f"w{n:02d}" for n in range(20)]
    assert all(lease.token == 1 for lease in leases)
    assert claim_next(journals[1], "owner-1:1:x") is None


def test_threads_racing_claim_next_never_get_the_same_workflow(db, kinds):
    kind = kinds()
    durable_kit.workflow(kind)(lambda wf: None)
    journal = Journal(db)
    for n in range(50):
        journal.start(kind, {}, f"w{n:02d}")
    barrier, won, errors = threading.Barrier(4), defaultdict(list), []

    def claimant(number: int) -> None:
        try:
            mine = Journal(db)  # a connection of its own
            barrier.wait()
            while (lease := claim_next(mine, f"t{number}:1:x")) is not None:
                won[number].append(lease)
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=claimant, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    ids = [lease.workflow_id for leases in won.values() for lease in leases]
    assert len(ids) == 50 and len(set(ids)) == 50
    owners = {lease.workflow_id: lease.owner for leases in won.values() for lease in leases}
    assert {w: (lease_row(journal.conn, w)["owner"], lease_row(journal.conn, w)["fencing_token"]) for w in ids} == {
        w: (owners[w], 1) for w in ids}


# --- immediate(): BEGIN IMMEDIATE is retried while another connection holds the write lock ---

def hold_write_lock(db: Path, release: threading.Event) -> threading.Thread:
    """Hold BEGIN IMMEDIATE on another connection until ``release`` is set; return once it holds the lock."""
    held = threading.Event()

    def hold():
        other = sqlite3.connect(str(db), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        held.set()
        release.wait(60)
        other.execute("COMMIT")
        other.close()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(5)
    return thread


def test_begin_is_retried_until_the_lock_is_released(db):
    # The lock is released when the second BEGIN starts: the first has waited out its busy timeout and failed.
    # Each later attempt waits up to 200 ms for the holder's thread to commit, time enough on a loaded machine.
    conn = connect(db, busy_timeout_ms=200)
    statements, release = [], threading.Event()

    def trace(statement):
        statements.append(statement)
        if statements.count("BEGIN IMMEDIATE") == 2:
            release.set()

    conn.set_trace_callback(trace)
    holder = hold_write_lock(db, release)
    started = time.monotonic()
    with immediate(conn):
        conn.execute("INSERT INTO faults (point, action) VALUES ('p', 'exit')")
    waited = time.monotonic() - started
    holder.join()
    begins = statements.count("BEGIN IMMEDIATE")
    assert 2 <= begins <= BEGIN_ATTEMPTS  # more than one BEGIN: the busy timeout alone was not enough
    assert waited >= 0.2  # the first BEGIN's whole busy timeout
    assert dump(db)["faults"] == ["('p', 'exit', 0.0, '*')"]  # armed for any workflow


def test_begin_gives_up_after_its_attempts_and_writes_nothing(db):
    conn = connect(db, busy_timeout_ms=50)
    statements = []
    conn.set_trace_callback(statements.append)
    release = threading.Event()
    holder = hold_write_lock(db, release)  # held until after the give-up: it gave up, it did not wait it out
    started = time.monotonic()
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            with immediate(conn):
                conn.execute("INSERT INTO faults (point, action) VALUES ('p', 'exit')")
        waited = time.monotonic() - started
    finally:
        release.set()
        holder.join()
    assert statements == ["BEGIN IMMEDIATE"] * BEGIN_ATTEMPTS
    assert waited >= 0.15  # about BEGIN_ATTEMPTS busy timeouts of 50 ms, each waited out
    assert dump(db)["faults"] == []
    assert not conn.in_transaction


def test_an_error_other_than_a_lock_is_not_retried(db):
    conn = connect(db, busy_timeout_ms=50)
    conn.execute("BEGIN")
    statements = []
    conn.set_trace_callback(statements.append)
    with pytest.raises(sqlite3.OperationalError, match="within a transaction"):
        with immediate(conn):
            pass
    assert statements == ["BEGIN IMMEDIATE"]


# --- real worker processes: notebook 06's four demonstrations, run once for the module ---

@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("workers")
    rows = run_all(folder)
    return {"folder": folder, **{row["scenario"]: row for row in rows}}


def test_the_four_demonstrations_in_order(demo):
    assert [demo[s]["scenario"] for s in ("no_leases", "leases", "sigkill_takeover", "sigstop_fencing")] == [
        "no_leases", "leases", "sigkill_takeover", "sigstop_fencing"]
    assert [(demo[s]["workers"], demo[s]["workflows"]) for s in ("no_leases", "leases", "sigkill_takeover",
                                                                 "sigstop_fencing")] == [(2, 3), (2, 3), (2, 1), (2, 1)]


def test_without_leases_the_second_worker_repeats_steps_the_first_is_still_running(demo):
    row, db = demo["no_leases"], demo["folder"] / "no_leases.db"
    assert row["duplicate_runs"] >= 1
    assert row["activity_runs"] == 9 + row["duplicate_runs"]
    assert (row["stale_writes_rejected"], row["takeover_seconds"]) == (0, None)
    repeated = {key: found for key, found in step_events(db).items()
                if [e["event"] for e in found].count("step_started") > 1}
    assert sum(len(found) - 2 for found in repeated.values()) == row["duplicate_runs"]
    for key, found in repeated.items():
        starts = [e for e in found if e["event"] == "step_started"]
        (completed,) = [e for e in found if e["event"] == "step_completed"]
        assert len({e["pid"] for e in starts}) == 2, key  # two workers
        # The second began before the step had finished: overlap. Wall-clock stamps are taken before the write lock,
        # so their order may differ from the commits'; the rows' own history positions give the commit order.
        conn = sqlite3.connect(db)
        second = conn.execute("SELECT seq FROM history WHERE workflow_id = ? AND step = ? AND event = 'step_started'"
                              " ORDER BY seq LIMIT 1", key).fetchone()[0]
        finished = conn.execute("SELECT completed_after FROM steps WHERE workflow_id = ? AND name = ?", key).fetchone()[0]
        conn.close()
        assert second <= finished, key


def test_with_leases_every_step_runs_once(demo):
    row, db = demo["leases"], demo["folder"] / "leases.db"
    assert (row["activity_runs"], row["duplicate_runs"], row["stale_writes_rejected"]) == (9, 0, 0)
    found = step_events(db)
    assert sorted(found) == [(f"w00{w}", f"work:{s}") for w in (1, 2, 3) for s in (1, 2, 3)]
    for key, events in found.items():  # one start and one completion per step, so no two executions overlap
        assert [e["event"] for e in events] == ["step_started", "step_completed"], key
        assert events[0]["pid"] == events[1]["pid"], key


def test_a_killed_owner_is_taken_over_when_its_lease_expires_and_only_the_interrupted_step_repeats(demo):
    row, db = demo["sigkill_takeover"], demo["folder"] / "sigkill.db"
    assert (row["activity_runs"], row["duplicate_runs"], row["stale_writes_rejected"]) == (4, 1, 0)
    # Lease 1 s, renewed every third of it, expiry-only. The takeover also waits for the standby's start-up and
    # a poll: 3.23 s in all at load 15. 9 s leaves room and still tells a 1 s lease from the default 10 s.
    assert 0.5 <= row["takeover_seconds"] <= 9.0
    ledger = Ledger.beside(db)
    calls = ledger.calls("activity")
    ledger.close()
    killed_pid = calls[0]["pid"]
    interrupted = [c["operation"] for c in calls if c["pid"] == killed_pid][-1]
    assert [op for op, n in Counter(c["operation"] for c in calls).items() if n > 1] == [interrupted]
    journal = Journal(db)
    assert {s["name"]: s["attempts"] for s in journal.steps("w001")} == {
        f"work:{n}": 2 if f"work:{n}" == interrupted else 1 for n in (1, 2, 3)}
    events = journal.history("w001")
    (recovered,) = [e for e in events if e["event"] == "recovered"]
    assert recovered["detail"] == "its lease expired"
    restarted = [e for e in events if e["event"] == "step_started" and e["step"] == interrupted][1]
    assert restarted["seq"] > recovered["seq"] and restarted["pid"] != killed_pid
    assert journal.workflow("w001")["output"] == {"steps": 3}


def test_a_paused_owner_is_fenced_out_when_it_wakes(demo):
    row, db = demo["sigstop_fencing"], demo["folder"] / "sigstop.db"
    assert (row["activity_runs"], row["duplicate_runs"], row["stale_writes_rejected"]) == (3, 1, 1)
    assert 0.3 <= row["takeover_seconds"] <= 9.0  # lease 0.6 s; the upper bound as above
    events = history(db, "w001")
    starts = [e for e in events if e["event"] == "step_started" and e["step"] == "work:1"]
    (completed,) = [e for e in events if e["event"] == "step_completed" and e["step"] == "work:1"]
    (refused,) = [e for e in events if e["event"] == "stale_write_refused"]
    paused, standby = starts[0]["pid"], starts[1]["pid"]
    assert paused != standby
    assert completed["pid"] == standby  # the paused owner ran the step too, but its outcome was refused
    assert refused["pid"] == paused
    assert "(token 1) was superseded by token 3" in refused["detail"]  # revoked (2), then claimed (3)
    assert [e["detail"] for e in events if e["event"] == "recovered"] == ["its lease expired"]
    journal = Journal(db)
    assert journal.workflow("w001")["output"] == {"steps": 2}
    assert journal.workflow("w001")["fencing_token"] == 3


def test_a_restarted_worker_takes_over_a_killed_one_at_once_without_waiting_out_the_lease(tmp_path):
    db = tmp_path / "restart.db"
    start_work(db, 1, 3, 0.3)
    owner = popen_worker(db, "--lease-seconds", "30")
    try:
        wait_until(lambda: activity_runs(db)[0] >= 1, timeout=30, what="the owner's first step")
    finally:
        owner.kill()
        owner.communicate(timeout=10)  # reaped: its pid is gone, not a zombie
    journal = Journal(db)
    assert lease_row(journal.conn, "w001")["left"] > 25  # the lease has long to run
    started = time.monotonic()
    done = cli("worker", "--db", str(db), "--until-idle", "--lease-seconds", "30")
    elapsed = time.monotonic() - started
    assert done.stdout.splitlines() == ["w001: recovered", "w001: complete", "worker stopped"]
    assert elapsed < 25  # not the lease's 30 s (a margin for a slow start on a loaded machine)
    assert [e["detail"] for e in journal.history("w001") if e["event"] == "recovered"] == [
        "its owner's process is gone"]
    assert activity_runs(db) == (4, 1)


def test_expiry_only_waits_for_the_lease_to_expire_even_when_the_owner_is_gone(tmp_path):
    db = tmp_path / "expiry.db"
    start_work(db, 1, 2, 0.3)
    owner = popen_worker(db, "--lease-seconds", "1.5")
    try:
        wait_until(lambda: activity_runs(db)[0] >= 1, timeout=30, what="the owner's first step")
    finally:
        owner.kill()
        owner.communicate(timeout=10)
    journal = Journal(db)
    row = lease_row(journal.conn, "w001")
    assert owner_is_gone(row["owner"]) is True  # a worker trusting pids would take over at once
    expires_at = row["lease_expires_at"]

    standby = popen_worker(db, "--expiry-only", "--lease-seconds", "1.5")
    try:
        wait_until(lambda: all_complete(db), timeout=30, what="the takeover")
    finally:
        (errors,) = finish(standby)
    assert "Traceback" not in errors
    (recovered,) = [e for e in journal.history("w001") if e["event"] == "recovered"]
    assert recovered["detail"] == "its lease expired"
    assert recovered["at"] >= expires_at - 0.01  # not before the lease ran out
    assert activity_runs(db) == (3, 1)


@pytest.mark.parametrize("leases", [False, True], ids=["no-leases", "leases"])
def test_a_token_moved_under_a_running_worker(tmp_path, leases):
    """``--no-leases`` writes on regardless; a leased worker's next write is refused and it stops."""
    db = tmp_path / "moved.db"
    start_work(db, 1, 1, 1.0)
    worker = popen_worker(db, "--until-idle", *(["--no-leases"] if not leases else []))
    try:
        wait_until(lambda: activity_runs(db)[0] >= 1, timeout=30, what="the worker's first step")
        journal = Journal(db)
        assert grant(journal.conn, "w001", THIEF, 60, only_if_due=False).token == 2
        out, errors = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0 and "Traceback" not in errors, errors
    refusals = [e for e in journal.history("w001") if e["event"] == "stale_write_refused"]
    wf = journal.workflow("w001")
    if not leases:
        assert out.splitlines() == ["w001: complete", "worker stopped"]
        assert refusals == []
        assert (wf["status"], wf["output"], wf["fencing_token"]) == ("complete", {"steps": 1}, 2)
        assert activity_runs(db) == (1, 0)
    else:
        assert out.splitlines() == ["w001: lease lost to token 2; this worker stopped working on it", "worker stopped"]
        assert len(refusals) == 1 and "(token 1) was superseded by token 2; the write was refused" in refusals[0]["detail"]
        assert (wf["status"], wf["owner"], wf["output"], wf["fencing_token"]) == ("running", THIEF, None, 2)
        assert [(s["name"], s["status"]) for s in journal.steps("w001")] == [("work:1", "running")]
        assert activity_runs(db) == (1, 0)


# --- contention: many workers, instant steps ---

def test_four_workers_on_sixty_workflows_complete_everything_once(tmp_path):
    result = contention(tmp_path, workers=4, workflows=60)
    assert {k: result[k] for k in ("workers", "workflows", "steps", "complete", "duplicate_runs", "busy_errors",
                                   "failed_workers")} == {
        "workers": 4, "workflows": 60, "steps": 180, "complete": True, "duplicate_runs": 0, "busy_errors": 0,
        "failed_workers": 0}
    assert result["steps_per_second"] > 0
    db = tmp_path / "contention-4.db"
    found = step_events(db)
    assert len(found) == 180
    for key, events in found.items():  # one execution per step: none overlaps another
        assert [e["event"] for e in events] == ["step_started", "step_completed"], key
    counts = all_events(db)
    assert (counts["replay_started"], counts["workflow_completed"]) == (60, 60)
    assert (counts["recovered"], counts["stale_write_refused"]) == (0, 0)
    assert activity_runs(db) == (180, 0)


def test_bench_workers_prints_one_json_object():
    import json

    done = run_python("-m", "durable_kit.bench", "workers", "--json", "--workflows", "20")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"steps_per_second", "relative_to_one_worker", "duplicate_runs", "busy_errors",
                           "all_complete", "workflows", "steps_per_workflow"}
    assert set(result["steps_per_second"]) == {"1", "2", "4", "8"}
    assert all(v > 0 for v in result["steps_per_second"].values())
    assert result["relative_to_one_worker"]["1"] == 1.0
    assert (result["duplicate_runs"], result["busy_errors"], result["all_complete"]) == (0, 0, True)
    assert (result["workflows"], result["steps_per_workflow"]) == (20, 3)
