"""Checks of the four parts of the engine in one file (``durable_kit/mini.py``) that notebooks 02, 03, 04 and 06
have the learner write, and the learner's engine assembled from them (notebook 06).

A part is a function in a file the notebook saves with ``%%writefile``, so that worker processes can import it.
Its check puts it in ``durable_kit.mini`` in place of the engine's own part, tries it in this process on rows it
prepared (where a message can be exact), then runs workflows in real worker processes with a crash or a pause,
and compares what they leave with what the kit leaves (``scenarios.EXPECTED``). It prints one line, as every
check does (``checks.py``): ``pass:``, ``not quite:`` with what was expected and a hint, or ``not yet:`` while the
stub is unchanged. It never raises.
"""
from __future__ import annotations

import ast
import inspect
import json
import sqlite3
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from ... import mini
from . import scenarios
from .checks import NOT_QUITE, NOT_YET, report

# part -> (notebook, the learner's file in that notebook's scratch folder, the learner's function)
ANSWERS = {"run_step": ("02", "my_step.py", "my_run_step"), "after_failure": ("03", "my_retry.py", "my_after_failure"),
           "decide_wait": ("04", "my_decision.py", "my_decide_wait"), "fenced": ("06", "my_fence.py", "my_fenced")}


class PartNotLoaded(Exception):
    """The learner's file could not be imported, or has no function of that name."""


def load_part(path: str | Path, name: str) -> Callable:
    """Function ``name`` of the Python file at ``path``, read afresh (an edited file is read again). A file that does
    not import, or lacks ``name``, gives a function that raises ``PartNotLoaded`` saying why."""
    try:
        return scenarios.function_in(path, name)
    except Exception as error:  # the learner's file: say what broke when the check calls it
        said = f"{path} could not be imported ({type(error).__name__}: {error})"

        def not_loaded(*args: Any, **kwargs: Any) -> Any:
            raise PartNotLoaded(said)
        not_loaded.__name__ = name
        return not_loaded


def _source(part: Callable) -> tuple[str, str] | None:
    """(the file, the function's name) a worker process imports the part from; None for a function of no file."""
    try:
        return inspect.getsourcefile(inspect.unwrap(part)), part.__name__  # unwrap: a @contextmanager's own
    except TypeError:
        return None


@contextmanager
def _plugged(name: str, part: Callable) -> Iterator[None]:
    before = getattr(mini, name)
    setattr(mini, name, part)
    try:
        yield
    finally:
        setattr(mini, name, before)


def _unfinished(error: BaseException, stub: str) -> str | None:
    """The verdict for an exception out of the learner's code, or None if it is not theirs to fix."""
    if isinstance(error, NotImplementedError):
        return f"{NOT_YET} {stub} still raises NotImplementedError: write its body, then run this cell again"
    if isinstance(error, PartNotLoaded):
        return f"{NOT_QUITE} {error}. Hint: run the %%writefile cell again after fixing the file"
    return None


def _in_processes(part_name: str, part: Callable, names: list[str], folder: Path,
                  expected: dict[str, dict] | None = None) -> str | None:
    """Run scenarios ``names`` on mini with ``part`` plugged in, in worker processes; what differs from the kit."""
    source = _source(part)
    if source is None:
        return f"{NOT_QUITE} save the function in its file with the %%writefile cell: worker processes import it from there"
    for name in names:
        run = scenarios.Run("mini", folder / name.replace(" ", "-"), {part_name: source}, timeout=30)
        try:
            with scenarios.plugged({part_name: source}):
                seen = scenarios.SCENARIOS[name](run)
        except TimeoutError as error:
            return (f"{NOT_QUITE} in worker processes ({name}), the workflow never settled: {error}. "
                    f"{_status_of(run)}")
        finally:
            run.journal.conn.close()
        want = (expected or scenarios.EXPECTED)[name]
        if seen != want:
            differ = "; ".join(f"{key} {seen.get(key)!r}, where the kit leaves {want[key]!r}" for key in want
                               if seen.get(key) != want[key])
            return f"{NOT_QUITE} in worker processes ({name}): {differ}. {_status_of(run)}"
    return None


