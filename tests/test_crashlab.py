"""The crash lab on a workflow written outside the package, from the public API alone, in real processes."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from durable_kit.core.store import connect
from durable_kit.harness.crashlab import explore, fuzz, step_map
from durable_kit.harness.crashlab import INVARIANTS, CrashLabError, answers, promise_violations, summarize
from durable_kit.harness.crashlab import cancel_all, compensation_violations, crash_once, discover, effect_violations
from durable_kit.harness.crashlab import observe, order_violations, scenario
from durable_kit.world.service import KeyedService, UnkeyedService
from durable_kit.world.service import KeyReused, StaleToken
from durable_kit.harness.faults import InjectedFailure, arm, disarm_all, tracing, trip
from durable_kit.world import sender

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


def test_a_point_armed_for_one_workflow_fires_only_there_and_one_armed_for_any_in_the_first(tmp_path, monkeypatch):
    monkeypatch.delenv("DURABLE_KIT_TRACE", raising=False)
    conn = connect(tmp_path / "j.db")
    arm(conn, "before_send:x", "fail", workflow_id="wf-2")
    trip(conn, "before_send:x", "wf-1")  # armed for another workflow: nothing happens
    with pytest.raises(InjectedFailure, match="'before_send:x' in workflow 'wf-2'"):
        trip(conn, "before_send:x", "wf-2")
    trip(conn, "before_send:x", "wf-2")  # fired once: gone
    arm(conn, "after_send:x", "fail")
    arm(conn, "after_send:x", "fail", workflow_id="wf-2")
    with pytest.raises(InjectedFailure, match="wf-1"):  # the one armed for any, fired by the first to reach it
        trip(conn, "after_send:x", "wf-1")
    assert [tuple(r) for r in conn.execute("SELECT point, workflow_id FROM faults")] == [("after_send:x", "wf-2")]
    assert disarm_all(conn) == ["after_send:x"]


def test_the_sender_is_named_from_before_send_to_the_next_point_on_its_thread(tmp_path, monkeypatch):
    monkeypatch.delenv("DURABLE_KIT_TRACE", raising=False)
    conn = connect(tmp_path / "j.db")
    assert sender() == (None, None)
    trip(conn, "before_send:charge", "wf-1")
    assert sender() == ("wf-1", "charge")
    seen = []
    worker = threading.Thread(target=lambda: seen.append(sender()))
    worker.start(), worker.join()
    assert seen == [(None, None)]  # another thread sends nothing on this one's behalf
    trip(conn, "after_send:charge", "wf-1")
    assert sender() == (None, None)


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


def test_two_workflows_in_one_journal_are_each_crashed_and_recovered_with_one_of_each(travel, tmp_path):
    other = {"request": "Lisbon to Porto on 9 March", "traveller": "li@example.com"}
    rows = explore("trip", [TRIP_INPUT, other], module=travel, actions=("exit", "kill"),
                   points=["after_send:hold", "after_send:charge in lab-2"], folder=tmp_path, parallel=2)
    assert rows[0]["counts"] == {"model calls": 2, "seats requests": 2, "seats effects": 2, "cards requests": 2,
                                 "cards effects": 2, "mail requests": 2, "mail effects": 2}
    assert rows[0]["status"] == "complete" and rows[0]["artifacts_stored"] == 8
    # A point alone is crashed in every workflow; one that names its workflow, in that one only.
    assert [(r["point"], r["workflow"], r["action"], r["exit_code"], r["fired"]) for r in rows[1:]] == [
        ("after_send:hold", "lab-1", "exit", 13, ["after_send:hold in lab-1"]),
        ("after_send:hold", "lab-1", "kill", -9, ["after_send:hold in lab-1"]),
        ("after_send:hold", "lab-2", "exit", 13, ["after_send:hold in lab-2"]),
        ("after_send:hold", "lab-2", "kill", -9, ["after_send:hold in lab-2"]),
        ("after_send:charge", "lab-2", "exit", 13, ["after_send:charge in lab-2"]),
        ("after_send:charge", "lab-2", "kill", -9, ["after_send:charge in lab-2"])]
    for row in rows[1:]:
        assert row["invariants_held"] and row["status"] == "complete", row["violations"]
        assert {k: v for k, v in row["counts"].items() if k.endswith(" effects")} == {
            "seats effects": 2, "cards effects": 2, "mail effects": 2}
    # The repeated hold request is the crashed workflow's own, never the other's.
    assert [(r["by_workflow"]["lab-1"]["seats requests"], r["by_workflow"]["lab-2"]["seats requests"])
            for r in rows[1:5]] == [(2, 1), (2, 1), (1, 2), (1, 2)]
    assert rows[5]["by_workflow"]["lab-2"]["cards requests"] == 1  # it asked first, and did not send again


SHARED_CARD = '''
"""Two workflows, one card processor without keys: a naive charge or a reserved one (at most once)."""
from durable_kit import effect_key, send_at_most_once, send_guarded, workflow
from durable_kit.world.service import KeyedService, UnkeyedService


class Cards(UnkeyedService):
    name = "cards"


class Vault(KeyedService):
    name = "vault"


@workflow("pay")
def pay(wf):
    how = wf.input["charge"]
    charge = lambda key=None: Cards.beside(wf.db_path).request("charge", {"booking": wf.id, "amount": 10.0})  # noqa
    if how == "naive":
        return wf.execute_step("charge", lambda: send_guarded(wf, "charge", charge))
    if how == "reserve":
        return wf.execute_step("charge", lambda: send_at_most_once(wf, "charge", charge))
    # "reserve, then again": the reserved charge sent a second time, to a vault that deduplicates its key
    vault, key = Vault.beside(wf.db_path), effect_key(wf.id, "charge")
    store = lambda key=key: vault.request("store", {"booking": wf.id}, key)  # noqa: E731
    return wf.execute_step("charge", lambda: [send_at_most_once(wf, "charge", store),
                                              send_guarded(wf, "charge", store)][0])
'''


@pytest.fixture(scope="module")
def shared_card(tmp_path_factory) -> Path:
    module = tmp_path_factory.mktemp("shared") / "pay.py"
    module.write_text(SHARED_CARD)
    return module


def destination_rows(path: Path, table: str) -> list[tuple]:
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute(f"SELECT workflow_id, action, key FROM {table} ORDER BY rowid").fetchall()
    finally:
        conn.close()


def test_a_repeat_in_one_workflow_and_a_loss_in_another_do_not_cancel_out(shared_card, tmp_path):
    """Two workflows, one unkeyed processor: lab-1 killed after its send (a repeat), lab-2 between its reservation
    and its send (a loss). Summed per destination the trial made the clean run's 2 effects; judged per workflow,
    both broke exactly-once."""
    lab = scenario("pay", [{"charge": "naive"}, {"charge": "reserve"}], module=shared_card)
    points, baseline = discover(lab, tmp_path)
    assert points == [f"{p} in {w}" for w in ("lab-1", "lab-2") for p in (
        "next_step", "before_send:charge", "after_send:charge", "after_activity:charge", "after_commit:charge")]
    assert baseline["counts"] == {"cards requests": 2, "cards effects": 2}
    row = crash_once(lab, baseline["template"], tmp_path / "trial.db",
                     [("after_send:charge in lab-1", "kill"), ("before_send:charge in lab-2", "kill")], baseline)
    assert (row["crashed"], sorted(row["fired"])) == (
        [-9, -9], ["after_send:charge in lab-1", "before_send:charge in lab-2"])
    assert row["counts"] == {"cards requests": 2, "cards effects": 2}  # the sum hides both
    assert row["by_workflow"] == {"lab-1": {"cards effects": 2, "cards requests": 2}}
    assert row["violations"] == [
        "effects as promised: cards for lab-1 made 2 effects, the clean run 1: 1 more than exactly-once allows",
        "effects as promised: cards for lab-2 made 0 effects, the clean run 1: 1 fewer than exactly-once allows"]
    assert row["effects_changed"] == ["cards effects +1 for lab-1", "cards effects -1 for lab-2"]
    assert not row["invariants_held"] and not row["effects_as_clean"]
    assert (row["effects_beyond"], row["effects_short"]) == (1, 1)
    # Each row at the processor names the workflow and the action that sent it.
    assert destination_rows(tmp_path / "trial.cards.db", "requests") == [("lab-1", "charge", None)] * 2
    assert destination_rows(tmp_path / "trial.cards.db", "effects") == [("lab-1", "charge", None)] * 2
    # Each workflow's own strategy stated as its promise: the repeat and the loss are both allowed.
    stated = {"lab-1": "at-least-once", "lab-2": {"cards": "at-most-once"}}
    assert effect_violations(observe(tmp_path / "trial.db", lab.ids, lab)["sent"], baseline["sent"], stated,
                             lab.ids) == []


def test_fuzz_arms_its_points_in_every_workflow_of_the_journal(shared_card, tmp_path):
    """Two identical workflows: every kill once landed in the first; the points are now each workflow's."""
    result = fuzz("pay", [{"charge": "naive"}, {"charge": "naive"}], module=shared_card, trials=5, seed=0,
                  max_kills=1, folder=tmp_path)
    fired = [where.rsplit(" in ", 1)[1] for row in result["rows"] for where in row["fired"]]
    assert (fired.count("lab-1"), fired.count("lab-2")) == (2, 3)
    assert [row["armed"] for row in result["rows"]] == [
        [("before_send:charge in lab-2", "exit")], [("after_activity:charge in lab-2", "kill")],
        [("after_commit:charge in lab-1", "kill")], [("after_commit:charge in lab-2", "exit")],
        [("after_commit:charge in lab-1", "exit")]]
    assert sum(result["kill_points"].values()) == result["kills"] == 5
    # The one naive repeat is named with its workflow.
    assert [row["violations"] for row in result["rows"]][1] == [
        "effects as promised: cards for lab-2 made 2 effects, the clean run 1: 1 more than exactly-once allows"]


