"""The command line, run as a learner runs it."""
from __future__ import annotations

import json

from conftest import run_python


def test_help_lists_the_commands():
    done = run_python("-m", "durable_kit", "--help")
    assert done.returncode == 0, done.stderr
    for command in ("run", "fragile", "checkpoint-agent", "demo", "arm"):
        assert command in done.stdout


def test_demo_checkpoints_prints_one_json_array():
    done = run_python("-m", "durable_kit", "demo", "checkpoints", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert isinstance(rows, list) and len(rows) == 7
    for row in rows:
        assert set(row) == {"scenario", "exit_code", "source_calls", "evidence", "findings", "status"}
        assert row["status"] == "complete"
    assert {r["scenario"]: r["source_calls"] for r in rows}["crash_after_fetch"] == 2


def test_bench_prints_one_json_object():
    done = run_python("-m", "durable_kit.bench", "--json", "--quick")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["command"] == "steps" and list(result["levels"]) == ["FULL", "NORMAL"]
    for level, figures in result["levels"].items():
        assert set(figures) == {"per_step", "per_workflow", "replay", "fsyncs"}, level
        assert list(figures["per_step"]) == ["10", "100", "1000"]
        for row in figures["per_step"].values():
            assert set(row) == {"kit_us", "raw_us", "ratio"}
            assert all(isinstance(value, (int, float)) and value > 0 for value in row.values()), (level, row)
        workflow = figures["per_workflow"]
        assert set(workflow) == {"raw_commit_us", "one_step_us", "one_step_ratio", "three_step_us",
                                 "three_step_ratio"}
        assert all(value > 0 for value in workflow.values()), (level, workflow)
        assert figures["replay"]["us_per_step"] > 0 and figures["replay"]["samples"] >= 5
        fsyncs = figures["fsyncs"]
        if fsyncs["reason"] is None:
            assert all(isinstance(fsyncs[key], (int, float)) for key in ("per_step", "per_one_step_workflow"))
        else:
            assert fsyncs["per_step"] is None and fsyncs["per_one_step_workflow"] is None


def test_bench_without_json_prints_aligned_tables():
    done = run_python("-m", "durable_kit.bench", "--quick", "--levels", "NORMAL", "--steps", "10", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    first_table = done.stdout.split("\n\n")[1].splitlines()
    assert first_table[0].split() == ["sync", "N", "kit", "µs/step", "raw", "µs/step", "kit/raw"]
    assert first_table[1].split()[:2] == ["NORMAL", "10"]
    assert len(first_table[0]) == len(first_table[1])


def test_arm_then_run_crashes_at_the_armed_point(tmp_path):
    import durable_kit.workshop.agents  # noqa: F401  (registers research_report in this process, as the CLI does)
    from durable_kit import Journal
    from durable_kit.harness.faults import CRASH_EXIT_CODE

    db = tmp_path / "wf.db"
    journal = Journal(db)
    journal.start("research_report", {"topic": "a one-part question"}, "wf-1")
    armed = run_python("-m", "durable_kit", "arm", "--db", str(db), "--point", "after_commit:analyze")
    assert armed.returncode == 0, armed.stderr
    crashed = run_python("-m", "durable_kit", "run", "--db", str(db), "--workflow", "wf-1")
    assert crashed.returncode == CRASH_EXIT_CODE
    assert [s["name"] for s in journal.steps("wf-1")][-1] == "analyze"
    finished = run_python("-m", "durable_kit", "run", "--db", str(db), "--workflow", "wf-1")
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout) == journal.workflow("wf-1")["output"]


def test_help_lists_every_command_of_the_later_notebooks():
    done = run_python("-m", "durable_kit", "--help")
    for command in ("start", "status", "history", "approve", "reject", "answer", "worker", "fault"):
        assert command in done.stdout


def test_demo_workers_prints_exactly_the_documented_keys(monkeypatch, capsys):
    from durable_kit import __main__ as cli
    from durable_kit.workshop.agents import shared_work

    row = {"scenario": "leases", "workers": 2, "workflows": 3, "activity_runs": 9, "duplicate_runs": 0,
           "stale_writes_rejected": 0, "takeover_seconds": None, "extra": "not printed"}
    monkeypatch.setattr(shared_work, "run_all", lambda folder: [row])  # the scenarios themselves: test_leases.py
    assert cli.main(["demo", "workers", "--json"]) == 0
    (printed,) = json.loads(capsys.readouterr().out)
    assert list(printed) == ["scenario", "workers", "workflows", "activity_runs", "duplicate_runs",
                             "stale_writes_rejected", "takeover_seconds"]


def test_bench_workers_prints_throughput_by_worker_count_and_no_duplicates():
    done = run_python("-m", "durable_kit.bench", "workers", "--json", "--workflows", "20")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert list(result["steps_per_second"]) == ["1", "2", "4", "8"]
    assert all(value > 0 for value in result["steps_per_second"].values())
    assert (result["duplicate_runs"], result["busy_errors"], result["all_complete"]) == (0, 0, True)
