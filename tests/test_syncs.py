"""Which writes of a replay are synced to disk, and that each is synced before anything relies on it.

A replay runs inside ``Journal.relaxed``: SQLite commits at NORMAL and the
replay itself syncs the write-ahead log after every write that must outlive
a power loss. ``bench.record_commits`` records every statement on the
journal's connection and every ``Journal.sync``, in order, and says of each
commit how it reached the disk. A power loss cannot be staged here; what is
checked is that no write the journal's docstring calls synced is left
without a sync before the next statement, and that the only unsynced ones
are the grant, the *running* markers and a completed replay's last write.
"""
from __future__ import annotations

import os

from conftest import make_due

import durable_kit
from durable_kit import Journal, RetryPolicy, Transient, approve, run_workflow, send_at_most_once
from durable_kit.bench import commits_in, record_commits

UNSYNCED = ("UPDATE workflows SET status = 'running'",   # a grant, with replay_started
            "INSERT INTO steps",                          # a first attempt's running marker
            "UPDATE workflows SET status = 'complete'")   # a completed replay's end


def test_a_one_step_workflow_is_synced_twice_its_start_and_its_output(db, kinds):
    journal = Journal(db)
    kind = kinds()
    durable_kit.workflow(kind)(lambda wf: wf.execute_step("s", lambda: "ok"))
    outputs = []
    commits = record_commits(journal, lambda: (journal.start(kind, {}, "w"), outputs.append(run_workflow(journal, "w"))))
    assert outputs == ["ok"]
    assert commits == [
        ("INSERT INTO workflows", "by SQLite"),                       # start
        ("UPDATE workflows SET status = 'running'", "not synced"),    # the grant, with replay_started
        ("INSERT INTO steps", "not synced"),                          # the running marker
        ("UPDATE steps SET status = 'complete'", "synced"),           # the output, before it is returned
        ("UPDATE workflows SET status = 'complete'", "not synced"),   # completed, the lease given up
    ]
    assert [e["event"] for e in journal.history("w")] == [
        "workflow_created", "replay_started", "step_started", "step_completed", "workflow_completed"]
    row = journal.workflow("w")
    assert (row["status"], row["owner"], row["lease_expires_at"]) == ("complete", None, None)


def test_every_stop_that_records_a_time_or_a_decision_is_synced_before_the_replay_goes_on(db, kinds):
    journal = Journal(db)
    kind = kinds()
    failures = iter([Transient("503")])

    def flaky():
        for error in failures:
            raise error
        return "fetched"

    @durable_kit.workflow(kind)
    def paths(wf):
        wf.execute_step("fetch", flaky, retry=RetryPolicy(base_delay=60))
        wf.wait_for_approval("go", {"amount": 5})
        send_at_most_once(wf, "notify", lambda key: key)
        return "done"

    journal.start(kind, {}, "w")
    retry = record_commits(journal, lambda: run_workflow(journal, "w"))  # the failure: a retry time
    assert retry[-1] == ("UPDATE steps SET status = 'failed'", "synced")
    make_due(db, "w")
    waited = record_commits(journal, lambda: run_workflow(journal, "w"))  # the step completes, then the wait
    assert ("INSERT INTO steps", "not synced") in waited  # attempt 2's marker, with its history event
    assert ("INSERT INTO waits", "synced") in waited
    approve(journal, "w", by="Dana", wait="go")
    sent = record_commits(journal, lambda: run_workflow(journal, "w"))
    assert ("INSERT INTO reservations", "synced") in sent
    assert journal.workflow("w")["status"] == "complete"
    for what, how in retry + waited + sent:
        assert how != "not synced" or what in UNSYNCED, (what, how)


def test_a_fencing_token_is_synced_before_it_is_returned_once_a_replay(db, kinds, monkeypatch):
    journal, order, seen = Journal(db), [], []
    kind = kinds()
    sync = journal.sync
    monkeypatch.setattr(journal, "sync", lambda: (order.append("sync"), sync()))

    @durable_kit.workflow(kind)
    def uses_token(wf):
        for _ in range(2):
            order.append("read")
            seen.append(wf.fencing_token)
        return wf.execute_step("s", lambda: "ok")

    journal.start(kind, {}, "w")
    assert run_workflow(journal, "w") == "ok"
    assert order[:3] == ["read", "sync", "read"]  # the grant reached the disk before the token could leave
    assert seen == [1, 1]


def test_the_sync_is_an_fsync_of_the_write_ahead_log(db, monkeypatch):
    journal, synced = Journal(db), []
    name = "fdatasync" if hasattr(os, "fdatasync") else "fsync"
    real = getattr(os, name)
    monkeypatch.setattr(os, name, lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    journal.sync()
    assert synced == [f"{db}-wal"]


def test_at_normal_the_journal_never_syncs_and_never_switches_levels(db, kinds):
    journal = Journal(db, "NORMAL")
    kind = kinds()
    durable_kit.workflow(kind)(lambda wf: [wf.execute_step(f"s{i}", lambda i=i: i) for i in range(3)])
    journal.start(kind, {}, "w")
    events = []
    journal.conn.set_trace_callback(events.append)
    assert run_workflow(journal, "w") == [0, 1, 2]
    assert not any(e.startswith("PRAGMA synchronous") for e in events)
    assert {how for _, how in commits_in(events, "NORMAL")} == {"not synced"}


def test_outside_a_replay_the_journal_commits_at_its_own_level(db, kinds):
    journal = Journal(db)
    kind = kinds()
    durable_kit.workflow(kind)(lambda wf: wf.wait_for_approval("go", {}))
    journal.start(kind, {}, "w")
    run_workflow(journal, "w")
    decided = record_commits(journal, lambda: (approve(journal, "w", by="Dana", wait="go"),
                                               durable_kit.cancel(journal, "w", by="Dana", reason="not needed")))
    assert decided == [("UPDATE waits SET status = 'resolved'", "by SQLite"),
                       ("UPDATE workflows SET status = 'pending'", "by SQLite")]


def test_commits_in_reads_levels_transactions_and_syncs():
    events = ["PRAGMA synchronous = NORMAL", "BEGIN IMMEDIATE", "INSERT INTO history (seq) VALUES (1)",
              "UPDATE steps SET status = 'failed', error = 'x'", "COMMIT", "SYNC",
              "SELECT 1", "UPDATE steps SET output = 1", "BEGIN IMMEDIATE", "SELECT 2", "COMMIT",
              "PRAGMA synchronous = FULL", "DELETE FROM faults", "BEGIN IMMEDIATE", "INSERT INTO history (seq)",
              "ROLLBACK"]
    assert commits_in(events, "FULL") == [("UPDATE steps SET status = 'failed'", "synced"),
                                          ("UPDATE steps SET output", "not synced"),
                                          ("DELETE FROM faults", "by SQLite")]
