"""Shared helpers: every database lives under pytest's tmp_path."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dump(db_path: Path) -> dict:
    """Every row of every table, read through a fresh connection: what is committed on disk."""
    conn = sqlite3.connect(str(db_path))
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: sorted(map(repr, conn.execute(f'SELECT * FROM "{t}"'))) for t in tables}
    finally:
        conn.close()


def run_python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a new interpreter from the repository root."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def kit(*args: str, expect: int | None = 0) -> subprocess.CompletedProcess:
    """Run ``python -m durable_kit ARGS``; with ``expect``, assert its exit status (showing its output if not)."""
    done = run_python("-m", "durable_kit", *args)
    if expect is not None:
        assert done.returncode == expect, (done.stdout, done.stderr)
    return done


def wait_until(condition, timeout: float = 20.0, what: str = "condition"):
    """Poll ``condition`` every 20 ms until it returns something true; return that, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def grant(conn, workflow_id: str, owner: str, seconds: float = 10.0, only_if_due: bool = True):
    """A lease granted in a transaction of its own (``leases.grant`` runs inside the caller's)."""
    from durable_kit.core.leases import grant as grant_in_transaction
    from durable_kit.core.store import immediate

    with immediate(conn):
        return grant_in_transaction(conn, workflow_id, owner, seconds, only_if_due)


def make_due(db_path: Path, workflow_id: str, hours: float = 1.0) -> None:
    """The scheduled time has come: move the workflow's and its steps' schedules ``hours`` into the past.

    A negative ``hours`` moves them into the future: a check that nothing runs early, however slowly the next
    process starts.
    """
    conn = sqlite3.connect(str(db_path), isolation_level=None, timeout=5)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE steps SET next_attempt_at = next_attempt_at - ?"
                     " WHERE workflow_id = ? AND next_attempt_at IS NOT NULL", (3600 * hours, workflow_id))
        conn.execute("UPDATE workflows SET next_run_at = next_run_at - ? WHERE id = ?", (3600 * hours, workflow_id))
        conn.execute("COMMIT")
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def kinds(request):
    """Unique workflow kinds for one test, removed from the registry afterwards."""
    from durable_kit.core.journal import WORKFLOWS

    registered = []

    def kind(label: str = "wf") -> str:
        name = f"{request.module.__name__}.{request.node.name}.{label}"
        registered.append(name)
        return name

    yield kind
    for name in registered:
        WORKFLOWS.pop(name, None)


def plain(result: dict) -> dict:
    """A decision as the workflow sees it: what ``approve``/``reject``/``answer`` return, less where and whether saved."""
    return {k: v for k, v in result.items() if k not in ("wait", "saved", "decided_at")}
