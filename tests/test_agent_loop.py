"""The agent loop in real child processes: crashes at every boundary, fan-out, plan changes, outages, usage."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from durable_kit import Journal, resume, run_workflow
from durable_kit.workshop.agents.loop import (activity_runs, fixture_passage, load_case, replay_state, usage,
                                     usage_lines)
from durable_kit.decisions import answer
from durable_kit.world.provider import OpenAICompatibleModel, ProviderNotConfigured
from durable_kit.world.scripted import ScriptedModel, clear_outage, set_outage
from durable_kit.harness.runner import run_in_child

from conftest import ROOT

FY2025 = ["northwind-fy2025-rf-07", "harbor-lane-fy2025-rf-12", "tallis-fy2025-rf-04"]
FY2024 = ["northwind-fy2024-rf-07", "harbor-lane-fy2024-rf-12", "tallis-fy2024-rf-04"]
CLEAN_STEPS = ["turn:1", "turn:1:search", "turn:2", *[f"turn:2:read:{p}" for p in FY2025],
               "turn:3", "turn:3:note_finding", "turn:4", "turn:4:note_finding", "turn:5", "turn:5:note_finding",
               "turn:6", "turn:6:note_finding", "turn:7", "turn:7:finish"]
PARALLEL = {f"turn:2:read:{p}" for p in FY2025}


def clean_run(db, workflow_id="clean"):
    journal = Journal(db)
    journal.start("agent_loop", {"case": "three_companies_fy2025"}, workflow_id)
    return journal, run_workflow(journal, workflow_id)


def test_a_clean_run_names_every_step_from_its_turn(db):
    journal, output = clean_run(db)
    assert sorted(s["name"] for s in journal.steps("clean")) == sorted(CLEAN_STEPS)
    assert [f["id"] for f in output["findings"]] == ["f-northwind", "f-harbor-lane", "f-tallis",
                                                     "f-northwind-interruption"]
    assert sorted(p["id"] for p in output["passages"]) == sorted(FY2025)
    used = usage(db, "clean")
    assert (used["model_calls"], used["repeated_model_calls"]) == (7, 0)
    assert activity_runs(db, "clean") == {**{f"turn:{n}": 1 for n in range(1, 8)},
                                          "search supplier concentration any period": 1,
                                          **{f"read {p}": 1 for p in FY2025}}


def test_a_loop_crashed_at_every_boundary_reuses_finished_turns(db):
    """One workflow, killed (os._exit) after the activity and after the commit of each of its 16 steps in turn."""
    Journal(db).start("agent_loop", {"case": "three_companies_fy2025"}, "c1")
    journal = Journal(db)
    crashes = 0
    for step in CLEAN_STEPS:
        for point in ("after_activity", "after_commit"):
            before = {s["name"]: s["attempts"] for s in journal.steps("c1") if s["status"] == "complete"}
            if step in before:  # a fan-out branch that finished beside one killed earlier: nothing left to kill
                assert step in PARALLEL, step
                continue
            report = run_in_child(db, "c1", f"{point}:{step}")
            assert report.exit_code == 13, (point, step, report.stderr)
            crashes += 1
            after = {s["name"]: s["attempts"] for s in journal.steps("c1")}
            # every step finished before this process started was reused, never run again
            assert {name: after[name] for name in before} == before, (point, step)
            # and what ran again is at most the interrupted step (the fan-out's unfinished branches with it)
            rerun_now = {name for name in after if name not in before and after[name] > 1}
            assert rerun_now <= {step} | PARALLEL, (point, step, rerun_now)
    final = run_in_child(db, "c1")
    assert (final.exit_code, final.status) == (0, "complete")
    attempts = {s["name"]: s["attempts"] for s in journal.steps("c1")}
    # a crash after the commit repeats nothing; a crash after the activity repeats exactly that step once
    assert {name: n for name, n in attempts.items() if name not in PARALLEL} == {
        name: 2 for name in CLEAN_STEPS if name not in PARALLEL}
    assert all(1 <= attempts[name] <= 1 + len(PARALLEL) * 2 for name in PARALLEL)
    assert attempts[f"turn:2:read:{FY2025[0]}"] >= 2  # its first boundary was reached before any branch committed
    assert 32 - len(PARALLEL) * 2 < crashes <= 32  # every boundary of every sequential step, 26, crashed
    runs = activity_runs(db, "c1")
    assert {f"turn:{n}": runs[f"turn:{n}"] for n in range(1, 8)} == {f"turn:{n}": 2 for n in range(1, 8)}
    assert usage(db, "c1")["repeated_model_calls"] == 7
    assert journal.workflow("c1")["output"] == clean_run(db.with_name("clean.db"))[1]


def test_a_crash_mid_fan_out_reruns_only_the_unfinished_branches(db):
    first = f"turn:2:read:{FY2025[0]}"
    Journal(db).start("agent_loop", {"case": "three_companies_fy2025"}, "f1")
    crashed = run_in_child(db, "f1", f"after_commit:{first}")
    assert crashed.exit_code == 13
    journal = Journal(db)
    done_at_crash = {s["name"] for s in journal.steps("f1") if s["status"] == "complete"} & PARALLEL
    assert first in done_at_crash
    assert run_in_child(db, "f1").status == "complete"
    runs = activity_runs(db, "f1")
    for passage in FY2025:
        name = f"turn:2:read:{passage}"
        if name in done_at_crash:
            assert runs[f"read {passage}"] == 1, name
        else:
            assert runs[f"read {passage}"] <= 2, name
    assert runs["turn:2"] == 1  # the model turn that chose the reads was not asked again
    fan_out = [e for e in journal.history("f1") if e["step"] in PARALLEL and e["event"] == "step_started"]
    assert len(fan_out) == 3 + (3 - len(done_at_crash))


def answered(db, workflow_id, text):
    """Run the three-company case to its question in a child process, answer it, run it to the end."""
    Journal(db).start("agent_loop", {"case": "three_companies"}, workflow_id)
    asked = run_in_child(db, workflow_id)
    assert (asked.exit_code, asked.status) == (0, "waiting")
    planned = replay_state(Journal(db), workflow_id).planned
    answer(Journal(db), workflow_id, text, "Dana", wait="turn:2:ask_user")
    done = run_in_child(db, workflow_id)
    assert (done.exit_code, done.status) == (0, "complete"), done.stderr
    actions = {s["name"]: s["output"]["action"] for s in Journal(db).steps(workflow_id) if s["name"].count(":") == 1}
    return planned, actions


def test_a_clarification_answer_changes_the_next_action_away_from_the_saved_plan(db):
    planned, actions = answered(db, "q25", "FY2025, the latest filings")
    assert planned == [{"query": "supplier concentration", "period": "FY2024"}]
    assert actions["turn:2"]["tool"] == "ask_user"
    assert actions["turn:3"] == {**actions["turn:3"], "tool": "read", "args": {"passages": FY2025}}
    # control: an answer that agrees with the plan keeps it
    planned_24, actions_24 = answered(db, "q24", "FY2024")
    assert planned_24 == planned
    assert (actions_24["turn:3"]["tool"], actions_24["turn:3"]["args"]) == ("search", planned[0])


def test_newly_recovered_evidence_changes_the_next_action_away_from_the_saved_plan(db):
    Journal(db).start("agent_loop", {"case": "three_companies"}, "e1")
    run_workflow(Journal(db), "e1")
    answer(Journal(db), "e1", "FY2024", "Dana", wait="turn:2:ask_user")
    journal = Journal(db)
    state = replay_state(journal, "e1")  # what the next replay rebuilds: the answer included
    assert state.run["user_input"] == ["FY2024"] and state.history[-1] == {"turn": 2, "tool": "ask_user"}
    assert state.planned == [{"query": "supplier concentration", "period": "FY2024"}]
    model = ScriptedModel(load_case("three_companies")["rules"], db, "probe")
    without = model.decide(state.model_input(3))["action"]
    assert (without["tool"], without["args"]) == ("search", state.planned[0])
    for passage in FY2024:  # evidence an earlier attempt had read, restored into the store
        state.store.add_passage(fixture_passage(passage))
    with_evidence = model.decide(state.model_input(3))["action"]
    assert with_evidence["tool"] == "note_finding" and with_evidence["args"]["cites"] == [FY2024[0]]


def test_a_provider_outage_pauses_the_loop_and_a_resume_continues_it(db):
    Journal(db).start("agent_loop", {"case": "three_companies_fy2025"}, "o1")
    set_outage(db)
    paused = run_in_child(db, "o1")
    journal = Journal(db)
    row = journal.workflow("o1")
    assert (paused.exit_code, row["status"], row["next_run_at"]) == (0, "paused", None)
    assert row["error"] == "turn 1: scripted-1 refused turn:1: 503 Service Unavailable"
    forced = run_in_child(db, "o1")  # a person's run of a paused workflow is refused: only a resume restarts it
    assert (forced.exit_code, forced.status, usage(db, "o1")["refused_model_calls"]) == (2, "paused", 1)
    assert "is paused; nothing was changed. Resume it first" in forced.stderr
    resume(journal, "o1", by="ops")
    again = run_in_child(db, "o1")  # resumed while the provider is still down: it pauses again
    assert (again.status, usage(db, "o1")["refused_model_calls"]) == ("paused", 2)
    clear_outage(db)
    resume(journal, "o1", by="ops")
    done = run_in_child(db, "o1")
    assert (done.exit_code, done.status) == (0, "complete")
    used = usage(db, "o1")
    assert (used["model_calls"], used["refused_model_calls"]) == (7, 2)
    assert used["waiting_for_provider_seconds"] > 0


def test_usage_never_resets_across_five_resumptions(db):
    Journal(db).start("agent_loop", {"case": "three_companies_fy2025"}, "u1")
    seen = []
    for turn in range(1, 6):
        report = run_in_child(db, "u1", f"after_activity:turn:{turn}")
        assert report.exit_code == 13
        seen.append(usage(db, "u1"))
    assert run_in_child(db, "u1").status == "complete"
    seen.append(usage(db, "u1"))
    for earlier, later in zip(seen, seen[1:]):
        for key in ("model_calls", "input_tokens", "output_tokens", "cost_usd"):
            assert later[key] > earlier[key], key
    clean = usage(clean_run(db.with_name("clean.db"))[0].path, "clean")
    assert seen[-1]["model_calls"] == clean["model_calls"] + 5 == 12
    assert seen[-1]["repeated_model_calls"] == 5
    assert seen[-1]["cost_usd"] > clean["cost_usd"]


def test_status_shows_usage_and_time_apart(db):
    Journal(db).start("agent_loop", {"case": "three_companies"}, "s1")
    run_in_child(db, "s1")
    answer(Journal(db), "s1", "FY2025", "Dana", wait="turn:2:ask_user")
    run_in_child(db, "s1")
    status = subprocess.run([sys.executable, "-m", "durable_kit", "status", "--db", str(db), "--workflow", "s1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = status.stdout.splitlines()
    assert lines[-2].startswith("  usage across attempts: 8 model calls (0 repeated, 0 refused), ")
    assert lines[-1].startswith("  time: executing ") and "waiting for a person" in lines[-1]
    as_json = json.loads(subprocess.run(
        [sys.executable, "-m", "durable_kit", "status", "--db", str(db), "--workflow", "s1", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60).stdout)
    assert as_json["usage"]["model_calls"] == 8 and as_json["usage"]["waiting_for_person_seconds"] > 0
    assert usage_lines(db, {"id": "x", "kind": "research_report"}) == []


def test_the_real_model_adapter_refuses_clearly_when_unconfigured(db, monkeypatch):
    for name in ("DURABLE_KIT_LLM_BASE_URL", "DURABLE_KIT_LLM_MODEL", "DURABLE_KIT_LLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ProviderNotConfigured, match="DURABLE_KIT_LLM_BASE_URL and DURABLE_KIT_LLM_MODEL"):
        OpenAICompatibleModel.from_environment(db)
    journal = Journal(db)
    journal.start("agent_loop", {"case": "three_companies_fy2025", "model": "provider"}, "p1")
    with pytest.raises(ProviderNotConfigured):
        run_workflow(journal, "p1")
    assert journal.workflow("p1")["status"] == "failed"
    assert journal.steps("p1") == []
    assert usage_lines(db, journal.workflow("p1"))[0].endswith(
        "0 model calls (0 repeated, 0 refused), 0 tokens in, 0 out, no price for unconfigured in data/prices.json")
