"""The kit's research-report agent and refund agent, ported to DBOS Transact as steps and workflows.

The port is mechanical, and that is the lesson: ``wf.execute_step("plan", ...)``
becomes a function decorated with ``@DBOS.step()``; the workflow function
becomes ``@DBOS.workflow()``; ``wf.wait_for_approval`` becomes ``DBOS.recv``
(a person's decision arrives by ``DBOS.send``); a key the destination
deduplicates is still made from the workflow id and the action.

What DBOS records is the same as the kit: a step's output once it returns,
replayed (not re-run) on recovery. So the same crash repeats the same call.
What differs is said where it matters:

* a step is named by its position in the workflow, not by a name we choose:
  code outside steps must call the same steps in the same order on replay;
* a wait holds a thread in a live process; with none running, the workflow
  is a pending row that waits for an executor to recover it;
* ``DBOS.send`` does not check that the workflow is waiting, nor that it
  was decided before: a second message is stored and never received;
* retries inside a step (``retries_allowed``) live in the process's memory:
  a crash starts the count again.

Every step's output is JSON (``engine.json_serializer``). Fake services are
the kit's own (``durable_kit.world``), found beside the ``world`` path each
workflow receives, so both engines are counted by the same destinations.
"""
from __future__ import annotations

from typing import Any, Callable

from dbos import DBOS

from ..agents.refunds import VERSIONS, approval_reason, check_evidence  # the business rules do not change
from ...effects import effect_key
from ...world.llm import FakeLLM
from ...world.notifier import Notifier
from ...world.payments import Payments
from ...world.sources import OrderDesk
from ...world.ledger import Ledger
from ...core.retries import InvalidRequest
from .points import boundary

PORTED_STRATEGIES = ("naive", "destination_key", "reconciliation")
NOT_PORTED = {
    "reservation": "the kit reserves the key in its journal before sending (at most once); a DBOS step has no "
                   "reservation of its own: use destination_key",
    "outbox": "the kit's outbox commits the intent with the step; in DBOS the workflow itself is the durable "
              "intent and a step with a destination key delivers it: use destination_key",
}
WAIT_SECONDS = 7 * 24 * 3600  # how long a workflow waits for a person; DBOS stores the deadline durably
WAITING_EVENT = "waiting_for"  # an event the workflow sets while it waits, so others can see what for


def model(world: str) -> FakeLLM:
    """The fake model, counting its calls in the ledger beside ``world`` under this workflow's id."""
    return FakeLLM(Ledger.beside(world), DBOS.workflow_id)


def finished(name: str, output: Any) -> Any:
    """Return a step's output through the crash point ``after_activity:<name>`` (done, not yet recorded)."""
    boundary(f"after_activity:{name}")
    return output


def recorded(name: str, output: Any) -> Any:
    """Return a step's output through the crash point ``after_commit:<name>`` (DBOS has recorded it)."""
    boundary(f"after_commit:{name}")
    return output


def wait_for_decision(name: str, request: dict) -> Any:
    """Wait for a message on topic ``name`` (an approval or an answer); say what we wait for while we wait."""
    DBOS.set_event(WAITING_EVENT, {"name": name, "request": request})
    boundary(f"waiting:{name}")
    decision = DBOS.recv(name, timeout_seconds=WAIT_SECONDS)
    if decision is None:
        raise TimeoutError(f"workflow {DBOS.workflow_id!r}: nobody answered {name!r} within {WAIT_SECONDS} s")
    DBOS.set_event(WAITING_EVENT, None)
    return decision


# --- The research-report agent (notebooks 02 and 04) ---

@DBOS.step(name="plan")
def plan(world: str, topic: str) -> dict:
    """A research plan, or a clarifying question when the topic is too broad."""
    return finished("plan", model(world).plan(topic))


@DBOS.step(name="research")
def research(world: str, topic: str, subtopic: str) -> dict:
    """Findings for one subtopic."""
    return finished(f"research:{subtopic}", model(world).research(topic, subtopic))


