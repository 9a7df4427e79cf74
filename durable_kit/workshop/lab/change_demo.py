"""Notebook 07's trip: the outside world it books, the actions it takes, and the exercise's check.

A trip booking talks to five destinations, each a ``KeyedService`` in its own
file beside the journal (``x.db`` -> ``x.seats.db``): an airline's seat holds,
a card processor, a ticket office, a mail server and a fraud desk. Every
action sends one request with a key made from the workflow and the action
(``effect_key``), so a repeated request is one effect. Each compensation has
its own key (``release_seat``, ``refund_card``): undoing is an action too.

The workflows themselves are written in the notebook (``%%writefile``) and
import these actions, so the notebook's versions and the exercise share them.
Nothing here imports matplotlib, pandas or ipywidgets.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from ...effects import effect_key
from ...world.service import KeyedService
from ...harness.faults import arm
from ...core.journal import VERSIONS, WORKFLOWS, Journal, Workflow, run_workflow, workflow
from ...world import beside

BASE_FARE = 400.0


class Seats(KeyedService):
    """An airline's seat holds: one hold per key; a release frees a hold."""

    name = "seats"

    def hold(self, booking: str, flight: str, key: str) -> dict:
        return self.request("hold", {"booking": booking, "flight": flight}, key)

    def release(self, booking: str, hold_id: str, key: str) -> dict:
        return self.request("release", {"booking": booking, "hold": hold_id}, key)


class Cards(KeyedService):
    """A card processor with idempotency keys: charges and refunds."""

    name = "cards"

    def charge(self, booking: str, amount: float, key: str) -> dict:
        return self.request("charge", {"booking": booking, "amount": amount}, key)

    def refund(self, booking: str, charge_id: str, amount: float, key: str) -> dict:
        return self.request("refund", {"booking": booking, "charge": charge_id, "amount": amount}, key)


class Tickets(KeyedService):
    """A ticket office: one ticket per key."""

    name = "tickets"

    def issue(self, booking: str, flight: str, key: str) -> dict:
        return self.request("issue", {"booking": booking, "flight": flight}, key)


class Mail(KeyedService):
    """A mail server: one message per key."""

    name = "mail"

    def send(self, booking: str, to: str, text: str, key: str) -> dict:
        return self.request("send", {"booking": booking, "to": to, "text": text}, key)


class FraudDesk(KeyedService):
    """A fraud desk that screens a booking: one screening per key."""

    name = "fraud"

    def screen(self, booking: str, key: str) -> dict:
        return self.request("screen", {"booking": booking}, key)


SERVICES = (Seats, Cards, Tickets, Mail, FraudDesk)


# --- the trip's actions: each one request, with the workflow's key for that action ----------

def quote(route: str, markup: float) -> dict:
    """The fare for ``route`` with ``markup``: deterministic, no destination."""
    return {"route": route, "flight": "LX318", "fare": round(BASE_FARE * (1 + markup), 2)}


def hold_seat(wf: Workflow, offer: dict) -> dict:
    """Hold a seat on the offer's flight."""
    return Seats.beside(wf.db_path).hold(wf.id, offer["flight"], effect_key(wf.id, "hold_seat"))


def release_seat(wf: Workflow, hold: dict) -> dict:
    """Undo ``hold_seat``: release the hold, with a key of its own."""
    return Seats.beside(wf.db_path).release(wf.id, hold["effect_id"], effect_key(wf.id, "release_seat"))


def charge_card(wf: Workflow, offer: dict) -> dict:
    """Charge the offer's fare."""
    return {**Cards.beside(wf.db_path).charge(wf.id, offer["fare"], effect_key(wf.id, "charge_card")),
            "amount": offer["fare"]}


def refund_card(wf: Workflow, charge: dict) -> dict:
    """Undo ``charge_card``: refund the charge in full, with a key of its own."""
    return Cards.beside(wf.db_path).refund(wf.id, charge["effect_id"], charge["amount"],
                                          effect_key(wf.id, "refund_card"))


def screen_booking(wf: Workflow) -> dict:
    """Ask the fraud desk to screen the booking."""
    return FraudDesk.beside(wf.db_path).screen(wf.id, effect_key(wf.id, "screen_booking"))


def issue_ticket(wf: Workflow, offer: dict) -> dict:
    """Issue the ticket."""
    return Tickets.beside(wf.db_path).issue(wf.id, offer["flight"], effect_key(wf.id, "issue_ticket"))


