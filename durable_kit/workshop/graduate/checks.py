"""Notebook 10's exercise: port the refund's payment to a DBOS step with a key, checked in real processes.

The learner's file defines ``my_pay_refund(world, order_id, amount)``, a
``@DBOS.step()`` that pays at the kit's payment service (``Payments.beside(world)``).
The check runs two workflows in child processes: the first is killed right
after the service answered, before DBOS recorded the step; a new process
recovers it and runs the second. With a key made from the workflow id and
the action, the service holds one refund per workflow: two in all.
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Callable

from ...world.payments import Payments
from .crashlab import child
from .engine import sqlite_url, step_rows, workflow_rows

HINT = ("Hint: which values stay the same in every attempt of one workflow's refund, yet differ between two "
        "workflows? DBOS.workflow_id is one; add the action's name, and pass the key to refund(order_id, amount, key).")


class _SameFileAgain(logging.Filter):
    """Drop DBOS's warning that a function of a file loaded again is registered again: the edit replaces it."""

    def __init__(self, names: set[str]):
        super().__init__()
        self.names = names

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(f"Duplicate registration of function '{name}'" in record.getMessage() for name in self.names)


def load_function(path: str | Path, name: str) -> Callable:
    """Import the Python file at ``path`` as a module and return its function ``name``.

    Loading the same file again (after an edit) replaces the first load quietly: the functions it
    defines are registered with DBOS again under the same names, which is what a learner means.
    """
    path = Path(path).resolve()
    module_name = f"learner_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: is it a .py file?")
    module = importlib.util.module_from_spec(spec)
    again = _SameFileAgain({node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
                           if module_name in sys.modules else set())
    sys.modules[module_name] = module
    dbos_log = logging.getLogger("dbos")
    dbos_log.addFilter(again)
    try:
        spec.loader.exec_module(module)
    finally:
        dbos_log.removeFilter(again)
    if not hasattr(module, name):
        raise AttributeError(f"{path.name} defines no function {name!r}")
    return getattr(module, name)


def run_exercise(step: Callable, folder: Path) -> dict:
    """Workflow ex-1 killed after the payment, then recovered; then ex-2; what the service and DBOS hold."""
    original = inspect.unwrap(step)  # a @DBOS.step wrapper lives in dbos's files; the learner's code does not
    source = f"{inspect.getsourcefile(original)}:{original.__name__}"
    url, world = sqlite_url(folder / "exercise.dbos.sqlite"), str(folder / "exercise.db")
    start = ["run", "--db", url, "--exercise", source, "--start", "exercise_refund",
             "--input", json.dumps({"order_id": "A-1001", "amount": 89.0, "world": world})]
    crashed = child("durable_kit.workshop.graduate", *start, "--id", "ex-1", "--crash-at", "after_send:refund")
    second = child("durable_kit.workshop.graduate", *start, "--id", "ex-2", "--until", "done")
    payments = Payments.beside(world)
    try:
        rows = workflow_rows(url) if second.returncode == 0 else []
        return {"crash_exit": crashed.returncode, "second_exit": second.returncode,
                "stderr": (crashed.stderr + second.stderr)[-1500:],
                "statuses": {r["id"]: r["status"] for r in rows},
                "errors": [str(r.get("error")) for r in rows if r["status"] == "ERROR"],
                "payment_calls": payments.request_count(), "refunds": payments.refunds(),
                "steps_recorded": sum(1 for wid in ("ex-1", "ex-2") for s in step_rows(url, wid)
                                      if s["output"] and "refund_id" in json.dumps(s["output"]))
                if rows else 0}
    finally:
        payments.close()


def check_pay_refund(step: Callable) -> None:
    """Run the learner's refund step through a real crash and a second workflow; print the verdict (never raises)."""
    try:
        print(verdict_for(step))
    except Exception as error:  # the notebook runs on; the message says what broke
        print(f"not quite: the check could not run your step: {type(error).__name__}: {error}")


def verdict_for(step: Callable) -> str:
    """``pass: ...``, or what went wrong and a hint; never raises."""
    if not callable(step):
        return (f"not quite: expected a function my_pay_refund(world: str, order_id: str, amount: float) -> dict, "
                f"got {type(step).__name__}. Define it in the file.")
    with tempfile.TemporaryDirectory() as tmp:
        run = run_exercise(step, Path(tmp))
    unwritten = "key = None" in inspect.getsource(inspect.unwrap(step))
    if unwritten and len(run["refunds"]) > 2:
        return ("not yet: the key is still None. Write the key in the cell above, run it to save the file, then "
                f"run this cell again. {HINT}")
    if run["crash_exit"] != 13:
        lines = [line for line in run["stderr"].splitlines() if line.strip()]
        return ("not quite: the first workflow never reached the payment service's answer, so nothing crashed. "
                f"It ended with: {lines[-1] if lines else 'no error'}. "
                "The step must call Payments.beside(world).refund(order_id, amount, key) and return that receipt, "
                "a dict with 'refund_id'.")
    if run["second_exit"] != 0 or any(s != "SUCCESS" for s in run["statuses"].values()):
        return (f"not quite: a workflow did not finish: {run['statuses'] or run['stderr'][-600:]} "
                f"{run['errors']}. {HINT}")
    count = len(run["refunds"])
    if count > 2:
        return (f"not quite: {count} refunds for 2 workflows: the crashed one was paid again after recovery, so its "
                f"key changed between attempts (or there was none). {HINT}")
    if count < 2:
        return (f"not quite: {count} refund for 2 workflows: the second was taken for a repeat of the first, so "
                f"both used one key. {HINT}")
    if run["steps_recorded"] != 2:
        return ("not quite: the payment paid once per workflow, but DBOS recorded no receipt for it: "
                "decorate the function with @DBOS.step() so a recovery replays its output instead of paying again.")
    return (f"pass: 2 workflows, {run['payment_calls']} calls to the payment service, 2 refunds: "
            "the crashed attempt's repeat was deduplicated by its key.")