@DBOS.step(name="analyze")
def analyze(world: str, topic: str, findings: list) -> dict:
    """An analysis that joins the findings."""
    return finished("analyze", model(world).analyze(topic, findings))


@DBOS.step(name="recommend")
def recommend(world: str, topic: str, analysis: dict) -> dict:
    """A recommendation with a confidence."""
    return finished("recommend", model(world).recommend(topic, analysis))


@DBOS.step(name="report")
def report(world: str, topic: str, analysis: dict, recommendation: dict) -> dict:
    """The final report."""
    return finished("report", model(world).report(topic, analysis, recommendation))


def research_and_recommend(world: str, topic: str) -> tuple[str, list, dict, dict]:
    """The steps both research workflows share; a too-broad topic waits for a person's narrower one."""
    first_plan = recorded("plan", plan(world, topic))
    if first_plan.get("question"):
        topic = wait_for_decision("clarify", {"question": first_plan["question"]})
        first_plan = recorded("plan", plan(world, topic))
        if first_plan.get("question"):
            raise ValueError(f"workflow {DBOS.workflow_id!r}: the answer {topic!r} is still too broad to plan: "
                             "start a new workflow with a narrower topic")
    findings = [recorded(f"research:{s}", research(world, topic, s)) for s in first_plan["subtopics"]]
    analysis = recorded("analyze", analyze(world, topic, findings))
    recommendation = recorded("recommend", recommend(world, topic, analysis))
    return topic, findings, analysis, recommendation


@DBOS.workflow(name="research_report")
def research_report(topic: str, world: str) -> dict:
    """Notebook 02's agent: plan, research each subtopic, analyze, recommend, report."""
    topic, _, analysis, recommendation = research_and_recommend(world, topic)
    final = recorded("report", report(world, topic, analysis, recommendation))
    return {"title": final["title"], "recommendation": recommendation["recommendation"]}


@DBOS.step(name="notify")
def notify(world: str, to: str, message: str, key: str | None) -> dict:
    """Send one message; with a key, the notifier delivers it once whatever the number of attempts."""
    notifier = Notifier.beside(world, dedupe=key is not None)
    try:
        boundary("before_send:notify")
        delivery = notifier.send(to, message, key)
        boundary("after_send:notify")
        return delivery
    finally:
        notifier.close()


@DBOS.workflow(name="reviewed_report")
def reviewed_report(topic: str, world: str, notify_to: str = "research-team@example.com") -> dict:
    """Notebook 04's agent: a person approves by ``DBOS.send`` before the report is written and announced."""
    topic, findings, analysis, recommendation = research_and_recommend(world, topic)
    decision = wait_for_decision("approval", {"recommendation": recommendation["recommendation"],
                                              "confidence": recommendation["confidence"], "evidence": findings})
    if not decision["approved"]:
        because = f": {decision['comment']}" if decision.get("comment") else ""
        return {"outcome": "rejected", "reason": f"rejected by {decision['by']}{because}"}
    final = recorded("report", report(world, topic, analysis, recommendation))
    recorded("notify", notify(world, notify_to, f"{final['title']} is ready (approved by {decision['by']})",
                              effect_key(DBOS.workflow_id, "notify")))
    return {"outcome": "complete", "title": final["title"], "approved_by": decision["by"], "notification": "sent"}


# --- The refund agent (notebook 05) ---

@DBOS.step(name="fetch_order")
def fetch_order(world: str, order_id: str) -> dict:
    """One order, with the customer's complaint."""
    return finished("fetch_order", OrderDesk(Ledger.beside(world), DBOS.workflow_id).fetch_order(order_id))


@DBOS.step(name="fetch_policy")
def fetch_policy(world: str, reason: str) -> dict:
    """The policy rule for the refund's reason, with the policy's version and approval thresholds."""
    return finished("fetch_policy", OrderDesk(Ledger.beside(world), DBOS.workflow_id).fetch_policy_rule(reason))


