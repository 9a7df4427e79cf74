"""Benchmarks: what a journaled workflow costs against the raw SQLite floor, on the kit and on other engines.

``python -m durable_kit.bench --json`` (the ``steps`` command) measures, at
``synchronous`` FULL and NORMAL, in one process and in alternating rounds so
every series sees the same disk:

* per step: one whole workflow of N trivial steps (``Journal.start`` plus
  ``run_workflow``) divided by N, for N = 10, 100 and 1000, against N raw
  ``BEGIN IMMEDIATE; INSERT; COMMIT`` of a small JSON row (WAL, same level);
* per workflow: a whole 1-step and a whole 3-step workflow, against one raw commit;
* replay: reading back every step of a finished N-step run under a lease;
* fsyncs: ``fsync`` plus ``fdatasync`` calls counted by ``strace`` in a child process.

``python -m durable_kit.bench compare --json`` runs the same workflows on the
kit, on DBOS Transact (SQLite system database) and on LangGraph
(``SqliteSaver``, ``durability="sync"``), beside the raw floor.

``python -m durable_kit.bench workers --json`` runs 1, 2, 4 and 8 worker
processes on 200 workflows of instant steps and reports steps per second,
duplicate executions and SQLITE_BUSY errors that reached a worker.

Every figure is measured in one run on this machine; nothing is subtracted.
Times are medians of several rounds; each ratio is the median of per-round
ratios, the two sides of a round measured back to back. This is not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from .core.journal import Journal, Workflow, run_workflow, workflow
from .core.leases import grant, new_owner
from .core.store import immediate
from .workshop.peers import INSTALL, available

LEVELS = ("FULL", "NORMAL")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the folder holding the durable_kit being measured


@workflow("bench_steps")
def bench_steps(wf: Workflow) -> int:
    """``wf.input["steps"]`` trivial steps; step i returns ``{"i": i}``."""
    steps = wf.input["steps"]
    for i in range(steps):
        wf.execute_step(f"step-{i}", lambda i=i: {"i": i})
    return steps


@dataclass(frozen=True)
class Settings:
    """How much work each figure is the median of."""

    step_counts: tuple[int, ...] = (10, 100, 1000)
    rounds: int = 7  # per-step rounds for each N (kit and raw back to back), at least
    steps_per_series: int = 2000  # ... and at least this many steps in all for each N: more rounds for a small N
    workflow_rounds: int = 50  # rounds of whole 1-step and 3-step workflows and of raw commits
    workflow_batch: int = 5  # of each, back to back, per round
    replay_steps: int = 1000
    replay_samples: int = 7
    fsync_steps: int = 200  # steps of the workflow run under strace
    fsync_workflows: int = 20  # 1-step workflows (and raw commits) run under strace


QUICK = Settings(step_counts=(10, 100, 1000), rounds=2, steps_per_series=0, workflow_rounds=5, workflow_batch=2,
                 replay_steps=100, replay_samples=5, fsync_steps=50, fsync_workflows=5)


# --- how each commit reaches the disk ----------------------------------------------------------------------------

WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)
# What a write writes: its table, and for an UPDATE its first column (with a status, the status).
WHAT = re.compile(r"^(INSERT INTO \w+|DELETE FROM \w+|UPDATE \w+ SET \w+(?: = '[a-z_]+')?)")


def record_commits(journal: Journal, work: Callable[[], object]) -> list[tuple[str, str]]:
    """Run ``work()``; each commit it made on ``journal``'s connection, as (what it wrote, how it reached the disk).

    What: the commit's first write (a history event only if it wrote nothing
    else), like ``UPDATE steps SET status = 'complete'``. How: ``by SQLite``
    (committed at FULL: SQLite synced the log itself), ``synced`` (committed
    at NORMAL and followed at once by ``Journal.sync``) or ``not synced``.
    """
    events: list[str] = []
    sync = journal.sync
    journal.conn.set_trace_callback(events.append)
    journal.sync = lambda: (events.append("SYNC"), sync())[1]  # this journal only, for this call only
    try:
        work()
    finally:
        journal.conn.set_trace_callback(None)
        del journal.sync
    return commits_in(events, journal.synchronous)


def commits_in(events: list[str], level: str) -> list[tuple[str, str]]:
    """``record_commits`` on a list of statements and ``SYNC`` marks, the connection starting at ``level``."""
    found, written, in_transaction = [], None, False
    for i, event in enumerate(events):
        if event.startswith("PRAGMA synchronous"):
            level = event.split("=")[1].strip().upper()
        elif event.startswith("BEGIN"):
            in_transaction, written = True, None
        elif event == "ROLLBACK":
            in_transaction = False
        elif event == "COMMIT" or (WRITE.match(event) and not in_transaction):
            statement = written if event == "COMMIT" else event
            in_transaction = False
            if statement is None:  # a transaction that wrote nothing
                continue
            how = "by SQLite" if level in ("FULL", "EXTRA") else (
                "synced" if events[i + 1:i + 2] == ["SYNC"] else "not synced")
            match = WHAT.match(" ".join(statement.split()))
            found.append((match.group(1) if match else statement.split()[0], how))
        elif WRITE.match(event) and (written is None or written.startswith("INSERT INTO history")):
            written = event
    return found


# --- the floor and the kit -------------------------------------------------------------------------------------

class RawFloor:
    """``BEGIN IMMEDIATE; INSERT small JSON row; COMMIT`` on a raw connection: the least a durable step can cost."""

    def __init__(self, path: Path, synchronous: str):
        self.conn = sqlite3.connect(str(path), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute(f"PRAGMA synchronous = {synchronous}")
        self.conn.execute("CREATE TABLE IF NOT EXISTS t (name TEXT PRIMARY KEY, output TEXT)")
        self.rows = self.conn.execute("SELECT COUNT(*) FROM t").fetchone()[0]

    def commit_rows(self, count: int) -> float:
        """Seconds for ``count`` transactions of one INSERT each."""
        start = time.perf_counter()
        for i in range(self.rows, self.rows + count):
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT INTO t VALUES (?, ?)", (f"step-{i}", json.dumps({"i": i})))
            self.conn.execute("COMMIT")
        self.rows += count
        return time.perf_counter() - start

    def close(self) -> None:
        self.conn.close()


class KitWorkflows:
    """Whole ``bench_steps`` workflows on one journal: ``Journal.start`` plus ``run_workflow`` (its own lease)."""

    def __init__(self, path: Path, synchronous: str = "FULL"):
        self.path = path
        self.journal = Journal(path, synchronous)
        self.started = 0

    def run(self, steps: int) -> float:
        """Seconds to start a new workflow of ``steps`` trivial steps and run it to completion."""
        self.started += 1
        start = time.perf_counter()
        workflow_id = self.journal.start("bench_steps", {"steps": steps}, f"bench-{steps}-{self.started}")
        output = run_workflow(self.journal, workflow_id)
        elapsed = time.perf_counter() - start
        if output != steps:
            raise RuntimeError(f"bench workflow {workflow_id} returned {output!r}, not {steps}")
        return elapsed

    def finished_steps_under_lease(self, steps: int) -> tuple[str, object]:
        """A workflow whose ``steps`` steps are all complete but which is not finished, and a lease on it.

        A finished workflow is never granted a lease again, and ``run_workflow``
        returns its output without replaying: so the steps are run by hand.
        """
        workflow_id = self.journal.start("bench_steps", {"steps": steps}, f"replay-{steps}")
        with immediate(self.journal.conn):
            lease = grant(self.journal.conn, workflow_id, new_owner(), only_if_due=False)
        wf = self.journal.open(workflow_id, lease)
        for i in range(steps):
            wf.execute_step(f"step-{i}", lambda i=i: {"i": i})
        return workflow_id, lease

    def replay(self, workflow_id: str, lease, steps: int) -> float:
        """Seconds to open the workflow (one read of its steps) and ask for each of its ``steps`` steps again.

        Every step is found complete, so no activity runs and nothing is
        committed: the reuse events wait for the next write, which is not timed.
        """
        start = time.perf_counter()
        wf = self.journal.open(workflow_id, lease)
        for i in range(steps):
            wf.execute_step(f"step-{i}", lambda i=i: {"i": i})
        return time.perf_counter() - start

    def close(self) -> None:
        close_journal(self.journal)


def close_journal(journal: Journal) -> None:
    """Close every connection of ``journal`` (``Journal.close`` where the kit has it, else its one connection)."""
    closer: Callable[[], None] = getattr(journal, "close", journal.conn.close)
    closer()


def median_us(seconds: list[float], per: int = 1) -> float:
    """The median of ``seconds``, each divided by ``per``, in microseconds."""
    return statistics.median(s / per for s in seconds) * 1e6


def paired_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median of the ratios of rounds measured back to back, to two decimals.

    Both sides of one round saw the same moment of the machine (a neighbour's
    load, the disk's mood), so the median of per-round ratios moves less than
    a ratio of two medians.
    """
    return round(statistics.median(n / d for n, d in zip(numerators, denominators)), 2)


