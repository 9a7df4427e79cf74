"""The booking workflow of the model-based test (``tests/test_model_based.py``), loaded with ``--module``.

quote the seat and the card at once (parallel steps, their names not in name
order) -> hold a seat -> charge the card -> wait for the itinerary's approval
(with a deadline, if the input gives one) -> issue the ticket. Holding and charging
have compensations; every send goes through ``send_guarded`` (its action is the
step's name) and carries the effect's key and the replay's fencing token to a
keyed fake service beside the journal (``x.seats.db``, ``x.cards.db``,
``x.tickets.db``), which counts every request and effect with the workflow and
the action that sent it.

Two inputs make trouble on purpose. ``trouble`` ends the booking after the
charge, in a step ``check_trip``: ``escalate`` (an invalid request),
``fail`` (an unexpected error, no retry policy) or ``pause`` (``wf.pause``).
``outrun_seconds`` makes the seat hold's activity stop its own process (SIGSTOP,
heartbeat and all) for that long before it sends, every attempt: an activity
that outruns its lease.

The environment variable ``DURABLE_KIT_MODEL_CODE`` picks the deployed code:
``v1``; ``v2-patched`` adds a fraud check after the hold behind
``durable_kit.patched(wf, "fraud-check")``; ``v2-unpatched`` adds it without the patch.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import durable_kit
from durable_kit import InvalidRequest, RetryPolicy, effect_key, send_guarded
from durable_kit.world.service import KeyedService

CODE = os.environ.get("DURABLE_KIT_MODEL_CODE", "v1")


class Seats(KeyedService):
    name = "seats"


class Cards(KeyedService):
    name = "cards"


class Tickets(KeyedService):
    name = "tickets"


SERVICES = {"seats": Seats, "cards": Cards, "tickets": Tickets}


def send(wf, service: type[KeyedService], operation: str, action: str) -> dict:
    """One keyed, fenced request; ``step_seconds`` in the input makes each take that long first."""
    time.sleep(float(wf.input.get("step_seconds", 0)))
    token = wf.fencing_token
    return send_guarded(wf, action, lambda: service.beside(wf.db_path).request(
        operation, {"trip": wf.input["trip"]}, effect_key(wf.id, action), fencing_token=token))


def hold_the_process(seconds: float) -> None:
    """Stop this whole process for ``seconds`` (SIGSTOP; a child sends SIGCONT): nothing in it runs, no heartbeat."""
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"], start_new_session=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def hold_seat(wf) -> dict:
    if wf.input.get("outrun_seconds"):
        hold_the_process(float(wf.input["outrun_seconds"]))
    return send(wf, Seats, "hold", "hold_seat")


def check_trip(wf) -> None:
    """The trouble the input asks for, after the charge: an escalation, a failure or a pause."""
    trouble = wf.input.get("trouble")
    if trouble == "escalate":
        def refused():
            raise InvalidRequest("the trip's fare class does not exist")
        wf.execute_step("check_trip", refused, retry=RetryPolicy(max_attempts=3, base_delay=0))
    elif trouble == "fail":
        def broken():
            raise ValueError("a bug in the trip check")
        wf.execute_step("check_trip", broken)
    elif trouble == "pause":
        wf.pause("the fare needs a person's look")


def fraud_check(wf) -> None:
    wf.execute_step("check_fraud", lambda: {"score": 0.1})


@durable_kit.workflow("booking", version=f"booking-{CODE}", inputs={"trip": str})
def booking(wf) -> dict:
    durable_kit.execute_parallel(wf, {"quote:seat": lambda: {"seat": 120}, "quote:card": lambda: {"fee": 2}})
    wf.execute_step("hold_seat", lambda: hold_seat(wf),
                    compensate=lambda hold: send(wf, Seats, "release", "compensate:hold_seat"))
    if CODE == "v2-unpatched" or (CODE == "v2-patched" and durable_kit.patched(wf, "fraud-check")):
        fraud_check(wf)
    wf.execute_step("charge_card", lambda: send(wf, Cards, "charge", "charge_card"),
                    compensate=lambda charge: send(wf, Cards, "refund", "compensate:charge_card"))
    if wf.input.get("trouble"):
        check_trip(wf)
    decision = wf.wait_for_approval("itinerary", {"trip": wf.input["trip"]}, deadline=wf.input.get("deadline"))
    if decision.get("timed_out"):
        wf.end("stopped", "no decision on the itinerary before its deadline")
    if not decision["approved"]:
        wf.end("rejected", f"itinerary rejected by {decision['by']}")
    ticket = wf.execute_step("issue_ticket", lambda: send(wf, Tickets, "issue", "issue_ticket"))
    return {"ticket": ticket["effect_id"]}
