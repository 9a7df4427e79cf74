"""The refund agent (notebook 05): retrying a refund costs money, so each delivery strategy is explicit.

fetch the order -> fetch the policy rule -> structured recommendation (every
cited piece of evidence must have been fetched) -> policy code decides whether
a person must approve -> wait for approval -> refund -> notify the customer.

The input names a delivery ``strategy`` (see ``durable_kit.effects``) used for
both the refund and the notification:

=================  ==========================================  =====================================
strategy           refund                                       notification
=================  ==========================================  =====================================
naive              no key, service without keys                 no key, no deduplication
reservation        key reserved in the journal, then sent       the same: at most once
destination_key    key sent, service deduplicates               key sent, notifier deduplicates
outbox             intent committed with the step, dispatched    the same, notifier deduplicates
reconciliation     ask the service for the order's refunds      key sent, notifier deduplicates
=================  ==========================================  =====================================

The workflow, policy, prompt and model versions are recorded with every
consequential step (in its input, and as the recommendation's versions).
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ... import (InvalidRequest, Journal, NOT_SENT, RetryPolicy, Workflow, destination, effect_key,
                reconcile_then_send, send_at_most_once, send_guarded, send_via_outbox, waits, workflow)
from ...harness.faults import arm, trip
from ...world.llm import MODEL_NAME, FakeLLM
from ...world.notifier import Notifier
from ...world.payments import Payments
from ...world.sources import OrderDesk
from ...world.ledger import Ledger
from ...harness.runner import worker_in_child

STRATEGIES = ("naive", "reservation", "destination_key", "outbox", "reconciliation")
VERSIONS = {"workflow": "refund-agent-1", "prompt": "refund-recommendation-2", "model": MODEL_NAME}
RETRY = RetryPolicy(max_attempts=3, base_delay=1.0, max_delay=30.0)


def check_evidence(recommendation: dict, fetched: list[str]) -> dict:
    """Refuse a recommendation that cites evidence nobody fetched, with a message a repair can act on."""
    for reference in recommendation["evidence"]:
        if reference not in fetched:
            raise InvalidRequest(f"reference {reference!r} was not returned by retrieval; cite only {fetched}")
    return recommendation


def approval_reason(order: dict, recommendation: dict, rules: dict) -> str | None:
    """Why a person must approve this refund, or None. Deterministic code, never the model's call.

    ``rules`` are the thresholds stored with the fetched policy, so every
    replay decides the same way, even if the policy file changes meanwhile.
    """
    if recommendation["amount"] > rules["auto_approve_up_to"]:
        return f"amount {recommendation['amount']:g} is above {rules['auto_approve_up_to']:g}"
    if order["reason"] in rules["always_review_reasons"]:
        return f"reason {order['reason']!r} is always reviewed"
    return None


@workflow("refund", version=VERSIONS["workflow"], inputs={"order_id": str})
def refund_agent(wf: Workflow) -> dict:
    """One refund request, end to end; the strategy comes from the input."""
    order_id, strategy = wf.input["order_id"], wf.input.get("strategy", "destination_key")
    if strategy not in STRATEGIES:
        raise ValueError(f"workflow {wf.id!r}: strategy must be one of {STRATEGIES}, not {strategy!r}")
    ledger = Ledger.beside(wf.db_path)
    desk, llm = OrderDesk(ledger, wf.id), FakeLLM(ledger, wf.id)

    order = wf.execute_step("fetch_order", lambda: desk.fetch_order(order_id), {"order_id": order_id})
    rule = wf.execute_step("fetch_policy", lambda: desk.fetch_policy_rule(order["reason"]), {"reason": order["reason"]})
    versions = {**VERSIONS, "policy": rule["policy_version"]}
    fetched = [f"order:{order['id']}", rule["id"]]
    recommendation = wf.execute_step(
        "recommend", lambda: check_evidence(llm.recommend_refund(order, rule, fetched), fetched),
        {"versions": versions, "evidence": fetched}, retry=RETRY, versions=versions,
        repair=lambda message: check_evidence(llm.recommend_refund(order, rule, fetched, message), fetched))

    why = approval_reason(order, recommendation, rule["approval"])
    if why:
        decision = wf.wait_for_approval("approval", {"recommendation": recommendation, "why": why, "order": order})
        if not decision["approved"]:
            because = f": {decision['comment']}" if decision["comment"] else ""
            wf.end("rejected", f"refund rejected by {decision['by']}{because}")

    refund = {"order_id": order_id, "amount": recommendation["amount"], "versions": versions}
    receipt = issue_refund(wf, strategy, refund)
    if receipt is None:
        wf.end("escalated", "the refund's key was reserved by an attempt that may have died before paying: "
                            "ask the payment service before paying again")
    trip(wf.conn, "after_receipt:refund", wf.id)

    message = {"to": order["customer"], "versions": versions,
               "message": f"Your refund {receipt['refund_id']} of {receipt['amount']:g} {order['currency']} "
                          f"for order {order_id} is on its way."}
    delivered = notify_customer(wf, strategy, message)
    return {"order_id": order_id, "refund_id": receipt["refund_id"], "amount": receipt["amount"],
            "strategy": strategy, "approved_by": decision["by"] if why else "policy",
            "notification": "sent" if delivered else NOT_SENT}


def issue_refund(wf: Workflow, strategy: str, refund: dict) -> dict | None:
    """Pay the refund by ``strategy``; return the receipt, or None if an earlier attempt may have paid.

    Every keyed request carries this replay's fencing token, which the
    payment service checks per key: a paused owner that lost its lease is
    refused if its successor already paid.
    """
    order_id, amount, token = refund["order_id"], refund["amount"], wf.fencing_token
    if strategy == "outbox":
        return send_via_outbox(wf, "refund", "payments.refund", refund)
    payments = Payments.beside(wf.db_path, accepts_keys=strategy in ("destination_key", "outbox"))
    key = effect_key(wf.id, "refund")
    if strategy == "naive":
        return wf.execute_step("refund", lambda: send_guarded(
            wf, "refund", lambda: payments.refund(order_id, amount)), refund)
    if strategy == "destination_key":
        return wf.execute_step("refund", lambda: send_guarded(
            wf, "refund", lambda: payments.refund(order_id, amount, key, fencing_token=token)), refund)
    if strategy == "reservation":
        result = wf.execute_step("refund", lambda: send_at_most_once(
            wf, "refund", lambda k: payments.refund(order_id, amount, k, fencing_token=token)), refund)
        return result["receipt"] if result["sent"] else None
    # Without keys the service cannot deduplicate, but it can still fence by the effect key.
    result = wf.execute_step("refund", lambda: reconcile_then_send(
        wf, "refund", lambda: next(iter(payments.refunds(order_id)), None),
        lambda: payments.refund(order_id, amount, key, fencing_token=token)), refund)
    return result["receipt"]


def notify_customer(wf: Workflow, strategy: str, message: dict) -> bool:
    """Tell the customer by ``strategy``; False if an earlier attempt reserved the key and this one did not send."""
    if strategy == "outbox":
        send_via_outbox(wf, "notify", "notifier.send", message)
        return True
    notifier = Notifier.beside(wf.db_path, dedupe=strategy != "naive")
    key = None if strategy == "naive" else effect_key(wf.id, "notify")
    if strategy == "reservation":
        return wf.execute_step("notify", lambda: send_at_most_once(
            wf, "notify", lambda k: notifier.send(message["to"], message["message"], k)), message)["sent"]
    wf.execute_step("notify", lambda: send_guarded(
        wf, "notify", lambda: notifier.send(message["to"], message["message"], key)), message)
    return True


@destination("payments.refund")
def refund_from_outbox(journal_path: Path, payload: Any, key: str) -> dict:
    """The outbox's way to the payment service: always with the key, which the service deduplicates."""
    return Payments.beside(journal_path, accepts_keys=True).refund(payload["order_id"], payload["amount"], key)


