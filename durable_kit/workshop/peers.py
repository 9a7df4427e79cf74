"""Other engines under the same harness: one three-step crash experiment on the kit, DBOS and LangGraph.

The experiment, the same for every engine: a workflow of three steps, each
recording its call in a call ledger (``peer.calls.db``) as its first line.
Step 3's first line ends the process with ``os._exit(13)`` if a crash file
exists (it deletes the file first, so the crash happens once): the process
dies after steps 1 and 2 returned and before step 3 did anything. A second
process recovers the workflow the engine's own way. Then the ledger says how
often each step ran.

* the kit: ``python -m durable_kit worker`` twice (its journal commits each step's output before the next);
* DBOS Transact with a SQLite system database: ``DBOS.launch()`` in a new process recovers pending workflows;
* LangGraph with ``SqliteSaver``: ``graph.invoke(None, config)`` resumes from the last checkpoint, with
  ``durability="sync"`` (each checkpoint written before the next step starts) or ``"async"`` (written
  in the background while the next step runs).

DBOS and LangGraph are optional (``pip install -e ".[engines]"``) and imported only inside the child
process's functions: ``import durable_kit`` never loads them, and a missing engine gives a row that says
how to install it.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..world.ledger import Ledger

STEPS = ("step1", "step2", "step3")
WORKFLOW_ID = "three-steps-1"
ENGINES = {"kit": None, "dbos": "dbos", "langgraph": "langgraph.checkpoint.sqlite"}
INSTALL = 'pip install -e ".[engines]"'
CRASH_EXIT_CODE = 13


def available(engine: str) -> bool:
    """True if the engine's package can be imported here (the kit always can)."""
    module = ENGINES[engine]
    if module is None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


# --- what every engine's steps do ---------------------------------------------------------------------------

def record_call(folder: Path, step: str) -> None:
    """The step's first line: count the call in the ledger; in step 3, die once if the crash file is there."""
    if step == "step3":
        crash_file = folder / "crash-at-step3"
        if crash_file.exists():
            crash_file.unlink()
            os._exit(CRASH_EXIT_CODE)
    Ledger(folder / "peer.calls.db").record("tool", step, WORKFLOW_ID)


# --- the three engines, each run inside a child process -------------------------------------------------------

def kit_workflow_module() -> str:
    """The kit's three-step workflow, as source for a file a worker imports with ``--module``."""
    return (
        "from pathlib import Path\n"
        "from durable_kit import workflow\n"
        "from durable_kit.workshop.peers import STEPS, record_call\n\n\n"
        "@workflow('peer_three_steps')\n"
        "def three_steps(wf):\n"
        "    folder = Path(wf.db_path).parent\n"
        "    return [wf.execute_step(step, lambda s=step: record_call(folder, s) or s) for step in STEPS]\n"
    )


def run_dbos(folder: Path, recover: bool) -> None:
    """Start the workflow (or, with ``recover``, let ``DBOS.launch()`` recover it) and wait for its result."""
    from dbos import DBOS, SetWorkflowID

    DBOS(config={"name": "peer-three-steps", "system_database_url": f"sqlite:///{folder / 'dbos.sqlite'}",
                 "application_version": "1", "executor_id": "peer-executor"})

    @DBOS.step()
    def step(name: str) -> str:
        record_call(folder, name)
        return name

    @DBOS.workflow()
    def three_steps() -> list[str]:
        return [step(name) for name in STEPS]

    DBOS.launch()  # recovers this executor's pending workflows in the background
    try:
        if recover:
            DBOS.retrieve_workflow(WORKFLOW_ID).get_result()
        else:
            with SetWorkflowID(WORKFLOW_ID):
                three_steps()
    finally:
        DBOS.destroy()


def run_langgraph(folder: Path, recover: bool, durability: str) -> None:
    """Invoke the graph (or, with ``recover``, resume it from its last checkpoint) with ``durability``."""
    import operator
    import sqlite3
    from typing import Annotated, TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    # Built by call, not by class syntax: this module's postponed annotations would hide the reducer.
    State = TypedDict("State", {"done": Annotated[list, operator.add]})

    def node(name: str):
        def run(state) -> dict:
            record_call(folder, name)
            return {"done": [name]}
        return run

    graph = StateGraph(State)
    for name in STEPS:
        graph.add_node(name, node(name))
    graph.add_edge(START, STEPS[0])
    graph.add_edge(STEPS[0], STEPS[1])
    graph.add_edge(STEPS[1], STEPS[2])
    graph.add_edge(STEPS[2], END)
    conn = sqlite3.connect(str(folder / "langgraph.sqlite"), check_same_thread=False)
    app = graph.compile(checkpointer=SqliteSaver(conn))
    config = {"configurable": {"thread_id": WORKFLOW_ID}}
    app.invoke(None if recover else {"done": []}, config, durability=durability)
    conn.close()


