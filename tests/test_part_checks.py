"""The checks of the engine in one file's four parts (notebooks 02, 03, 04, 06): the notebooks' own solutions pass,
each common misunderstanding is refused by name, a stub is "not yet", and the four solutions assembled leave what the
kit leaves in all twelve crash scenarios."""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from durable_kit.workshop.lab import parts

ROOT = Path(__file__).resolve().parents[1]
SOLUTION_FILE = re.compile(r"^%%writefile scratch/(\d\d)/(solution_\w+)\.py\n", re.M)


def said(capsys) -> str:
    return capsys.readouterr().out.strip()


def solutions() -> dict[str, tuple[str, str]]:
    """Each notebook's solution file, as a learner who wrote it has it: ``{notebook: (file name, source)}``."""
    found = {}
    for path in sorted((ROOT / "notebooks").glob("0[2346]_*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"])
            if (match := SOLUTION_FILE.match(source)) is not None:
                written_in = re.sub(r"\bsolution_(\w+)", r"my_\1", source[match.end():])
                found[match.group(1)] = (match.group(2).replace("solution_", "my_") + ".py", written_in)
    return found


def written(folder: Path, notebook: str) -> Path:
    name, source = solutions()[notebook]
    (folder / notebook).mkdir(parents=True, exist_ok=True)
    (folder / notebook / name).write_text(source)
    return folder / notebook / name


def part_of(tmp_path: Path, source: str, name: str):
    """A function of ``source``, saved to a file as the notebooks' %%writefile cells do."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return parts.load_part(path, name)


def test_each_notebook_has_the_solution_of_its_part():
    assert {notebook: name for notebook, (name, _) in solutions().items()} == {
        notebook: file for notebook, file, _ in parts.ANSWERS.values()}


@pytest.mark.parametrize("part", list(parts.ANSWERS))
def test_the_notebook_s_solution_passes_its_check_and_a_stub_is_not_yet(part, tmp_path, capsys):
    notebook, _, function = parts.ANSWERS[part]
    check = getattr(parts, f"check_{part}")
    check(parts.load_part(written(tmp_path, notebook), function))
    assert said(capsys).startswith("pass:")
    stub = part_of(tmp_path, f"""
        def {function}(*args):
            raise NotImplementedError("write {function}")
        """, function)
    check(stub)
    assert said(capsys).startswith("not yet:")
    check(parts.load_part(tmp_path / "missing.py", function))
    assert said(capsys).startswith(f"not quite: {tmp_path / 'missing.py'} could not be imported (FileNotFoundError")


RUN_STEP = """
import json
from durable_kit.mini import fenced, mark
FINISHED = "SELECT output FROM steps WHERE workflow_id = ? AND name = ? AND status = 'complete'"

def {name}(wf, name, activity):
    row = None if {skip_lookup} else wf.conn.execute(FINISHED, (wf.id, name)).fetchone()
    if row is not None:
        return json.loads(row["output"])
    output = activity()
    with fenced(wf.conn, wf.lease) as conn:
        row = conn.execute(FINISHED, (wf.id, name)).fetchone() if {look_again} else None
        if row is not None:
            return json.loads(row["output"])
        {store}
    return output
"""
MARK = 'mark(conn, wf.id, name, "complete", output=json.dumps(output))'


@pytest.mark.parametrize("name, changes, verdict", [
    ("no_lookup", {"skip_lookup": True}, "not quite: a replay called the activity of a complete step again"),
    ("no_second_look", {"look_again": False}, "not quite: another process committed the step while its activity "
                                              "ran, and your run_step returned {'written_by': 'this process'}"),
    ("inserts", {"store": "conn.execute('INSERT INTO steps (workflow_id, name, status) VALUES (?, ?, \\'complete\\')', "
                          "(wf.id, name))"}, "not quite: your run_step raised IntegrityError"),
    ("never_stores", {"store": "pass"}, "not quite: the first run should call plan's activity once and leave the "
                                        "step complete"),
])
def test_run_step_refuses_each_misunderstanding(name, changes, verdict, tmp_path, capsys):
    source = RUN_STEP.format(name=name, **{"skip_lookup": False, "look_again": True, "store": MARK, **changes})
    parts.check_run_step(part_of(tmp_path, source, name))
    assert said(capsys).startswith(verdict)


AFTER_FAILURE = """
import time
from durable_kit.mini import RetryPolicy, Transient, mark, move

