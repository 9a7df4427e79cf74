"""Try every storage fault and bad input against the command line, in real processes; print what happened.

``python -m durable_kit.harness.faultcheck --json``. Not a test (the tests assert
each case exactly): a check an operator runs on a machine to see, in one
table, that every fault gives one clear line, no traceback, and leaves the
journal as it was. Each case runs in its own temporary folder. A read-only file or mount needs
another user or a mount, so that case is left to the tests.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

KIT = [sys.executable, "-m", "durable_kit"]
REFUND = '{"order_id": "A-1001"}'


_watched: list = []  # [folder, snapshots]: while a case runs, the journal as it was before each command


def _kit(*args: str, env: dict | None = None, prepare: Callable | None = None) -> subprocess.CompletedProcess:
    if _watched:
        _watched[1].append(_snapshot(_watched[0]))
    return subprocess.run([*KIT, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, preexec_fn=prepare)


def _snapshot(folder: Path) -> dict:
    """Every committed row of the journal (read through its log), and the bytes of every other file."""
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())
             if p.is_file() and not p.name.endswith(("-wal", "-shm", "journal.db"))}
    db = folder / "journal.db"
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        rows: Any = {t: sorted(map(repr, conn.execute(f'SELECT * FROM "{t}"'))) for t in tables}
        conn.close()
    except sqlite3.Error:  # missing, empty, damaged or a folder: compare its bytes (or its entries) instead
        rows = db.read_bytes() if db.is_file() else sorted(os.listdir(db)) if db.is_dir() else None
    return {"files": files, "journal": rows}


def _started(db: Path) -> None:
    _kit("start", "--db", str(db), "--kind", "refund", "--input", REFUND, "--id", "r1")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # so an unchanged journal is unchanged byte for byte
    conn.close()


def _case_disk_full(db: Path) -> subprocess.CompletedProcess:
    _started(db)
    limit = max(p.stat().st_size for p in db.parent.glob("journal.db*")) + 4096
    big = json.dumps({"order_id": "A-1001", "note": "x" * 100_000})
    return _kit("start", "--db", str(db), "--kind", "refund", "--input", big, "--id", "big",
                prepare=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))


def _case_locked(db: Path) -> subprocess.CompletedProcess:
    _started(db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        return _kit("start", "--db", str(db), "--kind", "refund", "--input", REFUND, "--id", "r2",
                    env={"DURABLE_KIT_BUSY_TIMEOUT_MS": "100"})
    finally:
        holder.execute("ROLLBACK")


def _case_damaged(db: Path) -> subprocess.CompletedProcess:
    _started(db)
    with db.open("r+b") as f:
        f.write(b"this is no sqlite")
    return _kit("status", "--db", str(db), "--workflow", "r1")


def _case_empty(db: Path) -> subprocess.CompletedProcess:
    db.write_bytes(b"")
    return _kit("worker", "--db", str(db), "--until-idle")


def _case_other_app(db: Path) -> subprocess.CompletedProcess:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    return _kit("status", "--db", str(db), "--workflow", "r1")


def damage_table(db: Path, table: str = "workflows") -> None:
    """Overwrite the first page of ``table`` in a checkpointed journal: the file opens, reading the table fails."""
    conn = sqlite3.connect(db)
    (root_page,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    with db.open("r+b") as f:
        f.seek((root_page - 1) * page_size)
        f.write(b"\xff" * page_size)


def _case_damaged_page(db: Path) -> subprocess.CompletedProcess:
    _started(db)
    damage_table(db)
    return _kit("worker", "--db", str(db), "--until-idle")


def _case_worker_file_size_limit(db: Path) -> subprocess.CompletedProcess:
    _started(db)
    limit = 8192  # the log starts empty: its first commit of two pages passes the limit
    return _kit("worker", "--db", str(db), "--until-idle",
                prepare=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))


def _case_folder(db: Path) -> subprocess.CompletedProcess:
    db.mkdir()
    return _kit("status", "--db", str(db), "--workflow", "r1")


def _case_busy_timeout(db: Path) -> subprocess.CompletedProcess:
    _started(db)
    return _kit("status", "--db", str(db), "--workflow", "r1", env={"DURABLE_KIT_BUSY_TIMEOUT_MS": "5s"})


def _with_start(*args: str) -> Callable[[Path], subprocess.CompletedProcess]:
    def case(db: Path) -> subprocess.CompletedProcess:
        _started(db)
        return _kit(*args[:1], "--db", str(db), *args[1:])
    return case


CASES: dict[str, Callable[[Path], subprocess.CompletedProcess]] = {
    "missing file (status)": lambda db: _kit("status", "--db", str(db), "--workflow", "r1"),
    "another application's SQLite file (status)": _case_other_app,
    "zero-length journal (worker)": _case_empty,
    "damaged header (status)": _case_damaged,
    "disk or file-size limit full (start)": _case_disk_full,
    "file-size limit (worker --until-idle)": _case_worker_file_size_limit,
    "damaged page (worker --until-idle)": _case_damaged_page,
    "a folder given as --db (status)": _case_folder,
    "malformed DURABLE_KIT_BUSY_TIMEOUT_MS (status)": _case_busy_timeout,
    "locked past the busy timeout (start)": _case_locked,
    "empty workflow id (start)": _with_start("start", "--kind", "refund", "--input", REFUND, "--id", ""),
    "input that is not JSON (start)": _with_start("start", "--kind", "refund", "--input", "{order", "--id", "r2"),
    "input without a required key (start)": _with_start("start", "--kind", "refund", "--input", "{}", "--id", "r2"),
    "negative poll interval (worker)": _with_start("worker", "--poll", "-1"),
    "zero lease (worker)": _with_start("worker", "--lease-seconds", "0"),
    "negative fault duration (fault)": _with_start("fault", "slow-next-step", "--seconds", "-5"),
}


def run_case(name: str) -> dict:
    """One fault in a fresh folder: exit code, the error line, whether it was clear and the files unchanged."""
    with tempfile.TemporaryDirectory(prefix="durable-kit-fault-") as folder:
        db = Path(folder) / "journal.db"
        _watched[:] = [Path(folder), []]
        try:
            done = CASES[name](db)
        finally:
            snapshots = _watched.pop()
            _watched.clear()
        lines = done.stderr.strip().splitlines()
        after = _snapshot(Path(folder))
        return {"fault": name, "exit_code": done.returncode, "error": lines[-1] if lines else "",
                "clear_error": done.returncode != 0 and bool(lines) and "Traceback" not in done.stderr,
                "state_unchanged": after == snapshots[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durable_kit.harness.faultcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    rows = [run_case(name) for name in CASES]
    summary = {"faults_tried": len(rows), "clear_errors": sum(r["clear_error"] for r in rows),
               "states_unchanged": sum(r["state_unchanged"] for r in rows), "cases": rows}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for r in rows:
            print(f"{'ok  ' if r['clear_error'] and r['state_unchanged'] else 'FAIL'} {r['fault']:<45} {r['error']}")
        print(f"{summary['clear_errors']}/{len(rows)} clear errors, {summary['states_unchanged']}/{len(rows)} unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
