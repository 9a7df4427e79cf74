"""Notebook 01: application checkpoints made by hand, before any executor.

The filings research task keeps its own records: a run with a status, an
evidence table (passages, identified by document, period and location) and a
findings table (claims with their own identities, each citing evidence). The
source's calls are counted in a separate ledger. Crash points sit at the three
boundaries where recovery differs: after the source returned, after the
evidence commit, after the finding commit.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ... import Journal, immediate
from ...harness.faults import arm, disarm_all, trip
from ...world.llm import FakeLLM
from ...world.sources import FixtureSource, SourceUnavailable, load_filings
from ...world.ledger import Ledger

QUESTION = "How does the company describe supplier concentration risk?"
CRASH_POINTS = ("after_fetch", "after_evidence", "after_finding")

CHECKPOINT_SCHEMA = """
CREATE TABLE IF NOT EXISTS research_runs (
    id         TEXT PRIMARY KEY,
    company    TEXT NOT NULL,
    period     TEXT,
    status     TEXT NOT NULL CHECK (status IN ('running', 'paused', 'waiting', 'complete')),
    question   TEXT,   -- what the run waits for, when status is 'waiting'
    answer     TEXT,   -- the person's answer, saved before the run continues
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS evidence (
    id      TEXT PRIMARY KEY,  -- the passage's own identity: document, period, location
    run_id  TEXT NOT NULL,
    company TEXT NOT NULL,
    period  TEXT NOT NULL,
    quote   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS findings (
    id          TEXT PRIMARY KEY,  -- a finding's own identity: two claims may cite one passage
    run_id      TEXT NOT NULL,
    evidence_id TEXT NOT NULL REFERENCES evidence (id),
    claim       TEXT NOT NULL
);
"""


class NotWaiting(ValueError):
    """An answer was given to a run that is not waiting for one; nothing was saved."""


def open_checkpoints(db_path: str | Path):
    """Connect and create the research tables if needed."""
    conn = Journal(db_path).conn  # the kit's SQLite settings (WAL, FULL sync), beside its tables
    with immediate(conn):
        for statement in CHECKPOINT_SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
    return conn


def _set_status(conn, run_id: str, status: str, question: str | None = None) -> None:
    with immediate(conn):
        conn.execute("UPDATE research_runs SET status = ?, question = ?, updated_at = ? WHERE id = ?",
                     (status, question, time.time(), run_id))


def research_filing(db_path: str | Path, run_id: str, company: str, period: str | None = None,
                    source_available: bool = True) -> str:
    """One attempt at the task; returns the status it saved.

    Artifacts, not the status, decide what to do: saved evidence is never
    fetched again and a saved finding is never generated again.
    """
    conn = open_checkpoints(db_path)
    ledger = Ledger.beside(db_path)
    with immediate(conn):
        conn.execute("INSERT OR IGNORE INTO research_runs (id, company, period, status, updated_at)"
                     " VALUES (?, ?, ?, 'running', ?)", (run_id, company, period, time.time()))
        run = conn.execute("SELECT * FROM research_runs WHERE id = ?", (run_id,)).fetchone()
    period = run["period"] or run["answer"]
    if period is None:
        company_name = load_filings().get(company, {}).get("name", company)
        _set_status(conn, run_id, "waiting",
                    f"Which reporting period of {company_name} should I read (FY2024 or FY2025)?")
        return "waiting"
    _set_status(conn, run_id, "running")

    evidence = conn.execute("SELECT * FROM evidence WHERE run_id = ?", (run_id,)).fetchone()
    if evidence is None:
        try:
            passage = FixtureSource(ledger, run_id, available=source_available).fetch_passage(company, period)
        except SourceUnavailable:
            _set_status(conn, run_id, "paused")
            return "paused"
        trip(conn, "after_fetch", run_id)
        with immediate(conn):
            conn.execute("INSERT OR IGNORE INTO evidence (id, run_id, company, period, quote) VALUES (?, ?, ?, ?, ?)",
                         (passage["id"], run_id, passage["company"], period, passage["text"]))
        trip(conn, "after_evidence", run_id)
        evidence = conn.execute("SELECT * FROM evidence WHERE run_id = ?", (run_id,)).fetchone()

    if conn.execute("SELECT 1 FROM findings WHERE run_id = ?", (run_id,)).fetchone() is None:
        passage = {"id": evidence["id"], "company": evidence["company"], "period": evidence["period"],
                   "text": evidence["quote"]}
        finding = FakeLLM(ledger, run_id).summarize_passage(QUESTION, passage)
        with immediate(conn):
            conn.execute("INSERT OR IGNORE INTO findings (id, run_id, evidence_id, claim) VALUES (?, ?, ?, ?)",
                         (f"{run_id}/finding-1", run_id, finding["evidence_id"], finding["claim"]))
        trip(conn, "after_finding", run_id)

    _set_status(conn, run_id, "complete")
    return "complete"


def answer_clarification(db_path: str | Path, run_id: str, answer: str) -> None:
    """Commit a person's answer to a waiting run; the next attempt reads it."""
    conn = open_checkpoints(db_path)
    with immediate(conn):
        run = conn.execute("SELECT status FROM research_runs WHERE id = ?", (run_id,)).fetchone()
        if run is None or run["status"] != "waiting":
            status = "missing" if run is None else run["status"]
            raise NotWaiting(f"run {run_id!r} is {status}, not waiting for an answer; nothing was saved. "
                             "Check the run's status before answering.")
        conn.execute("UPDATE research_runs SET answer = ?, question = NULL, updated_at = ? WHERE id = ?",
                     (answer, time.time(), run_id))


def saved_state(db_path: str | Path, run_id: str = "filings-1") -> dict:
    """What the database and the ledger hold for a run right now."""
    conn = open_checkpoints(db_path)
    run = conn.execute("SELECT status FROM research_runs WHERE id = ?", (run_id,)).fetchone()
    ledger = Ledger.beside(db_path)
    try:
        return {
            "source_calls": ledger.count("source", run_id),
            "model_calls": ledger.count("model", run_id),
            "evidence": conn.execute("SELECT COUNT(*) FROM evidence WHERE run_id = ?", (run_id,)).fetchone()[0],
            "findings": conn.execute("SELECT COUNT(*) FROM findings WHERE run_id = ?", (run_id,)).fetchone()[0],
            "status": run["status"] if run else None,
        }
    finally:
        ledger.close()
        conn.close()


# --- the seven scenarios, each in fresh child processes against its own database ---

SCENARIOS = ("clean", "crash_after_fetch", "crash_after_evidence", "crash_after_finding",
             "provider_unavailable", "clarification", "duplicate_delivery")


def attempt_in_child(db_path: Path, run_id: str = "filings-1", company: str = "northwind",
                     period: str | None = "FY2025", source_down: bool = False) -> int:
    """Start one attempt in a new Python process; return its exit code."""
    command = [sys.executable, "-m", "durable_kit", "checkpoint-agent", "--db", str(db_path),
               "--run", run_id, "--company", company]
    if period:
        command += ["--period", period]
    if source_down:
        command.append("--source-down")
    return subprocess.run(command, capture_output=True, text=True, timeout=60).returncode


def run_scenario(name: str, folder: str | Path | None = None) -> dict:
    """Run one scenario in real processes; return its exit code, call counts and saved state.

    ``exit_code`` is the first process's; ``first_attempt`` is the state it left behind.
    """
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose one of {SCENARIOS}")
    folder = Path(folder or tempfile.mkdtemp(prefix="checkpoints-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / f"{name}.db"
    for stale in folder.glob(f"{name}.*db*"):
        stale.unlink()
    conn = open_checkpoints(db)

    if name.startswith("crash_"):
        arm(conn, name.removeprefix("crash_"), "exit")
        exit_code = attempt_in_child(db)
        first = saved_state(db)
        disarm_all(conn)
        attempt_in_child(db)
    elif name == "provider_unavailable":
        exit_code = attempt_in_child(db, source_down=True)
        first = saved_state(db)
        attempt_in_child(db)
    elif name == "clarification":
        exit_code = attempt_in_child(db, period=None)
        first = saved_state(db)
        answer_clarification(db, "filings-1", "FY2025")
        attempt_in_child(db, period=None)
    elif name == "duplicate_delivery":
        exit_code = attempt_in_child(db)
        first = saved_state(db)
        attempt_in_child(db)
    else:
        exit_code = attempt_in_child(db)
        first = saved_state(db)
    final = saved_state(db)
    return {"scenario": name, "exit_code": exit_code, "source_calls": final["source_calls"],
            "evidence": final["evidence"], "findings": final["findings"], "status": final["status"],
            "model_calls": final["model_calls"], "first_attempt": first}


def run_all(folder: str | Path | None = None) -> list[dict]:
    """Every scenario, in order."""
    return [run_scenario(name, folder) for name in SCENARIOS]


def summary_rows(results: list[dict]) -> list[dict]:
    """The rows the command line prints: scenario, exit code, calls and final state."""
    keys = ("scenario", "exit_code", "source_calls", "evidence", "findings", "status")
    return [{key: row[key] for key in keys} for row in results]