def draft_itinerary(offer: dict, ticket: dict, prompt: str) -> str:
    """A fake model's itinerary for the traveller; prompt ``itinerary-1`` forgets the ticket number."""
    text = f"Flight {offer['flight']} on {offer['route']}, fare {offer['fare']:.2f}."
    return text if prompt == "itinerary-1" else f"{text} Ticket {ticket['effect_id']}."


def send_itinerary(wf: Workflow, text: str) -> dict:
    """Mail the itinerary to the traveller."""
    return Mail.beside(wf.db_path).send(wf.id, wf.input["traveller"], text, effect_key(wf.id, "send_itinerary"))


def remind_agent(wf: Workflow, offer: dict) -> dict:
    """Ask a travel agent to call the traveller (the path taken when a confirmation deadline passes)."""
    return Mail.beside(wf.db_path).send(wf.id, "agents@example.test", f"call about {offer['flight']}",
                                        effect_key(wf.id, "remind_agent"))


# --- what the destinations hold ----------------------------------------------------------------

def destination_rows(db: str | Path, booking: str | None = None) -> list[dict]:
    """Per destination and operation: requests received and effects made (of one booking, if given)."""
    rows = []
    for service in SERVICES:
        path = beside(db, service.name)
        if not path.exists():  # never contacted: opening it would create it
            continue
        opened = service(path)
        try:
            rows += _count(opened.conn, booking, service.name)
        finally:
            opened.close()
    return rows


def _count(conn, booking: str | None, name: str = "") -> list[dict]:
    counts: dict[str, dict] = {}
    for table in ("requests", "effects"):
        for row in conn.execute(f"SELECT operation, payload FROM {table} ORDER BY seq"):
            if booking is not None and json.loads(row["payload"]).get("booking") != booking:
                continue
            entry = counts.setdefault(row["operation"], {"destination": name, "operation": row["operation"],
                                                         "requests": 0, "effects": 0})
            entry[table] += 1
    return list(counts.values())


def effects(db: str | Path, booking: str | None = None) -> dict[str, int]:
    """``{"seats hold": 1, ...}``: effects per destination and operation (of one booking, if given)."""
    return {f"{r['destination']} {r['operation']}": r["effects"] for r in destination_rows(db, booking)}


def requests(db: str | Path, booking: str | None = None) -> dict[str, int]:
    """Like ``effects``, counting every request received, repeats included."""
    return {f"{r['destination']} {r['operation']}": r["requests"] for r in destination_rows(db, booking)}


# --- the exercise: make a price change safe for a workflow already running ----------------------

EXERCISE_KIND = "exercise_trip"
OLD_MARKUP, NEW_MARKUP = 0.05, 0.08


@workflow(EXERCISE_KIND, version="v1")
def exercise_trip_v1(wf: Workflow) -> dict:
    """Version 1: quote with a 5% markup, hold a seat, charge the card."""
    route = wf.input["route"]
    offer = wf.execute_step("quote", lambda: quote(route, OLD_MARKUP), {"route": route, "markup": OLD_MARKUP})
    wf.execute_step("hold_seat", lambda: hold_seat(wf, offer))
    charge = wf.execute_step("charge_card", lambda: charge_card(wf, offer))
    return {"charged": charge["amount"]}


def check_patched_trip(trip_v2: Callable[[Workflow], Any]) -> None:
    """Run the learner's ``trip_v2`` against a real journal; print ``pass:`` or what is wrong, never raise.

    A workflow ``old-1`` is started under ``exercise_trip_v1`` and its worker, a
    real child process, is killed right after ``hold_seat`` committed. Then
    ``trip_v2`` is deployed (in this process): it replays ``old-1`` and runs a
    new workflow ``new-1``. ``old-1`` must complete at the old price (5%
    markup), ``new-1`` at the new one (8%), each with one seat hold.
    """
    with tempfile.TemporaryDirectory(prefix="exercise-07-") as folder:
        try:
            problem = _patched_trip_problem(trip_v2, Path(folder) / "exercise.db")
        except Exception as error:  # whatever the learner's code did, the notebook runs on
            problem = f"not quite: the check could not finish with your function: {type(error).__name__}: {error}"
        print(problem or f"pass: the running workflow replayed its old price ({_fare(OLD_MARKUP):.2f}) and completed; "
                          f"the new one charged the new price ({_fare(NEW_MARKUP):.2f})")


