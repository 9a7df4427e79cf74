"""Effects in isolation: the fake destinations, and each delivery strategy with its exact guarantee."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from durable_kit import Journal, run_workflow, workflow
from durable_kit.change import cancel, fork
from durable_kit.core.store import now
from durable_kit.admin import waits
from durable_kit.core.worker import run_due
from durable_kit.effects import (DESTINATIONS, NOT_SENT, destination, dispatch_outbox, effect_key,
                                 reconcile_then_send, send_at_most_once, send_guarded, send_via_outbox)
from durable_kit.world.notifier import Notifier, notifier_path
from durable_kit.world.payments import KeyReused, Payments, payments_path
from durable_kit.harness.faults import CRASH_EXIT_CODE, InjectedFailure, arm

from conftest import dump, run_python

PAYLOAD = {"to": "ops@example.com", "message": "done"}


def events(journal: Journal, workflow_id: str) -> list[str]:
    return [e["event"] for e in journal.history(workflow_id)]


def rows(db: Path, sql: str, *args) -> list[tuple]:
    """Rows read through a fresh connection: what is committed on disk."""
    conn = sqlite3.connect(str(db))
    try:
        return [tuple(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def outbox(db: Path) -> list[tuple]:
    return rows(db, "SELECT key, action, status, attempts, sent_at IS NOT NULL FROM outbox ORDER BY key")


def started(db: Path, workflow_id: str = "w1") -> Journal:
    """A journal holding one pending workflow (reservations and history belong to a workflow)."""
    journal = Journal(db)
    journal.start("test_effects.none", {}, workflow_id, registered_elsewhere=True)
    return journal


# --- the payment service ---

def test_payments_with_keys_returns_the_original_refund_for_a_repeated_key(tmp_path):
    payments = Payments(tmp_path / "pay.db", accepts_keys=True)
    first = payments.refund("A-1001", 89.0, "k1")
    assert first == {"refund_id": "R-0001", "order_id": "A-1001", "amount": 89.0}
    assert payments.refund("A-1001", 89.0, "k1") == first
    assert payments.refunds() == [first]
    assert payments.request_count() == 2  # the repeat reached the service and was counted

    # The service's memory is its own file: a new client (another process, later) sees the same refund.
    again = Payments(tmp_path / "pay.db", accepts_keys=True)
    assert again.refund("A-1001", 89, "k1") == first
    assert (len(again.refunds()), again.request_count()) == (1, 3)

    # Another key is another refund; no key at all is a new refund every time.
    assert payments.refund("A-1001", 89.0, "k2")["refund_id"] == "R-0002"
    assert [payments.refund("A-1001", 89.0)["refund_id"] for _ in range(2)] == ["R-0003", "R-0004"]
    assert (len(payments.refunds()), payments.request_count()) == (4, 6)


@pytest.mark.parametrize("order_id, amount", [("A-1001", 50.0), ("A-1002", 89.0)])
def test_payments_refuses_a_key_reused_with_other_parameters(tmp_path, order_id, amount):
    payments = Payments(tmp_path / "pay.db", accepts_keys=True)
    first = payments.refund("A-1001", 89.0, "refund-A-1001:refund")
    with pytest.raises(KeyReused) as refused:
        payments.refund(order_id, amount, "refund-A-1001:refund")
    message = str(refused.value)
    assert "'refund-A-1001:refund'" in message
    assert f"not {amount:g} on {order_id}" in message and "89 on order A-1001" in message
    assert isinstance(refused.value, ValueError)
    assert payments.refunds() == [first]  # nothing was refunded
    assert payments.request_count() == 2  # but the request was counted on arrival


def test_payments_without_keys_makes_every_request_a_new_refund(tmp_path):
    payments = Payments(tmp_path / "pay.db", accepts_keys=False)
    receipts = [payments.refund("A-1001", 89.0, "k1") for _ in range(3)]
    assert [r["refund_id"] for r in receipts] == ["R-0001", "R-0002", "R-0003"]
    assert (len(payments.refunds()), payments.request_count()) == (3, 3)
    # It saw the key (each request is logged as received) but does not keep it.
    assert rows(payments.path, "SELECT key FROM requests") == [("k1",)] * 3
    assert rows(payments.path, "SELECT key FROM refunds") == [(None,)] * 3


def test_refunds_of_an_order_lists_only_that_orders_refunds_oldest_first(tmp_path):
    payments = Payments(tmp_path / "pay.db", accepts_keys=False)
    for order_id, amount in [("A-1001", 89.0), ("A-1002", 420.0), ("A-1001", 10.0)]:
        payments.refund(order_id, amount)
    assert payments.refunds("A-1001") == [{"refund_id": "R-0001", "order_id": "A-1001", "amount": 89.0},
                                          {"refund_id": "R-0003", "order_id": "A-1001", "amount": 10.0}]
    assert payments.refunds("A-1002") == [{"refund_id": "R-0002", "order_id": "A-1002", "amount": 420.0}]
    assert payments.refunds("A-9999") == []
    assert len(payments.refunds()) == 3


def test_the_outside_world_lives_beside_the_journal(tmp_path):
    db = tmp_path / "x.db"
    assert payments_path(db) == tmp_path / "x.payments.db" == Payments.beside(db).path
    assert notifier_path(db) == tmp_path / "x.notify.db" == Notifier.beside(db).path
    assert Payments.beside(db).accepts_keys is True and Notifier.beside(db).dedupe is False


# --- the notifier ---

def test_notifier_without_dedupe_delivers_every_request(tmp_path):
    notifier = Notifier(tmp_path / "n.db")
    answers = [notifier.send("ana@example.com", "hello", "k1") for _ in range(3)]
    assert [a["delivery"] for a in answers] == [1, 2, 3]
    assert (notifier.count(), notifier.count("k1"), notifier.request_count()) == (3, 3, 3)


def test_notifier_with_dedupe_delivers_a_key_once_and_answers_repeats_with_the_first(tmp_path):
    notifier = Notifier(tmp_path / "n.db", dedupe=True)
    first = notifier.send("ana@example.com", "hello", "k1")
    assert first == {"delivery": 1, "recipient": "ana@example.com"}
    assert notifier.send("ana@example.com", "hello", "k1") == first
    assert Notifier(tmp_path / "n.db", dedupe=True).send("ana@example.com", "hello", "k1") == first
    assert notifier.send("bob@example.com", "hi", "k2")["delivery"] == 2
    assert [notifier.send("cy@example.com", "no key")["delivery"] for _ in range(2)] == [3, 4]  # no key: no dedupe
    assert notifier.deliveries("k1") == [{"seq": 1, "key": "k1", "recipient": "ana@example.com", "message": "hello"}]
    assert (notifier.count(), notifier.count("k1"), notifier.request_count()) == (4, 1, 6)


# --- keys and the fault points around a send ---

def test_a_key_is_made_of_the_workflow_and_the_action_only():
    assert effect_key("refund-A-1001", "refund") == "refund-A-1001:refund"
    assert effect_key("w1", "notify") != effect_key("w2", "notify") != effect_key("w1", "refund")


def test_send_guarded_checks_a_fault_point_before_and_after_the_send(db):
    journal = started(db)
    sent = []
    assert send_guarded(journal.open("w1"), "notify", lambda: sent.append(1) or "ok") == "ok"

    arm(journal.conn, "before_send:notify", "fail")
    with pytest.raises(InjectedFailure):
        send_guarded(journal.open("w1"), "notify", lambda: sent.append(2))
    assert sent == [1]  # failed before: nothing sent

    arm(journal.conn, "after_send:notify", "fail")
    with pytest.raises(InjectedFailure):
        send_guarded(journal.open("w1"), "notify", lambda: sent.append(3))
    assert sent == [1, 3]  # failed after: sent, and the caller never heard the answer
    fired = [e["detail"] for e in journal.history("w1") if e["event"] == "fault_fired"]
    assert fired == ["before_send:notify (fail)", "after_send:notify (fail)"]


# --- at most once: reserve the key, commit, then send ---

def test_send_at_most_once_sends_once_and_says_when_it_did_not(db):
    journal = started(db)
    sent = []

    def send(key):
        sent.append(key)
        return {"delivery": len(sent)}

    assert send_at_most_once(journal.open("w1"), "notify", send) == {
        "key": "w1:notify", "sent": True, "receipt": {"delivery": 1}}
    assert sent == ["w1:notify"]
    assert rows(db, "SELECT key, workflow_id FROM reservations") == [("w1:notify", "w1")]

    # A later attempt (a new replay of the same workflow) finds the key reserved and does not send.
    assert send_at_most_once(journal.open("w1"), "notify", send) == {"key": "w1:notify", "sent": False,
                                                                    "note": NOT_SENT}
    assert sent == ["w1:notify"]
    history = [(e["step"], e["event"], e["detail"]) for e in journal.history("w1") if e["step"]][-2:]
    assert history == [("notify", "key_reserved", "w1:notify"), ("notify", "key_already_reserved", "w1:notify")]

    # Another action, or another workflow, has its own key.
    started(db, "w2")
    assert send_at_most_once(journal.open("w1"), "refund", send)["sent"] is True
    assert send_at_most_once(journal.open("w2"), "notify", send)["sent"] is True
    assert sent == ["w1:notify", "w1:refund", "w2:notify"]
    assert len(rows(db, "SELECT key FROM reservations")) == 3


def test_a_failure_between_reservation_and_send_loses_the_effect(db):
    journal = started(db)
    sent = []
    arm(journal.conn, "before_send:notify", "fail")
    with pytest.raises(InjectedFailure):
        send_at_most_once(journal.open("w1"), "notify", sent.append)
    assert rows(db, "SELECT key FROM reservations") == [("w1:notify",)]  # committed before the send
    assert send_at_most_once(journal.open("w1"), "notify", sent.append)["sent"] is False
    assert sent == []


# --- reconciliation: ask the destination first ---

def test_reconcile_then_send_adopts_an_existing_effect_without_sending(db):
    journal = started(db)
    sent = []
    found = {"refund_id": "R-0001", "order_id": "A-1001", "amount": 89.0}
    result = reconcile_then_send(journal.open("w1"), "refund", lambda: found, lambda: sent.append(1))
    assert result == {"sent": False, "receipt": found}
    assert sent == []
    last = journal.history("w1")[-1]
    assert (last["step"], last["event"]) == ("refund", "reconciled")
    assert "already has this effect" in last["detail"]


def test_reconcile_then_send_sends_when_the_destination_has_nothing(db):
    journal = started(db)
    wf = journal.open("w1")
    before = events(journal, "w1")
    result = reconcile_then_send(wf, "refund", lambda: [], lambda: {"refund_id": "R-0001"})
    assert result == {"sent": True, "receipt": {"refund_id": "R-0001"}}
    assert events(journal, "w1") == before  # nothing reconciled

    arm(journal.conn, "before_send:refund", "fail")  # the send is guarded like every other send
    with pytest.raises(InjectedFailure):
        reconcile_then_send(journal.open("w1"), "refund", lambda: None, lambda: pytest.fail("sent anyway"))


def test_reconciliation_against_a_service_without_keys_pays_once(db):
    journal = started(db)
    payments = Payments.beside(db, accepts_keys=False)

    def pay_once():
        return reconcile_then_send(journal.open("w1"), "refund", lambda: next(iter(payments.refunds("A-1001")), None),
                                   lambda: payments.refund("A-1001", 89.0))

    first, second = pay_once(), pay_once()
    assert (first["sent"], second["sent"]) == (True, False)
    assert first["receipt"] == second["receipt"] == {"refund_id": "R-0001", "order_id": "A-1001", "amount": 89.0}
    assert (payments.request_count(), len(payments.refunds())) == (1, 1)
    assert events(journal, "w1").count("reconciled") == 1


# --- the transactional outbox, in this process ---

class Recorder:
    """An outbox destination for one test: records every call, fails the first ``failures`` of them."""

    def __init__(self, name: str):
        self.name, self.calls, self.failures = name, [], 0

    def __call__(self, journal_path: Path, payload, key: str) -> dict:
        self.calls.append((Path(journal_path).name, payload, key))
        if len(self.calls) <= self.failures:
            raise ConnectionError("destination down")
        return {"call": len(self.calls)}


@pytest.fixture
def recorder(request):
    name = f"{request.node.name}.recorder"
    yield destination(name)(Recorder(name))
    DESTINATIONS.pop(name, None)


def outbox_kind(kinds, destination_name: str) -> str:
    """A workflow kind that sends one message through the outbox and returns the destination's answer."""
    kind = kinds("outbox")

    @workflow(kind)
    def send_one(wf):
        return {"receipt": send_via_outbox(wf, "notify", destination_name, PAYLOAD)}

    return kind


