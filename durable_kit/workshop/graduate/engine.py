"""DBOS Transact configured the way the kit works, and named crash points that end a real process.

Three settings differ from DBOS's defaults, each for a reason the kit taught:

* **JSON, not pickle.** DBOS pickles workflow inputs, step outputs and
  messages by default (any Python object goes in, and only Python can read
  it back). We pass ``DBOSPortableJSONSerializer``: a value that is not JSON
  fails when it is stored, as ``store.to_json`` does in the kit.
* **A pinned application version.** By default the version is a hash of the
  workflow source: edit a workflow and DBOS no longer recovers the workflows
  started before the edit. Pinning it says "this code can replay those".
* **One executor id per process.** DBOS recovers, at launch, the pending
  workflows of its own executor id. Two processes sharing one id would each
  re-run the other's live workflows; a process that never comes back leaves
  its workflows pending until someone resumes them.

Crash points are armed for one process by its command line (``--crash-at``)
and fired by ``boundary``: ``os._exit`` or SIGKILL, no cleanup, no flush.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .points import arm_here, boundary  # noqa: F401  (the crash points, for the child processes)

APP_NAME = "durable-kit-graduate"
APP_VERSION = "graduate-1"  # pinned: bump it only when pending workflows cannot replay on the new code

def sqlite_url(path: str | Path) -> str:
    """DBOS's URL for a SQLite system database at ``path`` (made absolute, so any working directory works)."""
    return f"sqlite:///{Path(path).resolve()}"


def json_serializer() -> Any:
    """DBOS's portable JSON serializer: workflow inputs, step outputs and messages stored as JSON text."""
    from dbos import DBOSPortableJSONSerializer

    return DBOSPortableJSONSerializer()


def launch(url: str, executor_id: str = "local", queues: dict[str, int] | None = None,
           serializer: Any = "json") -> None:
    """Configure DBOS on ``url``, register the agents, launch (which recovers this executor's pending workflows).

    ``queues`` maps a queue name to how many of its workflows this process runs
    at once; queues are registered after launch, when the database is ready.
    ``serializer`` is ``"json"`` (the port's rule) or ``None`` for DBOS's
    default, pickle, which the Pydantic AI integration needs: its model steps
    return Python objects (``durable_kit.workshop.graduate.pydantic_loop``).
    """
    from dbos import DBOS

    from . import agents  # noqa: F401  (the decorators register the workflows before launch)

    DBOS(config={
        "name": APP_NAME,
        "system_database_url": url,
        "application_version": APP_VERSION,
        "executor_id": executor_id,
        **({"serializer": json_serializer()} if serializer == "json" else {}),
        "log_level": "WARNING",
        "notification_listener_polling_interval_sec": 0.05,  # a sent approval is seen within 50 ms
    })
    DBOS.launch()
    for name, concurrency in (queues or {}).items():
        DBOS.register_queue(name, worker_concurrency=concurrency, polling_interval_sec=0.1)


def shutdown() -> None:
    """Stop DBOS in this process without waiting for running workflows (they stay pending, as after a crash)."""
    from dbos import DBOS

    DBOS.destroy()


def client(url: str, serializer: Any = "json") -> Any:
    """A DBOSClient on ``url``: send messages, enqueue, list and resume workflows from outside any worker.

    ``serializer`` as for ``launch``: ``"json"``, or ``None`` for DBOS's default (pickle).
    """
    from dbos import DBOSClient

    chosen = {"serializer": json_serializer()} if serializer == "json" else {}
    return DBOSClient(system_database_url=url, application_name=APP_NAME, **chosen)


def workflow_rows(url: str) -> list[dict]:
    """Every workflow in the system database: id, status, executor id, version and error, sorted by id."""
    dbos_client = client(url)
    try:
        rows = [{"id": w.workflow_id, "status": w.status, "executor_id": w.executor_id, "version": w.app_version,
                 "error": str(w.error) if w.error else None}
                for w in dbos_client.list_workflows()]
    finally:
        dbos_client.destroy()
    return sorted(rows, key=lambda row: row["id"])


def step_rows(url: str, workflow_id: str) -> list[dict]:
    """The steps DBOS recorded for one workflow, in order: name and whether an output is stored."""
    dbos_client = client(url)
    try:
        steps = dbos_client.list_workflow_steps(workflow_id) or []
    finally:
        dbos_client.destroy()
    return [{"name": s["function_name"], "output": s["output"], "error": s["error"]} for s in steps]