def {name}(conn, workflow_id, step, error, policy):
    if {fails}:
        return "fail"
    policy = policy or RetryPolicy()
    (attempts,) = conn.execute("SELECT attempts FROM steps WHERE workflow_id = ? AND name = ?",
                               (workflow_id, step)).fetchone()
    if attempts >= policy.max_attempts and {escalates}:
        return "escalate"
    retry_at = time.time() + policy.delay(attempts)
    mark(conn, workflow_id, step, "retrying", next_attempt_at=retry_at)
    move(conn, workflow_id, "pending", next_run_at={run_at})
    return "retry"
"""


@pytest.mark.parametrize("name, changes, verdict", [
    ("never_escalates", {"escalates": False}, "not quite: for Transient('the process died') on attempt 3 with "
                                              "RetryPolicy(max_attempts=3, base_delay=2.0) the path is 'escalate'"),
    ("retries_a_bug", {"fails": "policy is None"}, "not quite: for ValueError('a bug') on attempt 1"),
    ("retries_without_a_policy", {"fails": "not isinstance(error, Transient)"},
     "not quite: for Transient('503') on attempt 1 with no policy the path is 'fail'"),
    ("due_at_once", {"run_at": "time.time()"}, "not quite: for Transient('503') on attempt 1 with RetryPolicy("
                                               "max_attempts=3, base_delay=2.0) the workflow should be 'pending' "
                                               "with next_run_at equal to the step's next_attempt_at"),
])
def test_after_failure_refuses_each_misunderstanding(name, changes, verdict, tmp_path, capsys):
    source = AFTER_FAILURE.format(name=name, **{"fails": "policy is None or not isinstance(error, Transient)",
                                                "escalates": True, "run_at": "retry_at", **changes})
    parts.check_after_failure(part_of(tmp_path, source, name))
    assert said(capsys).startswith(verdict)


DECIDE = """
import json
import time
from durable_kit.mini import DecisionConflict, NotWaiting, mark, move

def {name}(conn, workflow_id, wait, decision):
    row = conn.execute("SELECT status, output FROM steps WHERE workflow_id = ? AND name = ? AND kind = 'approval'",
                       (workflow_id, wait)).fetchone()
    if row is None:
        {missing}
    if row["status"] == "complete" and {final}:
        first = json.loads(row["output"])
        if first["approved"] != decision["approved"]:
            raise DecisionConflict("final")
        return first, False
    mark(conn, workflow_id, wait, "complete", output=json.dumps(decision))
    {wake}
    return decision, True
"""


@pytest.mark.parametrize("name, changes, verdict", [
    ("not_final", {"final": False}, "not quite: for Sam's approval after Dana's return ({'approved': True, "
                                    "'by': 'Dana', 'comment': 'sources are sound'}, False)"),
    ("no_wake", {"wake": "pass"}, "not quite: after Dana's approval the workflow should be 'pending' and due now"),
    ("no_refusal", {"missing": "return decision, False"}, "not quite: a decision on 'plan', a wait not reached "
                                                          "should raise NotWaiting"),
    ("wrong_refusal", {"missing": "raise ValueError('no wait')"}, "not quite: for a decision on 'plan', a wait not "
                                                                  "reached your function raised ValueError: no wait; "
                                                                  "expected NotWaiting"),
])
def test_decide_wait_refuses_each_misunderstanding(name, changes, verdict, tmp_path, capsys):
    source = DECIDE.format(name=name, **{"missing": "raise NotWaiting('no')", "final": True,
                                         "wake": "move(conn, workflow_id, 'pending', next_run_at=time.time())",
                                         **changes})
    parts.check_decide_wait(part_of(tmp_path, source, name))
    assert said(capsys).startswith(verdict)


FENCED = """
from contextlib import contextmanager
from durable_kit.mini import LeaseLost, immediate

