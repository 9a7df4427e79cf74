"""Notebook 06: many workers, one database. Who runs each step, and how often?

The ``shared_work`` workflow has a few slow steps; each execution of a step is
recorded in the ledger as an ``activity`` call the moment it starts, so a step
that runs twice (on two workers, or again after a takeover) is counted twice
even if one of them never commits.

The scenarios run real worker processes (``python -m durable_kit worker``)
against one database and return one row each, with the keys
``scenario, workers, workflows, activity_runs, duplicate_runs,
stale_writes_rejected, takeover_seconds``.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ... import Journal, Workflow, workflow
from ...world.ledger import Ledger, ledger_path


@workflow("shared_work", inputs={"steps": int})
def shared_work(wf: Workflow) -> dict:
    """``steps`` steps, each recorded as it starts and then ``seconds`` long.

    With ``gate`` in the input (a folder), each step waits after it starts until
    ``open_gate`` opened it, so a demo can hold a step until other processes
    reach a given point, however slow the machine.
    """
    ledger = ledger_beside(wf.db_path)

    def work(number: int) -> dict:
        ledger.record("activity", f"work:{number}", wf.id)
        if wf.input.get("gate"):  # a held step waits for the notebook to open it: an event, not a time
            opened = Path(wf.input["gate"]) / f"{wf.id}-work-{number}"
            while not opened.exists():
                time.sleep(0.02)
        time.sleep(wf.input["seconds"])
        return {"step": number}

    for number in range(1, wf.input["steps"] + 1):
        wf.execute_step(f"work:{number}", lambda n=number: work(n))
    return {"steps": wf.input["steps"]}


_LEDGERS: dict[Path, tuple[int, Ledger]] = {}


def ledger_beside(db_path: str | Path) -> Ledger:
    """The ledger beside the journal, opened once per process: a worker runs many of these workflows.

    Closing the last connection to a WAL database checkpoints it, so opening and
    closing the ledger on every replay cost every workflow a checkpoint. A ledger
    file replaced since it was opened (a folder reset) is opened again.
    """
    path = ledger_path(db_path)
    inode = path.stat().st_ino if path.exists() else None
    if path not in _LEDGERS or _LEDGERS[path][0] != inode:
        ledger = Ledger(path)
        _LEDGERS[path] = (path.stat().st_ino, ledger)
    return _LEDGERS[path][1]


def start_work(db: str | Path, workflows: int, steps: int, seconds: float, held: tuple[str, ...] = ()) -> list[str]:
    """Start ``workflows`` shared_work workflows (ids w001, w002, ...); return their ids.

    The steps of the workflows named in ``held`` wait until ``open_gate`` opens them.
    """
    journal = Journal(db)
    gate = {"gate": str(gate_folder(db))} if held else {}  # the folder only when some step is held
    ids = [journal.start("shared_work", {"steps": steps, "seconds": seconds,
                                         **(gate if f"w{n:03d}" in held else {})}, f"w{n:03d}")
           for n in range(1, workflows + 1)]
    journal.close()
    return ids


def gate_folder(db: str | Path) -> Path:
    """Where the held steps of the workflows in ``db`` look for their opened gates."""
    folder = Path(db).with_suffix(".gates")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def open_gate(db: str | Path, workflow_id: str, *steps: int) -> None:
    """Let the held steps ``steps`` of ``workflow_id`` go on, in every process that runs them."""
    for number in steps:
        (gate_folder(db) / f"{workflow_id}-work-{number}").touch()


def step_starts(db: str | Path, workflow_id: str, step: str) -> int:
    """How many times ``step`` of ``workflow_id`` has started, in any process (from the ledger)."""
    ledger = Ledger.beside(db)
    count = sum(1 for c in ledger.calls("activity") if (c["workflow_id"], c["operation"]) == (workflow_id, step))
    ledger.close()
    return count


def race(db: str | Path, *options: str, workflows: int = 3, on_start: Callable[[], None] | None = None
         ) -> dict[str, tuple[int, int, str, str]]:
    """Worker A starts on ``workflows`` workflows (three steps of 0.6 s); worker B starts once A runs a step.

    w001 is held: without leases (``--no-leases`` in ``options``) each of its
    steps goes on only once both workers have started it, so both run every
    step of it on any machine; with leases, once B has started a step of its own.
    ``on_start`` is called once the workflows exist, before the workers start.
    Returns, per worker ("A", "B"): its pid, exit code, stdout and stderr.
    """
    start_work(db, workflows=workflows, steps=3, seconds=0.6, held=("w001",))
    if on_start:
        on_start()
    a = popen_worker(db, "--until-idle", *options)
    wait_until(lambda: activity_runs(db)[0] >= 1, what="worker A's first step")
    b = popen_worker(db, "--until-idle", *options)
    if "--no-leases" in options:
        for number in (1, 2, 3):
            wait_until(lambda: step_starts(db, "w001", f"work:{number}") >= 2, what=f"both workers in work:{number}")
            open_gate(db, "w001", number)
    else:
        wait_until(lambda: activity_runs(db)[0] >= 2, what="worker B's first step")
        open_gate(db, "w001", 1, 2, 3)
    logs = {label: worker.communicate(timeout=120) for label, worker in (("A", a), ("B", b))}
    return {label: (worker.pid, worker.returncode, *logs[label]) for label, worker in (("A", a), ("B", b))}


def popen_worker(db: str | Path, *options: str) -> subprocess.Popen:
    """One worker in a new process; its log goes to a pipe."""
    return subprocess.Popen([sys.executable, "-m", "durable_kit", "worker", "--db", str(db), "--poll", "0.05",
                             *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until(condition: Callable[[], bool], timeout: float = 60.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:g} s")
        time.sleep(0.02)


def activity_runs(db: str | Path) -> tuple[int, int]:
    """(step executions started, executions beyond the first of each step), from the ledger."""
    ledger = Ledger.beside(db)
    runs = [(c["workflow_id"], c["operation"]) for c in ledger.calls("activity")]
    ledger.close()
    return len(runs), len(runs) - len(set(runs))


def all_complete(db: str | Path) -> bool:
    journal = Journal(db)
    try:
        return journal.conn.execute("SELECT COUNT(*) FROM workflows WHERE status != 'complete'").fetchone()[0] == 0
    finally:
        journal.close()


def count_events(db: str | Path, event: str) -> int:
    journal = Journal(db)
    try:
        return journal.conn.execute("SELECT COUNT(*) FROM history WHERE event = ?", (event,)).fetchone()[0]
    finally:
        journal.close()


def finish(*workers: subprocess.Popen) -> list[str]:
    """Stop the workers that are still running (SIGTERM) and return everything they wrote to stderr."""
    errors = []
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=30)
        errors.append(stderr)
    return errors


def row(scenario: str, db: Path, workers: int, workflows: int, takeover: float | None = None) -> dict:
    runs, duplicates = activity_runs(db)
    return {"scenario": scenario, "workers": workers, "workflows": workflows, "activity_runs": runs,
            "duplicate_runs": duplicates, "stale_writes_rejected": count_events(db, "stale_write_refused"),
            "takeover_seconds": None if takeover is None else round(takeover, 2)}


def two_workers(folder: str | Path, leases: bool, workflows: int = 3, steps: int = 3, seconds: float = 0.3) -> dict:
    """Worker A starts; once it runs a step, worker B starts. Without leases B takes back what A is running."""
    db = Path(folder) / ("leases.db" if leases else "no_leases.db")
    start_work(db, workflows, steps, seconds)
    options = ("--until-idle",) if leases else ("--until-idle", "--no-leases")
    first = popen_worker(db, *options)
    wait_until(lambda: activity_runs(db)[0] >= 1, what="worker A's first step")
    second = popen_worker(db, *options)
    errors = [worker.communicate(timeout=60)[1] for worker in (first, second)]
    if not all_complete(db) or any("Traceback" in e for e in errors):
        raise RuntimeError(f"two_workers(leases={leases}) did not finish cleanly:\n" + "\n".join(errors))
    return row("leases" if leases else "no_leases", db, 2, workflows)


def sigkill_takeover(folder: str | Path, lease_seconds: float = 1.0, steps: int = 3, seconds: float = 0.4) -> dict:
    """Kill the owner mid-step; a second worker takes over when the lease expires. Returns the takeover time."""
    db = Path(folder) / "sigkill.db"
    start_work(db, 1, steps, seconds)
    options = ("--lease-seconds", str(lease_seconds), "--expiry-only")
    owner = popen_worker(db, *options)
    wait_until(lambda: activity_runs(db)[0] >= 2, what="the owner's second step")
    standby = popen_worker(db, *options)
    owner.kill()
    killed_at = time.time()
    owner.communicate()
    wait_until(lambda: all_complete(db), what="the takeover")
    finish(standby)
    journal = Journal(db)
    (recovered_at,) = [e["at"] for e in journal.history("w001") if e["event"] == "recovered"]
    journal.close()
    return row("sigkill_takeover", db, 2, 1, recovered_at - killed_at)


def sigstop_fencing(folder: str | Path, lease_seconds: float = 0.6, steps: int = 2, seconds: float = 0.8) -> dict:
    """Pause the owner past its lease; another worker takes over and finishes; the woken owner's write is refused."""
    db = Path(folder) / "sigstop.db"
    start_work(db, 1, steps, seconds)
    options = ("--lease-seconds", str(lease_seconds))
    owner = popen_worker(db, "--until-idle", *options)
    wait_until(lambda: activity_runs(db)[0] >= 1, what="the owner's first step")
    owner.send_signal(signal.SIGSTOP)
    stopped_at = time.time()
    standby = popen_worker(db, *options)
    wait_until(lambda: all_complete(db), what="the takeover")
    owner.send_signal(signal.SIGCONT)
    owner_log, owner_errors = owner.communicate(timeout=30)
    finish(standby)
    journal = Journal(db)
    (recovered_at,) = [e["at"] for e in journal.history("w001") if e["event"] == "recovered"]
    journal.close()
    if "lease lost" not in owner_log:
        raise RuntimeError(f"the paused owner did not report its lost lease:\n{owner_log}\n{owner_errors}")
    return row("sigstop_fencing", db, 2, 1, recovered_at - stopped_at)


