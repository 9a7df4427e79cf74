"""The booking workflow of the model-based test (``tests/test_model_based.py``), loaded with ``--module``.

quote the seat and the card at once (parallel steps, their names not in name
order) -> hold a seat -> charge the card -> wait for the itinerary's approval
(with a deadline, if the input gives one) -> issue the ticket. Holding and charging
have compensations; every send carries the effect's key and the replay's
fencing token to a keyed fake service beside the journal (``x.seats.db``,
``x.cards.db``, ``x.tickets.db``), which counts every effect.

The environment variable ``DURABLE_KIT_MODEL_CODE`` picks the deployed code:
``v1``; ``v2-patched`` adds a fraud check after the hold behind
``durable_kit.patched(wf, "fraud-check")``; ``v2-unpatched`` adds it without the patch.
"""
from __future__ import annotations

import os
import time

import durable_kit
from durable_kit import effect_key
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
    return service.beside(wf.db_path).request(operation, {"trip": wf.input["trip"]}, effect_key(wf.id, action),
                                              fencing_token=wf.fencing_token)


def fraud_check(wf) -> None:
    wf.execute_step("check_fraud", lambda: {"score": 0.1})


@durable_kit.workflow("booking", version=f"booking-{CODE}", inputs={"trip": str})
def booking(wf) -> dict:
    durable_kit.execute_parallel(wf, {"quote:seat": lambda: {"seat": 120}, "quote:card": lambda: {"fee": 2}})
    wf.execute_step("hold_seat", lambda: send(wf, Seats, "hold", "hold_seat"),
                    compensate=lambda hold: send(wf, Seats, "release", "compensate:hold_seat"))
    if CODE == "v2-unpatched" or (CODE == "v2-patched" and durable_kit.patched(wf, "fraud-check")):
        fraud_check(wf)
    wf.execute_step("charge_card", lambda: send(wf, Cards, "charge", "charge_card"),
                    compensate=lambda charge: send(wf, Cards, "refund", "compensate:charge_card"))
    decision = wf.wait_for_approval("itinerary", {"trip": wf.input["trip"]}, deadline=wf.input.get("deadline"))
    if decision.get("timed_out"):
        wf.end("stopped", "no decision on the itinerary before its deadline")
    if not decision["approved"]:
        wf.end("rejected", f"itinerary rejected by {decision['by']}")
    ticket = wf.execute_step("issue_ticket", lambda: send(wf, Tickets, "issue", "issue_ticket"))
    return {"ticket": ticket["effect_id"]}
