"""The exercise checks of notebooks 00 to 03: they run the learner's code, pass a right answer, explain a wrong one."""
from __future__ import annotations

import json

from durable_kit import immediate, reconcile_then_send, send_at_most_once, send_guarded
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


# --- notebook 09: find the double charge, then fix it (real worker processes, two bookings per journal) ---

def naive_charge(wf, cards, booking, amount):
    return send_guarded(wf, "charge", lambda: cards.charge(booking, amount))


def reconciled_charge(wf, cards, booking, amount):
    return reconcile_then_send(wf, "charge", lambda: next(iter(cards.effects("charge", booking=booking)), None),
                               lambda: cards.charge(booking, amount))["receipt"]


def any_charge_counts(wf, cards, booking, amount):
    return reconcile_then_send(wf, "charge", lambda: next(iter(cards.effects("charge")), None),
                               lambda: cards.charge(booking, amount))["receipt"]


def whole_result(wf, cards, booking, amount):
    return reconcile_then_send(wf, "charge", lambda: next(iter(cards.effects("charge", booking=booking)), None),
                               lambda: cards.charge(booking, amount))


def reserved_charge(wf, cards, booking, amount):
    return send_at_most_once(wf, "charge", lambda key: cards.charge(booking, amount))["receipt"]


def unwritten_charge(wf, cards, booking, amount):
    raise NotImplementedError("write my_charge")


def test_check_boundary_on_the_naive_checkout(capsys, tmp_path):
    rows = checks.checkout_rows(naive_charge, tmp_path, points=["after_send:charge", "after_commit:charge"])
    assert [(r["point"], r["counts"]["cards effects"]) for r in rows] == [
        ("clean", 2), ("after_send:charge", 3), ("after_commit:charge", 2)]
    checks.check_boundary(..., rows)
    assert said(capsys).startswith("not yet: Ellipsis is not a boundary of the checkout")
    checks.check_boundary("after_sending:charge", rows)
    assert said(capsys).startswith("not yet: 'after_sending:charge' is not a boundary")
    checks.check_boundary("after_commit:charge", rows)
    assert said(capsys).startswith("not quite: a worker killed at after_commit:charge left 2 charges for 2 bookings")
    checks.check_boundary("after_send:charge", rows)
    assert said(capsys) == ("pass: a worker killed at after_send:charge left 3 charges for 2 bookings: "
                            "one booking was charged twice")


def test_check_charge_refuses_an_unwritten_a_naive_and_a_reserved_charge(capsys, tmp_path):
    checks.check_charge(...)
    assert said(capsys).startswith("not yet: define my_charge")
    checks.check_charge(unwritten_charge, tmp_path / "unwritten")
    assert said(capsys) == "not yet: write my_charge, then run this cell again"
    checks.check_charge(naive_charge, tmp_path / "naive")
    assert said(capsys).startswith("not quite: after a crash, (point, charges for 2 bookings, status) = "
                                   "[('after_send:charge', 3, 'complete'), ('after_activity:charge', 3, 'complete')]")
    checks.check_charge(reserved_charge, tmp_path / "reserved")
    assert said(capsys).startswith("not quite: after a crash, (point, charges for 2 bookings, status) = "
                                   "[('before_send:charge', 1, 'lab-1: failed; lab-2: complete')")


def test_check_charge_refuses_reconciliation_on_every_booking_and_a_wrong_return(capsys, tmp_path):
    checks.check_charge(any_charge_counts, tmp_path / "unfiltered")  # cards.effects("charge") with no booking filter
    assert said(capsys).startswith("not quite: without any crash the processor made 1 charges for 2 bookings. "
                                   "Hint: ask only about this booking's charges")
    checks.check_charge(whole_result, tmp_path / "whole")
    assert said(capsys).startswith("not quite: without any crash the checkouts ended failed")
    checks.check_charge(lambda wf, cards, booking, amount: None)
    assert said(capsys).startswith("not quite: write my_charge with def")


def test_check_charge_passes_reconciliation_by_booking(capsys, tmp_path):
    checks.check_charge(reconciled_charge, tmp_path)
    assert said(capsys) == ("pass: reconciled_charge charged each of 2 bookings once, without a crash and after a "
                            "crash at each of 4 boundaries")