def test_a_reserved_send_repeated_breaks_requests_as_promised_though_the_key_kept_one_effect(shared_card,
                                                                                          tmp_path):
    """The destination deduplicated the second send of a reserved key: only the count of requests shows it."""
    rows = explore("pay", {"charge": "reserve, then again"}, module=shared_card, actions=("exit",),
                   points=["after_commit:charge"], folder=tmp_path)
    clean, crash = rows
    assert clean["counts"] == crash["counts"] == {"vault requests": 2, "vault effects": 1}
    assert clean["violations"] == crash["violations"] == [
        "requests as promised: vault received 2 requests for lab-1's reserved 'charge': a reserved key is sent "
        "at most once"]
    assert not clean["invariants_held"] and not crash["invariants_held"]


BOOKING = '''
"""A hold and a charge, each with a compensation, then an approval: the crash lab's policy cancels it there."""
from durable_kit import effect_key, send_guarded, workflow
from durable_kit.world.service import KeyedService


class Seats(KeyedService):
    name = "seats"


class Cards(KeyedService):
    name = "cards"


def send(wf, service, operation, action):
    return send_guarded(wf, action, lambda: service.beside(wf.db_path).request(
        operation, {"trip": wf.id}, effect_key(wf.id, action)))


@workflow("booking")
def booking(wf):
    wf.execute_step("hold", lambda: send(wf, Seats, "hold", "hold"),
                    compensate=lambda hold: send(wf, Seats, "release", "release"))
    wf.execute_step("charge", lambda: send(wf, Cards, "charge", "charge"),
                    compensate=lambda charge: send(wf, Cards, "refund", "refund"))
    wf.wait_for_approval("approval", {"trip": wf.id})
    return "booked"
'''