# --- the steps command -----------------------------------------------------------------------------------------

def measure_level(folder: Path, synchronous: str, settings: Settings) -> dict:
    """Per-step, per-workflow and replay figures at one ``synchronous`` level (fsyncs are counted apart)."""
    raw = RawFloor(folder / f"raw-{synchronous}.db", synchronous)
    kit = KitWorkflows(folder / f"kit-{synchronous}.db", synchronous)
    try:
        per_step = {}
        for steps in settings.step_counts:
            raw_s, kit_s = [], []
            for _ in range(max(settings.rounds, settings.steps_per_series // steps)):
                raw_s.append(raw.commit_rows(steps))
                kit_s.append(kit.run(steps))
            per_step[str(steps)] = {"kit_us": round(median_us(kit_s, steps), 1),
                                    "raw_us": round(median_us(raw_s, steps), 1), "ratio": paired_ratio(kit_s, raw_s)}
        batch = settings.workflow_batch
        commit_s, one_s, three_s = [], [], []
        for _ in range(settings.workflow_rounds):  # each figure of a round: the mean of a batch back to back
            commit_s.append(raw.commit_rows(batch) / batch)
            one_s.append(sum(kit.run(1) for _ in range(batch)) / batch)
            three_s.append(sum(kit.run(3) for _ in range(batch)) / batch)
        commit_us, one_us, three_us = median_us(commit_s), median_us(one_s), median_us(three_s)
        workflow_id, lease = kit.finished_steps_under_lease(settings.replay_steps)
        replay_s = [kit.replay(workflow_id, lease, settings.replay_steps) for _ in range(settings.replay_samples)]
    finally:
        raw.close()
        kit.close()
    return {
        "per_step": per_step,
        "per_workflow": {"raw_commit_us": round(commit_us, 1),
                         "one_step_us": round(one_us, 1), "one_step_ratio": paired_ratio(one_s, commit_s),
                         "three_step_us": round(three_us, 1), "three_step_ratio": paired_ratio(three_s, commit_s)},
        "replay": {"steps": settings.replay_steps, "samples": settings.replay_samples,
                   "us_per_step": round(median_us(replay_s, settings.replay_steps), 2)},
    }


def measure(settings: Settings = Settings(), levels: tuple[str, ...] = LEVELS) -> dict:
    """The ``steps`` command: every figure at every level, fsync counts first (their children run in parallel)."""
    with tempfile.TemporaryDirectory(prefix="durable-kit-bench-") as tmp:
        fsyncs = count_fsyncs(Path(tmp), levels, settings.fsync_steps, settings.fsync_workflows)
        by_level = {level: {**measure_level(Path(tmp), level, settings), "fsyncs": fsyncs[level]} for level in levels}
    return {"command": "steps", "kit": str(PACKAGE_ROOT / "durable_kit"), "sqlite": sqlite3.sqlite_version,
            "settings": asdict(settings), "levels": by_level}


# --- fsyncs, counted by strace in a child process --------------------------------------------------------------

FSYNC_PHASES = ("open_only", "steps", "one_step_workflows", "raw_commits")


def count_fsyncs(folder: Path, levels: tuple[str, ...], steps: int, workflows: int) -> dict[str, dict]:
    """Per level: fsync plus fdatasync calls per step, per 1-step workflow and per raw commit, or null and why.

    Each phase is one child process under ``strace -f -c``, on its own journal
    and raw database, created by the parent (their schema is not counted):
    ``steps`` runs one workflow of ``steps`` steps, ``one_step_workflows`` runs
    ``workflows`` 1-step workflows, ``raw_commits`` makes ``steps`` raw commits,
    and ``open_only`` opens both files and does nothing (what every other count
    includes). Counts do not depend on timing, so the children run at the same time.
    """
    strace = shutil.which("strace")
    if strace is None:
        return {level: unavailable("strace is not on PATH") for level in levels}
    children = {}
    for level in levels:
        for phase in FSYNC_PHASES:
            journal_path, raw_path = folder / f"fsync-kit-{level}-{phase}.db", folder / f"fsync-raw-{level}-{phase}.db"
            close_journal(Journal(journal_path, level))
            RawFloor(raw_path, level).close()
            out = folder / f"strace-{level}-{phase}.txt"
            command = [strace, "-f", "-c", "-o", str(out), "-e", "trace=fsync,fdatasync",
                       sys.executable, "-m", "durable_kit.bench", "_fsync_child", phase, "--synchronous", level,
                       "--journal", str(journal_path), "--raw", str(raw_path),
                       "--steps", str(steps), "--workflows", str(workflows)]
            children[level, phase] = (out, subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment()))
    counts: dict[tuple[str, str], int | str] = {}
    for key, (out, child) in children.items():
        stdout, stderr = child.communicate(timeout=300)
        if child.returncode != 0 or not out.exists():
            counts[key] = failure(child.returncode, stderr)
        elif stdout.strip() != str(PACKAGE_ROOT / "durable_kit"):
            counts[key] = f"the traced child measured {stdout.strip() or 'nothing'}, not {PACKAGE_ROOT / 'durable_kit'}"
        else:
            counts[key] = strace_calls(out)
    result = {}
    for level in levels:
        problem = next((c for (lvl, _), c in counts.items() if lvl == level and isinstance(c, str)), None)
        if problem:
            result[level] = unavailable(problem)
            continue
        base = counts[level, "open_only"]
        result[level] = {"per_step": round(counts[level, "steps"] / steps, 2),
                         "per_one_step_workflow": round(counts[level, "one_step_workflows"] / workflows, 2),
                         "per_raw_commit": round(counts[level, "raw_commits"] / steps, 2),
                         "open_only": base, "steps": steps, "workflows": workflows, "reason": None}
    return result


def unavailable(reason: str) -> dict:
    return {"per_step": None, "per_one_step_workflow": None, "per_raw_commit": None, "reason": reason}


def failure(returncode: int, stderr: str) -> str:
    """A one-line reason from a failed traced child (for example ptrace not permitted)."""
    lines = [line for line in stderr.splitlines() if line.strip() and "attached" not in line]
    return f"strace failed (exit {returncode}): {lines[-1].strip() if lines else 'no message'}"[:200]


def strace_calls(summary: Path) -> int:
    """fsync plus fdatasync calls in an ``strace -c`` summary (a process that made none has no row)."""
    calls = 0
    for line in summary.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in ("fsync", "fdatasync"):
            calls += int(parts[3])
    return calls


def child_environment() -> dict[str, str]:
    """This environment with the measured copy of the kit first on the import path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    return env


def fsync_child(argv: list[str]) -> None:
    """One traced phase: open the journal and the raw database, do the phase's work, print the kit's folder."""
    parser = argparse.ArgumentParser(prog="python -m durable_kit.bench _fsync_child")
    parser.add_argument("phase", choices=FSYNC_PHASES)
    parser.add_argument("--synchronous", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--raw", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--workflows", type=int, required=True)
    args = parser.parse_args(argv)
    kit, raw = KitWorkflows(args.journal, args.synchronous), RawFloor(args.raw, args.synchronous)
    if args.phase == "steps":
        kit.run(args.steps)
    elif args.phase == "one_step_workflows":
        for _ in range(args.workflows):
            kit.run(1)
    elif args.phase == "raw_commits":
        raw.commit_rows(args.steps)
    kit.close()
    raw.close()
    print(PACKAGE_ROOT / "durable_kit")


# --- the compare command ---------------------------------------------------------------------------------------

class DbosWorkflows:
    """Whole DBOS workflows of trivial steps on a SQLite system database (``graduate.engine``'s configuration)."""

    _workflow = None  # DBOS registers a workflow name once per process

    def __init__(self, path: Path):
        from dbos import DBOS

        from .workshop.graduate import engine

        if DbosWorkflows._workflow is None:
            @DBOS.step(name="bench_compare_step")
            def step(i: int) -> dict:
                return {"i": i}

            @DBOS.workflow(name="bench_compare_steps")
            def steps_workflow(steps: int) -> int:
                for i in range(steps):
                    step(i)
                return steps

            DbosWorkflows._workflow = steps_workflow
        self.path, self.engine = path, engine
        engine.launch(engine.sqlite_url(path))

    def run(self, steps: int) -> float:
        """Seconds for one DBOS workflow of ``steps`` steps, called in this thread, start to finish."""
        start = time.perf_counter()
        DbosWorkflows._workflow(steps)
        return time.perf_counter() - start

    def close(self) -> None:
        self.engine.shutdown()


class LangGraphWorkflows:
    """Whole LangGraph runs on ``SqliteSaver``: one node looping ``steps`` times, each step checkpointed (sync)."""

    def __init__(self, path: Path):
        from typing import TypedDict

        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph

        state = TypedDict("BenchState", {"i": int, "steps": int, "output": dict})

        def step(values: dict) -> dict:
            return {"i": values["i"] + 1, "output": {"i": values["i"]}}

        graph = StateGraph(state)
        graph.add_node("step", step)
        graph.add_edge(START, "step")
        graph.add_conditional_edges("step", lambda values: END if values["i"] >= values["steps"] else "step")
        self.path = path
        self.conn = sqlite3.connect(str(path), check_same_thread=False)
        self.app = graph.compile(checkpointer=SqliteSaver(self.conn))
        self.threads = 0

    def run(self, steps: int) -> float:
        """Seconds for one new thread's run of ``steps`` steps with ``durability="sync"``, start to finish."""
        self.threads += 1
        config = {"configurable": {"thread_id": f"bench-{self.threads}"}, "recursion_limit": steps + 10}
        start = time.perf_counter()
        final = self.app.invoke({"i": 0, "steps": steps, "output": {}}, config, durability="sync")
        elapsed = time.perf_counter() - start
        if final["i"] != steps:
            raise RuntimeError(f"LangGraph ran {final['i']} steps, not {steps}")
        return elapsed

    def close(self) -> None:
        self.conn.close()


class RawRuns:
    """The raw floor with the engines' interface: ``run(steps)`` is ``steps`` INSERT+COMMIT transactions."""

    def __init__(self, path: Path):
        self.floor = RawFloor(path, "FULL")
        self.path = path

    def run(self, steps: int) -> float:
        """Seconds for ``steps`` INSERT+COMMIT transactions."""
        return self.floor.commit_rows(steps)

    def close(self) -> None:
        self.floor.close()


ENGINES = {  # name: (its settings, as a row shows them; what runs it, built on one new database file)
    "raw": ("WAL, synchronous=FULL", RawRuns),
    "kit": ("Journal defaults: WAL, synchronous=FULL", KitWorkflows),
    "dbos": ("DBOS on a SQLite system database, graduate.engine settings", DbosWorkflows),
    "langgraph": ('SqliteSaver, durability="sync"', LangGraphWorkflows),
}


def installed(engine: str) -> bool:
    """True if ``engine`` can run here: raw SQLite and the kit always, DBOS and LangGraph with their extra."""
    return engine == "raw" or available(engine)


def compare(step_counts: tuple[int, ...] = (100,), rounds: int = 5, workflow_rounds: int = 20) -> dict:
    """The same workflows on raw SQLite, the kit, DBOS and LangGraph, in alternating rounds; medians.

    Each ratio is the median of per-round ratios (``paired_ratio``).

    Per step: one whole workflow of N trivial steps divided by N (raw: N
    INSERT+COMMIT). Per workflow: one whole 1-step workflow (raw: one
    INSERT+COMMIT). Each engine runs at its own defaults, noted in its row.
    """
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="durable-kit-compare-") as tmp:
        runners = {}
        try:
            for name, (setting, make) in ENGINES.items():
                rows[name] = {"engine": name, "setting": setting}
                if not installed(name):
                    rows[name]["skipped"] = f"{name} is not installed: {INSTALL}"
                    continue
                runners[name] = make(Path(tmp) / f"{name}.sqlite")
            per_step = {steps: {name: [] for name in runners} for steps in step_counts}
            per_workflow: dict[str, list[float]] = {name: [] for name in runners}
            for _ in range(rounds):
                for steps in step_counts:
                    for name, runner in runners.items():
                        per_step[steps][name].append(runner.run(steps))
            for _ in range(workflow_rounds):
                for name, runner in runners.items():
                    per_workflow[name].append(runner.run(1))
        finally:
            for runner in runners.values():
                runner.close()
        for name, runner in runners.items():
            rows[name]["journal_mode"] = journal_mode(runner.path)
    for name in runners:
        rows[name]["per_step_us"] = {str(n): round(median_us(per_step[n][name], n), 1) for n in step_counts}
        rows[name]["per_workflow_us"] = round(median_us(per_workflow[name]), 1)
    for name in runners:
        for base in ("raw", "kit"):
            if base in runners:
                rows[name][f"per_step_vs_{base}"] = {str(n): paired_ratio(per_step[n][name], per_step[n][base])
                                                     for n in step_counts}
                rows[name][f"per_workflow_vs_{base}"] = paired_ratio(per_workflow[name], per_workflow[base])
    return {"command": "compare", "kit": str(PACKAGE_ROOT / "durable_kit"), "step_counts": list(step_counts),
            "rounds": rounds, "workflow_rounds": workflow_rounds, "engines": list(rows.values())}


def journal_mode(path: Path) -> str | None:
    """The journal mode recorded in an SQLite file (``wal`` persists in the file), read after the engine closed."""
    if not path.exists():
        return None
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()


# --- workers ---------------------------------------------------------------------------------------------------

def measure_workers(counts=(1, 2, 4, 8), workflows: int = 200) -> dict:
    """Steps per second with 1, 2, 4 and 8 worker processes on one database, and what went wrong (nothing, we hope)."""
    from .workshop.agents.shared_work import contention

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


# --- output ----------------------------------------------------------------------------------------------------

def table(headers: list[str], rows: list[list]) -> str:
    """``rows`` under ``headers``: columns of numbers right-aligned, others left-aligned; None shows as "-"."""
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) for i in range(len(headers))]
    cells = [headers] + [["-" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(cell.rjust(width) if right else cell.ljust(width)
                                for cell, width, right in zip(row, widths, numeric)).rstrip() for row in cells)


def steps_report(result: dict) -> str:
    """The ``steps`` result as three small tables, under the measured kit's folder (relative to here where it can be)."""
    levels = result["levels"].items()
    per_step = table(["sync", "N", "kit µs/step", "raw µs/step", "kit/raw"],
                     [[level, int(n), row["kit_us"], row["raw_us"], row["ratio"]]
                      for level, figures in levels for n, row in figures["per_step"].items()])
    per_workflow = table(
        ["sync", "raw commit µs", "1-step wf µs", "/raw", "3-step wf µs", "/raw", "replay µs/step"],
        [[level, w["raw_commit_us"], w["one_step_us"], w["one_step_ratio"], w["three_step_us"], w["three_step_ratio"],
          figures["replay"]["us_per_step"]] for level, figures in levels for w in [figures["per_workflow"]]])
    fsyncs = table(["sync", "fsyncs/step", "fsyncs/1-step wf", "fsyncs/raw commit", "note"],
                   [[level, f["per_step"], f["per_one_step_workflow"], f["per_raw_commit"], f["reason"] or ""]
                    for level, figures in levels for f in [figures["fsyncs"]]])
    return f"{shown_path(result['kit'])} (SQLite {result['sqlite']})\n\n{per_step}\n\n{per_workflow}\n\n{fsyncs}"


def shown_path(path: str) -> str:
    """``path`` relative to the working directory if it lies below it or below its parent, else as it is.

    A report shows where the measured kit lives without printing the
    machine's own folders (the JSON keeps the whole path).
    """
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir + os.sep + os.pardir) else relative