@DBOS.step(name="recommend_refund")
def recommend_refund(world: str, order: dict, rule: dict, fetched: list) -> dict:
    """A recommendation citing only fetched evidence; one repair, in this process, if it cites more."""
    llm = model(world)
    try:
        answer = check_evidence(llm.recommend_refund(order, rule, fetched), fetched)
    except InvalidRequest as error:  # the kit's repair is a durable retry; here it lives in this attempt
        answer = check_evidence(llm.recommend_refund(order, rule, fetched, str(error)), fetched)
    return finished("recommend", answer)


@DBOS.step(name="refund")
def pay_refund(world: str, strategy: str, order_id: str, amount: float) -> dict:
    """Pay the refund by ``strategy``: no key, a key the service deduplicates, or ask the service first."""
    payments = Payments.beside(world, accepts_keys=strategy == "destination_key")
    try:
        if strategy == "reconciliation":
            earlier = payments.refunds(order_id)
            if earlier:  # an earlier attempt paid: take its receipt instead of paying again
                return earlier[0]
        key = effect_key(DBOS.workflow_id, "refund") if strategy == "destination_key" else None
        boundary("before_send:refund")
        receipt = payments.refund(order_id, amount, key)
        boundary("after_send:refund")
        return receipt
    finally:
        payments.close()


def check_strategy(strategy: str, workflow_id: str) -> None:
    """Refuse a strategy the port does not have, naming the workflow and what to use instead."""
    if strategy in NOT_PORTED:
        raise ValueError(f"workflow {workflow_id!r}: strategy {strategy!r} is not ported to DBOS: "
                         f"{NOT_PORTED[strategy]}")
    if strategy not in PORTED_STRATEGIES:
        raise ValueError(f"workflow {workflow_id!r}: strategy must be one of {PORTED_STRATEGIES}, not {strategy!r}")


@DBOS.workflow(name="refund")
def refund_agent(order_id: str, strategy: str, world: str) -> dict:
    """One refund request, end to end: the kit's refund agent with DBOS steps."""
    check_strategy(strategy, DBOS.workflow_id)
    order = recorded("fetch_order", fetch_order(world, order_id))
    rule = recorded("fetch_policy", fetch_policy(world, order["reason"]))
    versions = {**VERSIONS, "policy": rule["policy_version"]}
    fetched = [f"order:{order['id']}", rule["id"]]
    recommendation = recorded("recommend", recommend_refund(world, order, rule, fetched))

    why = approval_reason(order, recommendation, rule["approval"])
    if why:
        decision = wait_for_decision("approval", {"recommendation": recommendation, "why": why, "order": order})
        if not decision["approved"]:
            because = f": {decision['comment']}" if decision.get("comment") else ""
            return {"order_id": order_id, "outcome": "rejected",
                    "reason": f"refund rejected by {decision['by']}{because}"}

    receipt = recorded("refund", pay_refund(world, strategy, order_id, recommendation["amount"]))
    boundary("after_receipt:refund")
    message = (f"Your refund {receipt['refund_id']} of {receipt['amount']:g} {order['currency']} "
               f"for order {order_id} is on its way.")
    key = None if strategy == "naive" else effect_key(DBOS.workflow_id, "notify")
    recorded("notify", notify(world, order["customer"], message, key))
    return {"order_id": order_id, "outcome": "complete", "refund_id": receipt["refund_id"],
            "amount": receipt["amount"], "strategy": strategy, "versions": versions,
            "approved_by": decision["by"] if why else "policy"}


# --- The notebook's exercise: a learner's refund step, run inside a workflow ---

EXERCISE_STEP: dict[str, Callable[[str, str, float], dict]] = {}  # set by the child that loads the learner's file


@DBOS.workflow(name="exercise_refund")
def exercise_refund(order_id: str, amount: float, world: str) -> dict:
    """Call the learner's refund step once; its receipt is the workflow's output."""
    receipt = EXERCISE_STEP["step"](world, order_id, amount)
    boundary("after_receipt:refund")
    return receipt


__all__ = ["PORTED_STRATEGIES", "research_report", "reviewed_report", "refund_agent", "exercise_refund"]