def _status_of(run: scenarios.Run) -> str:
    conn = sqlite3.connect(run.db)
    row = conn.execute("SELECT status, error FROM workflows WHERE id = 'w1'").fetchone()
    conn.close()
    return f"The workflow is {row[0]}" + (f", with the error: {row[1]}" if row and row[1] else "") + "."


def _snapshot(conn: sqlite3.Connection) -> str:
    return "\n".join(conn.iterdump())


# --- notebook 02: run_step ------------------------------------------------------------------------------------

RUN_STEP_HINT = ("Hint: look for the complete row first and return its output without calling activity(); else call "
                 "activity(), then inside `with fenced(wf.conn, wf.lease) as conn:` look again, and store with "
                 "mark(conn, wf.id, name, \"complete\", output=json.dumps(output)) only if it is still not complete.")


@mini.workflow("check:run_step")
def _journal_check(wf: mini.Workflow) -> dict:
    return wf.execute_step("plan", lambda: _counted(wf, "plan", {"subtopics": ["a", "b"]}))


@mini.workflow("check:race")
def _race_check(wf: mini.Workflow) -> dict:
    return wf.execute_step("analyze", lambda: _raced(wf))


RUNS: dict[str, int] = {}
THEIRS = {"written_by": "another process"}


def _counted(wf: mini.Workflow, name: str, output: Any) -> Any:
    RUNS[name] = RUNS.get(name, 0) + 1
    return output


def _raced(wf: mini.Workflow) -> dict:
    """An activity during which another connection commits the same step: its output must be the one that stays."""
    RUNS["analyze"] = RUNS.get("analyze", 0) + 1
    other = sqlite3.connect(wf.db_path, isolation_level=None)
    other.execute("UPDATE steps SET status = 'complete', output = ? WHERE workflow_id = ? AND name = 'analyze'",
                  (json.dumps(THEIRS), wf.id))
    other.close()
    return {"written_by": "this process"}


def check_run_step(run_step: Callable) -> None:
    """Check the learner's ``run_step(wf, name, activity)`` (notebook 02) in this process and in worker processes."""
    with tempfile.TemporaryDirectory(prefix="check-02-") as folder:
        problem = _run_step_problem(run_step, Path(folder))
    report(problem, "run_step reuses a stored output, stores a new one once, keeps one committed meanwhile, and "
                     "the engine with it left what the kit leaves after a crash after an activity and after a commit")


def _run_step_problem(run_step: Callable, folder: Path) -> str | None:
    journal = mini.Journal(folder / "here.db")
    RUNS.clear()
    try:
        with _plugged("run_step", run_step):
            for workflow_id, kind in (("c1", "check:run_step"), ("c2", "check:race")):
                journal.start(kind, {}, workflow_id)
                try:
                    mini.run_workflow(journal, workflow_id)
                except Exception as error:  # the learner's code: say what broke
                    hint = (RUN_STEP_HINT if not isinstance(error, sqlite3.IntegrityError) else "Hint: activity() "
                            "made the step's row already (status 'running'): change it with mark(...).")
                    return _unfinished(error, "my_run_step") or (
                        f"{NOT_QUITE} your run_step raised {type(error).__name__}: {error}. {hint}")
                if workflow_id == "c2":
                    break
                plan = journal.steps("c1")[0]
                if RUNS.get("plan") != 1 or plan["status"] != "complete" or plan["output"] != {"subtopics": ["a", "b"]}:
                    return (f"{NOT_QUITE} the first run should call plan's activity once and leave the step complete "
                            f"with its output; it called it {RUNS.get('plan', 0)} times and left it "
                            f"{plan['status']} with {plan['output']!r}. {RUN_STEP_HINT}")
                first = journal.workflow("c1")["output"]
                with mini.immediate(journal.conn) as conn:  # replay it: its step is complete
                    mini.move(conn, "c1", "pending", next_run_at=0)
                again = mini.run_workflow(journal, "c1")
                if RUNS.get("plan") != 1:
                    return (f"{NOT_QUITE} a replay called the activity of a complete step again: return the stored "
                            f"output without calling activity(). {RUN_STEP_HINT}")
                if again != first:
                    return f"{NOT_QUITE} a replay returned {again!r}, the first run {first!r}. {RUN_STEP_HINT}"
            stored, output = journal.steps("c2")[0]["output"], journal.workflow("c2")["output"]
            if stored != THEIRS:
                return (f"{NOT_QUITE} another process committed the step while its activity ran, and the stored "
                        f"output became {stored!r}: a stored output is never replaced. {RUN_STEP_HINT}")
            if output != THEIRS:
                return (f"{NOT_QUITE} another process committed the step while its activity ran, and your run_step "
                        f"returned {output!r} while the journal holds {THEIRS!r}: every caller gets the one stored "
                        f"output. {RUN_STEP_HINT}")
    finally:
        journal.conn.close()
    return _in_processes("run_step", run_step, ["clean", "crash after the activity", "crash after the commit"],
                         folder)


