"""Shared helpers: every database lives under pytest's tmp_path."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
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


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def kinds(request):
    """Unique workflow kinds for one test, removed from the registry afterwards."""
    from durable_kit.journal import WORKFLOWS

    registered = []

    def kind(label: str = "wf") -> str:
        name = f"{request.module.__name__}.{request.node.name}.{label}"
        registered.append(name)
        return name

    yield kind
    for name in registered:
        WORKFLOWS.pop(name, None)