@destination("notifier.send")
def notify_from_outbox(journal_path: Path, payload: Any, key: str) -> dict:
    """The outbox's way to the notifier, which deduplicates by key."""
    return Notifier.beside(journal_path, dedupe=True).send(payload["to"], payload["message"], key)


# --- The crash matrix: every strategy against every crash point, in real processes ---

CRASH_POINTS = {
    "before_payment": "before_send:refund",   # intent recorded (a reservation, an outbox row), nothing paid
    "after_payment": "after_send:refund",     # the service paid; the journal has no receipt yet
    "after_receipt": "after_receipt:refund",  # the receipt is stored
    "during_notification": "after_send:notify",  # the customer was told; the journal does not know yet
}


def stored_receipts(journal: Journal, workflow_id: str) -> int:
    """How many refund receipts the journal holds for the workflow (in the refund step or the outbox's answer)."""
    stored = [s["output"] for s in journal.steps(workflow_id) if s["name"] == "refund" and s["status"] == "complete"]
    stored += [w["decision"] for w in waits(journal, workflow_id) if w["name"] == "refund:receipt" and w["decision"]]
    return sum(1 for value in stored if "refund_id" in json.dumps(value))


def run_cell(folder: str | Path, strategy: str, crash_point: str, order_id: str = "A-1001") -> dict:
    """One refund, crashed once at ``crash_point`` and restarted; the counts at every destination."""
    db = Path(folder) / f"{strategy}-{crash_point}.db"
    journal = Journal(db)
    journal.start("refund", {"order_id": order_id, "strategy": strategy}, f"refund-{order_id}")
    arm(journal.conn, CRASH_POINTS[crash_point], "exit")
    crashed = worker_in_child(db)
    restarted = worker_in_child(db)
    if restarted.returncode != 0:
        raise RuntimeError(f"the restarted worker for {strategy}/{crash_point} failed:\n{restarted.stderr}")
    payments, notifier = Payments.beside(db), Notifier.beside(db)
    row = {
        "strategy": strategy, "crash_point": crash_point, "exit_code": crashed.returncode,
        "payment_calls": payments.request_count(), "refunds_at_destination": len(payments.refunds()),
        "receipts_stored": stored_receipts(journal, f"refund-{order_id}"),
        "notifications_delivered": notifier.count(), "status": journal.workflow(f"refund-{order_id}")["status"],
    }
    payments.close(), notifier.close(), journal.close()
    return row


def crash_matrix(folder: str | Path, strategies=STRATEGIES, crash_points=tuple(CRASH_POINTS),
                 parallel: int = 4) -> list[dict]:
    """Every strategy against every crash point, each in its own database; rows in matrix order."""
    cells = [(strategy, point) for strategy in strategies for point in crash_points]
    with ThreadPoolExecutor(max_workers=parallel) as pool:  # the children are separate processes
        return list(pool.map(lambda cell: run_cell(folder, *cell), cells))