# --- notebook 03: after_failure -------------------------------------------------------------------------------

AFTER_FAILURE_HINT = ("Hint: a failure that is not Transient, or no policy, is 'fail'; read the step's attempts; at "
                      "policy.max_attempts or more it is 'escalate'; else retry_at = time.time() + "
                      "policy.delay(attempts), mark the step 'retrying' with next_attempt_at=retry_at, move the "
                      "workflow to 'pending' with next_run_at=retry_at, and return 'retry'.")
POLICY = mini.RetryPolicy(max_attempts=3, base_delay=2.0)
# (error, policy, the step's attempts so far) -> the path, and the delay of a retry
FAILURES = [(ValueError("a bug"), POLICY, 1, "fail", None), (mini.Transient("503"), None, 1, "fail", None),
            (mini.Transient("503"), POLICY, 1, "retry", 2.0), (mini.Transient("503"), POLICY, 2, "retry", 4.0),
            (mini.Transient("the process died"), POLICY, 3, "escalate", None)]


def check_after_failure(after_failure: Callable) -> None:
    """Check the learner's ``after_failure(conn, workflow_id, step, error, policy)`` (notebook 03)."""
    with tempfile.TemporaryDirectory(prefix="check-03-") as folder:
        problem = _after_failure_problem(after_failure, Path(folder))
    report(problem, "each failure takes its path, a retry's time is written in the failure's transaction, and "
                     "the engine with it retried on time after its worker was gone and escalated a crash loop")


def _after_failure_problem(after_failure: Callable, folder: Path) -> str | None:
    for number, (error, policy, attempts, path, delay) in enumerate(FAILURES):
        journal = mini.Journal(folder / f"failure-{number}.db")
        conn = journal.conn
        conn.execute("INSERT INTO workflows (id, kind, input, status) VALUES ('f1', 'demo', '{}', 'running')")
        conn.execute("INSERT INTO steps (workflow_id, name, kind, position, status, attempts, error) VALUES"
                     " ('f1', 'fetch', 'step', 1, 'failed', ?, ?)", (attempts, f"{type(error).__name__}: {error}"))
        before, started = _snapshot(conn), time.time()
        case = (f"{type(error).__name__}({str(error)!r}) on attempt {attempts} with "
                + ("no policy" if policy is None else "RetryPolicy(max_attempts=3, base_delay=2.0)"))
        try:
            with mini.immediate(conn):
                got = after_failure(conn, "f1", "fetch", error, policy)
        except Exception as raised:
            journal.conn.close()
            return _unfinished(raised, "my_after_failure") or (
                f"{NOT_QUITE} for {case} your function raised {type(raised).__name__}: {raised}. {AFTER_FAILURE_HINT}")
        step = conn.execute("SELECT status, next_attempt_at FROM steps WHERE name = 'fetch'").fetchone()
        flow = conn.execute("SELECT status, next_run_at FROM workflows WHERE id = 'f1'").fetchone()
        changed = _snapshot(conn) != before
        journal.conn.close()
        if got != path:
            return f"{NOT_QUITE} for {case} the path is {path!r}; your function returned {got!r}. {AFTER_FAILURE_HINT}"
        if path != "retry" and changed:
            return (f"{NOT_QUITE} for {case} ({path!r}) your function wrote to the journal; only a retry writes a "
                    f"schedule (the engine records an escalation itself). {AFTER_FAILURE_HINT}")
        if path == "retry":
            due = step["next_attempt_at"]
            if step["status"] != "retrying" or due is None or abs(due - (started + delay)) > 1.0:
                return (f"{NOT_QUITE} for {case} the step should be 'retrying' with next_attempt_at about "
                        f"{delay:g} s from now; it is {step['status']!r}, "
                        f"{'none' if due is None else f'{due - started:.1f} s from now'}. {AFTER_FAILURE_HINT}")
            if flow["status"] != "pending" or flow["next_run_at"] != due:
                when = "none" if flow["next_run_at"] is None else f"{flow['next_run_at'] - started:.1f} s from now"
                return (f"{NOT_QUITE} for {case} the workflow should be 'pending' with next_run_at equal to the step's "
                        f"next_attempt_at ({due - started:.1f} s from now), so no worker runs it before; it is "
                        f"{flow['status']!r} with next_run_at {when}. {AFTER_FAILURE_HINT}")
    return _in_processes("after_failure", after_failure, ["transient failure retried", "crash loop escalates"],
                         folder)