# --- the experiment, from the parent ---------------------------------------------------------------------------

def _child(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)


def _kit_children(folder: Path) -> list[subprocess.CompletedProcess]:
    module = folder / "peer_three_steps.py"
    module.write_text(kit_workflow_module())
    db = folder / "peer.db"
    kit = ["-m", "durable_kit"]
    started = _child([*kit, "start", "--db", str(db), "--kind", "peer_three_steps", "--input", "{}",
                      "--id", WORKFLOW_ID, "--module", str(module)])
    if started.returncode != 0:
        raise RuntimeError(f"could not start the kit's three-step workflow: {started.stderr}")
    worker = [*kit, "worker", "--db", str(db), "--until-idle", "--module", str(module)]
    return [_child(worker), _child(worker)]


def crash_experiment(engine: str, folder: str | Path, durability: str = "sync") -> dict:
    """Run the experiment once on ``engine`` in two real processes; how often each step ran.

    The row: engine, durability, the first process's exit code (13: it died
    at step 3), the second's (0: it recovered), the calls of each step, and
    ``finished_steps_rerun``: runs of steps 1 and 2 beyond the first.
    """
    label = engine if engine == "kit" or engine == "dbos" else f"langgraph ({durability})"
    if not available(engine):
        return {"engine": label, "skipped": f"{engine} is not installed: {INSTALL}"}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "crash-at-step3").touch()
    if engine == "kit":
        first, second = _kit_children(folder)
    else:
        here = ["-m", "durable_kit.workshop.peers", engine, "--folder", str(folder), "--durability", durability]
        first = _child(here)
        second = _child([*here, "--recover"])
    if second.returncode != 0:
        raise RuntimeError(f"{label}: the recovering process failed ({second.returncode}):\n{second.stderr[-2000:]}")
    ledger = Ledger(folder / "peer.calls.db")
    calls = {step: sum(1 for c in ledger.calls("tool") if c["operation"] == step) for step in STEPS}
    ledger.close()
    return {"engine": label, "first_exit": first.returncode, "second_exit": second.returncode, **calls,
            "finished_steps_rerun": calls["step1"] - 1 + calls["step2"] - 1}


def compare(folder: str | Path | None = None, trials: int = 1) -> list[dict]:
    """The experiment ``trials`` times on each engine (LangGraph in both durability modes); one row per trial."""
    runs = [("kit", "sync"), ("dbos", "sync"), ("langgraph", "async"), ("langgraph", "sync")]
    with tempfile.TemporaryDirectory(prefix="durable-kit-peers-") as scratch:
        root = Path(folder) if folder is not None else Path(scratch)
        rows = []
        for engine, durability in runs:
            for trial in range(trials):
                row = crash_experiment(engine, root / f"{engine}-{durability}-{trial}", durability)
                rows.append({"trial": trial + 1, **row})
                if "skipped" in row:
                    break
        return rows


def main(argv: list[str] | None = None) -> int:
    """A child process of the experiment: ``python -m durable_kit.workshop.peers dbos|langgraph --folder F [--recover]``."""
    parser = argparse.ArgumentParser(prog="python -m durable_kit.workshop.peers",
                                     description="one process of the three-step crash experiment")
    parser.add_argument("engine", choices=["dbos", "langgraph", "compare"])
    parser.add_argument("--folder", help="the experiment's folder (ledger, engine database, crash file)")
    parser.add_argument("--durability", choices=["sync", "async"], default="sync", help="LangGraph only")
    parser.add_argument("--recover", action="store_true", help="recover the crashed workflow instead of starting it")
    parser.add_argument("--trials", type=int, default=1, help="compare: trials per engine")
    args = parser.parse_args(argv)
    if args.engine == "compare":
        print(json.dumps(compare(args.folder, args.trials)))
        return 0
    if not args.folder:
        parser.error("--folder is required")
    if args.engine == "dbos":
        run_dbos(Path(args.folder), args.recover)
    else:
        run_langgraph(Path(args.folder), args.recover, args.durability)
    return 0


if __name__ == "__main__":
    sys.exit(main())
