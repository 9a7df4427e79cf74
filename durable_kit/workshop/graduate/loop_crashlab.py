"""The research loop killed at every boundary: on the kit, and as a framework agent on DBOS, counted at the destinations.

Each cell is real processes: a child that ends by ``os._exit(13)`` or SIGKILL
at a named point, then new processes that recover the run. The kit's side is
``research_loop_send`` (``kit_loop``) run by ``python -m durable_kit worker``;
the frameworks' are the Pydantic AI agent (``pydantic_loop``, columns
``framework_*``) and the OpenAI Agents SDK agent (``openai_loop``, columns
``openai_*``), each run by ``python -m durable_kit.workshop.graduate loop``. All use
the same script, filings, call ledger and notifier, so the counts mean the
same thing:

* ``model_calls``: answered model calls in the ledger (a clean run makes 8);
* ``source_calls``: searches and passage reads that reached the filing source (4);
* ``deliveries`` and ``send_requests``: answers the requester received, and
  send requests that reached the notifier (a repeat deduplicated by its key
  is a request, not a delivery);
* ``answer``: whether the delivered answer is the clean run's, word for word.

The person's answer is given while no process runs: on the kit once the
workflow waits (``durable_kit answer``); on DBOS right after the start
(``DBOS.send`` keeps it until ``ask_user`` receives it).
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...core.journal import Journal
from ...world.ledger import Ledger
from ...world.notifier import Notifier
from .crashlab import checked, child, prepared
from .engine import client, sqlite_url

CASE = "three_companies"
ANSWER = "FY2025, the latest filings"
WORKFLOW_ID = "loop-1"
KIT_MODULE = "durable_kit.workshop.graduate.kit_loop"

# label -> (the kit's point, the framework's point, how the process ends). None: no crash on that side.
BOUNDARIES = {
    "no crash": (None, None, "exit"),
    "inside a tool call (search answered, not recorded)": ("after_activity:turn:1:search",
                                                           "after_activity:turn:1:search", "kill"),
    "after a tool call, before the next model request": ("after_commit:turn:1:search", "before_model:turn:2", "exit"),
    "while waiting for the person's answer": (None, "waiting:ask_user", "kill"),
    "inside a model request (answered, not recorded)": ("after_activity:turn:4", "after_activity:turn:4", "exit"),
    "after a model request (recorded, its tool not run)": ("after_commit:turn:4", "after_commit:turn:4", "exit"),
    "inside the send (delivered, not recorded)": ("after_send:send_answer", "after_send:send_answer", "exit"),
}
PLAIN_TOOLS = "inside a model request, search and read not decorated as steps"
COUNTS = ("model_calls", "source_calls", "deliveries", "send_requests")


def destination_counts(world: Path | str, workflow_id: str = WORKFLOW_ID) -> dict:
    """What the ledger and the notifier beside ``world`` hold for the run."""
    ledger, notifier = Ledger.beside(world), Notifier.beside(world)
    try:
        delivered = notifier.deliveries()
        return {"model_calls": ledger.count("model", workflow_id), "source_calls": ledger.count("source", workflow_id),
                "deliveries": len(delivered), "send_requests": notifier.request_count(),
                "delivered_text": delivered[0]["message"] if delivered else None}
    finally:
        ledger.close(), notifier.close()


def kit_cell(folder: Path, index: int, point: str | None, action: str) -> dict:
    """The kit's loop with its send, killed at ``point``; new workers (and the answer) until it completes."""
    db = folder / f"kit-loop-{index}.db"
    kit = lambda *args: child("durable_kit", *map(str, args))  # noqa: E731
    checked(kit("start", "--db", db, "--kind", "research_loop_send", "--module", KIT_MODULE,
                "--input", json.dumps({"case": CASE}), "--id", WORKFLOW_ID), "kit start")
    if point:
        checked(kit("arm", "--db", db, "--point", point, "--action", action), "kit arm")
    exits = []  # the crash may come in a later worker: the points after the question fire once it is answered
    for _ in range(5):
        status = Journal(db).workflow(WORKFLOW_ID)["status"]
        if status == "complete":
            break
        if status == "waiting":
            checked(kit("answer", "--db", db, "--workflow", WORKFLOW_ID, "--text", ANSWER, "--by", "Dana"), "answer")
        exits.append(kit("worker", "--db", db, "--until-idle", "--module", KIT_MODULE).returncode)
    crashed = [code for code in exits if code != 0]
    if len(crashed) > (1 if point else 0):
        raise RuntimeError(f"kit workers at {point}: exit codes {exits}; expected at most one crash")
    return {"exit_code": crashed[0] if crashed else None, "workers": len(exits),
            "status": Journal(db).workflow(WORKFLOW_ID)["status"], **destination_counts(db)}


