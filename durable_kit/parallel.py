"""A feature on the engine: independent steps at once, each its own step with its own row.

Completed branches are reused; the others are marked *running* in one
commit, run in threads, and each output is committed as soon as its branch
finishes, so a crash mid-fan-out reruns only the branches not yet committed.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable

from .core.journal import Workflow
from .core.store import boundary, to_json


def execute_parallel(wf: Workflow, branches: dict[str, Callable[[], Any]], inputs: dict[str, Any] | None = None,
                     max_threads: int = 4) -> dict[str, Any]:
    """Run the branches (step name -> activity) at once; return each branch's output by name.

    A branch that raises is marked *failed*; the others still commit, then the first error is raised (no
    retry policy here: a later replay reruns the fan-out and reuses what finished). Activities run on other
    threads: they must not touch ``wf.conn`` (``send_guarded`` opens its own there), and anything
    else they write to SQLite needs a connection opened on that thread.
    """
    results: dict[str, Any] = {}
    inputs_json, positions = {}, {}
    for name in branches:
        inputs_json[name] = to_json((inputs or {}).get(name), wf.id, name, "step input")
        positions[name] = wf.place(name, inputs_json[name])  # each branch its own place in the order
        if wf.reuse(name):
            results[name] = wf.output(name)
    to_run = [name for name in branches if name not in results]
    if to_run:
        wf.at_boundary()
        with wf.starting():  # one commit marks every branch running
            started = {name: wf.mark_running(name, inputs_json[name], position=positions[name]) for name in to_run}
        for name in to_run:
            if started[name] is None:  # another process completed it since this replay began
                results[name] = wf.recorded_output(name)
        runnable = [name for name in to_run if started[name] is not None]
        if any("next_step" in started[name] for name in runnable):
            boundary(wf.conn, "next_step", wf.id)
        first_error: Exception | None = None
        with ThreadPoolExecutor(max_workers=max(1, min(max_threads, len(runnable)))) as pool:
            futures = {pool.submit(branches[name]): name for name in runnable}
            for future in as_completed(futures):  # each branch is committed as it finishes, on this thread
                name = futures[future]
                try:
                    output = wf.encode_output(name, future.result(), started[name])
                except Exception as error:
                    wf.fail_attempt(name, error)
                    first_error = first_error or error
                    continue
                results[name] = wf.commit_output(name, output, started[name])
        if first_error is not None:
            raise first_error
    return {name: results[name] for name in branches}