COMPENSATION_POINTS = ["before_send:refund", "after_send:refund", "after_activity:compensate:charge",
                       "after_commit:compensate:charge", "after_send:release", "after_activity:compensate:hold"]


def test_a_cancelling_policy_crashes_every_compensation_and_each_runs_newest_first_once(tmp_path):
    module = tmp_path / "booking.py"
    module.write_text(BOOKING)
    rows = explore("booking", [{}, {}], module=module, policy=cancel_all, actions=("exit",),
                   points=COMPENSATION_POINTS, folder=tmp_path / "lab", parallel=2)
    clean = rows[0]
    assert (clean["status"], clean["violations"]) == ("cancelled", [])
    assert clean["by_workflow"]["lab-2"] == {"cards effects": 2, "cards requests": 2, "seats effects": 2,
                                             "seats requests": 2}
    assert len(rows) == 1 + 2 * len(COMPENSATION_POINTS)
    for row in rows[1:]:
        assert row["exit_code"] == 13 and row["status"] == "cancelled", (row["point"], row["workflow"])
        assert row["invariants_held"], (row["point"], row["workflow"], row["violations"])
    after_refund = next(r for r in rows if (r["point"], r["workflow"]) == ("after_send:refund", "lab-2"))
    assert after_refund["by_workflow"]["lab-2"]["cards requests"] == 3  # the refund asked twice, made once
    assert after_refund["by_workflow"]["lab-2"]["cards effects"] == 2