def framework_status(url: str, workflow_id: str = WORKFLOW_ID) -> str:
    """The run's DBOS status (SUCCESS, PENDING, ERROR ...)."""
    dbos_client = client(url, serializer=None)
    try:
        return next(w.status for w in dbos_client.list_workflows() if w.workflow_id == workflow_id)
    finally:
        dbos_client.destroy()


def framework_cell(folder: Path, index: int, point: str | None, action: str, plain_tools: bool = False,
                   framework: str = "pydantic") -> dict:
    """A framework's agent started (the answer sent at once) in a child killed at ``point``; one restart.

    ``framework`` is ``pydantic`` (Pydantic AI) or ``openai`` (the OpenAI Agents SDK), both on DBOS.
    """
    base = folder / f"{framework}{'-plain' if plain_tools else ''}-loop-{index}"
    url, world = sqlite_url(base.with_suffix(".dbos.sqlite")), base.with_suffix(".db")
    start = ["loop", "--framework", framework, "--db", url, "--start", WORKFLOW_ID, "--world", str(world),
             "--answer", ANSWER, "--case", CASE, "--until", "done"]
    if plain_tools:
        start.append("--plain-tools")
    if point:
        start += ["--crash-at", point, "--action", action]
    first = child("durable_kit.workshop.graduate", *start)
    checked(child("durable_kit.workshop.graduate", "loop", "--framework", framework, "--db", url, "--until", "done"),
            f"the {framework} restart after {point}")
    return {"exit_code": first.returncode if point else None, "workers": 2,
            "status": framework_status(url), **destination_counts(world)}


def loop_crash_table(folder: str | Path, labels=tuple(BOUNDARIES), plain_tools_row: bool = True,
                     openai: bool = True, parallel: int = 4) -> list[dict]:
    """One row per boundary: the kit's, Pydantic AI's (``framework_``) and the OpenAI Agents SDK's counts.

    ``answer`` says whether each side delivered the text of the kit's clean
    run (the first row when ``no crash`` is among ``labels``). The last row,
    with ``plain_tools_row``, is Pydantic AI with search and read left as
    plain functions.
    """
    folder = prepared(folder)
    sides = ("kit", "framework", "openai") if openai else ("kit", "framework")
    cells = [(side, i, label, BOUNDARIES[label][0 if side == "kit" else 1])
             for side in sides for i, label in enumerate(labels)]
    if plain_tools_row:
        cells.append(("plain", len(labels), PLAIN_TOOLS, "after_activity:turn:4"))

    def run(cell):
        side, index, label, point = cell
        action = BOUNDARIES.get(label, (None, None, "exit"))[2]
        if side == "kit":
            return kit_cell(folder, index, point, action)
        return framework_cell(folder, index, point, action, plain_tools=side == "plain",
                              framework="openai" if side == "openai" else "pydantic")

    with ThreadPoolExecutor(max_workers=parallel) as pool:  # each cell is its own processes and files
        results = dict(zip(((c[0], c[2]) for c in cells), pool.map(run, cells)))
    clean = results[("kit", "no crash")]["delivered_text"] if "no crash" in labels else None
    rows = []
    for label in list(labels) + ([PLAIN_TOOLS] if plain_tools_row else []):
        row = {"boundary": label}
        for side, name in (("kit", "kit"), ("framework", "framework"), ("plain", "framework"), ("openai", "openai")):
            if (side, label) in results:
                result = results[(side, label)]
                row.update({f"{name}_{key}": result[key] for key in ("exit_code", "status", *COUNTS)})
                row[f"{name}_answer"] = clean is not None and result["delivered_text"] == clean
        for name in sides:
            row.setdefault(f"{name}_exit_code", None)
        rows.append(row)
    return rows


