"""The world of the model-based test: one journal, its fake destinations, and the real processes acting on it.

Every action goes through ``python -m durable_kit ...`` in a child process;
every observation reads the committed rows through a fresh read-only
connection. ``World`` knows nothing about what *should* happen: that is the
model in ``tests/test_model_based.py``.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = Path(__file__).resolve().parent / "model_kinds.py"
LEASE_SECONDS = 2.0  # wide enough for a healthy worker on a loaded machine to renew in time
CLI_TIMEOUT = 90.0
DESTINATIONS = {"seats": "effects", "cards": "effects", "tickets": "effects", "payments": "refunds",
                "notify": "deliveries"}  # each fake destination beside the journal, and its table of effects


@dataclass
class Proc:
    """A worker (or a `run`) this test started: its process, its code and whether it is stopped."""

    label: str
    popen: subprocess.Popen
    code: str
    log: Path  # everything it printed: a file, never a pipe nobody reads (a full pipe would stop it mid-write)
    paused: bool = False
    ended_by_us: bool = False


@dataclass
class Totals:
    """What a run of the state machine did, summed over every sequence."""

    sequences: int = 0
    operations: int = 0
    kills: int = 0
    kills_that_interrupted_a_workflow: int = 0
    pauses: int = 0
    pauses_ended_by_sigcont: int = 0
    pauses_ended_by_kill: int = 0
    workers_started: int = 0
    workers_exited_on_their_own: int = 0
    cli_refused_on_a_lock: int = 0
    checks_failed: int = 0  # invariant checks that failed, counting Hypothesis's replays while it shrinks
    violations: int = 0  # failing sequences Hypothesis reported (each after shrinking)
    notes: list[str] = field(default_factory=list)
    ended: Counter = field(default_factory=Counter)  # each workflow's status at the end of its sequence

    def line(self) -> str:
        fields = {k: v for k, v in self.__dict__.items() if k not in ("notes", "ended")}
        return (", ".join(f"{k.replace('_', ' ')} {v}" for k, v in fields.items())
                + "; workflows ended " + ", ".join(f"{k} {v}" for k, v in sorted(self.ended.items())))


def connect_ro(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    conn.row_factory = sqlite3.Row
    return conn


class World:
    """One journal under ``folder``, the processes started on it, and reads of what they committed."""

    def __init__(self, folder: Path, totals: Totals):
        self.folder, self.totals = Path(folder), totals
        self.db = self.folder / "journal.db"
        self.code = "v1"
        self.procs: list[Proc] = []
        self.exited: list[str] = []  # workers that ended without our signal: their last words
        from durable_kit import Journal

        Journal(self.db).close()  # the schema exists before any process or read looks at the file

    # --- processes ---

    def env(self, code: str | None = None) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["DURABLE_KIT_MODEL_CODE"] = code or self.code
        return env

    def cli(self, *args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess:
        """One ``python -m durable_kit`` command to its end (killed after ``timeout``, with exit code -9)."""
        command = [sys.executable, "-m", "durable_kit", *args]
        child = subprocess.Popen(command, cwd=self.folder, env=self.env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
        if child.returncode == 3 and "lock" in err:
            self.totals.cli_refused_on_a_lock += 1
        return subprocess.CompletedProcess(command, child.returncode, out, err)

    def start_worker(self) -> Proc:
        command = [sys.executable, "-m", "durable_kit", "worker", "--db", str(self.db), "--module", str(MODULE),
                   "--poll", "0.1", "--lease-seconds", str(LEASE_SECONDS)]
        label = f"worker-{len(self.procs) + 1}"
        log = self.folder / f"{label}.log"
        with log.open("w") as out:
            popen = subprocess.Popen(command, cwd=self.folder, env=self.env(), stdout=out, stderr=subprocess.STDOUT)
        proc = Proc(label, popen, self.code, log)
        self.procs.append(proc)
        self.totals.workers_started += 1
        return proc

    def live(self) -> list[Proc]:
        """Workers still alive (running or stopped); a worker that ended on its own is noted once."""
        alive = []
        for proc in self.procs:
            if proc.popen.poll() is None:
                alive.append(proc)
            elif not proc.ended_by_us:
                proc.ended_by_us = True  # noted: not counted again
                self.exited.append(f"{proc.label} exited {proc.popen.returncode}: {' | '.join(self.last_words(proc))}")
                self.totals.workers_exited_on_their_own += 1
        return alive

    def owned_by(self, pid: int) -> list[str]:
        """Workflows whose lease names process ``pid`` and are running: what a kill of it interrupts."""
        with self.read() as conn:
            rows = conn.execute("SELECT id, owner FROM workflows WHERE status = 'running'").fetchall()
        return [r["id"] for r in rows if owner_pid(r["owner"]) == pid]

    def kill(self, proc: Proc) -> list[str]:
        """SIGKILL one process; the running workflows it owned (their attempts died with it)."""
        interrupted = self.owned_by(proc.popen.pid)
        proc.ended_by_us = True
        proc.popen.kill()
        proc.popen.wait()
        self.totals.kills += 1
        self.totals.kills_that_interrupted_a_workflow += bool(interrupted)
        if proc.paused:
            self.totals.pauses_ended_by_kill += 1
            proc.paused = False
        return interrupted

    def pause(self, proc: Proc) -> list[str]:
        """SIGSTOP one worker; the running workflows it owned (their leases now run out)."""
        owned = self.owned_by(proc.popen.pid)
        proc.popen.send_signal(signal.SIGSTOP)
        proc.paused = True
        self.totals.pauses += 1
        return owned

    def resume_process(self, proc: Proc) -> None:
        proc.popen.send_signal(signal.SIGCONT)
        proc.paused = False
        self.totals.pauses_ended_by_sigcont += 1

    def stop_all(self) -> None:
        """End every process this world started: stopped ones are continued first, then all are killed."""
        for proc in self.procs:
            if proc.popen.poll() is None:
                if proc.paused:
                    proc.popen.send_signal(signal.SIGCONT)
                proc.ended_by_us = True
                proc.popen.kill()
            proc.popen.wait()

    def last_words(self, proc: Proc, lines: int = 3) -> list[str]:
        return proc.log.read_text(errors="replace").strip().splitlines()[-lines:]

    def diagnose(self, workflow_ids) -> dict[str, str]:
        """For workflows that did not settle: the lease's owner, how long it has left, and that process's state."""
        with self.read() as conn:
            rows = {r["id"]: dict(r) for r in conn.execute("SELECT id, owner, lease_expires_at FROM workflows")}
        found = {}
        for workflow_id in workflow_ids:
            row = rows[workflow_id]
            left = "no lease" if row["lease_expires_at"] is None else f"{row['lease_expires_at'] - time.time():.1f} s left"
            owner = [p for p in self.procs if owner_pid(row["owner"]) == p.popen.pid]
            state = "not a process of this test" if not owner else (
                f"{owner[0].label}, {'alive' if owner[0].popen.poll() is None else 'ended'}, "
                f"{_process_state(owner[0].popen.pid)}; it printed: {' | '.join(self.last_words(owner[0]))}")
            found[workflow_id] = f"owner {row['owner']} ({left}): {state}"
        return found

    # --- observations ---

    def read(self) -> sqlite3.Connection:
        return connect_ro(self.db)

    def snapshot(self) -> dict:
        """The committed state: workflows, steps, waits, outbox rows and history events by workflow."""
        with self.read() as conn:
            workflows = {r["id"]: dict(r) for r in conn.execute(
                "SELECT id, kind, input, status, output, error, cancel_requested, origin, next_run_at FROM workflows")}
            steps = {(r["workflow_id"], r["name"]): dict(r) for r in conn.execute(
                "SELECT workflow_id, name, status, output, attempts, position FROM steps")}
            waits = {(r["workflow_id"], r["name"]): dict(r) for r in conn.execute(
                "SELECT workflow_id, name, kind, status, decision, wake_at FROM waits")}
            outbox = {r["key"]: dict(r) for r in conn.execute("SELECT key, workflow_id, action, status, attempts"
                                                              " FROM outbox")}
            events: dict[str, list[str]] = {}
            steps_of_events: dict[str, list[tuple[str | None, str]]] = {}
            for r in conn.execute("SELECT workflow_id, step, event FROM history ORDER BY seq"):
                events.setdefault(r["workflow_id"], []).append(r["event"])
                steps_of_events.setdefault(r["workflow_id"], []).append((r["step"], r["event"]))
        return {"workflows": workflows, "steps": steps, "waits": waits, "outbox": outbox, "events": events,
                "step_events": steps_of_events}

    def busy(self, horizon: float = 0.0) -> bool:
        """True while a workflow is running, or due within ``horizon`` seconds, or an outbox row is unsent."""
        with self.read() as conn:
            return conn.execute(
                "SELECT EXISTS (SELECT 1 FROM workflows WHERE status = 'running' OR (status IN ('pending', 'waiting',"
                " 'paused') AND next_run_at <= ?)) OR EXISTS (SELECT 1 FROM outbox WHERE status = 'pending')",
                (time.time() + horizon,)).fetchone()[0] == 1

    def working(self) -> bool:
        """True while a workflow is pending or running (a due wait, which ends at once when run, does not count)."""
        with self.read() as conn:
            return conn.execute("SELECT EXISTS (SELECT 1 FROM workflows WHERE status IN ('pending', 'running'))"
                                ).fetchone()[0] == 1

    def integrity(self) -> list[str]:
        """``PRAGMA integrity_check`` of the journal and every destination file that exists."""
        problems = []
        for path in [self.db, *sorted(self.folder.glob("journal.*.db"))]:
            if path.exists():
                result = self.checked(path)
                if result is not None and result != ["ok"]:
                    problems.append(f"{path.name}: {result}")
        return problems

    def checked(self, path: Path, seconds: float = 5.0) -> list[str] | None:
        """``PRAGMA integrity_check`` of one file; None if a stopped process keeps it unreadable for now.

        A file a process is still creating, or one a stopped process holds
        mid-write, may refuse a read-only connection for a moment: try again
        for ``seconds``. Past that, with every process running, the refusal
        is itself the finding; with one stopped, the check at the end of the
        sequence (every process continued) reads the file again.
        """
        deadline = time.monotonic() + seconds
        while True:
            conn = connect_ro(path)
            try:
                return [r[0] for r in conn.execute("PRAGMA integrity_check")]
            except sqlite3.OperationalError as error:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                if any(proc.paused for proc in self.procs):
                    self.totals.notes.append(f"{path.name} unreadable while a process was stopped: {error}")
                    return None
                return [f"unreadable: {error}"]
            finally:
                conn.close()

    def sent(self) -> list[dict]:
        """Every request and effect at every destination, each with the workflow and the action that sent it.

        ``kind`` is ``request`` or ``effect``; ``workflow`` is the one the row
        names (the kit's effect helpers name it), else the one whose id begins
        its key. Read before the journal's snapshot, so every request seen
        has its attempt in that snapshot (an attempt commits before it sends).
        """
        rows = []
        for name, effects in DESTINATIONS.items():
            for kind, table in (("request", "requests"), ("effect", effects)):
                for r in self.destination_rows(name, table):
                    rows.append({"destination": name, "kind": kind, "workflow": r.get("workflow_id"),
                                 "action": r.get("action"), "key": r.get("key"), "at": r["at"]})
        return rows

    def destination_rows(self, name: str, table: str) -> list[dict]:
        """Every row of one table of the destination ``journal.<name>.db`` (none if it was never used)."""
        path = self.folder / f"journal.{name}.db"
        if not path.exists():
            return []
        conn = connect_ro(path)
        try:
            return [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]
        except sqlite3.OperationalError:  # created, schema not committed yet
            return []
        finally:
            conn.close()


def owner_pid(owner: str | None) -> int | None:
    """The process id inside a lease owner's name (``machine:pid:nonce``); None for no owner."""
    return int(owner.split(":")[-2]) if owner else None


def _process_state(pid: int) -> str:
    """What Linux says the process is doing: its state letter and the kernel function it waits in."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return f"state {state}, waiting in {Path(f'/proc/{pid}/wchan').read_text() or '-'}"
    except OSError:
        return "no /proc entry"


def decoded(text: str | None):
    return None if text is None else json.loads(text)


def wait_for(condition, timeout: float, poll: float = 0.1):
    """Poll ``condition`` until it returns something true (returned) or ``timeout`` passes (None)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(poll)