def compare_report(result: dict) -> str:
    """The ``compare`` result as one table: µs per step for each N and per 1-step workflow, ratios to raw and kit."""
    counts = [str(n) for n in result["step_counts"]]
    headers = ["engine"] + [f"µs/step N={n}" for n in counts] + ["µs/workflow", "step/raw", "step/kit",
                                                                "wf/raw", "wf/kit", "journal", "setting"]
    rows = []
    for row in result["engines"]:
        if "skipped" in row:
            rows.append([row["engine"]] + [None] * (len(headers) - 2) + [row["skipped"]])
            continue
        last = counts[-1]
        rows.append([row["engine"], *(row["per_step_us"][n] for n in counts), row["per_workflow_us"],
                     row.get("per_step_vs_raw", {}).get(last), row.get("per_step_vs_kit", {}).get(last),
                     row.get("per_workflow_vs_raw"), row.get("per_workflow_vs_kit"), row["journal_mode"],
                     row["setting"]])
    return table(headers, rows) + f"\n(step ratios at N={counts[-1]}; journal: the journal mode left in the file)"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_fsync_child"]:
        fsync_child(argv[1:])
        return
    parser = argparse.ArgumentParser(prog="python -m durable_kit.bench", description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", default="steps", choices=["steps", "compare", "workers"],
                        help="steps (default): the kit against raw SQLite; compare: the kit, DBOS and LangGraph; "
                             "workers: 1 to 8 workers sharing one database")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and smaller replays: a few seconds")
    parser.add_argument("--steps", help="comma-separated step counts N (steps: 10,100,1000; compare: 100)")
    parser.add_argument("--rounds", type=int, help="rounds per N (steps: 7; compare: 5)")
    parser.add_argument("--workflow-rounds", type=int, help="rounds of whole 1-step workflows (steps: 50; compare: 20)")
    parser.add_argument("--levels", default=",".join(LEVELS), help="steps: synchronous levels, comma-separated")
    parser.add_argument("--workflows", type=int, default=200, help="workers: how many workflows (3 steps each)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    step_counts = tuple(int(n) for n in args.steps.split(",")) if args.steps else None
    if args.what == "steps":
        settings = QUICK if args.quick else Settings()
        settings = replace(settings, step_counts=step_counts or settings.step_counts,
                           rounds=args.rounds or settings.rounds,
                           workflow_rounds=args.workflow_rounds or settings.workflow_rounds)
        result = measure(settings, tuple(level.strip().upper() for level in args.levels.split(",")))
        report = steps_report
    elif args.what == "compare":
        result = compare(step_counts or ((20,) if args.quick else (100,)),
                         args.rounds or (2 if args.quick else 5), args.workflow_rounds or (3 if args.quick else 20))
        report = compare_report
    else:
        result = measure_workers(workflows=args.workflows)
        report = lambda r: "\n".join(f"{key:>24}: {value}" for key, value in r.items())  # noqa: E731
    print(json.dumps(result) if args.json else report(result))


if __name__ == "__main__":
    main()