def test_the_outbox_row_and_its_step_commit_together_or_not_at_all(db, kinds, recorder):
    journal = Journal(db)
    journal.start(outbox_kind(kinds, recorder.name), {}, "o1")
    journal.conn.execute("CREATE TRIGGER refuse_outbox BEFORE INSERT ON outbox"
                         " BEGIN SELECT RAISE(ABORT, 'outbox refused'); END")
    wf = journal.open("o1")
    before = dump(db)
    with pytest.raises(sqlite3.IntegrityError, match="outbox refused"):
        send_via_outbox(wf, "notify", recorder.name, PAYLOAD)
    assert dump(db) == before  # the step insert, which ran first, was rolled back with the outbox row
    assert (rows(db, "SELECT * FROM steps"), outbox(db)) == ([], [])
    assert "notify" not in wf._outputs

    # Without the trigger the same replay commits both, with one history event.
    journal.conn.execute("DROP TRIGGER refuse_outbox")
    assert run_workflow(journal, "o1") is None
    assert outbox(db) == [("o1:notify", "notify", "pending", 0, 0)]
    step = journal.steps("o1")[0]
    assert (step["name"], step["status"], step["input"], step["output"]) == (
        "notify", "complete", PAYLOAD, {"key": "o1:notify", "destination": recorder.name})
    assert events(journal, "o1").count("outbox_enqueued") == 1
    assert recorder.calls == []  # enqueued, not sent: only a dispatcher sends


