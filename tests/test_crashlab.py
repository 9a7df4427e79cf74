"""The crash lab on a workflow written outside the package, from the public API alone, in real processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from durable_kit.core.store import connect
from durable_kit.harness.crashlab import explore, fuzz, step_map
from durable_kit.harness.crashlab import INVARIANTS, CrashLabError, answers, promise_violations, summarize
from durable_kit.world.service import KeyedService, UnkeyedService
from durable_kit.world.service import KeyReused, StaleToken
from durable_kit.harness.faults import tracing, trip

from conftest import ROOT, run_python

TRAVEL = '''
"""A travel booking agent: a model proposes a flight, a keyed seat hold, an approval,
a card charge without keys that reconciles first, an itinerary by a keyed mailer."""
from durable_kit import effect_key, reconcile_then_send, send_at_most_once, send_guarded, workflow
from durable_kit.world.scripted import ScriptedModel
from durable_kit.world.service import KeyedService, UnkeyedService
from travel_services import Cards, Mail, Seats

SCRIPT = [{"when": {}, "action": {"tool": "propose", "args": {"flight": "LX318", "fare": 412.0}}}]


def charge_card(wf, cards, fare):
    how, token = wf.input.get("charge"), wf.fencing_token
    if how == "naive":
        return {"receipt": send_guarded(wf, "charge", lambda: cards.charge(wf.id, fare))}
    if how == "reserve":
        reserved = send_at_most_once(wf, "charge", lambda key: cards.charge(wf.id, fare))
        return {"receipt": reserved.get("receipt") or {"effect_id": None}}
    fenced = {"key": effect_key(wf.id, "charge"), "token": token} if how == "fenced" else {}
    return reconcile_then_send(wf, "charge", lambda: next(iter(cards.effects("charge", booking=wf.id)), None),
                               lambda: cards.charge(wf.id, fare, **fenced))


@workflow("trip")
def trip(wf):
    model = ScriptedModel(SCRIPT, wf.db_path, wf.id)
    proposal = wf.execute_step("propose", lambda: model.decide({"request": wf.input["request"]})["action"]["args"])
    seats, cards, mail = Seats.beside(wf.db_path), Cards.beside(wf.db_path), Mail.beside(wf.db_path)
    hold = wf.execute_step("hold", lambda: send_guarded(
        wf, "hold", lambda: seats.hold(proposal["flight"], effect_key(wf.id, "hold"))))
    wf.wait_for_approval("approval", {"flight": proposal["flight"], "fare": proposal["fare"]})
    charge = wf.execute_step("charge", lambda: charge_card(wf, cards, proposal["fare"]))
    wf.execute_step("itinerary", lambda: send_guarded(
        wf, "itinerary", lambda: mail.request("send", {"to": wf.input["traveller"]}, effect_key(wf.id, "itinerary"))))
    return {"hold": hold["effect_id"], "charge": charge["receipt"]["effect_id"]}
'''

SERVICES = '''
from durable_kit.world.service import KeyedService, UnkeyedService


class Seats(KeyedService):
    name = "seats"

    def hold(self, flight, key):
        return self.request("hold", {"flight": flight}, key)


class Cards(UnkeyedService):
    name = "cards"

    def charge(self, booking, amount, key=None, token=None):
        return self.request("charge", {"booking": booking, "amount": amount}, key, fencing_token=token)


class Mail(KeyedService):
    name = "mail"
'''

TRIP_INPUT = {"request": "Zurich to Lisbon on 3 March", "traveller": "ana@example.com"}
TRIP_POINTS = ["next_step", "after_activity:propose", "after_commit:propose", "before_send:hold", "after_send:hold",
               "after_activity:hold", "after_commit:hold", "after_wait:approval", "before_send:charge",
               "after_send:charge", "after_activity:charge", "after_commit:charge", "before_send:itinerary",
               "after_send:itinerary", "after_activity:itinerary", "after_commit:itinerary"]


@pytest.fixture(scope="module")
def travel(tmp_path_factory) -> Path:
    """The travel agent in its own folder, importing a sibling module: nothing of it is in the package."""
    folder = tmp_path_factory.mktemp("agents")
    (folder / "travel_services.py").write_text(SERVICES)
    (folder / "travel.py").write_text(TRAVEL)
    return folder / "travel.py"


@pytest.fixture(scope="module")
def explored(travel, tmp_path_factory) -> list[dict]:
    return explore("trip", TRIP_INPUT, module=travel, actions=("exit",), folder=tmp_path_factory.mktemp("explore"))


def by_point(rows: list[dict]) -> dict[str, dict]:
    return {row["point"]: row for row in rows}


# --- tracing ---

def test_trip_appends_every_point_to_the_trace_when_tracing(tmp_path, monkeypatch):
    conn = connect(tmp_path / "j.db")
    monkeypatch.delenv("DURABLE_KIT_TRACE", raising=False)
    assert not tracing()
    trip(conn, "before_send:x", "wf-1")  # not traced, not armed: nothing happens
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("DURABLE_KIT_TRACE", str(trace))
    assert tracing()
    trip(conn, "before_send:x", "wf-1")
    trip(conn, "after_send:x", "wf-2")
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines == [{"point": "before_send:x", "workflow_id": "wf-1"},
                     {"point": "after_send:x", "workflow_id": "wf-2"}]


# --- the module loader ---

def test_start_and_worker_import_a_file_whose_folder_holds_its_imports(travel, tmp_path):
    db = tmp_path / "t.db"
    started = run_python("-m", "durable_kit", "start", "--db", str(db), "--kind", "trip", "--input",
                         json.dumps(TRIP_INPUT), "--id", "trip-1", "--module", str(travel))
    assert started.returncode == 0, started.stderr
    worker = run_python("-m", "durable_kit", "worker", "--db", str(db), "--until-idle", "--module", str(travel))
    assert worker.returncode == 0, worker.stderr
    assert "trip-1: waiting" in worker.stdout


def test_module_may_be_an_importable_name(travel, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(travel.parent)}
    started = subprocess.run([sys.executable, "-m", "durable_kit", "start", "--db", str(tmp_path / "t.db"), "--kind",
                              "trip", "--input", json.dumps(TRIP_INPUT), "--module", "travel"],
                             cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
    assert started.returncode == 0, started.stderr
    missing = run_python("-m", "durable_kit", "start", "--db", str(tmp_path / "u.db"), "--kind", "trip",
                         "--input", "{}", "--module", "no_such_agents_module")
    assert missing.returncode != 0 and "no_such_agents_module" in missing.stderr
    assert not (tmp_path / "u.db").exists() or "trip" not in (tmp_path / "u.db").read_bytes().decode("latin-1")


# --- explore ---

def test_explore_lists_every_boundary_of_the_outside_workflow_in_order(explored):
    assert [row["point"] for row in explored] == ["clean", *TRIP_POINTS]
    clean = explored[0]
    assert clean["counts"] == {"model calls": 1, "seats requests": 1, "seats effects": 1, "cards requests": 1,
                               "cards effects": 1, "mail requests": 1, "mail effects": 1}
    assert clean["status"] == "complete" and clean["artifacts_stored"] == 4


def test_every_single_crash_of_the_keyed_and_reconciled_trip_ends_with_one_of_each(explored):
    for row in explored[1:]:
        assert row["exit_code"] == 13, row["point"]
        assert row["fired"] == [row["point"]]
        assert row["invariants_held"] and row["effects_as_clean"], (row["point"], row["violations"])
        assert row["status"] == "complete" and row["output_as_clean"]
        assert {k: v for k, v in row["counts"].items() if k.endswith("effects")} == {
            "seats effects": 1, "cards effects": 1, "mail effects": 1}


def test_crashes_after_a_send_repeat_the_request_not_the_effect(explored):
    rows = by_point(explored)
    assert rows["after_send:hold"]["counts"]["seats requests"] == 2  # the key made the repeat harmless
    assert rows["after_activity:itinerary"]["counts"]["mail requests"] == 2
    assert rows["after_send:charge"]["counts"]["cards requests"] == 1  # it asked first, and did not send again
    assert rows["after_send:charge"]["reconciled"] == ["charge"]
    assert rows["after_activity:propose"]["counts"]["model calls"] == 2
    assert rows["after_commit:propose"]["counts"]["model calls"] == 1
    assert rows["after_send:hold"]["repeated"]["seats requests"] == 1


def test_sigkill_at_a_point_is_recovered_like_exit(travel, tmp_path):
    rows = explore("trip", TRIP_INPUT, module=travel, actions=("kill",), points=["after_send:charge"],
                   folder=tmp_path)
    crash = rows[1]
    assert (crash["point"], crash["action"], crash["exit_code"]) == ("after_send:charge", "kill", -9)
    assert crash["invariants_held"] and crash["counts"]["cards effects"] == 1


def test_an_unkeyed_charge_without_reconciliation_is_charged_twice_caught_and_flagged(travel, tmp_path):
    naive = {**TRIP_INPUT, "charge": "naive"}
    rows = explore("trip", naive, module=travel, actions=("exit",), points=["after_send:charge"],
                   folder=tmp_path / "explore")
    crash = rows[1]
    assert crash["counts"]["cards effects"] == 2 and crash["effects_changed"] == ["cards effects +1"]
    assert not crash["effects_as_clean"] and not crash["invariants_held"]
    # The duplicate carries no key, so the keyed-repeat invariant (all the lab once checked) misses it;
    # counting every effect against the clean run and the promise catches it.
    assert crash["violations"] == [
        "effects as promised: cards made 2 effects, the clean run 1: 1 more than exactly-once allows"]
    assert promise_violations(crash["counts"], rows[0]["counts"], {"cards": "at-least-once"}) == []
    assert promise_violations(crash["counts"], rows[0]["counts"], "at-most-once") == [
        "effects as promised: cards made 2 effects, the clean run 1: 1 more than at-most-once allows"]
    steps = {s["name"]: s for s in step_map("trip", naive, module=travel, rows=rows, folder=tmp_path / "map")}
    assert steps["charge"]["kind"] == "side effect" and steps["charge"]["identity"] == ""
    assert steps["charge"]["reconciliation"] == "none" and steps["charge"]["flagged"]


def test_a_lost_effect_breaks_exactly_once_and_not_at_most_once(travel, tmp_path):
    reserve = {**TRIP_INPUT, "charge": "reserve"}
    rows = explore("trip", reserve, module=travel, actions=("exit",), points=["before_send:charge"],
                   promise={"cards": "at-most-once"}, folder=tmp_path)
    clean, crash = rows
    assert clean["counts"]["cards effects"] == 1
    assert crash["counts"]["cards effects"] == 0 and crash["effects_changed"] == ["cards effects -1"]
    assert crash["invariants_held"] and crash["status"] == "complete"
    assert promise_violations(crash["counts"], clean["counts"], "exactly-once") == [
        "effects as promised: cards made 0 effects, the clean run 1: 1 fewer than exactly-once allows"]


def test_two_workflows_in_one_journal_are_each_recovered_with_one_of_each(travel, tmp_path):
    other = {"request": "Lisbon to Porto on 9 March", "traveller": "li@example.com"}
    rows = explore("trip", [TRIP_INPUT, other], module=travel, actions=("exit", "kill"),
                   points=["after_send:hold", "after_send:charge"], folder=tmp_path)
    assert rows[0]["counts"] == {"model calls": 2, "seats requests": 2, "seats effects": 2, "cards requests": 2,
                                 "cards effects": 2, "mail requests": 2, "mail effects": 2}
    assert rows[0]["status"] == "complete" and rows[0]["artifacts_stored"] == 8
    assert [(r["point"], r["action"], r["exit_code"], r["fired"]) for r in rows[1:]] == [
        ("after_send:hold", "exit", 13, ["after_send:hold"]), ("after_send:hold", "kill", -9, ["after_send:hold"]),
        ("after_send:charge", "exit", 13, ["after_send:charge"]),
        ("after_send:charge", "kill", -9, ["after_send:charge"])]
    for row in rows[1:]:
        assert row["invariants_held"] and row["status"] == "complete", row["violations"]
        assert {k: v for k, v in row["counts"].items() if k.endswith(" effects")} == {
            "seats effects": 2, "cards effects": 2, "mail effects": 2}
    assert rows[1]["counts"]["seats requests"] == 3 and rows[3]["counts"]["cards requests"] == 2


def test_a_paused_owner_charges_twice_without_a_fence_and_once_with_one(travel, tmp_path):
    """SIGSTOP after reconciliation asked and before it charged; a standby takes over past the lease; SIGCONT."""
    unfenced = explore("trip", TRIP_INPUT, module=travel, actions=("pause",), points=["before_send:charge"],
                       folder=tmp_path / "unfenced")[1]
    assert (unfenced["action"], unfenced["exit_code"], unfenced["paused"]) == ("pause", 0, 1)
    assert unfenced["fired"] == ["before_send:charge"] and unfenced["status"] == "complete"
    assert (unfenced["counts"]["cards requests"], unfenced["counts"]["cards effects"]) == (2, 2)
    assert unfenced["refused"] >= 1  # the journal refused the paused owner's late write; the card was not
    assert unfenced["violations"] == [
        "effects as promised: cards made 2 effects, the clean run 1: 1 more than exactly-once allows"]
    fenced = explore("trip", {**TRIP_INPUT, "charge": "fenced"}, module=travel, actions=("pause",),
                     points=["before_send:charge"], folder=tmp_path / "fenced")[1]
    assert (fenced["paused"], fenced["status"], fenced["invariants_held"]) == (1, "complete", True)
    assert (fenced["counts"]["cards requests"], fenced["counts"]["cards effects"]) == (2, 1)
    assert fenced["children"] == 3  # one worker up to the approval, then the paused owner and its standby


def test_step_map_marks_every_step_by_what_it_touched(travel, explored, tmp_path):
    steps = step_map("trip", TRIP_INPUT, module=travel, rows=explored, folder=tmp_path)
    assert [(s["name"], s["kind"]) for s in steps] == [
        ("propose", "model decision"), ("hold", "side effect"), ("approval", "human event"),
        ("charge", "side effect"), ("itinerary", "side effect")]
    entries = {s["name"]: s for s in steps}
    assert entries["hold"]["identity"] == "lab-1:hold"
    assert entries["hold"]["reconciliation"] == "destination deduplicates the key"
    assert entries["charge"]["reconciliation"] == "asks the destination first (reconciliation)"
    assert not any(s["flagged"] for s in steps)


def test_a_keyed_destination_that_ignores_its_key_breaks_an_invariant(tmp_path):
    module = tmp_path / "noisy.py"
    module.write_text(
        "from durable_kit import effect_key, send_guarded, workflow\nfrom durable_kit.world.notifier import Notifier\n\n\n"
        "@workflow('noisy')\n"
        "def noisy(wf):\n"
        "    notifier = Notifier.beside(wf.db_path, dedupe=False)\n"
        "    return wf.execute_step('notify', lambda: send_guarded(wf, 'notify', lambda: notifier.send(\n"
        "        'ana@example.com', 'booked', effect_key(wf.id, 'notify'))))\n")
    rows = explore("noisy", {}, module=module, actions=("exit",), points=["after_send:notify"],
                   expected_status="complete", folder=tmp_path / "lab")
    assert rows[1]["violations"] == [
        "effects as promised: notify made 2 effects, the clean run 1: 1 more than exactly-once allows",
        "keyed effects at most once: notify: key 'lab-1:notify' made 2 effects"]
    assert not rows[1]["invariants_held"]
    # The step map checks a sent key by crashing after the step's activity: this one is flagged.
    steps = step_map("noisy", {}, module=module, folder=tmp_path / "map")
    assert [(s["name"], s["identity"], s["reconciliation"], s["flagged"]) for s in steps] == [
        ("notify", "lab-1:notify", "none", True)]


def test_a_question_is_answered_by_the_policy_or_named_in_a_clear_error(tmp_path):
    with pytest.raises(CrashLabError, match="Which question about our suppliers.*answers"):
        explore("reviewed_report", {"topic": "our suppliers"}, actions=("exit",), folder=tmp_path / "a")
    asked = explore("reviewed_report", {"topic": "our suppliers"}, policy=answers("supplier concentration risk"),
                    actions=("exit",), points=["after_wait:clarify"], folder=tmp_path / "b")
    assert [r["status"] for r in asked] == ["complete", "complete"]
    assert asked[1]["exit_code"] == 13 and asked[1]["invariants_held"]


def test_an_unknown_kind_is_a_clear_error_that_names_it(tmp_path):
    done = run_python("-m", "durable_kit", "crashlab", "explore", "--kind", "trpi", "--input", "{}")
    assert done.returncode != 0
    assert "trpi" in done.stderr and "Traceback" not in done.stderr


# --- fuzz ---

def test_fuzz_finds_no_violation_in_the_keyed_trip(travel, tmp_path):
    result = fuzz("trip", TRIP_INPUT, module=travel, trials=24, seed=7, folder=tmp_path)
    assert result["trials"] == 24 and result["trials_with_violations"] == 0
    assert set(result["violations_by_invariant"].values()) == {0}
    assert list(result["violations_by_invariant"]) == list(INVARIANTS)
    assert result["statuses"] == {"complete": 24} and result["pauses"] == 0
    assert sum(result["kill_points"].values()) == result["kills"] >= 24  # every trial armed a point it reaches
    assert result["trials_with_extra_effects"] == 0 and result["trials_with_lost_effects"] == 0
    assert all(row["crashed"] and set(row["crashed"]) <= {13, -9} for row in result["rows"])


def test_fuzz_with_pauses_and_two_fenced_trips_in_one_journal(travel, tmp_path):
    fenced = [{**TRIP_INPUT, "charge": "fenced"}, {**TRIP_INPUT, "traveller": "li@example.com", "charge": "fenced"}]
    result = fuzz("trip", fenced, module=travel, trials=6, seed=5, actions=("exit", "kill", "pause"),
                  folder=tmp_path)
    assert (result["trials"], result["workflows"], result["trials_with_violations"]) == (6, 2, 0)
    assert result["statuses"] == {"complete": 6}
    fired_pauses = sum(1 for row in result["rows"] for point, action in row["armed"]
                       if action == "pause" and point in row["fired"])
    assert result["pauses"] == fired_pauses >= 1
    assert all(row["counts"]["cards effects"] == 2 and row["counts"]["seats effects"] == 2 for row in result["rows"])


def test_fuzz_counts_every_naive_duplicate_as_a_broken_promise(travel, tmp_path):
    result = fuzz("trip", {**TRIP_INPUT, "charge": "naive"}, module=travel, trials=8, seed=3, folder=tmp_path)
    doubled = [row["trial"] for row in result["rows"] if row["counts"]["cards effects"] == 2]
    assert doubled and result["trials_with_extra_effects"] == len(doubled)
    assert result["trials_with_violations"] == result["violations_by_invariant"]["effects as promised"] == len(doubled)
    assert result["violations_by_invariant"]["keyed effects at most once"] == 0  # what the lab once counted alone


def test_the_fuzz_command_prints_its_tally_as_json(travel):
    done = run_python("-m", "durable_kit", "crashlab", "fuzz", "--kind", "trip", "--module", str(travel), "--input",
                      json.dumps(TRIP_INPUT), "--trials", "3", "--seed", "3", "--no-progress", "--json")
    assert done.returncode == 0, done.stderr
    tally = json.loads(done.stdout)
    assert tally["trials"] == 3 and tally["trials_with_violations"] == 0 and "rows" not in tally
    assert tally["points"] == TRIP_POINTS and (tally["workflows"], tally["pauses"]) == (1, 0)


def test_the_fuzz_command_takes_workflows_and_a_promise_and_refuses_an_unknown_one(travel):
    naive = json.dumps({**TRIP_INPUT, "charge": "naive"})
    done = run_python("-m", "durable_kit", "crashlab", "fuzz", "--kind", "trip", "--module", str(travel), "--input",
                      naive, "--workflows", "2", "--promise", '{"cards": "at-least-once"}', "--trials", "2",
                      "--seed", "1", "--no-progress", "--json")
    assert done.returncode == 0, done.stderr
    tally = json.loads(done.stdout)
    assert (tally["workflows"], tally["promise"], tally["trials_with_violations"]) == (
        2, {"cards": "at-least-once"}, 0)
    wrong = run_python("-m", "durable_kit", "crashlab", "fuzz", "--kind", "trip", "--module", str(travel),
                       "--input", naive, "--promise", "once-ish", "--trials", "1", "--no-progress")
    assert wrong.returncode != 0 and "Traceback" not in wrong.stderr
    assert "a promise is one of ('exactly-once', 'at-most-once', 'at-least-once')" in wrong.stderr


def test_summarize_counts_each_violation_once_per_trial():
    rows = [{"violations": ["final status as expected: escalated, expected complete"], "invariants_held": False,
             "fired": ["a", "a"], "crashed": [13, 13], "children": 3, "repeated": {"x effects": -1},
             "status": "escalated"},
            {"violations": [], "invariants_held": True, "fired": ["b"], "crashed": [-9], "children": 2,
             "repeated": {"x effects": 1}, "status": "complete"}]
    tally = summarize(rows, ["a", "b", "c"])
    assert tally["trials_with_violations"] == 1 and tally["violations_by_invariant"]["final status as expected"] == 1
    assert tally["kill_points"] == {"a": 2, "b": 1, "c": 0} and tally["kills"] == 3
    assert tally["trials_with_extra_effects"] == 1 and tally["trials_with_lost_effects"] == 1


# --- the fake services ---

class Seats(KeyedService):
    name = "seats"


class Cards(UnkeyedService):
    name = "cards"

    def perform(self, operation, payload):
        return {"amount": payload["amount"]}


def test_a_keyed_service_makes_one_effect_per_key_and_counts_every_request(tmp_path):
    seats = Seats.beside(tmp_path / "j.db")
    first = seats.request("hold", {"flight": "LX318"}, "trip-1:hold")
    again = seats.request("hold", {"flight": "LX318"}, "trip-1:hold")
    assert first == again == {"effect_id": "seats-0001", "operation": "hold"}
    assert (seats.request_count(), seats.effect_count()) == (2, 1)
    with pytest.raises(KeyReused, match="trip-1:hold"):
        seats.request("hold", {"flight": "TP941"}, "trip-1:hold")
    assert (seats.request_count(), seats.effect_count()) == (3, 1)
    assert (tmp_path / "j.seats.db").exists()


def test_an_unkeyed_service_makes_an_effect_per_request_and_answers_reconciliation(tmp_path):
    cards = Cards.beside(tmp_path / "j.db")
    assert cards.effects("charge", booking="trip-1") == []
    one = cards.request("charge", {"booking": "trip-1", "amount": 412.0}, "ignored-key")
    two = cards.request("charge", {"booking": "trip-1", "amount": 412.0})
    assert (one["effect_id"], two["effect_id"], one["amount"]) == ("cards-0001", "cards-0002", 412.0)
    assert [e["effect_id"] for e in cards.effects("charge", booking="trip-1")] == ["cards-0001", "cards-0002"]
    assert cards.effects("charge", booking="trip-2") == [] and cards.effects()[0]["key"] is None


def test_a_service_refuses_a_stale_fencing_token_for_its_key_and_does_nothing(tmp_path):
    seats = Seats.beside(tmp_path / "j.db")
    seats.request("hold", {"flight": "LX318"}, "w1:hold", fencing_token=2)
    with pytest.raises(StaleToken, match="'w1:hold': fencing token 1, older than 2"):
        seats.request("hold", {"flight": "LX318"}, "w1:hold", fencing_token=1)
    assert (seats.request_count(), seats.effect_count()) == (2, 1)
    assert seats.request("hold", {"flight": "LX319"}, "w2:hold", fencing_token=1)["effect_id"] == "seats-0002"
    assert seats.request("hold", {"flight": "LX318"}, "w1:hold", fencing_token=3)["effect_id"] == "seats-0001"
    with pytest.raises(ValueError, match="seats: hold with a fencing token needs the key it fences"):
        seats.request("hold", {"flight": "LX320"}, fencing_token=4)
    assert (seats.request_count(), seats.effect_count()) == (4, 2)


FENCED = '''
from durable_kit import effect_key, workflow
from durable_kit.world.service import KeyedService, UnkeyedService


class Seats(KeyedService):
    name = "seats"


class Cards(UnkeyedService):
    name = "cards"


@workflow("booking")
def booking(wf):
    for n in range(wf.input["approvals"]):
        wf.wait_for_approval(f"approval-{n}", {"n": n})
    seats, cards, token = Seats.beside(wf.db_path), Cards.beside(wf.db_path), wf.fencing_token
    hold = wf.execute_step("hold", lambda: seats.request(
        "hold", {"booking": wf.id}, effect_key(wf.id, "hold"), fencing_token=token))
    charge = wf.execute_step("charge", lambda: cards.request(
        "charge", {"booking": wf.id}, effect_key(wf.id, "charge"), fencing_token=token))
    return {"hold": hold["effect_id"], "charge": charge["effect_id"], "token": token}
'''


def _kit(*args):
    done = run_python("-m", "durable_kit", *map(str, args))
    assert done.returncode == 0, done.stderr
    return done


def test_two_bookings_in_one_journal_are_fenced_each_by_its_own_key(tmp_path):
    """Tokens count per workflow: a second booking's first token is lower than the first booking's last."""
    module, db = tmp_path / "fenced.py", tmp_path / "j.db"
    module.write_text(FENCED)
    _kit("start", "--db", db, "--kind", "booking", "--input", '{"approvals": 3}', "--id", "b-1", "--module", module)
    _kit("worker", "--db", db, "--until-idle", "--module", module)
    for n in range(3):
        _kit("approve", "--db", db, "--workflow", "b-1", "--by", "ana", "--wait", f"approval-{n}")
        _kit("worker", "--db", db, "--until-idle", "--module", module)
    _kit("start", "--db", db, "--kind", "booking", "--input", '{"approvals": 0}', "--id", "b-2", "--module", module)
    _kit("worker", "--db", db, "--until-idle", "--module", module)
    conn = connect(db)
    rows = {r["id"]: r for r in conn.execute("SELECT id, status, output FROM workflows")}
    assert {i: r["status"] for i, r in rows.items()} == {"b-1": "complete", "b-2": "complete"}
    first, second = (json.loads(rows[i]["output"])["token"] for i in ("b-1", "b-2"))
    assert (first, second) == (4, 1)  # four leases for the first (three waits), one for the second
    seats, cards = Seats.beside(db), Cards.beside(db)
    assert (seats.request_count(), seats.effect_count(), cards.request_count(), cards.effect_count()) == (2, 2, 2, 2)
    # Within one key the fence still holds: the first booking's stale owner is refused, and nothing is done.
    with pytest.raises(StaleToken, match="b-1:hold.*token 3, older than 4"):
        seats.request("hold", {"booking": "b-1"}, "b-1:hold", fencing_token=3)
    with pytest.raises(StaleToken, match="b-1:charge.*token 3, older than 4"):
        cards.request("charge", {"booking": "b-1"}, "b-1:charge", fencing_token=3)
    assert (seats.request_count(), seats.effect_count(), cards.request_count(), cards.effect_count()) == (3, 2, 3, 2)


def test_importing_the_kit_loads_no_engine_no_chart_and_no_dataframe():
    done = run_python("-c", "import sys, durable_kit; print(sorted({m.split('.')[0] for m in sys.modules} & "
                            "{'pandas', 'matplotlib', 'ipywidgets', 'dbos', 'langgraph', 'tqdm'}))")
    assert done.stdout.strip() == "[]", done.stderr
