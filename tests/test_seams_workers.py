"""Where workers meet people's commands and the storage, in real processes: `run` against a live owner, a
takeover, an escalation resumed, a worker started under a held lock, read-only commands under a paused writer,
the lease renewer after an exception, and faults that waiting cannot clear."""
from __future__ import annotations

import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from durable_kit.admin import read_only
from durable_kit import Journal
from durable_kit.workshop.agents.shared_work import activity_runs, finish, popen_worker, start_work
from durable_kit.harness.faultcheck import damage_table

from conftest import ROOT, dump, wait_until

KIT = [sys.executable, "-m", "durable_kit"]
# Root ignores file modes: without these capabilities it obeys them, as any other user does.
OBEY_FILE_MODES = (["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
                   if hasattr(os, "getuid") and os.getuid() == 0 else [])

# A workflow whose steps are recorded in the ledger as they start, then wait for a file named ``gate`` beside the
# journal: a test decides when an attempt ends, instead of guessing how long a loaded machine takes.
GATED = '''
import os
import time
from pathlib import Path

import durable_kit
import durable_kit.core.leases
from durable_kit.workshop.agents.shared_work import ledger_beside


@durable_kit.workflow("gated")
def gated(wf):
    gate = Path(wf.db_path).with_name("gate")

    def step(number):
        if wf.input.get("big"):
            return "x" * 200_000
        ledger_beside(wf.db_path).record("activity", f"step:{number}", wf.id)
        deadline = time.monotonic() + 120
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return number

    for number in range(1, wf.input["steps"] + 1):
        wf.execute_step(f"step:{number}", lambda n=number: step(n))
    return {"steps": wf.input["steps"]}


@durable_kit.workflow("crashes_until_fixed")
def crashes_until_fixed(wf):
    def risky():
        if not Path(wf.db_path).with_name("fixed").exists():
            os._exit(13)
        return "fixed"
    return wf.execute_step("risky", risky)


if os.environ.get("RENEWAL_RAISES_ONCE"):  # the renewer thread meets an exception it does not expect, once
    marker = Path(os.environ["RENEWAL_RAISES_ONCE"])
    real_renew_row = durable_kit.core.leases.renew

    def renew_row(conn, lease):
        if not marker.exists():
            marker.write_text("raised")
            raise RuntimeError("a bug in the renewal")
        return real_renew_row(conn, lease)

    durable_kit.core.leases.renew = renew_row
'''


def kit(*args: str, env: dict | None = None, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*KIT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, **kwargs)


def popen_kit(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*KIT, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def gated(tmp_path: Path, kind: str = "gated", steps: int = 1, workflow_id: str = "g1",
          **extra) -> tuple[Path, Path]:
    """A journal with one workflow of ``kind`` from the GATED module; (journal, module)."""
    module, db = tmp_path / "gated.py", tmp_path / "journal.db"
    module.write_text(GATED)
    journal = Journal(db)
    journal.start(kind, {"steps": steps, **extra} if kind == "gated" else {}, workflow_id, registered_elsewhere=True)
    journal.close()
    return db, module


def row(db: Path, workflow_id: str = "g1") -> dict:
    journal = read_only(db)
    try:
        return journal.workflow(workflow_id)
    finally:
        journal.close()


def events(db: Path, workflow_id: str = "g1") -> list[dict]:
    journal = read_only(db)
    try:
        return journal.history(workflow_id)
    finally:
        journal.close()


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


class LockHolder:
    """Another process holding the journal's write lock (``BEGIN IMMEDIATE``) until ``release``."""

    def __init__(self, db: Path):
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import sqlite3, sys\n"
             "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
             "conn.execute('BEGIN IMMEDIATE')\nprint('held', flush=True)\nsys.stdin.read()\nconn.execute('ROLLBACK')",
             str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline() == "held\n"

    def release(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # in case a test paused it
            self.process.stdin.close()
            self.process.wait(timeout=30)


def lines_until(stream, wanted: str, timeout: float = 60.0) -> list[str]:
    """Read lines from a child's pipe until one contains ``wanted``; every line read so far."""
    seen: list[str] = []
    found = threading.Event()

    def read():
        for line in stream:
            seen.append(line.rstrip("\n"))
            if wanted in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), f"no line with {wanted!r} within {timeout} s; read {seen}"
    return seen


# --- item 1: a person's `run` against a live owner -------------------------------------------------------------

# `python -m durable_kit run` with its imports done, started by a line on stdin: the test times the command, not the
# interpreter's start-up on a loaded machine.
READY_RUN = ("import sys\nimport durable_kit.workshop.agents\nfrom durable_kit.__main__ import main\n"
             "print('ready', flush=True)\nsys.stdin.readline()\nsys.exit(main(sys.argv[1:]))")


def test_three_runs_against_a_worker_running_a_two_second_step_are_refused_and_it_completes_in_five_of_five(
        tmp_path):
    outcomes = []
    for trial in range(5):
        db = tmp_path / f"trial-{trial}" / "journal.db"
        db.parent.mkdir()
        start_work(db, 1, 1, 2.0)
        runs = [subprocess.Popen([sys.executable, "-c", READY_RUN, "run", "--db", str(db), "--workflow", "w001"],
                                 cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(3)]
        assert [r.stdout.readline() for r in runs] == ["ready\n"] * 3
        worker = popen_worker(db, "--lease-seconds", "30", "--until-idle")
        try:
            wait_until(lambda: activity_runs(db)[0] >= 1, timeout=60, what="the worker's step")
            for r in runs:  # three `run` commands 0.6 s apart, while the two-second step runs
                r.stdin.write("go\n")
                r.stdin.flush()
                time.sleep(0.6)
            done = [(r.wait(timeout=60), *r.communicate()) for r in runs]
            out, errors = worker.communicate(timeout=60)
        finally:
            finish(worker)
        assert worker.returncode == 0 and "Traceback" not in errors, errors
        assert out.splitlines() == ["w001: complete", "worker stopped"]
        for code, stdout, stderr in done:
            if code == 2:  # it came while the worker held the lease
                assert stderr.startswith("error: workflow 'w001' is running under owner "), stderr
                assert "whose lease expires in " in stderr and "pass --take-over" in stderr
            else:  # on a machine so loaded that it came after the worker completed: the stored output, nothing run
                assert (code, stdout, stderr) == (0, '{"steps": 1}\n', "")
        outcomes.append((row(db, "w001")["status"], activity_runs(db), done[0][0]))
    assert outcomes == [("complete", (1, 0), 2)] * 5  # the first run, at the step's start, is always refused


def test_run_refuses_a_live_owner_by_name_and_expiry_and_changes_nothing(tmp_path):
    db, module = gated(tmp_path)
    worker = popen_kit("worker", "--db", str(db), "--until-idle", "--lease-seconds", "60", "--module", str(module))
    try:
        wait_until(lambda: activity_runs(db)[0] == 1, timeout=60, what="the worker's step")
        before, owner = dump(db), row(db)["owner"]
        done = kit("run", "--db", str(db), "--workflow", "g1", "--module", str(module))
        assert done.returncode == 2
        line = one_error_line(done)
        assert line.startswith(f"error: workflow 'g1' is running under owner {owner} (token 1), whose lease "
                               "expires in "), line
        assert line.endswith(" s; nothing was changed. Wait for it (see `status`), or pass --take-over to fence "
                             "that owner out (its attempt then counts as taken over, not as a crash)."), line
        assert dump(db) == before
        (tmp_path / "gate").touch()
        out, errors = worker.communicate(timeout=60)
    finally:
        finish(worker)
    assert out.splitlines() == ["g1: complete", "worker stopped"]
    assert (row(db)["status"], activity_runs(db)) == ("complete", (1, 0))


def test_three_take_overs_are_not_crashes_and_the_last_owner_completes(tmp_path):
    db, module = gated(tmp_path)
    worker = popen_kit("worker", "--db", str(db), "--until-idle", "--lease-seconds", "60", "--module", str(module))
    runs = []
    try:
        wait_until(lambda: activity_runs(db)[0] == 1, timeout=60, what="the worker's step")
        for number in (2, 3, 4):
            runs.append(popen_kit("run", "--db", str(db), "--workflow", "g1", "--module", str(module), "--take-over"))
            wait_until(lambda: activity_runs(db)[0] == number, timeout=60, what=f"take-over {number - 1}'s attempt")
        (tmp_path / "gate").touch()
        done = [(r.wait(timeout=60), *r.communicate()) for r in runs]
        out, errors = worker.communicate(timeout=60)
    finally:
        finish(worker, *runs)
    assert [(code, stdout) for code, stdout, _ in done] == [(0, "null\n"), (0, "null\n"), (0, '{"steps": 1}\n')]
    assert out.splitlines() == ["g1: lease lost to token 4; this worker stopped working on it", "worker stopped"]
    wf = row(db)
    assert (wf["status"], wf["output"], wf["fencing_token"]) == ("complete", {"steps": 1}, 4)
    history = events(db)
    taken = [e["detail"] for e in history if e["event"] == "attempt_taken_over"]
    assert [t.split(" by ")[0] for t in taken] == [
        "attempt 1 (token 1)", "attempt 2 (token 2)", "attempt 3 (token 3)"]
    assert [e["event"] for e in history].count("step_failed") == 0
    assert [e["event"] for e in history].count("stale_write_refused") == 3
    assert activity_runs(db) == (4, 3)  # one activity per owner: each takeover ran it again, as it must


def test_two_owners_paused_past_their_leases_are_not_crashes_and_the_third_completes(tmp_path):
    # A third owner paused in a row would escalate the step instead: its activity outran its lease three times
    # (tests/test_trust_round3.py).
    db, module = gated(tmp_path)
    workers = []
    try:
        for number in (1, 2, 3):  # each worker takes over from the paused one before it, once its lease expires
            workers.append(popen_kit("worker", "--db", str(db), "--poll", "0.05", "--lease-seconds", "2",
                                     "--module", str(module)))
            wait_until(lambda: activity_runs(db)[0] == number, timeout=60, what=f"worker {number}'s attempt")
            if number < 3:
                workers[-1].send_signal(signal.SIGSTOP)
        (tmp_path / "gate").touch()
        wait_until(lambda: row(db)["status"] == "complete", timeout=60, what="the third worker to complete it")
        woken = []
        for paused in workers[:2]:
            paused.send_signal(signal.SIGCONT)
            woken.append(lines_until(paused.stdout, "lease lost"))
        workers[2].send_signal(signal.SIGTERM)
        last_out, _ = workers[2].communicate(timeout=30)
    finally:
        for w in workers:
            w.send_signal(signal.SIGCONT)
        finish(*[w for w in workers if w.poll() is None])
    assert last_out.splitlines() == ["g1: recovered", "g1: complete", "worker stopped (SIGTERM)"]
    lost = "g1: lease lost to token 5; this worker stopped working on it"
    assert woken == [[lost], ["g1: recovered", lost]]  # 2 and 3 each took over first
    history = [e["event"] for e in events(db)]
    assert (history.count("attempt_taken_over"), history.count("step_failed"), history.count("workflow_escalated")) \
        == (2, 0, 0)
    assert (row(db)["status"], activity_runs(db)) == ("complete", (3, 2))


def test_an_escalated_workflow_is_resumed_after_the_fix_and_the_history_says_so(tmp_path):
    db, module = gated(tmp_path, "crashes_until_fixed")
    worker = ("worker", "--db", str(db), "--until-idle", "--module", str(module))
    assert [kit(*worker).returncode for _ in range(4)] == [13, 13, 13, 0]
    assert row(db)["status"] == "escalated"

    (tmp_path / "fixed").touch()
    done = kit("resume", "--db", str(db), "--workflow", "g1", "--by", "Dana")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "g1: pending; a worker will replay it, reusing every completed step\n", "")
    assert kit(*worker).stdout.splitlines() == ["g1: complete", "worker stopped"]
    wf = row(db)
    assert (wf["status"], wf["output"]) == ("complete", "fixed")
    history = [(e["event"], e["detail"]) for e in events(db)]
    assert ("workflow_resumed", "from escalated by Dana") in history
    assert [e for e, _ in history].count("workflow_escalated") == 1


# --- item 8: a held write lock at a worker's start; read-only commands under a paused writer -------------------

def test_a_worker_started_under_a_held_write_lock_waits_says_so_and_runs_once_it_is_released(tmp_path):
    db = tmp_path / "journal.db"
    start_work(db, 1, 1, 0.0)
    holder = LockHolder(db)
    worker = popen_kit("worker", "--db", str(db), "--until-idle", "--poll", "0.05",
                       env={"DURABLE_KIT_BUSY_TIMEOUT_MS": "100"})
    try:
        seen = lines_until(worker.stdout, "trying again in")
        assert worker.poll() is None  # still there, waiting
        holder.release()
        rest, errors = worker.communicate(timeout=60)
    finally:
        holder.release()
        finish(worker)
    assert worker.returncode == 0 and errors == "", errors
    assert seen[-1].startswith("storage fault in journal.db: database is locked; nothing was lost, trying again in ")
    assert rest.splitlines()[-2:] == ["w001: complete", "worker stopped"]
    assert (row(db, "w001")["status"], activity_runs(db)) == ("complete", (1, 0))


def test_status_and_history_of_an_agent_loop_read_under_a_paused_writer(tmp_path):
    db = tmp_path / "loop.db"
    assert kit("start", "--db", str(db), "--kind", "agent_loop", "--input", '{"case": "three_companies"}',
               "--id", "compare-1").returncode == 0
    assert kit("worker", "--db", str(db), "--until-idle").returncode == 0  # stops at its question
    before = dump(db)
    holder = LockHolder(db)
    holder.process.send_signal(signal.SIGSTOP)  # a writer paused inside its transaction
    try:
        fast = {"DURABLE_KIT_BUSY_TIMEOUT_MS": "100"}
        text = kit("status", "--db", str(db), "--workflow", "compare-1", env=fast)
        as_json = kit("status", "--db", str(db), "--workflow", "compare-1", "--json", env=fast)
        history = kit("history", "--db", str(db), "--workflow", "compare-1", env=fast)
    finally:
        holder.release()
    assert [d.returncode for d in (text, as_json, history)] == [0, 0, 0], [text.stderr, as_json.stderr,
                                                                          history.stderr]
    assert text.stdout.startswith("compare-1 (agent_loop, version ") and "usage across attempts: " in text.stdout
    assert json.loads(as_json.stdout)["workflow"]["status"] == "waiting"
    assert "usage" in json.loads(as_json.stdout)
    assert "waiting_for_clarification" in history.stdout
    assert dump(db) == before


# --- item 12: the lease renewer after an exception; a replay whose heartbeat gave up ---------------------------

def test_the_renewer_logs_an_exception_and_keeps_renewing(tmp_path):
    db, module = gated(tmp_path)
    marker = tmp_path / "raised"
    worker = popen_kit("worker", "--db", str(db), "--until-idle", "--lease-seconds", "9", "--module", str(module),
                       env={"RENEWAL_RAISES_ONCE": str(marker)})
    try:
        wait_until(marker.exists, timeout=60, what="the renewal that raises")
        expiry = row(db)["lease_expires_at"]
        wait_until(lambda: row(db)["lease_expires_at"] > expiry, timeout=30, what="a renewal after the exception")
        (tmp_path / "gate").touch()
        out, errors = worker.communicate(timeout=60)
    finally:
        finish(worker)
    assert out.splitlines() == ["g1: complete", "worker stopped"]
    assert errors.splitlines() == [f"lease renewals in {db.name}: RuntimeError: a bug in the renewal; "
                                   "the renewer goes on and tries these leases again at the next beat"]
    assert (row(db)["status"], activity_runs(db)) == ("complete", (1, 0))


def test_a_replay_whose_heartbeat_could_not_renew_says_lease_lost(tmp_path):
    db, module = gated(tmp_path, steps=2)
    worker = popen_kit("worker", "--db", str(db), "--until-idle", "--lease-seconds", "4", "--module", str(module))
    try:
        wait_until(lambda: activity_runs(db)[0] == 1, timeout=60, what="the worker's first step")
        holder = LockHolder(db)  # the heartbeat cannot write until the lease has run out
        try:
            wait_until(lambda: row(db)["lease_expires_at"] < time.time() - 0.5, timeout=60, what="the expiry")
        finally:
            holder.release()
        (tmp_path / "gate").touch()
        out, errors = worker.communicate(timeout=60)
    finally:
        finish(worker)
    assert worker.returncode == 0 and "Traceback" not in errors, errors
    assert out.splitlines() == [
        "g1: lease lost (it expired before the heartbeat could renew it); this worker stopped working on it",
        "g1: recovered", "g1: complete", "worker stopped"]
    # Step 1's output was committed under the unchanged token; only step 2, refused at its start, ran later.
    assert (row(db)["status"], activity_runs(db)) == ("complete", (2, 0))
    assert [e["event"] for e in events(db)].count("stale_write_refused") == 1


# --- item 14: faults that waiting cannot clear end `worker --until-idle`; each message names the real cause ------

def obeying_file_modes(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*OBEY_FILE_MODES, *KIT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          **kwargs)


def checkpointed(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX file modes")
def test_worker_until_idle_on_a_read_only_journal_file_ends_with_the_cause_and_a_non_zero_status(tmp_path):
    db = tmp_path / "journal.db"
    start_work(db, 1, 1, 0.0)
    before = dump(db)
    db.chmod(0o444)
    try:
        done = obeying_file_modes("worker", "--db", str(db), "--until-idle")
    finally:
        db.chmod(0o644)
    assert done.returncode == 3, done
    assert one_error_line(done) == (f"error: {db} is read-only (its file mode, its folder or its mount); nothing was "
                                    "written. Make it writable, then run the command again.")
    assert "trying again" not in done.stdout
    assert dump(db) == before


def test_worker_until_idle_on_a_malformed_page_ends_with_the_cause_and_a_non_zero_status(tmp_path):
    db = tmp_path / "journal.db"
    start_work(db, 40, 1, 0.0)
    checkpointed(db)
    damage_table(db)
    done = kit("worker", "--db", str(db), "--until-idle")
    assert done.returncode == 3, done
    line = one_error_line(done)
    assert line.startswith(f"error: {db} is damaged or is not an SQLite database (database disk image is "
                           "malformed); nothing was changed."), line
    assert "trying again" not in done.stdout


def test_worker_until_idle_past_a_file_size_limit_ends_with_the_cause_and_the_work_resumes_after(tmp_path):
    db, module = gated(tmp_path, big=True)
    checkpointed(db)
    before = dump(db)
    limit = max(p.stat().st_size for p in tmp_path.glob("journal.db*")) + 4096

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = kit("worker", "--db", str(db), "--until-idle", "--module", str(module), preexec_fn=limited)
    assert done.returncode == 3, done
    line = one_error_line(done)
    assert line.startswith(f"error: {db}: the disk refused a write (a full disk, a file-size limit such as "
                           "`ulimit -f`, or a failing device)"), line
    assert "trying again" not in done.stdout
    journal = read_only(db)
    # The attempt's marker was committed; its output, past the limit, was not written at all.
    assert [(s["name"], s["status"], s["attempts"], s["output"]) for s in journal.steps("g1")] == [
        ("step:1", "running", 1, None)]
    assert journal.workflow("g1")["output"] is None
    journal.close()
    assert before["steps"] == []
    assert kit("worker", "--db", str(db), "--until-idle", "--module", str(module)).stdout.splitlines() == [
        "g1: recovered", "g1: complete", "worker stopped"]  # its owner's process is gone: taken back at once


@pytest.mark.parametrize("command", ["status", "history", "run", "worker", "start", "resume"])
def test_a_folder_given_as_db_is_named_as_a_folder(tmp_path, command):
    folder = tmp_path / "journals"
    folder.mkdir()
    extra = {"status": ("--workflow", "r1"), "history": ("--workflow", "r1"), "run": ("--workflow", "r1"),
             "worker": ("--until-idle",), "start": ("--kind", "refund", "--input", '{"order_id": "A-1001"}'),
             "resume": ("--workflow", "r1", "--by", "Dana")}[command]
    done = kit(command, "--db", str(folder), *extra)
    assert done.returncode in (2, 3), done
    assert one_error_line(done) == (f"error: {folder} is a folder, not a journal file; nothing was written. Point "
                                    f"--db at a file, for example {folder / 'journal.db'}.")
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX file modes")
@pytest.mark.parametrize("command", ["status", "worker"])
def test_a_write_ahead_log_without_permissions_is_named(tmp_path, command):
    db = tmp_path / "journal.db"
    start_work(db, 1, 1, 0.0)
    keeper = sqlite3.connect(db)  # keeps the log in place while the command runs
    keeper.execute("UPDATE workflows SET updated_at = updated_at")
    keeper.commit()
    wal = Path(f"{db}-wal")
    wal.chmod(0o000)
    try:
        done = obeying_file_modes(command, "--db", str(db), *(("--workflow", "w001") if command == "status"
                                                             else ("--until-idle",)))
    finally:
        wal.chmod(0o644)
        keeper.close()
    assert done.returncode in (2, 3), done
    assert one_error_line(done) == (
        f"error: {wal} (the journal's write-ahead log) cannot be read and written by this process (mode 000); "
        "nothing was written. Give it the journal's own owner and mode (for example `chmod 644`), then run "
        "the command again.")


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX file modes")
def test_status_and_history_read_a_journal_in_a_read_only_folder(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    db = folder / "journal.db"
    start_work(db, 1, 1, 0.0)
    assert sorted(p.name for p in folder.iterdir()) == ["journal.db"]
    db.chmod(0o444)
    folder.chmod(0o555)
    try:
        status = obeying_file_modes("status", "--db", str(db), "--workflow", "w001")
        history = obeying_file_modes("history", "--db", str(db), "--workflow", "w001")
    finally:
        folder.chmod(0o755)
        db.chmod(0o644)
    assert (status.returncode, status.stderr) == (0, ""), status.stderr
    assert status.stdout.startswith("w001 (shared_work, version ") and ": pending" in status.stdout.splitlines()[0]
    assert (history.returncode, history.stderr) == (0, "")
    assert "workflow_created" in history.stdout
    assert sorted(p.name for p in folder.iterdir()) == ["journal.db"]  # no log, no shared-memory file made


# --- item 15 (one input): a malformed busy timeout in the environment ---------------------------------------------

@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "5e3", "", "86400001"])
@pytest.mark.parametrize("command", ["status", "worker", "start"])
def test_a_malformed_busy_timeout_is_refused_with_what_to_give(tmp_path, value, command):
    db = tmp_path / "journal.db"
    start_work(db, 1, 1, 0.0)
    before = dump(db)
    extra = {"status": ("--workflow", "w001"), "worker": ("--until-idle",),
             "start": ("--kind", "shared_work", "--input", '{"steps": 1, "seconds": 0}', "--id", "w002")}[command]
    done = kit(command, "--db", str(db), *extra, env={"DURABLE_KIT_BUSY_TIMEOUT_MS": value})
    assert done.returncode == 2, done
    assert one_error_line(done) == (
        f"error: DURABLE_KIT_BUSY_TIMEOUT_MS must be a whole number of milliseconds from 0 to 86400000 (for "
        f"example 5000), not {value!r}; nothing was opened. Set it so, or unset it for the default (5000).")
    assert dump(db) == before
