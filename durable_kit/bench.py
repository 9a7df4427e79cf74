"""Benchmark: what a journaled step costs against the raw SQLite floor.

``python -m durable_kit.bench --json`` runs, in one process and under the same
durability settings, N trivial steps (in alternating rounds, medians reported) through ``execute_step``, the same number
of raw INSERT-plus-COMMIT statements, and one replay of the finished workflow.
Figures are ratios measured in one run; this is not a test.
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
    """Trivial steps through ``execute_step``, all in one workflow."""

    def __init__(self, path: Path, synchronous: str):
        self.journal = Journal(path, synchronous)
        self.journal.start("bench", {}, "wf")
        self.wf = self.journal.open("wf")
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
        wf = self.journal.open("wf")  # a replay reads the journal once
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m durable_kit.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--synchronous", default="FULL", choices=["OFF", "NORMAL", "FULL", "EXTRA"])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = measure(args.steps, args.synchronous)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value}")


if __name__ == "__main__":
    main()