def test_dispatch_sends_with_the_key_marks_sent_saves_the_receipt_and_wakes_the_workflow(db, kinds, recorder):
    journal = Journal(db)
    journal.start(outbox_kind(kinds, recorder.name), {}, "o1")
    assert run_workflow(journal, "o1") is None
    wf = journal.workflow("o1")
    assert (wf["status"], wf["next_run_at"]) == ("waiting", None)  # no worker held, no run time
    [wait] = waits(journal, "o1")
    assert (wait["name"], wait["kind"], wait["status"], wait["request"]) == (
        "notify:receipt", "delivery", "waiting", {"key": "o1:notify"})

    log = []
    assert dispatch_outbox(journal, log.append) == 1
    assert recorder.calls == [("journal.db", PAYLOAD, "o1:notify")]
    assert log == []
    assert outbox(db) == [("o1:notify", "notify", "sent", 1, 1)]
    assert rows(db, "SELECT result FROM outbox") == [('{"call":1}',)]
    [wait] = waits(journal, "o1")
    assert (wait["status"], wait["decision"]) == ("resolved", {"call": 1})
    wf = journal.workflow("o1")
    assert wf["status"] == "pending" and wf["next_run_at"] <= now()
    assert events(journal, "o1")[-1] == "outbox_sent"

    assert dispatch_outbox(journal, log.append) == 0  # sent rows are not sent again
    assert len(recorder.calls) == 1
    assert run_workflow(journal, "o1") == {"receipt": {"call": 1}}
    assert journal.workflow("o1")["status"] == "complete"
    assert len(recorder.calls) == 1


