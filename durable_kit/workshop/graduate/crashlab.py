"""The kit's crash experiments run against both engines, in real processes, counted at the same destinations.

Every crash is a child process that ends by ``os._exit(13)`` (or SIGKILL) at
a named point; every restart is a new process. The kit's side is run through
its own command line (``python -m durable_kit ...``), the port's through
``python -m durable_kit.workshop.graduate ...``; the fake model, payment service and
notifier are the kit's on both sides, so the counts mean the same thing.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..agents.refunds import CRASH_POINTS
from ...world.notifier import Notifier
from ...world.payments import Payments
from ...core.journal import Journal
from ...world.ledger import Ledger
from .agents import PORTED_STRATEGIES
from .engine import client, sqlite_url, step_rows, workflow_rows

TOPIC = "supplier concentration risk"
RESEARCH_POINTS = {  # a label a learner reads -> the same named point on both engines
    "research done, not recorded": "after_activity:research:single sourcing",
    "analysis recorded": "after_commit:analyze",
    "report done, not recorded": "after_activity:report",
}
DBOS_STATUS = {"SUCCESS": "complete", "ERROR": "failed", "PENDING": "pending"}


def prepared(folder: str | Path) -> Path:
    """The folder as an absolute path (workflow inputs must name files any process can find), created if needed."""
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def child(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m MODULE ARGS`` in a new interpreter and wait for it."""
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout)