def stale(conn, lease):
    (token,) = conn.execute("SELECT fencing_token FROM workflows WHERE id = ?", (lease.workflow_id,)).fetchone()
    return token != lease.token

@contextmanager
def {name}(conn, lease):
{body}
"""
RIGHT = """    with immediate(conn):
        if lease is not None and stale(conn, lease):
            raise LeaseLost("superseded")
        yield conn"""


@pytest.mark.parametrize("name, body, verdict", [
    ("unchecked", "    with immediate(conn):\n        yield conn", "not quite: for worker-a's stale lease (token 1) "
                                                                    "expected LeaseLost"),
    ("checked_before", "    if lease is not None and stale(conn, lease):\n        raise LeaseLost('superseded')\n"
                       "    with immediate(conn):\n        yield conn", "not quite: the token was not read inside the "
                                                                       "transaction"),
    ("refuses_everyone", "    with immediate(conn):\n        if lease is not None:\n            raise LeaseLost('no')\n"
                         "        yield conn", "not quite: for worker-b's current lease (token 2) the write was refused"),
    ("wrong_exception", RIGHT.replace('raise LeaseLost("superseded")', 'raise ValueError("superseded")'),
     "not quite: for worker-a's stale lease (token 1) `with my_fenced(conn, lease):` raised ValueError: superseded; "
     "expected LeaseLost"),
    ("no_rollback", "    conn.execute('BEGIN IMMEDIATE')\n    if lease is not None and stale(conn, lease):\n"
                    "        conn.execute('ROLLBACK')\n        raise LeaseLost('superseded')\n    yield conn\n"
                    "    conn.execute('COMMIT')", "not quite: for the current lease, with an error inside the block the "
                                                  "transaction was left open"),
])
def test_fenced_refuses_each_misunderstanding(name, body, verdict, tmp_path, capsys):
    parts.check_fenced(part_of(tmp_path, FENCED.format(name=name, body=body), name))
    assert said(capsys).startswith(verdict)


def test_a_function_that_is_no_context_manager_is_told_to_be_one(tmp_path, capsys):
    parts.check_fenced(part_of(tmp_path, "def plain(conn, lease):\n    return None\n", "plain"))
    assert said(capsys).startswith("not quite: `with my_fenced(conn, lease):` failed")


def test_a_stub_or_a_missing_file_is_not_yours_and_an_answer_is(tmp_path, capsys):
    for notebook, file, function in parts.ANSWERS.values():
        if notebook == "03":
            (tmp_path / notebook).mkdir()
            (tmp_path / notebook / file).write_text(f"def {function}(*args):\n    raise NotImplementedError('x')\n")
    written(tmp_path, "06")
    assert list(parts.your_parts(tmp_path)) == ["fenced"]
    assert said(capsys).splitlines() == [
        f"run_step       not written yet in {tmp_path}/02/my_step.py: the engine's own runs",
        f"after_failure  not written yet in {tmp_path}/03/my_retry.py: the engine's own runs",
        f"decide_wait    not written yet in {tmp_path}/04/my_decision.py: the engine's own runs",
        f"fenced         yours: my_fenced in {tmp_path}/06/my_fence.py"]


def test_the_four_solutions_assembled_leave_what_the_kit_leaves(tmp_path, capsys):
    for notebook in ("02", "03", "04", "06"):
        written(tmp_path / "scratch", notebook)
    yours = parts.your_parts(tmp_path / "scratch")
    assert sorted(yours) == sorted(parts.ANSWERS)
    table = parts.against_the_kit(tmp_path / "assembled", yours)
    assert len(table) == 12 and table["same"].all(), table.to_string()