def run_all(folder: str | Path) -> list[dict]:
    """The four demonstrations of notebook 06, in order."""
    return [two_workers(folder, leases=False), two_workers(folder, leases=True),
            sigkill_takeover(folder), sigstop_fencing(folder)]


def contention(folder: str | Path, workers: int, workflows: int = 200, steps: int = 3) -> dict:
    """``workers`` processes on ``workflows`` workflows of instant steps: throughput, duplicates, busy errors."""
    db = Path(folder) / f"contention-{workers}.db"
    start_work(db, workflows, steps, 0.0)
    procs = [popen_worker(db, "--until-idle") for _ in range(workers)]
    outcomes = [(p.communicate(timeout=600), p.returncode) for p in procs]
    runs, duplicates = activity_runs(db)
    ledger = Ledger.beside(db)  # from the first step's start to the last one's: process start-up is not counted
    first, last = ledger.conn.execute("SELECT MIN(at), MAX(at) FROM calls").fetchone()
    ledger.close()
    elapsed = max(last - first, 1e-9)
    busy = sum("locked" in stderr or "busy" in stderr for (_, stderr), _ in outcomes)
    failed = sum(code != 0 for _, code in outcomes)
    return {"workers": workers, "workflows": workflows, "steps": workflows * steps, "complete": all_complete(db),
            "steps_per_second": round(runs / elapsed, 1), "duplicate_runs": duplicates,
            "busy_errors": busy, "failed_workers": failed}


