"""The refund agent (notebook 05): policy, approval, evidence repair, versions, and the crash matrix."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import durable_kit.workshop.agents  # noqa: F401  (registers the refund workflow and its outbox destinations)
from durable_kit import Journal, run_workflow
from durable_kit.__main__ import MATRIX_KEYS
from durable_kit.workshop.agents.refunds import CRASH_POINTS, STRATEGIES, approval_reason, check_evidence, crash_matrix
from durable_kit.core.retries import InvalidRequest
from durable_kit.admin import open_wait, waits
from durable_kit.decisions import approve, reject
from durable_kit.core.worker import run_worker
from durable_kit.world.llm import MODEL_NAME, FakeLLM
from durable_kit.world.notifier import Notifier, notifier_path
from durable_kit.world.payments import Payments, payments_path
from durable_kit.world.sources import load_orders, load_refund_policy
from durable_kit.harness.faults import CRASH_EXIT_CODE
from durable_kit.world.ledger import Ledger
from durable_kit.harness.runner import run_in_child

from conftest import run_python

VERSIONS = {"workflow": "refund-agent-1", "policy": "refund-policy-2026-03", "prompt": "refund-recommendation-2",
            "model": MODEL_NAME}
REPAIR_MESSAGE = ("reference 'policy:store-credit' was not returned by retrieval; "
                  "cite only ['order:A-1003', 'policy:changed_mind']")
STEPS = ["fetch_order", "fetch_policy", "recommend", "refund", "notify"]


def cli(*args: str):
    return run_python("-m", "durable_kit", *args, timeout=60)


def start(db: Path, order_id: str, strategy: str | None = None, workflow_id: str = "r1") -> Journal:
    journal = Journal(db)
    journal.start("refund", {"order_id": order_id, **({"strategy": strategy} if strategy else {})}, workflow_id)
    return journal


def run_to_the_end(db: Path) -> list[str]:
    """An in-process worker until nothing is due (it dispatches the outbox too); its log."""
    log = []
    run_worker(db, until_idle=True, log=log.append)
    return log


def counts(db: Path) -> dict:
    payments, notifier = Payments.beside(db), Notifier.beside(db)
    return {"payment_calls": payments.request_count(), "refunds": len(payments.refunds()),
            "notification_calls": notifier.request_count(), "notifications": notifier.count()}


def steps(journal: Journal, workflow_id: str = "r1") -> dict:
    return {s["name"]: s for s in journal.steps(workflow_id)}


def keys_seen(path: Path) -> list:
    """The key of every request a fake service received, oldest first."""
    conn = sqlite3.connect(str(path))
    try:
        return [row[0] for row in conn.execute("SELECT key FROM requests ORDER BY seq")]
    finally:
        conn.close()


# --- policy code, not the model, decides ---

def test_check_evidence_refuses_what_was_not_fetched():
    fetched = ["order:A-1003", "policy:changed_mind"]
    assert check_evidence({"evidence": fetched[:1]}, fetched) == {"evidence": fetched[:1]}
    with pytest.raises(InvalidRequest) as refused:
        check_evidence({"evidence": [*fetched, "policy:store-credit"]}, fetched)
    assert str(refused.value) == REPAIR_MESSAGE


def test_approval_reason_comes_from_the_policy_thresholds():
    orders, rules = load_orders(), load_refund_policy()["approval"]
    assert approval_reason(orders["A-1001"], {"amount": 89.0}, rules) is None
    assert approval_reason(orders["A-1001"], {"amount": 100.0}, rules) is None  # up to 100 inclusive
    assert approval_reason(orders["A-1001"], {"amount": 100.5}, rules) == "amount 100.5 is above 100"
    assert approval_reason(orders["A-1002"], {"amount": 420.0}, rules) == "amount 420 is above 100"
    assert approval_reason(orders["A-1002"], {"amount": 20.0}, rules) == "reason 'defective' is always reviewed"
    assert approval_reason(orders["A-1001"], {"amount": 89.0}, {**rules, "auto_approve_up_to": 50.0}) == (
        "amount 89 is above 50")


def test_the_approval_thresholds_are_stored_with_the_fetched_policy(db):
    journal = start(db, "A-1001")
    run_workflow(journal, "r1")
    (policy,) = [s["output"] for s in journal.steps("r1") if s["name"] == "fetch_policy"]
    assert policy["approval"] == load_refund_policy()["approval"]  # a replay decides from this, not the file


# --- the agent, in this process ---

def test_a_small_damaged_order_is_refunded_by_policy_without_a_wait(db):
    journal = start(db, "A-1001")
    assert run_workflow(journal, "r1") == {
        "order_id": "A-1001", "refund_id": "R-0001", "amount": 89.0, "strategy": "destination_key",
        "approved_by": "policy", "notification": "sent"}
    assert journal.workflow("r1")["status"] == "complete"
    assert waits(journal, "r1") == []
    assert list(steps(journal)) == STEPS
    assert {name: step["attempts"] for name, step in steps(journal).items()} == dict.fromkeys(STEPS, 1)
    assert counts(db) == {"payment_calls": 1, "refunds": 1, "notification_calls": 1, "notifications": 1}
    assert Notifier.beside(db).deliveries() == [{
        "seq": 1, "key": "r1:notify", "recipient": "r.okafor@example.com",
        "message": "Your refund R-0001 of 89 EUR for order A-1001 is on its way."}]
    assert Ledger.beside(db).count("model", "r1") == 1


def test_a_large_refund_waits_for_a_person_and_says_why(db):
    journal = start(db, "A-1002")
    assert run_workflow(journal, "r1") is None
    wf = journal.workflow("r1")
    assert (wf["status"], wf["next_run_at"]) == ("waiting", None)
    wait = open_wait(journal, "r1")
    assert (wait["name"], wait["kind"]) == ("approval", "approval")
    assert wait["request"]["why"] == "amount 420 is above 100"
    assert wait["request"]["order"]["id"] == "A-1002"
    assert wait["request"]["recommendation"]["amount"] == 420.0
    assert wait["request"]["recommendation"]["evidence"] == ["order:A-1002", "policy:defective"]
    assert counts(db) == {"payment_calls": 0, "refunds": 0, "notification_calls": 0, "notifications": 0}

    approve(journal, "r1", "ana", "warranty claim checked")
    output = run_workflow(journal, "r1")
    assert output == {"order_id": "A-1002", "refund_id": "R-0001", "amount": 420.0, "strategy": "destination_key",
                      "approved_by": "ana", "notification": "sent"}
    assert journal.workflow("r1")["status"] == "complete"
    assert counts(db) == {"payment_calls": 1, "refunds": 1, "notification_calls": 1, "notifications": 1}
    assert Ledger.beside(db).count("model", "r1") == 1  # the recommendation was not asked for again


def test_a_rejected_refund_pays_nothing_and_tells_nobody(db):
    journal = start(db, "A-1002")
    run_workflow(journal, "r1")
    reject(journal, "r1", "bob", "replace it instead")
    assert run_workflow(journal, "r1") is None
    wf = journal.workflow("r1")
    assert (wf["status"], wf["error"], wf["output"]) == ("rejected", "refund rejected by bob: replace it instead",
                                                         None)
    assert list(steps(journal)) == ["fetch_order", "fetch_policy", "recommend"]
    assert counts(db) == {"payment_calls": 0, "refunds": 0, "notification_calls": 0, "notifications": 0}
    assert run_workflow(journal, "r1") is None  # final: a replay does nothing
    assert counts(db)["payment_calls"] == 0


def test_a_rejection_without_a_comment_names_only_who_rejected(db):
    # Like the reviewed report agent ("rejected by bob"): no dangling ": " when no reason was given.
    journal = start(db, "A-1002")
    run_workflow(journal, "r1")
    reject(journal, "r1", "bob")
    run_workflow(journal, "r1")
    assert journal.workflow("r1")["error"] == "refund rejected by bob"


def test_a_recommendation_citing_unfetched_evidence_is_repaired_with_the_message(db, monkeypatch):
    seen = []
    recommend_refund = FakeLLM.recommend_refund

    def spy(self, order, rule, evidence_ids, repair_message=None):
        seen.append(repair_message)
        return recommend_refund(self, order, rule, evidence_ids, repair_message)

    monkeypatch.setattr(FakeLLM, "recommend_refund", spy)
    journal = start(db, "A-1003")
    assert run_workflow(journal, "r1")["approved_by"] == "policy"  # 64 EUR, changed mind: no review needed

    assert seen == [None, REPAIR_MESSAGE]  # the repair was given the validation message itself
    recommend = steps(journal)["recommend"]
    assert (recommend["status"], recommend["attempts"], recommend["repair_message"]) == (
        "complete", 2, REPAIR_MESSAGE)
    assert recommend["output"]["evidence"] == ["order:A-1003", "policy:changed_mind"]
    failed = [e["detail"] for e in journal.history("r1") if e["event"] == "step_failed"]
    assert failed == [f"InvalidRequest: {REPAIR_MESSAGE}"]
    ledger = Ledger.beside(db)
    assert [c["operation"] for c in ledger.calls("model", "r1")] == ["recommend_refund"] * 2
    assert counts(db)["refunds"] == 1


def test_a_crash_after_the_repair_repeats_the_repair_not_the_bad_request(db):
    start(db, "A-1003")
    crashed = run_in_child(db, "r1", crash_at="after_activity:recommend")
    assert crashed.exit_code == CRASH_EXIT_CODE, crashed.stderr
    assert Ledger.beside(db).count("model", "r1") == 2  # the bad answer, then the repair; neither stored

    finished = run_in_child(db, "r1")
    assert (finished.exit_code, finished.status) == (0, "complete"), finished.stderr
    assert Ledger.beside(db).count("model", "r1") == 3  # one more repair, never the unrepaired request again
    recommend = steps(Journal(db))["recommend"]
    assert (recommend["attempts"], recommend["repair_message"]) == (3, REPAIR_MESSAGE)
    assert recommend["output"]["evidence"] == ["order:A-1003", "policy:changed_mind"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_versions_are_recorded_in_every_consequential_step(db, strategy):
    journal = start(db, "A-1001", strategy)
    run_to_the_end(db)
    assert journal.workflow("r1")["status"] == "complete"
    by_name = steps(journal)
    assert by_name["recommend"]["input"] == {"versions": VERSIONS, "evidence": ["order:A-1001", "policy:damaged"]}
    assert by_name["refund"]["input"] == {"order_id": "A-1001", "amount": 89.0, "versions": VERSIONS}
    assert by_name["notify"]["input"]["versions"] == VERSIONS
    assert by_name["notify"]["input"]["to"] == "r.okafor@example.com"
    # Without a crash every strategy pays once and tells the customer once.
    assert counts(db) == {"payment_calls": 1, "refunds": 1, "notification_calls": 1, "notifications": 1}


def test_the_outbox_strategy_commits_the_refund_intent_with_its_versions(db):
    journal = start(db, "A-1001", "outbox")
    assert run_workflow(journal, "r1") is None
    refund = steps(journal)["refund"]
    assert refund["input"] == {"order_id": "A-1001", "amount": 89.0, "versions": VERSIONS}
    assert refund["output"] == {"key": "r1:refund", "destination": "payments.refund"}
    conn = journal.conn
    row = conn.execute("SELECT key, destination, payload, status FROM outbox").fetchone()
    assert (row["key"], row["destination"], row["status"]) == ("r1:refund", "payments.refund", "pending")
    assert json.loads(row["payload"])["versions"] == VERSIONS
    assert counts(db)["payment_calls"] == 0  # decided and committed, not yet sent

    run_to_the_end(db)
    assert [w["name"] for w in waits(journal, "r1")] == ["refund:receipt", "notify:receipt"]
    assert journal.workflow("r1")["output"]["refund_id"] == "R-0001"
    assert keys_seen(payments_path(db)) == ["r1:refund"]
    assert keys_seen(notifier_path(db)) == ["r1:notify"]


def test_an_unknown_strategy_fails_with_a_clear_error_before_any_call(db):
    journal = start(db, "A-1001", "bogus", workflow_id="bad-1")
    with pytest.raises(ValueError) as failed:
        run_workflow(journal, "bad-1")
    message = str(failed.value)
    assert message.startswith("workflow 'bad-1': strategy must be one of (")
    assert message.endswith("not 'bogus'")
    assert all(strategy in message for strategy in STRATEGIES)
    wf = journal.workflow("bad-1")
    assert (wf["status"], wf["error"]) == ("failed", f"ValueError: {message}")
    assert journal.steps("bad-1") == []
    assert Ledger.beside(db).count(workflow_id="bad-1") == 0


# --- the command line ---

def test_start_a_refund_from_the_command_line_and_a_worker_completes_it(db):
    started = cli("start", "--db", str(db), "--kind", "refund", "--input", '{"order_id": "A-1001"}',
                  "--id", "cli-1", "--json")
    assert (started.returncode, json.loads(started.stdout)) == (0, {"workflow_id": "cli-1"}), started.stderr
    journal = Journal(db)
    assert journal.workflow("cli-1")["input"] == {"order_id": "A-1001"}

    worker = cli("worker", "--db", str(db), "--until-idle")
    assert worker.returncode == 0, worker.stderr
    assert "cli-1: complete" in worker.stdout.splitlines()
    wf = journal.workflow("cli-1")
    assert (wf["status"], wf["output"]["refund_id"], wf["output"]["approved_by"]) == ("complete", "R-0001", "policy")
    assert counts(db) == {"payment_calls": 1, "refunds": 1, "notification_calls": 1, "notifications": 1}


def test_an_outbox_refund_started_from_the_command_line_waits_for_approval_then_completes(db):
    refund = json.dumps({"order_id": "A-1002", "strategy": "outbox"})
    assert cli("start", "--db", str(db), "--kind", "refund", "--input", refund, "--id", "cli-2").stdout == "cli-2\n"
    assert cli("worker", "--db", str(db), "--until-idle").returncode == 0
    journal = Journal(db)
    assert (journal.workflow("cli-2")["status"], open_wait(journal, "cli-2")["kind"]) == ("waiting", "approval")

    assert cli("approve", "--db", str(db), "--workflow", "cli-2", "--by", "ana").returncode == 0
    worker = cli("worker", "--db", str(db), "--until-idle")
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.splitlines()[-2:] == ["cli-2: complete", "worker stopped"]
    output = journal.workflow("cli-2")["output"]
    assert (output["refund_id"], output["amount"], output["approved_by"], output["strategy"]) == (
        "R-0001", 420.0, "ana", "outbox")
    assert counts(db) == {"payment_calls": 1, "refunds": 1, "notification_calls": 1, "notifications": 1}


# --- the crash matrix: every strategy against every crash point, in real processes ---

# strategy, crash point: payment calls, refunds at the destination, receipts stored, notifications, final status
EXPECTED = {
    ("naive", "before_payment"):               (1, 1, 1, 1, "complete"),
    ("naive", "after_payment"):                (2, 2, 1, 1, "complete"),   # paid twice
    ("naive", "after_receipt"):                (1, 1, 1, 1, "complete"),
    ("naive", "during_notification"):          (1, 1, 1, 2, "complete"),   # told twice
    ("reservation", "before_payment"):         (0, 0, 0, 0, "escalated"),  # reserved, never paid: lost
    ("reservation", "after_payment"):          (1, 1, 0, 0, "escalated"),  # paid, but the journal cannot know
    ("reservation", "after_receipt"):          (1, 1, 1, 1, "complete"),
    ("reservation", "during_notification"):    (1, 1, 1, 1, "complete"),
    ("destination_key", "before_payment"):     (1, 1, 1, 1, "complete"),
    ("destination_key", "after_payment"):      (2, 1, 1, 1, "complete"),   # asked twice, one refund
    ("destination_key", "after_receipt"):      (1, 1, 1, 1, "complete"),
    ("destination_key", "during_notification"): (1, 1, 1, 1, "complete"),
    ("outbox", "before_payment"):              (1, 1, 1, 1, "complete"),
    ("outbox", "after_payment"):               (2, 1, 1, 1, "complete"),   # sent again before the mark
    ("outbox", "after_receipt"):               (1, 1, 1, 1, "complete"),
    ("outbox", "during_notification"):         (1, 1, 1, 1, "complete"),
    ("reconciliation", "before_payment"):      (1, 1, 1, 1, "complete"),
    ("reconciliation", "after_payment"):       (1, 1, 1, 1, "complete"),   # asked first, adopted the refund
    ("reconciliation", "after_receipt"):       (1, 1, 1, 1, "complete"),
    ("reconciliation", "during_notification"): (1, 1, 1, 1, "complete"),
}
COUNTED = ("payment_calls", "refunds_at_destination", "receipts_stored", "notifications_delivered", "status")


def expected_row(strategy: str, point: str) -> dict:
    return {"strategy": strategy, "crash_point": point, **dict(zip(COUNTED, EXPECTED[strategy, point]))}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """The whole matrix, run once for this module: its folder (one database per cell) and its rows."""
    folder = tmp_path_factory.mktemp("matrix")
    return folder, crash_matrix(folder)


def test_the_matrix_covers_every_strategy_and_crash_point_in_order(matrix):
    _, rows = matrix
    assert [(r["strategy"], r["crash_point"]) for r in rows] == list(EXPECTED)
    assert list(EXPECTED) == [(s, p) for s in STRATEGIES for p in CRASH_POINTS]


@pytest.mark.parametrize("strategy, point", list(EXPECTED))
def test_crash_matrix_cell(matrix, strategy, point):
    folder, rows = matrix
    row = next(r for r in rows if (r["strategy"], r["crash_point"]) == (strategy, point))
    assert row == {**expected_row(strategy, point), "exit_code": CRASH_EXIT_CODE}
    # The first worker died exactly where the cell says, once.
    history = Journal(folder / f"{strategy}-{point}.db").history("refund-A-1001")
    assert [e["detail"] for e in history if e["event"] == "fault_fired"] == [f"{CRASH_POINTS[point]} (exit)"]


def test_an_escalated_reservation_says_what_to_do(matrix):
    folder, _ = matrix
    for point in ("before_payment", "after_payment"):
        wf = Journal(folder / f"reservation-{point}.db").workflow("refund-A-1001")
        assert wf["status"] == "escalated"
        assert "ask the payment service before paying again" in wf["error"]


def test_every_attempt_of_an_action_carries_the_same_key(matrix):
    folder, _ = matrix
    key = "refund-A-1001:refund"
    for strategy in ("destination_key", "outbox"):  # crashed after paying, then paid again
        assert keys_seen(payments_path(folder / f"{strategy}-after_payment.db")) == [key, key]
    assert keys_seen(payments_path(folder / "reservation-after_payment.db")) == [key]
    assert keys_seen(payments_path(folder / "naive-after_payment.db")) == [None, None]  # no key: two refunds
    assert keys_seen(notifier_path(folder / "destination_key-during_notification.db")) == [
        "refund-A-1001:notify", "refund-A-1001:notify"]
    assert keys_seen(notifier_path(folder / "naive-during_notification.db")) == [None, None]


def test_demo_refunds_prints_the_matrix_as_json():
    done = cli("demo", "refunds", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert len(rows) == 20
    assert all(list(row) == list(MATRIX_KEYS) for row in rows)
    assert list(MATRIX_KEYS) == ["strategy", "crash_point", *COUNTED]
    assert rows == [expected_row(strategy, point) for strategy, point in EXPECTED]
