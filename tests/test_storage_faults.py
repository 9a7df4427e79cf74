"""Storage faults and bad input, in real processes: one clear line with the path, nothing half-written, and the
work resumes once the fault is cleared."""
from __future__ import annotations

import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from durable_kit import Journal, RetryPolicy

from conftest import ROOT, dump

KIT = [sys.executable, "-m", "durable_kit"]


def kit(*args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*KIT, *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, **kwargs)


def start(db: Path, workflow_id: str = "r1", **kwargs) -> subprocess.CompletedProcess:
    return kit("start", "--db", str(db), "--kind", "refund", "--input", '{"order_id": "A-1001"}', "--id", workflow_id,
               **kwargs)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# --- read-only commands never write ---

def test_status_and_history_never_touch_another_applications_database(tmp_path):
    other = tmp_path / "other-app.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO invoices (total) VALUES (12.5)")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    for command in ("status", "history"):
        done = kit(command, "--db", str(other), "--workflow", "r1")
        assert done.returncode == 2
        assert one_error_line(done) == (f"error: {other} is an SQLite file but not a durable_kit journal (it has no "
                                        "workflows table); nothing was changed. Point --db at a journal, or create "
                                        "one with `start`.")
    assert other.read_bytes() == before  # no tables added, still in its own journal mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-app.db"]


def test_a_mistyped_path_is_refused_and_never_created(tmp_path):
    for command in ("status", "history", "run", "approve", "cancel", "resume"):
        extra = {"approve": ("--by", "Dana"), "cancel": ("--by", "Dana", "--reason", "r"),
                 "resume": ("--by", "Dana")}.get(command, ())
        done = kit(command, "--db", str(tmp_path / "jornal.db"), "--workflow", "r1", *extra)
        assert done.returncode == 2, (command, done.stderr)
        assert "jornal.db: no such journal; nothing was created" in one_error_line(done)
    assert list(tmp_path.iterdir()) == []


def test_status_reads_while_another_process_holds_the_write_lock(tmp_path):
    db = tmp_path / "journal.db"
    assert start(db).returncode == 0
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        done = kit("status", "--db", str(db), "--workflow", "r1", env={"DURABLE_KIT_BUSY_TIMEOUT_MS": "100"})
    finally:
        holder.execute("ROLLBACK")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("r1 (refund, version refund-agent-1): pending")


def test_a_journal_of_another_schema_version_is_refused_by_name(tmp_path):
    db = tmp_path / "journal.db"
    start(db)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    done = kit("status", "--db", str(db), "--workflow", "r1")
    assert done.returncode == 2 and "has schema version 99, this durable_kit expects" in one_error_line(done)


# --- storage faults ---

def test_an_empty_file_where_a_journal_is_expected_is_refused_not_reinitialised(tmp_path):
    db = tmp_path / "journal.db"
    start(db)
    kit("worker", "--db", str(db), "--until-idle")
    ledger = db.with_name("journal.calls.db").read_bytes()
    db.write_bytes(b"")  # the journal was truncated; the ledger beside it still holds its records
    for args in (("worker", "--db", str(db), "--until-idle"), ("status", "--db", str(db), "--workflow", "r1"),
                 ("run", "--db", str(db), "--workflow", "r1")):
        done = kit(*args)
        assert done.returncode == 2, done.stderr
        assert f"{db} is empty (0 bytes), not a journal; nothing was changed" in one_error_line(done)
    assert db.stat().st_size == 0
    assert db.with_name("journal.calls.db").read_bytes() == ledger


def test_a_damaged_header_gives_a_clear_error_and_changes_nothing(tmp_path):
    db = tmp_path / "journal.db"
    start(db)
    with db.open("r+b") as f:
        f.write(b"this is no sqlite")
    damaged = db.read_bytes()
    for args in (("status", "--db", str(db), "--workflow", "r1"), ("worker", "--db", str(db), "--until-idle")):
        done = kit(*args)
        assert done.returncode in (2, 3), done.stderr
        assert f"{db} is damaged or is not an SQLite database" in one_error_line(done)
    assert db.read_bytes() == damaged


def test_a_full_disk_or_file_size_limit_gives_a_clear_error_and_the_work_resumes_after(tmp_path):
    db = tmp_path / "journal.db"
    start(db)
    before = dump(db)
    size = max(p.stat().st_size for p in tmp_path.glob("journal.db*"))
    big = '{"order_id": "A-1001", "note": "' + "x" * 100_000 + '"}'

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 4096, size + 4096))

    done = kit("start", "--db", str(db), "--kind", "refund", "--input", big, "--id", "big", preexec_fn=limited)
    assert done.returncode == 3
    line = one_error_line(done)
    assert line.startswith(f"error: {db}: ") and "nothing was half-written (the transaction rolled back)" in line
    assert "full" in line or "file-size limit" in line
    assert dump(db) == before
    assert kit("start", "--db", str(db), "--kind", "refund", "--input", big, "--id", "big").returncode == 0


