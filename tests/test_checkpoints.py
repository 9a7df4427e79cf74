"""Notebook 01's hand-made checkpoints, each scenario in real child processes."""
from __future__ import annotations

import pytest

from durable_kit.workshop.agents.checkpoints import SCENARIOS, answer_clarification, run_all, run_scenario, saved_state

from conftest import dump

CRASHES = ("crash_after_fetch", "crash_after_evidence", "crash_after_finding")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return {row["scenario"]: row for row in run_all(tmp_path_factory.mktemp("scenarios"))}


def test_every_scenario_runs_in_order(results):
    assert list(results) == list(SCENARIOS)
    assert len(SCENARIOS) == 7


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_scenario_ends_with_one_evidence_one_finding_and_complete(results, name):
    row = results[name]
    assert (row["evidence"], row["findings"], row["status"]) == (1, 1, "complete")
    # Only a crash between the fetch and the evidence commit fetches again.
    assert row["source_calls"] == (2 if name == "crash_after_fetch" else 1)
    assert row["model_calls"] == 1
    assert row["exit_code"] == (13 if name in CRASHES else 0)


@pytest.mark.parametrize("name, status", [
    ("crash_after_finding", "running"), ("provider_unavailable", "paused"), ("clarification", "waiting"),
    ("clean", "complete"), ("duplicate_delivery", "complete")])
def test_first_attempt_leaves_the_expected_status(results, name, status):
    assert results[name]["first_attempt"]["status"] == status


def test_first_attempts_keep_what_they_committed(results):
    first = results["crash_after_fetch"]["first_attempt"]
    assert (first["source_calls"], first["model_calls"], first["evidence"], first["findings"]) == (1, 0, 0, 0)
    assert results["crash_after_evidence"]["first_attempt"]["evidence"] == 1
    assert results["crash_after_finding"]["first_attempt"]["findings"] == 1
    assert results["provider_unavailable"]["first_attempt"]["source_calls"] == 0
    assert results["clarification"]["first_attempt"]["source_calls"] == 0


def test_unknown_scenario_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown scenario"):
        run_scenario("no_such_scenario", tmp_path)


@pytest.mark.parametrize("run_id, state", [("filings-1", "complete"), ("no-such-run", "missing")])
def test_answer_clarification_refuses_a_run_that_is_not_waiting(tmp_path, run_id, state):
    run_scenario("clean", tmp_path)
    db = tmp_path / "clean.db"
    before = dump(db)
    with pytest.raises(ValueError, match=f"is {state}, not waiting"):
        answer_clarification(db, run_id, "FY2024")
    assert dump(db) == before
    assert saved_state(db)["status"] == "complete"
