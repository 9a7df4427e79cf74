"""Notebook 07's trip actions and exercise check, in real processes, with the counts at the destinations."""
from __future__ import annotations

from pathlib import Path

import pytest

from durable_kit import Journal, patched
from durable_kit.core.journal import VERSIONS, WORKFLOWS
from durable_kit.harness.faults import arm
from durable_kit.workshop.lab import change_demo
from durable_kit.workshop.lab.change_demo import (EXERCISE_KIND, NEW_MARKUP, OLD_MARKUP, Seats, charge_card,
                                         check_patched_trip, effects, hold_seat, quote, requests)

from conftest import run_python


def v2(markup_for: "callable", quote_input: "callable | None" = None):
    """A version 2 of the exercise trip whose markup (and the quote's input) the test chooses."""
    def trip(wf):
        route = wf.input["route"]
        markup = markup_for(wf)
        given = markup if quote_input is None else quote_input(wf)
        offer = wf.execute_step("quote", lambda: quote(route, markup), {"route": route, "markup": given})
        wf.execute_step("hold_seat", lambda: hold_seat(wf, offer))
        charge = wf.execute_step("charge_card", lambda: charge_card(wf, offer))
        return {"charged": charge["amount"]}
    return trip


def checked(capsys, trip) -> str:
    check_patched_trip(trip)
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out  # one line, and no exception
    return out.strip()


def test_the_check_passes_a_patch_and_restores_version_1(capsys):
    said = checked(capsys, v2(lambda wf: NEW_MARKUP if patched(wf, "markup-8") else OLD_MARKUP))
    assert said == ("pass: the running workflow replayed its old price (420.00) and completed; "
                    "the new one charged the new price (432.00)")
    assert (WORKFLOWS[EXERCISE_KIND], VERSIONS[EXERCISE_KIND]) == (change_demo.exercise_trip_v1, "v1")


def test_the_check_says_not_yet_for_the_stub(capsys):
    def stub(wf):
        raise NotImplementedError("write it")
    assert checked(capsys, stub) == ("not yet: my_trip_v2 still raises NotImplementedError; "
                                     "write it, then run this cell again")


def test_the_check_shows_the_divergence_of_an_unpatched_price_change(capsys):
    said = checked(capsys, v2(lambda wf: NEW_MARKUP))
    assert said.startswith("not quite: the running workflow old-1 is 'blocked': workflow 'old-1': non-deterministic "
                           "replay: step 'quote' completed with input {\"markup\":0.05,\"route\":\"ZRH-LIS\"}, but the "
                           "code now gives {\"markup\":0.08,\"route\":\"ZRH-LIS\"}")
    assert "Hint: choose the markup behind patched(wf, ...)" in said


@pytest.mark.parametrize("trip, problem", [
    (v2(lambda wf: OLD_MARKUP), "not quite: the card processor charged {'old-1': [420.0], 'new-1': [420.0]}"),
    (v2(lambda wf: NEW_MARKUP if patched(wf, "m") else OLD_MARKUP, quote_input=lambda wf: OLD_MARKUP),
     "not quite: both quote steps were given the input"),
    (lambda wf: 1 / 0, "not quite: replaying old-1 raised ZeroDivisionError: division by zero"),
    (lambda wf: {**v2(lambda wf: NEW_MARKUP if patched(wf, "m") else OLD_MARKUP)(wf), "charged": None},
     "not quite: the workflows returned {'old-1': {'charged': None}, 'new-1': {'charged': None}}; each should "
     "return {'charged': amount}"),
], ids=["never-new-price", "input-hides-the-change", "raises", "returns-another-shape"])
def test_the_check_names_what_is_wrong(capsys, trip, problem):
    assert checked(capsys, trip).startswith(problem)


BOOKING = '''
from durable_kit import workflow
from durable_kit.workshop.lab.change_demo import charge_card, hold_seat, quote, refund_card, release_seat


@workflow("demo_trip", version="v1")
def trip(wf):
    offer = wf.execute_step("quote", lambda: quote("ZRH-LIS", 0.05), {"markup": 0.05})
    wf.execute_step("hold_seat", lambda: hold_seat(wf, offer), compensate=lambda hold: release_seat(wf, hold))
    wf.execute_step("charge_card", lambda: charge_card(wf, offer), compensate=lambda paid: refund_card(wf, paid))
    wf.wait_for_approval("confirm", offer)
    return "booked"
'''


def kit(*args: str, expect: int | None = 0):
    done = run_python("-m", "durable_kit", *args)
    if expect is not None:
        assert done.returncode == expect, (done.stdout, done.stderr)
    return done


def test_cancelling_a_booking_refunds_and_releases_once_each_with_their_own_keys(tmp_path: Path):
    db, module = tmp_path / "trip.db", tmp_path / "demo_trip.py"
    module.write_text(BOOKING)
    kit("start", "--db", str(db), "--kind", "demo_trip", "--input", "{}", "--id", "t1", "--module", str(module))
    kit("worker", "--db", str(db), "--until-idle", "--module", str(module))
    assert effects(db) == {"seats hold": 1, "cards charge": 1}
    kit("cancel", "--db", str(db), "--workflow", "t1", "--by", "Ana", "--reason", "called off")
    arm(Journal(db).conn, "after_activity:compensate:charge_card", "exit")
    assert kit("worker", "--db", str(db), "--until-idle", "--module", str(module), expect=None).returncode == 13
    kit("worker", "--db", str(db), "--until-idle", "--module", str(module))
    assert Journal(db).workflow("t1")["status"] == "cancelled"
    assert effects(db) == {"seats hold": 1, "seats release": 1, "cards charge": 1, "cards refund": 1}
    assert requests(db) == {"seats hold": 1, "seats release": 1, "cards charge": 1, "cards refund": 2}
    assert [e["key"] for e in Seats.beside(db).effects()] == ["t1:hold_seat", "t1:release_seat"]
    assert Seats.beside(db).effects("release")[0]["payload"] == {"booking": "t1", "hold": "seats-0001"}


def test_counts_are_per_destination_and_operation_and_can_be_read_per_booking(tmp_path: Path):
    db = tmp_path / "world.db"
    seats = Seats.beside(db)
    seats.hold("b1", "LX318", "b1:hold_seat")
    seats.hold("b1", "LX318", "b1:hold_seat")  # a repeat: one more request, the same hold
    seats.hold("b2", "LX318", "b2:hold_seat")
    assert requests(db) == {"seats hold": 3} and effects(db) == {"seats hold": 2}
    assert requests(db, "b1") == {"seats hold": 2} and effects(db, "b1") == {"seats hold": 1}
    assert effects(tmp_path / "nothing.db") == {}