def paired_rows(rows: list[dict]) -> list[dict]:
    """The table for reading: each count as ``"kit / Pydantic AI / OpenAI Agents"`` (``-``: no such cell)."""
    labels = {"exit_code": "exit code", "model_calls": "model calls", "source_calls": "tool calls (search, read)",
              "deliveries": "answers delivered", "send_requests": "send requests", "answer": "same answer"}
    sides = [side for side in ("kit", "framework", "openai") if any(f"{side}_status" in r for r in rows)]

    def shown(row: dict, side: str, key: str) -> str:
        value = row.get(f"{side}_{key}", "-")
        return "-" if value is None else str(value)

    return [{"boundary": r["boundary"], **{label: " / ".join(shown(r, side, key) for side in sides)
                                           for key, label in labels.items()}} for r in rows]


SIDES = {"kit": "the kit", "framework": "Pydantic AI", "openai": "OpenAI Agents SDK"}
SHORT = dict(zip([*BOUNDARIES, PLAIN_TOOLS], ["no crash", "in a tool", "after a tool", "waiting", "in a model call",
                                             "after a model call", "in the send", "in a model call, plain tools"]))
CALLS = ("model_calls", "source_calls", "send_requests")  # every request a crash can make again


def chart_series(rows: list[dict]) -> dict:
    """The crash table as ``charts.calls_vs_artifacts`` arguments, grouped by side.

    Per cell: every request made (model, tool and send), of which the clean
    run's count is needed once, beside the answers delivered (one needed).
    The first row must be the clean run.
    """
    if rows[0]["boundary"] != "no crash":
        raise ValueError(f"the first row must be the clean run ('no crash'), not {rows[0]['boundary']!r}")
    series = {"labels": [], "groups": [], "calls": [], "stored": []}
    for side, name in SIDES.items():
        for row in rows:
            if row.get(f"{side}_model_calls") is None:
                continue  # no such cell
            series["labels"].append(SHORT[row["boundary"]])
            series["groups"].append(name)
            series["calls"].append(sum(row[f"{side}_{count}"] for count in CALLS))
            series["stored"].append(row[f"{side}_deliveries"])
    return {**series, "needed": sum(rows[0][f"kit_{count}"] for count in CALLS), "kept_needed": 1,
            "calls_label": "requests", "stored_label": "answers delivered"}


# --- Beyond one machine: the agent on PostgreSQL, two DBOS workers, one SIGKILLed mid-run ---

def loop_two_workers(url: str, folder: str | Path, runs: int = 4) -> dict:
    """``runs`` research runs queued on PostgreSQL; worker-1 is SIGKILLed inside a model request of its first run.

    Each run's answer is sent as it is queued. worker-2 drains the queue;
    the killed worker's run waits, pending, until worker-1 restarts with its
    executor id (``crashlab.kill_one_of_two``). Counted at the destinations,
    summed over the runs: a clean run makes 8 model calls and 4 source calls.
    """
    from dbos import EnqueueOptions

    from .crashlab import kill_one_of_two

    world = str(prepared(folder) / "pg-loop-world.db")
    ids = [f"pg-loop-{i}" for i in range(runs)]

    def enqueue(dbos_client) -> None:
        for workflow_id in ids:
            options = EnqueueOptions(workflow_name="research_agent", queue_name="research", workflow_id=workflow_id)
            dbos_client.enqueue(options, CASE, world, True)
            dbos_client.send(workflow_id, ANSWER, topic="answer")  # kept until the run's ask_user receives it

    run = kill_one_of_two(url, enqueue, "after_activity:turn:4", "--agent", "pydantic", "--queue", "research")
    final = run.pop("final")
    counts = [destination_counts(world, workflow_id) for workflow_id in ids]
    return {"runs": runs, **run, "lost": runs - len(final),
            **{key: sum(c[key] for c in counts) for key in ("model_calls", "source_calls")},
            "deliveries": counts[0]["deliveries"], "send_requests": counts[0]["send_requests"]}  # one notifier