# --- notebook 04: decide_wait ---------------------------------------------------------------------------------

DECIDE_HINT = ("Hint: read the approval wait's row (kind 'approval'); none: raise NotWaiting; complete: compare "
               "'approved' with the stored decision (json.loads of output): the same returns (the stored one, False), "
               "another raises DecisionConflict; else mark it complete with the decision as JSON, move the workflow "
               "to 'pending' with next_run_at=time.time(), and return (decision, True).")


@mini.workflow("check:decision")
def _decision_check(wf: mini.Workflow) -> dict:
    draft = wf.execute_step("draft", lambda: {"recommendation": "Proceed."})
    return {"draft": draft, "decision": wf.wait_for_approval("review", draft)}


def check_decide_wait(decide_wait: Callable) -> None:
    """Check the learner's ``decide_wait(conn, workflow_id, wait, decision)`` (notebook 04)."""
    with tempfile.TemporaryDirectory(prefix="check-04-") as folder:
        problem = _decide_problem(decide_wait, Path(folder))
    report(problem, "a decision is saved once with the workflow made due, a repeat returns the first and a "
                     "conflict is refused, writing nothing; the engine with it finished after a crash, reusing it")


DANA = {"approved": True, "by": "Dana", "comment": "sources are sound"}


def _decide_problem(decide_wait: Callable, folder: Path) -> str | None:
    journal = mini.Journal(folder / "here.db")
    conn = journal.conn
    try:
        journal.start("check:decision", {}, "d1")
        mini.run_workflow(journal, "d1")  # with the engine's own parts: it stops at the approval
        tries: list[tuple[str, str, dict, Any]] = [  # (case, wait, decision, the exception or the return expected)
                 ("a decision on 'plan', a wait not reached", "plan", DANA, mini.NotWaiting),
                 ("Dana's approval", "review", DANA, (DANA, True)),
                 ("Sam's approval after Dana's", "review", {**DANA, "by": "Sam", "comment": ""}, (DANA, False)),
                 ("Eli's rejection after Dana's approval", "review", {**DANA, "approved": False, "by": "Eli"},
                  mini.DecisionConflict)]
        for case, wait, decision, expected in tries:
            before = _snapshot(conn)
            try:
                with mini.immediate(conn):
                    got = decide_wait(conn, "d1", wait, dict(decision))
            except Exception as raised:
                if isinstance(expected, type) and isinstance(raised, expected):
                    if _snapshot(conn) != before:
                        return f"{NOT_QUITE} {case} was refused, but the journal changed. {DECIDE_HINT}"
                    continue
                want = expected.__name__ if isinstance(expected, type) else repr(expected)
                return _unfinished(raised, "my_decide_wait") or (
                    f"{NOT_QUITE} for {case} your function raised {type(raised).__name__}: {raised}; expected "
                    f"{want}. {DECIDE_HINT}")
            if isinstance(expected, type):
                return (f"{NOT_QUITE} {case} should raise {expected.__name__} (from durable_kit.mini) and change "
                        f"nothing; your function returned {got!r}. {DECIDE_HINT}")
            if not (isinstance(got, tuple) and len(got) == 2 and got[0] == expected[0] and got[1] is expected[1]):
                return (f"{NOT_QUITE} for {case} return {expected!r} (the decision that stands, and whether this "
                        f"call saved it); your function returned {got!r}. {DECIDE_HINT}")
            if expected[1] is False and _snapshot(conn) != before:
                return f"{NOT_QUITE} {case} returned the first decision, but wrote to the journal. {DECIDE_HINT}"
            if expected[1] is True:
                row = journal.workflow("d1")
                wait_row = conn.execute("SELECT status, output FROM steps WHERE name = 'review'").fetchone()
                if wait_row["status"] != "complete" or json.loads(wait_row["output"] or "null") != DANA:
                    return (f"{NOT_QUITE} after {case} the wait's row should be complete with the decision as its "
                            f"output; it is {wait_row['status']!r} with {wait_row['output']}. {DECIDE_HINT}")
                if row["status"] != "pending" or (row["next_run_at"] or float("inf")) > time.time():
                    return (f"{NOT_QUITE} after {case} the workflow should be 'pending' and due now, so a worker runs "
                            f"it; it is {row['status']!r} with next_run_at {row['next_run_at']!r}. {DECIDE_HINT}")
    finally:
        conn.close()
    return (_in_processes("decide_wait", decide_wait, ["approval", "wait decided twice"], folder)
            or _decision_after_a_crash(decide_wait, folder))