def test_a_lock_held_past_the_busy_timeout_gives_a_clear_error_and_changes_nothing(tmp_path):
    db = tmp_path / "journal.db"
    start(db)
    before = dump(db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        done = start(db, "r2", env={"DURABLE_KIT_BUSY_TIMEOUT_MS": "100"})
    finally:
        holder.execute("ROLLBACK")
    assert done.returncode == 3
    assert f"{db} stayed locked by another process past the busy timeout" in one_error_line(done)
    assert dump(db) == before
    assert start(db, "r2").returncode == 0


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX file modes and mounts")
def test_a_read_only_journal_gives_a_clear_error_and_changes_nothing(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    db = folder / "journal.db"
    start(db)
    before = dump(db)
    command = [*KIT, "start", "--db", str(db), "--kind", "refund", "--input", '{"order_id": "A-1001"}', "--id", "r2"]
    if os.getuid() == 0:  # root ignores file modes: make the folder a read-only mount, as a read-only share would be
        shell = f"mount --bind -o ro {folder} {folder} && exec " + " ".join(f"'{c}'" for c in command)
        done = subprocess.run(["unshare", "--mount", "sh", "-c", shell], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
    else:
        for path in folder.iterdir():
            path.chmod(0o444)
        folder.chmod(0o555)
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
        folder.chmod(0o755)
        for path in folder.iterdir():
            path.chmod(0o644)
    assert done.returncode in (2, 3), done.stderr
    line = one_error_line(done)
    assert str(db) in line and "read-only" in line, line
    assert dump(db) == before
    assert start(db, "r2").returncode == 0  # writable again: the same command succeeds


# --- bad input at the door ---

@pytest.mark.parametrize("args, message", [
    (("--id", ""), "a workflow id cannot be empty (an unset variable?)"),
    (("--input", "{order_id: A-1001}"), "--input is not JSON (Expecting property name enclosed in double quotes"),
    (("--input", '{"strategy": "naive"}'), "of kind 'refund' needs input 'order_id' (str); it got ['strategy']"),
    (("--input", '{"order_id": 1001}'), "input 'order_id' must be a str, not int"),
])
def test_start_refuses_input_the_kind_cannot_run_and_starts_nothing(tmp_path, args, message):
    db = tmp_path / "journal.db"
    start(db)
    before = dump(db)
    base = {"--id": "r2", "--input": '{"order_id": "A-1001"}'}
    base.update(dict(zip(args[::2], args[1::2])))
    done = kit("start", "--db", str(db), "--kind", "refund", *[x for kv in base.items() for x in kv])
    assert done.returncode in (1, 2), done.stderr
    assert message in one_error_line(done)
    assert dump(db) == before


def test_the_api_refuses_an_empty_id_and_missing_input_too(tmp_path):
    import durable_kit.workshop.agents  # noqa: F401  (registers refund)
    from durable_kit import WorkflowError

    journal = Journal(tmp_path / "journal.db")
    before = dump(journal.path)
    with pytest.raises(WorkflowError, match="a workflow id cannot be empty"):
        journal.start("refund", {"order_id": "A-1001"}, "  ")
    with pytest.raises(WorkflowError, match="needs input 'order_id'"):
        journal.start("refund", {}, "r9")
    assert dump(journal.path) == before


@pytest.mark.parametrize("settings", [dict(max_attempts=0), dict(max_attempts=2.5), dict(base_delay=float("nan")),
                                      dict(max_delay=-1), dict(base_delay=float("inf"))])
def test_a_retry_policy_checks_its_settings(settings):
    with pytest.raises(ValueError, match="RetryPolicy: "):
        RetryPolicy(**settings)


@pytest.mark.parametrize("args", [("worker", "--poll", "-1"), ("worker", "--lease-seconds", "0"),
                                  ("worker", "--lease-seconds", "nan"), ("fault", "slow-next-step", "--seconds", "-5")])
def test_worker_and_fault_flags_are_checked(tmp_path, args):
    done = kit(*args, "--db", str(tmp_path / "journal.db"))
    assert done.returncode == 2 and "seconds: give a number from " in done.stderr
    assert list(tmp_path.iterdir()) == []


# --- secrets stay out of the journal ---

CANARY = "sk-canary0123456789ABCDEFabcdef"

LEAKY = f'''
import durable_kit
from durable_kit import RetryPolicy, Transient


@durable_kit.workflow("leaky")
def leaky(wf):
    wf.execute_step("echo", lambda: {{"said": wf.input["note"]}}, wf.input)
    def call():
        raise Transient("provider said: invalid key {CANARY}")
    return wf.execute_step("call", call, retry=RetryPolicy(max_attempts=2, base_delay=0))
'''


def test_a_secret_in_an_input_and_in_an_error_never_reaches_the_database_its_log_or_the_output(tmp_path):
    module, db = tmp_path / "leaky.py", tmp_path / "journal.db"
    module.write_text(LEAKY)
    note = {"note": f"please use {CANARY} for this"}
    import json
    done = kit("start", "--db", str(db), "--kind", "leaky", "--input", json.dumps(note), "--id", "s1",
               "--module", str(module))
    assert done.returncode == 0, done.stderr
    printed = [done.stdout]
    for _ in range(3):
        printed.append(kit("worker", "--db", str(db), "--until-idle", "--module", str(module)).stdout)
    printed += [kit("status", "--db", str(db), "--workflow", "s1").stdout,
                kit("history", "--db", str(db), "--workflow", "s1").stdout]
    journal = Journal(db)
    assert journal.workflow("s1")["status"] == "escalated"
    assert journal.workflow("s1")["input"] == {"note": "please use [REDACTED] for this"}
    assert "invalid key [REDACTED]" in journal.workflow("s1")["error"]
    found = {path.name: path.read_bytes().count(CANARY.encode()) for path in sorted(tmp_path.iterdir())
             if path.is_file() and path.name != "leaky.py"}
    assert set(found) >= {"journal.db"} and sum(found.values()) == 0, found
    assert not any(CANARY in text for text in printed)


@pytest.mark.parametrize("secret", [
    "sk-abcdefghij0123456789", "AKIAABCDEFGHIJKLMNOP", "ghp_" + "a1" * 16, "xoxb-1234567890ab",
    "Bearer abcdefghijklmnop.q", "bearer abcdefghijklmnop.q",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----"])
def test_every_built_in_pattern_is_redacted_where_it_stands_alone_and_nowhere_inside_a_word(secret):
    from durable_kit.redact import redact

    assert redact(f"key: {secret}; end") == "key: [REDACTED]; end"
    assert redact(f'{{"k": "{secret}"}}'.replace("\n", "\\n")) == '{"k": "[REDACTED]"}'
    if not secret.startswith("-----"):  # a private key has no word boundary before it
        assert redact(f"x{secret}") == f"x{secret}"


def test_a_registered_secret_is_redacted_as_written_and_as_json_escapes_it():
    import json

    from durable_kit.redact import redact, register_secret

    register_secret('tr0ub4dor"&3')
    assert redact('the password is tr0ub4dor"&3.') == "the password is [REDACTED]."
    assert redact(json.dumps({"password": 'tr0ub4dor"&3'})) == '{"password": "[REDACTED]"}'


def test_purge_removes_a_finished_workflow_and_rewrites_the_file(tmp_path):
    import json

    db = tmp_path / "journal.db"
    start(db, "purge-me-0001")
    start(db, "keep-me-0002")
    kit("worker", "--db", str(db), "--until-idle")

    def on_disk() -> bytes:
        return b"".join(p.read_bytes() for p in sorted(tmp_path.glob("journal.db*")))

    assert on_disk().count(b"purge-me-0001") > 0
    assert kit("purge", "--db", str(db), "--workflow", "nope").returncode == 2
    done = kit("purge", "--db", str(db), "--workflow", "purge-me-0001", "--json")
    assert done.returncode == 0, done.stderr
    deleted = json.loads(done.stdout)["deleted"]
    assert (deleted["workflows"], deleted["escalations"]) == (1, 0) and deleted["steps"] >= 5
    assert on_disk().count(b"purge-me-0001") == 0  # not in a free page, not in the write-ahead log
    assert on_disk().count(b"keep-me-0002") > 0
    assert [r["id"] for r in Journal(db).conn.execute("SELECT id FROM workflows")] == ["keep-me-0002"]


# --- failed is a state a person can see and leave ---

NOT_JSON = '''
import datetime
import durable_kit


@durable_kit.workflow("stamp")
def stamp(wf):
    first = wf.execute_step("first", lambda: "kept")
    return [first, wf.execute_step("when", lambda: {when})]
'''


def test_an_activity_returning_non_json_fails_clearly_and_resumes_after_the_fix(tmp_path):
    module, db = tmp_path / "stamp.py", tmp_path / "journal.db"
    module.write_text(NOT_JSON.format(when="datetime.date(2026, 12, 1)"))
    kit("start", "--db", str(db), "--kind", "stamp", "--input", "{}", "--id", "t1", "--module", str(module))
    ran = kit("worker", "--db", str(db), "--until-idle", "--module", str(module))
    assert ran.returncode == 0 and "Traceback" not in ran.stderr
    assert "t1: failed: NotJSON: workflow 't1', step 'when': the activity's output cannot be stored as JSON " \
           "($ is a date)" in ran.stdout
    status = kit("status", "--db", str(db), "--workflow", "t1").stdout
    assert "failed: its code raised an error that is not a failure class" in status and "`resume` it" in status
    kit("worker", "--db", str(db), "--until-idle", "--module", str(module))  # no worker retries a failed workflow
    assert Journal(db).workflow("t1")["status"] == "failed"

    module.write_text(NOT_JSON.format(when="datetime.date(2026, 12, 1).isoformat()"))  # the fix
    assert kit("resume", "--db", str(db), "--workflow", "t1", "--by", "ops").returncode == 0
    kit("worker", "--db", str(db), "--until-idle", "--module", str(module))
    journal = Journal(db)
    assert journal.workflow("t1")["output"] == ["kept", "2026-12-01"]
    assert {s["name"]: s["attempts"] for s in journal.steps("t1")} == {"first": 1, "when": 2}
