"""Benchmarks: what a journaled step costs against the raw SQLite floor, and how workers share a database.

``python -m durable_kit.bench --json`` runs, in one process and under the same
durability settings, N trivial steps (in alternating rounds, medians reported)
through ``execute_step``, the same number of raw INSERT-plus-COMMIT
statements, and one replay of the finished workflow.

``python -m durable_kit.bench workers --json`` runs 1, 2, 4 and 8 worker
processes on 200 workflows of instant steps and reports steps per second,
duplicate executions and SQLITE_BUSY errors that reached a worker.

Figures are measured in one run, on this machine; this is not a test.
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from .journal import Journal
from .leases import grant, new_owner


class RawFloor:
    """INSERT plus COMMIT of a small JSON row: the least a durable step can cost."""

    def __init__(self, path: Path, synchronous: str):
        self.conn = sqlite3.connect(str(path), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute(f"PRAGMA synchronous = {synchronous}")
        self.conn.execute("CREATE TABLE t (workflow_id TEXT, name TEXT, output TEXT, PRIMARY KEY (workflow_id, name))")
        self.done = 0

    def run(self, steps: int) -> float:
        """Seconds for ``steps`` more rows."""
        start = time.perf_counter()
        for i in range(self.done, self.done + steps):
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT INTO t VALUES (?, ?, ?)", ("wf", f"step-{i}", json.dumps({"i": i})))
            self.conn.execute("COMMIT")
        self.done += steps
        return time.perf_counter() - start


class JournalSteps:
    """Trivial steps through ``execute_step``, all in one workflow, under a lease (fenced writes)."""

    def __init__(self, path: Path, synchronous: str):
        self.journal = Journal(path, synchronous)
        self.journal.start("bench", {}, "wf", registered_elsewhere=True)  # steps are driven by hand here
        self.lease = grant(self.journal.conn, "wf", new_owner(), only_if_due=False)  # every write checks it
        self.wf = self.journal.open("wf", self.lease)
        self.done = 0

    def run(self, steps: int) -> float:
        """Seconds for ``steps`` more first-run steps."""
        start = time.perf_counter()
        for i in range(self.done, self.done + steps):
            self.wf.execute_step(f"step-{i}", lambda: {"i": i})
        self.done += steps
        return time.perf_counter() - start

    def replay(self) -> float:
        """Seconds for one replay of every step so far, from the first line."""
        start = time.perf_counter()
        wf = self.journal.open("wf", self.lease)  # a replay reads the journal once
        for i in range(self.done):
            wf.execute_step(f"step-{i}", lambda: {"i": i})
        wf.finish(None)  # writes the batched reuse events
        return time.perf_counter() - start


def measure(steps: int = 2000, synchronous: str = "FULL", rounds: int = 20) -> dict:
    """Alternate rounds of raw and journaled steps so both see the same disk; report medians."""
    per_round = max(1, steps // rounds)
    with tempfile.TemporaryDirectory() as tmp:
        raw, journal = RawFloor(Path(tmp) / "raw.db", synchronous), JournalSteps(Path(tmp) / "j.db", synchronous)
        raw_us, journal_us = [], []
        for _ in range(rounds):
            raw_us.append(raw.run(per_round) / per_round * 1e6)
            journal_us.append(journal.run(per_round) / per_round * 1e6)
        replay_us = journal.replay() / journal.done * 1e6
    raw_median, journal_median = statistics.median(raw_us), statistics.median(journal_us)
    return {
        "journal_us_per_step": round(journal_median, 1),
        "raw_us_per_step": round(raw_median, 1),
        "ratio": round(journal_median / raw_median, 2),
        "replay_us_per_step": round(replay_us, 2),
        "synchronous": synchronous,
        "steps": per_round * rounds,
    }


def measure_workers(counts=(1, 2, 4, 8), workflows: int = 200) -> dict:
    """Steps per second with 1, 2, 4 and 8 worker processes on one database, and what went wrong (nothing, we hope)."""
    from .agents.shared_work import contention

    with tempfile.TemporaryDirectory() as tmp:
        runs = [contention(tmp, workers, workflows) for workers in counts]
    single = runs[0]["steps_per_second"]
    return {
        "steps_per_second": {str(r["workers"]): r["steps_per_second"] for r in runs},
        "relative_to_one_worker": {str(r["workers"]): round(r["steps_per_second"] / single, 2) for r in runs},
        "duplicate_runs": sum(r["duplicate_runs"] for r in runs),
        "busy_errors": sum(r["busy_errors"] for r in runs),
        "all_complete": all(r["complete"] for r in runs),
        "workflows": workflows, "steps_per_workflow": runs[0]["steps"] // workflows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m durable_kit.bench", description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", default="steps", choices=["steps", "workers"],
                        help="steps (default): a journaled step against raw SQLite; workers: 1 to 8 workers sharing "
                             "one database")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--synchronous", default="FULL", choices=["OFF", "NORMAL", "FULL", "EXTRA"])
    parser.add_argument("--workflows", type=int, default=200, help="for workers: how many workflows (3 steps each)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = measure(args.steps, args.synchronous) if args.what == "steps" else measure_workers(workflows=args.workflows)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value}")


if __name__ == "__main__":
    main()
