"""The exercise checks of notebooks 00 to 03: they run the learner's code, pass a right answer, explain a wrong one."""
from __future__ import annotations

import json

from durable_kit import immediate
from durable_kit.lab import checks
from durable_kit.retries import (AmbiguousEffect, FormatFailure, InvalidRequest, PolicyDenied, RateLimited,
                                 Transient)

FINISHED = "SELECT output FROM steps WHERE workflow_id = ? AND name = ? AND status = 'complete'"


def said(capsys) -> str:
    return capsys.readouterr().out.strip()


def stub(*args):
    raise NotImplementedError("not written yet")


def test_predicted_calls(capsys):
    checks.check_predicted_calls(..., 16)
    assert said(capsys).startswith("not yet:")
    checks.check_predicted_calls(15, 16)
    assert said(capsys).startswith("not quite: you predicted 15 model calls, the ledger counted 16.")
    checks.check_predicted_calls("16", 16)
    assert said(capsys).startswith("not quite: the prediction should be an int")
    checks.check_predicted_calls(16, 16)
    assert said(capsys) == "pass: 16 model calls, as the ledger counted"


def store_then_return(journal, workflow_id, name, activity, recheck):
    row = journal.conn.execute(FINISHED, (workflow_id, name)).fetchone()
    if row is not None:
        return json.loads(row["output"])
    output = activity()
    with immediate(journal.conn):
        row = journal.conn.execute(FINISHED, (workflow_id, name)).fetchone() if recheck else None
        if row is not None:
            return json.loads(row["output"])
        journal.conn.execute("INSERT INTO steps (workflow_id, name, status, output, attempts) VALUES (?, ?, 'complete', ?, 1)"
                             " ON CONFLICT (workflow_id, name) DO UPDATE SET output = excluded.output",
                             (workflow_id, name, json.dumps(output)))
    return output


def test_execute_step_passes_the_reference_and_catches_an_overwrite(capsys):
    checks.check_execute_step(stub)
    assert said(capsys).startswith("not yet:")
    checks.check_execute_step(lambda j, w, n, a: store_then_return(j, w, n, a, recheck=True))
    assert said(capsys).startswith("pass:")
    checks.check_execute_step(lambda j, w, n, a: store_then_return(j, w, n, a, recheck=False))
    assert said(capsys).startswith("not quite: the stored output was replaced")
    checks.check_execute_step(lambda j, w, n, a: a())  # never stores anything
    assert said(capsys).startswith("not quite: the step's row should be stored")


def reference_classify(response):
    status, message = response["status"], response.get("message", "")
    if status is None or status >= 500:
        return AmbiguousEffect(message) if response["sends"] else Transient(message)
    if status == 429:
        return RateLimited(message, retry_after=float(response["retry_after"]))
    if status == 403:
        return PolicyDenied(message)
    if status == 200:
        return FormatFailure("prose")
    return InvalidRequest(message)


def test_classify(capsys):
    checks.check_classify(stub)
    assert said(capsys).startswith("not yet:")
    checks.check_classify(reference_classify)
    assert said(capsys) == "pass: all 7 responses take the path they need"
    checks.check_classify(lambda r: Transient(r.get("message", "")))
    assert said(capsys).startswith("not quite: 5 of 7 responses take the wrong path")
    checks.check_classify(lambda r: "transient")
    assert "return an exception instance" in said(capsys)


def test_kill_after_fetch_runs_real_processes(capsys):
    checks.check_kill_after_fetch(stub)
    assert said(capsys).startswith("not yet:")
    checks.check_kill_after_fetch(checks.run_kill_after_fetch, {"exit_code": -9, "source_calls": 2})
    assert said(capsys) == ("pass: SIGKILL at after_fetch: exit code -9, two source calls, one passage, "
                            "one finding")
    checks.check_kill_after_fetch(checks.run_kill_after_fetch, {"exit_code": 13, "source_calls": 2})
    assert said(capsys).startswith("not quite: your code is right, your predictions are not: exit_code")

    def exits_politely(db):
        from durable_kit.agents.checkpoints import attempt_in_child, open_checkpoints, saved_state
        from durable_kit.faults import arm, disarm_all
        conn = open_checkpoints(db)
        arm(conn, "after_fetch", "exit")
        code = attempt_in_child(db)
        disarm_all(conn)
        attempt_in_child(db)
        return code, saved_state(db)

    checks.check_kill_after_fetch(exits_politely)
    assert said(capsys).startswith("not quite: the database should show one crash point fired, "
                                   "'after_fetch (kill)'; it shows ['after_fetch (exit)']")