def _decision_after_a_crash(decide_wait: Callable, folder: Path) -> str | None:
    """Approved, then the worker dies after publish's call: the next worker reuses the decision and finishes."""
    source = _source(decide_wait)
    run = scenarios.Run("mini", folder / "crash-after-the-decision", {"decide_wait": source}, timeout=30)
    try:
        with scenarios.plugged({"decide_wait": source}):
            run.start("approval")
            run.settle()
            run.api.approve(run.journal, "w1", by="Dana", wait="review")
            run.arm("after_activity:publish", "exit")
            codes = run.settle()
            again = run.api.approve(run.journal, "w1", by="Dana", wait="review")
        seen = run.seen(first_worker=codes[0], decision_after=[again["by"], again["saved"]])
    finally:
        run.journal.conn.close()
    want = {"status": "complete", "steps": [["draft", "complete", 1], ["publish", "complete", 2]],
            "calls": {"draft": 1, "publish": 2}, "first_worker": 13, "decision_after": ["Dana", False]}
    if seen != want:
        return (f"{NOT_QUITE} approved, then a worker killed after publish's call: the engine left {seen}, the kit "
                f"leaves {want}. {_status_of(run)} {DECIDE_HINT}")
    return None


# --- notebook 06: fenced --------------------------------------------------------------------------------------

FENCED_HINT = ("Hint: a context manager (@contextmanager) that opens `with immediate(conn):`, then, if lease is not "
               "None, reads the workflow's fencing_token in that transaction and raises LeaseLost unless it equals "
               "lease.token, then yields conn.")
INSERT = "INSERT INTO steps (workflow_id, name, kind, position, status) VALUES ('w', ?, 'step', ?, 'complete')"


def check_fenced(fenced: Callable) -> None:
    """Check the learner's ``fenced(conn, lease)`` (notebook 06) in this process and in worker processes."""
    with tempfile.TemporaryDirectory(prefix="check-06-") as folder:
        problem = _fenced_problem(fenced, Path(folder))
    report(problem, "a superseded token writes nothing, the current one commits, an error rolls back, and the "
                     "engine with it refused a paused owner's write, as the kit does")


@mini.workflow("check:fence")
def _fence_check(wf: mini.Workflow) -> None:
    return None