def test_a_cancellation_withdraws_a_delivery_no_dispatcher_has_tried(db, kinds, recorder):
    journal = Journal(db)
    journal.start(outbox_kind(kinds, recorder.name), {}, "o1")
    assert run_workflow(journal, "o1") is None  # enqueued; the workflow waits for its receipt
    cancel(journal, "o1", "Dana", "wrong customer")
    run_workflow(journal, "o1")
    assert journal.workflow("o1")["status"] == "cancelled"
    assert outbox(db) == [("o1:notify", "notify", "withdrawn", 0, 0)]
    assert dispatch_outbox(journal) == 0
    assert recorder.calls == []  # never sent
    before = dump(db)
    with pytest.raises(Exception, match="'notify' .* was withdrawn by its cancellation and will never be sent"):
        fork(journal, "o1", "o2", up_to="notify", by="Dana")
    assert dump(db) == before
    [cancelled] = [e for e in journal.history("o1") if e["event"] == "workflow_cancelled"]
    assert "withdrew the undelivered notify" in cancelled["detail"]


def test_a_cancellation_leaves_a_delivery_already_tried_to_arrive_and_says_so(db, kinds, recorder):
    recorder.failures = 1  # the first send fails: it may or may not have reached the destination
    journal = Journal(db)
    journal.start(outbox_kind(kinds, recorder.name), {}, "o1")
    run_workflow(journal, "o1")
    assert dispatch_outbox(journal, lambda line: None) == 0
    assert outbox(db) == [("o1:notify", "notify", "pending", 1, 0)]
    cancel(journal, "o1", "Dana", "wrong customer")
    run_workflow(journal, "o1")
    [cancelled] = [e for e in journal.history("o1") if e["event"] == "workflow_cancelled"]
    assert "already tried, so it may still arrive: notify" in cancelled["detail"]
    assert dispatch_outbox(journal) == 1  # at least once, with its key: the destination deduplicates
    assert len(recorder.calls) == 2 and outbox(db)[0][2] == "sent"
    assert journal.workflow("o1")["status"] == "cancelled"  # the late receipt does not wake it