def checked(process: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    """Return ``process`` if it exited 0; otherwise raise with its stderr, saying which run failed."""
    if process.returncode != 0:
        raise RuntimeError(f"{what} exited with {process.returncode}:\n{process.stderr[-2000:]}")
    return process


def crash_and_restart(url: str, workflow: str, workflow_id: str, inputs: dict, point: str) -> int:
    """Start the workflow in a child armed to die at ``point``, recover it in a second child; the crash's exit code."""
    crashed = child("durable_kit.workshop.graduate", "run", "--db", url, "--start", workflow, "--id", workflow_id,
                    "--input", json.dumps(inputs), "--crash-at", point)
    checked(child("durable_kit.workshop.graduate", "run", "--db", url, "--until", "done"), f"the restart after {point}")
    return crashed.returncode


def dbos_status(url: str, workflow_id: str) -> str:
    """The workflow's status in the kit's words (complete, failed, pending)."""
    status = next(r["status"] for r in workflow_rows(url) if r["id"] == workflow_id)
    return DBOS_STATUS.get(status, status.lower())


# --- The research agent: a crash at three step boundaries ---

def kit_research_cell(folder: Path, label: str, point: str) -> dict:
    """The kit's research_report killed at ``point`` and restarted by a second worker."""
    db = folder / f"kit-research-{list(RESEARCH_POINTS).index(label)}.db"
    checked(child("durable_kit", "start", "--db", str(db), "--kind", "research_report", "--topic", TOPIC,
                  "--id", "report-1"), "kit start")
    checked(child("durable_kit", "arm", "--db", str(db), "--point", point, "--action", "exit"), "kit arm")
    crashed = child("durable_kit", "worker", "--db", str(db), "--until-idle")
    checked(child("durable_kit", "worker", "--db", str(db), "--until-idle"), f"kit restart after {point}")
    journal, ledger = Journal(db), Ledger.beside(db)
    try:
        return {"exit_code": crashed.returncode, "model_calls": ledger.count("model", "report-1"),
                "steps_stored": sum(s["status"] == "complete" for s in journal.steps("report-1")),
                "status": journal.workflow("report-1")["status"]}
    finally:
        journal.close(), ledger.close()


def dbos_research_cell(folder: Path, label: str, point: str) -> dict:
    """The ported research_report killed at the same ``point`` and recovered by a new process."""
    base = folder / f"dbos-research-{list(RESEARCH_POINTS).index(label)}"
    url, world = sqlite_url(base.with_suffix(".dbos.sqlite")), str(base.with_suffix(".db"))
    exit_code = crash_and_restart(url, "research_report", "report-1", {"topic": TOPIC, "world": world}, point)
    ledger = Ledger.beside(world)
    try:
        steps = [s for s in step_rows(url, "report-1") if s["output"] is not None and "." not in s["name"]]
        return {"exit_code": exit_code, "model_calls": ledger.count("model", "report-1"),
                "steps_stored": len(steps), "status": dbos_status(url, "report-1")}
    finally:
        ledger.close()


def research_crash_table(folder: str | Path, labels=tuple(RESEARCH_POINTS), parallel: int = 4) -> list[dict]:
    """Each research crash point on both engines; one row per point, the kit's and DBOS's counts side by side."""
    folder = prepared(folder)
    points = {label: RESEARCH_POINTS[label] for label in labels}
    cells = [(side, label, point) for label, point in points.items() for side in ("kit", "dbos")]
    run = {"kit": kit_research_cell, "dbos": dbos_research_cell}
    with ThreadPoolExecutor(max_workers=parallel) as pool:  # each cell is its own processes and databases
        results = list(pool.map(lambda cell: run[cell[0]](folder, cell[1], cell[2]), cells))
    return [side_by_side({"crash": label, "point": point}, results[2 * i], results[2 * i + 1])
            for i, (label, point) in enumerate(points.items())]


def side_by_side(key: dict, kit: dict, dbos: dict) -> dict:
    """One row: the key, then each count as ``kit_<name>`` and ``dbos_<name>``, then whether all counts match."""
    row = dict(key)
    for name in kit:
        row[f"kit_{name}"], row[f"dbos_{name}"] = kit[name], dbos[name]
    row["same_counts"] = all(kit[n] == dbos[n] for n in kit if n not in ("exit_code", "status"))
    return row


def paired(rows: list[dict], key_columns: list[str], counts: dict[str, str]) -> list[dict]:
    """Rows for reading: the key columns, then each count as ``"kit / DBOS"`` under a label, then whether all match."""
    return [{**{k: r[k] for k in key_columns},
             **{label: f"{r['kit_' + name]} / {r['dbos_' + name]}" for name, label in counts.items()},
             "same counts": r["same_counts"]} for r in rows]


# --- The refund agent: three strategies against the kit's four crash points ---

def kit_refund_rows(strategies=PORTED_STRATEGIES) -> dict:
    """The kit's crash matrix, read from its own demo command, keyed by (strategy, crash point)."""
    rows = json.loads(checked(child("durable_kit", "demo", "refunds", "--json"), "kit demo refunds").stdout)
    return {(r["strategy"], r["crash_point"]): r for r in rows if r["strategy"] in strategies}


def dbos_refund_cell(folder: Path, strategy: str, crash_point: str, order_id: str = "A-1001") -> dict:
    """One ported refund killed at ``crash_point`` and recovered; the counts at every destination."""
    base = folder / f"dbos-{strategy}-{crash_point}"
    url, world = sqlite_url(base.with_suffix(".dbos.sqlite")), str(base.with_suffix(".db"))
    workflow_id = f"refund-{order_id}"
    exit_code = crash_and_restart(url, "refund", workflow_id,
                                  {"order_id": order_id, "strategy": strategy, "world": world},
                                  CRASH_POINTS[crash_point])
    payments, notifier = Payments.beside(world), Notifier.beside(world)
    try:
        receipts = [s for s in step_rows(url, workflow_id) if s["name"] == "refund" and s["output"]]
        return {"exit_code": exit_code, "payment_calls": payments.request_count(),
                "refunds_at_destination": len(payments.refunds()), "receipts_stored": len(receipts),
                "notifications_delivered": notifier.count(), "status": dbos_status(url, workflow_id)}
    finally:
        payments.close(), notifier.close()


def refund_crash_table(folder: str | Path, strategies=PORTED_STRATEGIES, crash_points=tuple(CRASH_POINTS),
                       parallel: int = 4) -> list[dict]:
    """Every ported strategy against every crash point on DBOS, beside the kit's own counts for the same cell."""
    folder = prepared(folder)
    kit = kit_refund_rows(strategies)
    cells = [(strategy, point) for strategy in strategies for point in crash_points]
    with ThreadPoolExecutor(max_workers=parallel) as pool:  # the children mostly wait on DBOS's one-second polls
        dbos = list(pool.map(lambda cell: dbos_refund_cell(folder, *cell), cells))
    keys = ("payment_calls", "refunds_at_destination", "receipts_stored", "notifications_delivered", "status")
    rows = [side_by_side({"strategy": s, "crash_point": p}, {k: kit[(s, p)][k] for k in keys},
                         {k: d[k] for k in keys})
            for (s, p), d in zip(cells, dbos)]
    for row, d in zip(rows, dbos):  # the kit's demo reports no exit code; DBOS's crash is shown to be real
        row["dbos_exit_code"] = d["exit_code"]
    return rows


# --- A person's approval: the kit holds no process; DBOS holds a thread in a live one ---

def approval_run(folder: str | Path) -> dict:
    """The reviewed report on both engines: stop while waiting, approve with no process running, restart."""
    folder = prepared(folder)
    kit_db = folder / "kit-reviewed.db"
    checked(child("durable_kit", "start", "--db", str(kit_db), "--topic", TOPIC, "--id", "review-1"), "kit start")
    checked(child("durable_kit", "worker", "--db", str(kit_db), "--until-idle"), "kit worker")
    kit_waiting = Journal(kit_db).workflow("review-1")["status"]
    checked(child("durable_kit", "approve", "--db", str(kit_db), "--workflow", "review-1", "--by", "Dana",
                  "--comment", "sources are sound"), "kit approve")
    checked(child("durable_kit", "worker", "--db", str(kit_db), "--until-idle"), "kit worker after approval")

    url, world = sqlite_url(folder / "dbos-reviewed.dbos.sqlite"), str(folder / "dbos-reviewed.db")
    crashed = child("durable_kit.workshop.graduate", "run", "--db", url, "--start", "reviewed_report", "--id", "review-1",
                    "--input", json.dumps({"topic": TOPIC, "world": world}), "--crash-at", "waiting:approval")
    dbos_waiting = dbos_status(url, "review-1")
    dbos_client = client(url)
    try:  # no DBOS process runs now: the message is stored until the workflow receives it
        dbos_client.send("review-1", {"approved": True, "by": "Dana", "comment": "sources are sound"},
                         topic="approval")
    finally:
        dbos_client.destroy()
    checked(child("durable_kit.workshop.graduate", "run", "--db", url, "--until", "done"), "DBOS restart after approval")

    def counts(db: Path | str, status: str) -> dict:
        ledger, notifier = Ledger.beside(db), Notifier.beside(db)
        try:
            return {"model_calls": ledger.count("model", "review-1"), "notifications_delivered": notifier.count(),
                    "status": status}
        finally:
            ledger.close(), notifier.close()

    return {"kit": {"while_waiting": kit_waiting, "process_held": "none: the wait is a row",
                    **counts(kit_db, Journal(kit_db).workflow("review-1")["status"])},
            "dbos": {"while_waiting": dbos_waiting, "exit_code": crashed.returncode,
                     "process_held": "a thread in a live executor, until it exits",
                     **counts(world, dbos_status(url, "review-1"))}}


# --- Beyond one machine: two DBOS workers on PostgreSQL, one killed mid-run ---

def start_worker(url: str, executor_id: str, crash_at: str | None = None, *options: str) -> subprocess.Popen:
    """Start one queue worker and wait until it has launched (its migrations done, its queue registered)."""
    command = [sys.executable, "-m", "durable_kit.workshop.graduate", "worker", "--db", url, "--executor-id", executor_id,
               *options]
    if crash_at:
        command += ["--crash-at", crash_at, "--action", "kill"]
    worker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = worker.stdout.readline()
    if not line.startswith("ready"):
        worker.kill()
        raise RuntimeError(f"worker {executor_id} did not start:\n{worker.stderr.read()[-2000:]}")
    return worker


def wait_for(condition, what: str, timeout: float = 60.0) -> list[dict]:
    """Poll ``condition()`` (which returns rows or None) until it returns rows; raise if ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = condition()
        if rows is not None:
            return rows
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def stop(worker: subprocess.Popen) -> int:
    """Stop a worker with SIGTERM (it shuts DBOS down) and return its exit code."""
    if worker.poll() is None:
        worker.terminate()
    try:
        return worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        return worker.wait()


def kill_one_of_two(url: str, enqueue, crash_at: str, *options: str) -> dict:
    """Two workers on one queue; worker-1 is SIGKILLed at ``crash_at``; worker-1 restarts once worker-2 drained.

    ``enqueue(dbos_client)`` puts the work on the queue. worker-1 starts first
    and worker-2 joins once worker-1 has taken a workflow: with both polling
    from the start, worker-2 could take everything and worker-1 would never
    reach its crash. Returns worker-1's exit code, the workflows left pending
    once worker-2 had drained the queue, the final rows and the clean exits.
    """
    worker_1 = start_worker(url, "worker-1", crash_at, *options)
    worker_2 = restarted = None
    try:
        dbos_client = client(url, serializer="json" if "pydantic" not in options else None)
        try:
            enqueue(dbos_client)
        finally:
            dbos_client.destroy()

        def taken_by_worker_1() -> list[dict] | None:
            if worker_1.poll() is not None:  # it took one and died of it already
                return []
            rows = workflow_rows(url)
            return rows if any(r["executor_id"] == "worker-1" and r["status"] == "PENDING" for r in rows) else None

        wait_for(taken_by_worker_1, "worker-1 to take its first workflow")
        worker_2 = start_worker(url, "worker-2", None, *options)
        killed_exit = worker_1.wait(timeout=60)

        def drained() -> list[dict] | None:
            rows = workflow_rows(url)
            return rows if sum(r["status"] in ("PENDING", "ENQUEUED") for r in rows) <= 1 else None

        wait_for(drained, "worker-2 to drain the queue", timeout=120)
        time.sleep(2.0)  # give anyone the chance to pick up the dead worker's workflow: nobody does
        stranded = [r for r in workflow_rows(url) if r["status"] == "PENDING"]
        restarted = start_worker(url, "worker-1", None, *options)  # the same executor id recovers its pending work

        def all_done() -> list[dict] | None:
            rows = workflow_rows(url)
            return rows if all(r["status"] == "SUCCESS" for r in rows) else None

        final = wait_for(all_done, "worker-1's restart to recover its workflow", timeout=120)
    finally:
        exits = [stop(w) for w in (worker_2, restarted, worker_1) if w is not None]  # worker-1 is already dead
    stranded_ids = {r["id"] for r in stranded}
    return {"killed_worker_exit_code": killed_exit, "pending_after_drain": len(stranded),
            "stranded_on": sorted({r["executor_id"] for r in stranded}),
            "recovered_after_restart": sum(r["status"] == "SUCCESS" for r in final if r["id"] in stranded_ids),
            "complete": sum(r["status"] == "SUCCESS" for r in final), "final": final,
            "other_workers_stopped_cleanly": all(code == 0 for code in exits[:2])}


def two_workers(url: str, folder: str | Path, workflows: int = 6) -> dict:
    """Two workers share a queue of refunds on PostgreSQL; worker-1 is SIGKILLed after its first payment.

    Nothing is lost, worker-2 drains the rest of the queue, worker-1's
    workflow stays pending (no heartbeat tells anyone it died) until worker-1
    restarts with the same executor id: its launch puts the workflow back on
    DBOS's internal queue, and whichever worker polls first runs it. Each
    refund is paid once at the destination because its key names the workflow.
    """
    from dbos import EnqueueOptions

    world = str(prepared(folder) / "pg-world.db")

    def enqueue(dbos_client) -> None:
        for i in range(workflows):
            order_id = ("A-1001", "A-1003")[i % 2]  # both refunded without a person's approval
            options = EnqueueOptions(workflow_name="refund", queue_name="refunds", workflow_id=f"pg-refund-{i}")
            dbos_client.enqueue(options, order_id=order_id, strategy="destination_key", world=world)

    run = kill_one_of_two(url, enqueue, "after_send:refund")
    final = run.pop("final")
    payments, notifier = Payments.beside(world), Notifier.beside(world)
    try:
        return {"workflows": workflows, **run, "lost": workflows - len(final),
                "payment_calls": payments.request_count(), "refunds_at_destination": len(payments.refunds()),
                "notifications_delivered": notifier.count()}
    finally:
        payments.close(), notifier.close()