def executions(db: str | Path, who: dict[int, str]):
    """Per step: how often it started (the ledger), in which processes (``who``: pid to name), and whether the
    journal stored an output. A pandas DataFrame (pandas is imported here only, not by the workflow)."""
    import pandas as pd

    runs: dict[str, list[str]] = {}
    ledger, journal = Ledger.beside(db), Journal(db)
    for call in ledger.calls("activity"):
        runs.setdefault(f"{call['workflow_id']}/{call['operation']}", []).append(who.get(call["pid"], "?"))
    stored = {row["step"]: row["stored"] for row in journal.conn.execute(
        "SELECT workflow_id || '/' || name AS step, status = 'complete' AS stored FROM steps")}
    ledger.close()
    journal.close()
    return pd.DataFrame([{"step": step, "executions": len(by), "by": ", ".join(sorted(by)),
                          "stored": stored.get(step, 0)} for step, by in sorted(runs.items())])


def history(db: str | Path, who: dict[int, str], workflow_id: str = "w001"):
    """The workflow's history, each event with the process that wrote it (owner names, which hold a host name
    and a pid, left out). A pandas DataFrame."""
    import re

    import pandas as pd

    journal = Journal(db)
    table = pd.DataFrame(journal.history(workflow_id))
    journal.close()
    table["by"] = table["pid"].map(lambda pid: who.get(pid, "notebook"))
    table["detail"] = table["detail"].fillna("").map(lambda text: re.sub(r"by token (\d+) \([^)]*\)",
                                                                         r"by token \1", text))
    return table[["seq", "by", "step", "event", "detail"]].fillna("")