def _fenced_problem(fenced: Callable, folder: Path) -> str | None:
    journal = mini.Journal(folder / "here.db")
    conn = journal.conn
    rows = lambda: [r[0] for r in conn.execute("SELECT name FROM steps ORDER BY position")]  # noqa: E731
    try:
        journal.start("check:fence", {}, "w")
        old = mini.claim(conn, "worker-a", 30.0, "w")
        conn.execute("UPDATE workflows SET lease_expires_at = 0 WHERE id = 'w'")  # worker-a was paused past it
        new = mini.claim(conn, "worker-b", 30.0, "w")
        statements: list[str] = []
        tries = [("worker-a's stale lease (token 1)", old, mini.LeaseLost),
                 ("worker-b's current lease (token 2)", new, None),
                 ("the current lease, with an error inside the block", new, ValueError),
                 ("no lease (None)", None, None)]
        for position, (case, lease, refused) in enumerate(tries, start=1):
            before, raised = rows(), None
            conn.set_trace_callback(statements.append if lease is new and refused is None else None)
            try:
                with fenced(conn, lease) as opened:
                    (opened or conn).execute(INSERT, (f"write {position}", position))
                    if refused is ValueError:
                        raise ValueError("an error inside the block")
            except BaseException as error:  # LeaseLost is not an Exception: workflow code must not swallow it
                raised = error
            conn.set_trace_callback(None)
            left_open = conn.in_transaction
            if left_open:
                conn.execute("ROLLBACK")
            if raised is not None and not (refused and isinstance(raised, refused)):
                if isinstance(raised, mini.LeaseLost):
                    return (f"{NOT_QUITE} for {case} the write was refused ({raised}): refuse only a token other "
                            f"than the workflow's fencing_token. {FENCED_HINT}")
                if isinstance(raised, TypeError) and "context manager" in str(raised):
                    return (f"{NOT_QUITE} `with my_fenced(conn, lease):` failed ({raised}): make it a context "
                            f"manager. {FENCED_HINT}")
                return _unfinished(raised, "my_fenced") or (
                    f"{NOT_QUITE} for {case} `with my_fenced(conn, lease):` raised {type(raised).__name__}: "
                    f"{raised}" + (f"; expected {refused.__name__}" if refused else "") + f". {FENCED_HINT}")
            if refused is not None and raised is None:
                return (f"{NOT_QUITE} for {case} expected {refused.__name__} (from durable_kit.mini), and the write "
                        f"undone; nothing was raised. {FENCED_HINT}")
            if left_open:
                return (f"{NOT_QUITE} for {case} the transaction was left open: commit it when the block ends, roll "
                        f"it back when the block raises. {FENCED_HINT}")
            wanted = before if refused else before + [f"write {position}"]
            if rows() != wanted:
                return (f"{NOT_QUITE} for {case} the steps table holds {rows()}, not {wanted}: "
                        + ("a refused or failed block writes nothing" if refused else "the write was not committed")
                        + f". {FENCED_HINT}")
        inside = statements[statements.index("BEGIN IMMEDIATE"):] if "BEGIN IMMEDIATE" in statements else []
        if not any("fencing_token" in s for s in inside[:inside.index("COMMIT") if "COMMIT" in inside else None]):
            return (f"{NOT_QUITE} the token was not read inside the transaction (BEGIN IMMEDIATE ... COMMIT): "
                    f"checked before it, the lease can pass to another owner in between. {FENCED_HINT}")
    finally:
        conn.close()
    return _in_processes("fenced", fenced, ["paused owner's write refused"], folder)


# --- notebook 06: the learner's engine, assembled ---------------------------------------------------------------

def is_stub(path: Path, function: str) -> bool:
    """True if ``path`` is missing, or its ``function`` still raises ``NotImplementedError`` in its own body."""
    if not path.exists():
        return True
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except SyntaxError:
        return False  # theirs, to run and to fail
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return any(isinstance(s, ast.Raise) and "NotImplementedError" in ast.unparse(s) for s in node.body)
    return True


def your_parts(scratch: str | Path = "scratch") -> dict[str, tuple[str, str]]:
    """The parts you wrote, ``{part: (file, function)}``, read from the notebooks' scratch folders; say which."""
    parts = {}
    for part, (notebook, file, function) in ANSWERS.items():
        path = Path(scratch) / notebook / file
        if is_stub(path, function):
            print(f"{part:14} not written yet in {path}: the engine's own runs")
        else:
            print(f"{part:14} yours: {function} in {path}")
            parts[part] = (str(path.resolve()), function)
    return parts


def summary(seen: dict) -> str:
    """One scenario's outcome in a line: status, attempts per step, calls."""
    steps = ", ".join(f"{name} {attempts}" for name, _, attempts in seen["steps"])
    return f"{seen['status']}; attempts {steps}; {sum(seen['calls'].values())} calls"


def against_the_kit(folder: Path, parts: dict[str, tuple[str, str]]):
    """Every scenario on the kit and on the engine in one file with ``parts``: a table, one row a scenario."""
    import pandas as pd

    results = scenarios.side_by_side(Path(folder), parts)
    return pd.DataFrame([{"scenario": name, "the kit": summary(both["kit"]), "your engine": summary(both["mini"]),
                          "same": both["kit"] == both["mini"]} for name, both in results.items()])