def _fare(markup: float) -> float:
    return quote("ZRH-LIS", markup)["fare"]


def _patched_trip_problem(trip_v2: Callable[[Workflow], Any], db: Path) -> str | None:
    journal = Journal(db)
    try:
        journal.start(EXERCISE_KIND, {"route": "ZRH-LIS"}, "old-1")
        arm(journal.conn, "after_commit:hold_seat", "exit")
        crashed = subprocess.run([sys.executable, "-m", "durable_kit", "worker", "--db", str(db), "--until-idle",
                                  "--module", __name__], capture_output=True, text=True, timeout=60)
        if crashed.returncode != 13:
            return (f"not quite: the check's v1 worker should have crashed (exit 13); it exited {crashed.returncode}: "
                    f"{crashed.stderr.strip()[-300:]}")
        with _deployed(trip_v2):
            journal.start(EXERCISE_KIND, {"route": "ZRH-LIS"}, "new-1")
            for workflow_id in ("old-1", "new-1"):
                try:
                    run_workflow(journal, workflow_id)
                except NotImplementedError:
                    return "not yet: my_trip_v2 still raises NotImplementedError; write it, then run this cell again"
                except Exception as error:  # the learner's code: say what broke and carry on
                    return f"not quite: replaying {workflow_id} raised {type(error).__name__}: {error}"
            return _outcome_problem(journal, db)
    finally:
        journal.close()


def _outcome_problem(journal: Journal, db: Path) -> str | None:
    hint = ("Hint: choose the markup behind patched(wf, ...) before the quote step, so a workflow already past "
            "that line keeps OLD_MARKUP, and give the quote step the markup you chose as its input.")
    old, new = journal.workflow("old-1"), journal.workflow("new-1")
    if old["status"] != "complete":
        return f"not quite: the running workflow old-1 is {old['status']!r}: {(old['error'] or '').rstrip('.')}. {hint}"
    if new["status"] != "complete":
        return f"not quite: the new workflow new-1 is {new['status']!r}: {new['error'] or 'it did not finish'}"
    cards, seats = Cards.beside(db), Seats.beside(db)
    try:
        charged = {booking: [e["payload"]["amount"] for e in cards.effects("charge", booking=booking)]
                   for booking in ("old-1", "new-1")}
        holds = {booking: len(seats.effects("hold", booking=booking)) for booking in ("old-1", "new-1")}
    finally:
        cards.close()
        seats.close()
    wanted = {"old-1": [_fare(OLD_MARKUP)], "new-1": [_fare(NEW_MARKUP)]}
    if charged != wanted:
        return f"not quite: the card processor charged {charged}; it should have charged {wanted}. {hint}"
    quoted = {w: s["input"] for w in ("old-1", "new-1") for s in journal.steps(w) if s["name"] == "quote"}
    if set(quoted) != {"old-1", "new-1"}:
        return f"not quite: a step named 'quote' is missing from {sorted({'old-1', 'new-1'} - set(quoted))}. {hint}"
    if quoted["old-1"] == quoted["new-1"]:
        return (f"not quite: both quote steps were given the input {quoted['new-1']}, though new-1 used another "
                "markup: a step's input must say what the step used, or a replay cannot see the change. " + hint)
    if holds != {"old-1": 1, "new-1": 1}:
        return f"not quite: seat holds per booking were {holds}; each booking needs exactly one"
    returned = {w: journal.workflow(w)["output"] for w in ("old-1", "new-1")}
    if returned != {w: {"charged": fares[0]} for w, fares in wanted.items()}:
        return (f"not quite: the workflows returned {returned}; each should return {{'charged': amount}}, the "
                "amount charge_card's output holds, as version 1 does")
    return None


@contextmanager
def _deployed(fn: Callable[[Workflow], Any]) -> Iterator[None]:
    """Register ``fn`` as the exercise kind's code (version ``v2``) inside the block; put v1 back after."""
    saved = WORKFLOWS[EXERCISE_KIND], VERSIONS[EXERCISE_KIND]
    WORKFLOWS[EXERCISE_KIND], VERSIONS[EXERCISE_KIND] = fn, "v2"
    try:
        yield
    finally:
        WORKFLOWS[EXERCISE_KIND], VERSIONS[EXERCISE_KIND] = saved
