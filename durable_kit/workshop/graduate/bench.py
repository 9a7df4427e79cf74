"""What a step costs on the kit and on DBOS, against raw SQLite, measured side by side in one run.

``python -m durable_kit.workshop.graduate bench --json`` runs, in one process, rounds
of: raw INSERT-plus-COMMIT statements (WAL, ``synchronous=FULL``), a kit
workflow of trivial steps (``execute_step``, the kit's defaults), and a DBOS
workflow of trivial steps on a SQLite system database (DBOS's defaults). It
reports the median time per step of each and the ratios. With ``--postgres``
it adds DBOS on a PostgreSQL database (see ``postgres.py``).

The figures are measured in one run on this machine; this is not a test.
"""
from __future__ import annotations

import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from dbos import DBOS, SetWorkflowID

from ...core.journal import Journal, Workflow, run_workflow, workflow
from . import engine


@workflow("graduate_bench")
def kit_bench(wf: Workflow) -> int:
    """``steps`` trivial journaled steps."""
    for i in range(wf.input["steps"]):
        wf.execute_step(f"step-{i}", lambda i=i: {"i": i})
    return wf.input["steps"]


@DBOS.step(name="bench_step")
def dbos_step(i: int) -> dict:
    """One trivial step."""
    return {"i": i}


@DBOS.workflow(name="graduate_bench")
def dbos_bench(steps: int) -> int:
    """``steps`` trivial DBOS steps."""
    for i in range(steps):
        dbos_step(i)
    return steps


def raw_round(conn: sqlite3.Connection, first: int, steps: int) -> float:
    """Seconds for ``steps`` INSERT+COMMIT of a small JSON row: the least a durable step can cost."""
    start = time.perf_counter()
    for i in range(first, first + steps):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?, ?)", (f"step-{i}", json.dumps({"i": i})))
        conn.execute("COMMIT")
    return time.perf_counter() - start


def kit_round(journal: Journal, n: int, steps: int) -> float:
    """Seconds for one kit workflow of ``steps`` steps, start to finish."""
    start = time.perf_counter()
    workflow_id = journal.start("graduate_bench", {"steps": steps}, f"bench-{n}")
    run_workflow(journal, workflow_id)
    return time.perf_counter() - start


def dbos_round(n: int, steps: int) -> float:
    """Seconds for one DBOS workflow of ``steps`` steps, start to finish."""
    start = time.perf_counter()
    with SetWorkflowID(f"bench-{n}"):
        DBOS.start_workflow(dbos_bench, steps).get_result()
    return time.perf_counter() - start


def measure(steps: int = 500, rounds: int = 10, postgres: bool = False) -> dict:
    """Alternate rounds of raw, kit and DBOS steps so all see the same disk; report medians in µs per step."""
    per_round = max(1, steps // rounds)
    timings: dict[str, list[float]] = {"raw": [], "kit": [], "dbos_sqlite": []}
    with tempfile.TemporaryDirectory() as tmp:
        raw = sqlite3.connect(str(Path(tmp) / "raw.db"), isolation_level=None)
        raw.execute("PRAGMA journal_mode = WAL")
        raw.execute("PRAGMA synchronous = FULL")
        raw.execute("CREATE TABLE t (name TEXT PRIMARY KEY, output TEXT)")
        journal = Journal(Path(tmp) / "kit.db")
        engine.launch(engine.sqlite_url(Path(tmp) / "dbos.sqlite"))
        try:
            for n in range(rounds):
                timings["raw"].append(raw_round(raw, n * per_round, per_round) / per_round)
                timings["kit"].append(kit_round(journal, n, per_round) / per_round)
                timings["dbos_sqlite"].append(dbos_round(n, per_round) / per_round)
        finally:
            engine.shutdown()
            raw.close(), journal.close()
        if postgres:
            timings["dbos_postgres"] = postgres_rounds(rounds, per_round)
    us = {name: round(statistics.median(values) * 1e6, 1) for name, values in timings.items()}
    result = {f"{name}_us_per_step": value for name, value in us.items()}
    for name in us:
        if name != "raw":
            result[f"{name}_vs_raw"] = round(us[name] / us["raw"], 1)
    result["dbos_sqlite_vs_kit"] = round(us["dbos_sqlite"] / us["kit"], 1)
    result["steps_per_round"], result["rounds"] = per_round, rounds
    return result


def postgres_rounds(rounds: int, per_round: int) -> list[float]:
    """Seconds per step of DBOS on a fresh PostgreSQL database, one value per round."""
    from .postgres import start_postgres

    server = start_postgres()
    try:
        engine.launch(server.url)
        try:
            return [dbos_round(n, per_round) / per_round for n in range(rounds)]
        finally:
            engine.shutdown()
    finally:
        server.stop()