def test_run_due_dispatches_the_outbox_before_it_runs_workflows(db, kinds, recorder):
    journal = Journal(db)
    journal.start(outbox_kind(kinds, recorder.name), {}, "o1")
    run_workflow(journal, "o1")
    log = []
    assert run_due(journal, log.append) == 2  # one send, then the workflow it woke, in the same pass
    assert journal.workflow("o1")["status"] == "complete"
    assert "o1: complete" in log
    assert len(recorder.calls) == 1


def test_a_destination_not_registered_leaves_the_row_pending(db, kinds):
    journal = Journal(db)
    journal.start(outbox_kind(kinds, "nowhere.registered"), {}, "o1")
    run_workflow(journal, "o1")
    before = dump(db)
    assert dispatch_outbox(journal, pytest.fail) == 0
    assert dump(db) == before
    assert outbox(db) == [("o1:notify", "notify", "pending", 0, 0)]
    assert journal.workflow("o1")["status"] == "waiting"


def test_a_sender_that_raises_leaves_the_row_pending_and_the_next_dispatch_sends_it(db, kinds, recorder):
    recorder.failures = 1
    journal = Journal(db)
    journal.start(outbox_kind(kinds, recorder.name), {}, "o1")
    run_workflow(journal, "o1")

    log = []
    assert dispatch_outbox(journal, log.append) == 0
    assert log == ["o1: outbox o1:notify not sent: ConnectionError: destination down"]
    assert outbox(db) == [("o1:notify", "notify", "pending", 1, 0)]
    assert waits(journal, "o1")[0]["status"] == "waiting"
    assert journal.workflow("o1")["status"] == "waiting"

    assert dispatch_outbox(journal, log.append) == 1
    assert outbox(db) == [("o1:notify", "notify", "sent", 2, 1)]
    assert [key for _, _, key in recorder.calls] == ["o1:notify", "o1:notify"]  # the same key both times
    assert run_workflow(journal, "o1") == {"receipt": {"call": 2}}


# --- crashes in real processes ---

PROBES = '''
import durable_kit
from durable_kit.effects import destination, send_at_most_once, send_via_outbox
from durable_kit.world.notifier import Notifier


@destination("probe.notifier")
def notify(journal_path, payload, key):
    return Notifier.beside(journal_path, dedupe=True).send(payload["to"], payload["message"], key)


@durable_kit.workflow("probe_at_most_once")
def at_most_once(wf):
    notifier = Notifier.beside(wf.db_path)  # no dedupe: only the reservation stands between us and a repeat
    return wf.execute_step("notify", lambda: send_at_most_once(
        wf, "notify", lambda key: notifier.send("ops@example.com", "done", key)))


@durable_kit.workflow("probe_outbox")
def via_outbox(wf):
    return send_via_outbox(wf, "notify", "probe.notifier", {"to": "ops@example.com", "message": "done"})
'''