def test_compensations_oldest_first_or_one_skipped_break_their_invariant():
    done = {"lab-1": [("charge", 2), ("hold", 1)]}
    statuses = {"lab-1": "cancelled"}
    clean = {"compensations": done, "statuses": statuses}
    assert compensation_violations({"compensations": done, "statuses": statuses}, clean) == []
    assert compensation_violations({"compensations": {"lab-1": [("hold", 1), ("charge", 2)]}, "statuses": statuses},
                                   clean) == [
        "compensations newest first, once each: lab-1 undid hold, charge; newest first is charge, hold"]
    assert compensation_violations({"compensations": {"lab-1": [("charge", 2)]}, "statuses": statuses}, clean) == [
        "compensations newest first, once each: lab-1 ended cancelled without undoing hold"]


def test_effects_out_of_the_clean_run_s_order_break_their_invariant():
    def effect(destination, key, at):
        return {"destination": destination, "kind": "effect", "workflow": "lab-1", "key": key, "action": None,
                "identity": key, "at": at}

    clean = {"sent": [effect("seats", "lab-1:hold", 1.0), effect("cards", "lab-1:charge", 2.0)]}
    swapped = {"sent": [effect("seats", "lab-1:hold", 3.0), effect("cards", "lab-1:charge", 2.0),
                        effect("seats", "lab-1:hold", 0.5)]}
    assert order_violations(clean, clean) == []
    assert order_violations({"sent": clean["sent"][1:]}, clean) == []  # a lost effect is judged by its promise
    assert order_violations(swapped, clean) == []  # the first of each counts: the hold came first
    late = {"sent": [effect("cards", "lab-1:charge", 2.0), effect("seats", "lab-1:hold", 3.0)]}
    assert order_violations(late, clean) == [
        "effects in order: lab-1's effects came cards lab-1:charge, seats lab-1:hold; the clean run's "
        "seats lab-1:hold, cards lab-1:charge"]


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
             "fired": ["a", "a"], "crashed": [13, 13], "children": 3, "effects_beyond": 0, "effects_short": 1,
             "status": "escalated"},
            {"violations": [], "invariants_held": True, "fired": ["b"], "crashed": [-9], "children": 2,
             "effects_beyond": 1, "effects_short": 0, "status": "complete"}]
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