@pytest.fixture
def probe_worker(tmp_path, db):
    """Run one ``worker --until-idle`` child process that knows the probe workflows."""
    module = tmp_path / "probes.py"
    module.write_text(PROBES)
    return lambda: run_python("-m", "durable_kit", "worker", "--db", str(db), "--until-idle", "--module", str(module))


def test_a_crash_between_reservation_and_send_loses_the_effect_for_good(db, probe_worker):
    journal = Journal(db)
    journal.start("probe_at_most_once", {}, "m1", registered_elsewhere=True)
    arm(journal.conn, "before_send:notify", "exit")

    crashed = probe_worker()
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert rows(db, "SELECT key FROM reservations") == [("m1:notify",)]
    notifier = Notifier.beside(db)
    assert (notifier.count(), notifier.request_count()) == (0, 0)

    restarted = probe_worker()
    assert restarted.returncode == 0, restarted.stderr
    wf = journal.workflow("m1")
    assert wf["status"] == "complete"
    assert wf["output"] == {"key": "m1:notify", "sent": False, "note": NOT_SENT}
    assert (notifier.count(), notifier.request_count()) == (0, 0)  # at most once: here, zero times
    assert journal.steps("m1")[0]["attempts"] == 2
    history = events(journal, "m1")
    assert (history.count("key_reserved"), history.count("key_already_reserved")) == (1, 1)


def test_a_crash_between_send_and_mark_sends_twice_and_the_keyed_destination_keeps_one(db, probe_worker):
    journal = Journal(db)
    journal.start("probe_outbox", {}, "o1", registered_elsewhere=True)
    arm(journal.conn, "after_send:notify", "exit")

    crashed = probe_worker()
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    notifier = Notifier.beside(db)
    assert (notifier.request_count(), notifier.count()) == (1, 1)
    assert outbox(db) == [("o1:notify", "notify", "pending", 1, 0)]  # sent, never marked
    assert journal.workflow("o1")["status"] == "waiting"

    restarted = probe_worker()
    assert restarted.returncode == 0, restarted.stderr
    assert outbox(db) == [("o1:notify", "notify", "sent", 2, 1)]
    assert (notifier.request_count(), notifier.count()) == (2, 1)
    assert rows(notifier.path, "SELECT key FROM requests") == [("o1:notify",), ("o1:notify",)]
    wf = journal.workflow("o1")
    assert (wf["status"], wf["output"]) == ("complete", {"delivery": 1, "recipient": "ops@example.com"})
    history = events(journal, "o1")
    assert (history.count("outbox_enqueued"), history.count("outbox_sent"), history.count("fault_fired")) == (1, 1, 1)


def test_a_payment_service_refuses_a_lower_fencing_token_for_the_same_key(db):
    from durable_kit.world.payments import StaleToken

    payments = Payments.beside(db, accepts_keys=False)
    assert payments.refund("A-1001", 89.0, "w1:refund", fencing_token=2)["refund_id"] == "R-0001"
    with pytest.raises(StaleToken, match="key 'w1:refund': fencing token 1 is older than 2"):
        payments.refund("A-1001", 89.0, "w1:refund", fencing_token=1)  # the paused, superseded worker
    assert [r["refund_id"] for r in payments.refunds()] == ["R-0001"]
    # Fences are per key: another workflow's token 1, on the same order, is its own business.
    assert payments.refund("A-1001", 89.0, "w2:refund", fencing_token=1)["refund_id"] == "R-0002"
    assert payments.refund("A-1001", 89.0, "w1:refund", fencing_token=3)["refund_id"] == "R-0003"
    assert payments.request_count() == 4
    with pytest.raises(ValueError, match="a fencing token needs the effect key it fences; nothing was refunded"):
        payments.refund("A-1001", 89.0, fencing_token=4)
    assert payments.request_count() == 4 and len(payments.refunds()) == 3
