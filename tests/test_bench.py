"""The benchmarks' shape and plumbing: what they report and how, never how fast anything is."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from conftest import run_python

from durable_kit import bench


def test_compare_measures_every_installed_engine_or_says_how_to_install_it():
    done = run_python("-m", "durable_kit.bench", "compare", "--json", "--quick", "--steps", "5",
                      "--rounds", "1", "--workflow-rounds", "1")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["command"] == "compare" and result["step_counts"] == [5]
    rows = {row["engine"]: row for row in result["engines"]}
    assert list(rows) == ["raw", "kit", "dbos", "langgraph"]
    for name, row in rows.items():
        if "skipped" in row:
            assert bench.INSTALL in row["skipped"], name
            continue
        assert row["per_step_us"]["5"] > 0 and row["per_workflow_us"] > 0, name
        assert row["per_step_vs_raw"]["5"] > 0 and row["per_workflow_vs_kit"] > 0, name
    assert rows["raw"]["per_step_vs_raw"]["5"] == 1.0 and rows["kit"]["per_workflow_vs_kit"] == 1.0


def test_compare_gives_an_install_hint_for_a_missing_engine(monkeypatch):
    monkeypatch.setattr(bench, "installed", lambda engine: engine in ("raw", "kit"))
    result = bench.compare(step_counts=(2,), rounds=1, workflow_rounds=1)
    rows = {row["engine"]: row for row in result["engines"]}
    assert rows["dbos"]["skipped"] == f'dbos is not installed: {bench.INSTALL}'
    assert rows["langgraph"]["skipped"] == f'langgraph is not installed: {bench.INSTALL}'
    assert rows["kit"]["per_step_us"]["2"] > 0 and "per_step_vs_dbos" not in rows["kit"]
    assert "not installed" in bench.compare_report(result)


def strace_works() -> str | None:
    """None if strace can trace a child here, else why not."""
    if shutil.which("strace") is None:
        return "strace is not on PATH"
    probe = subprocess.run(["strace", "-f", "-c", "-o", "/dev/null", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"strace cannot trace here: {probe.stderr.strip()[-200:]}"


def test_a_one_step_workflow_at_full_syncs_at_least_once(tmp_path):
    reason = strace_works()
    if reason:
        pytest.skip(reason)
    counts = bench.count_fsyncs(tmp_path, ("FULL",), steps=10, workflows=2)["FULL"]
    assert counts["reason"] is None, counts
    assert isinstance(counts["per_one_step_workflow"], (int, float)) and counts["per_one_step_workflow"] >= 1
    assert counts["per_step"] >= 1 and counts["per_raw_commit"] >= 1
    assert counts["open_only"] == 0  # opening an existing journal syncs nothing


def test_without_strace_fsyncs_are_null_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    counts = bench.count_fsyncs(tmp_path, ("FULL", "NORMAL"), steps=10, workflows=2)
    assert counts["NORMAL"] == {"per_step": None, "per_one_step_workflow": None, "per_raw_commit": None,
                                "reason": "strace is not on PATH"}


def test_strace_summary_counts_fsync_and_fdatasync(tmp_path):
    summary = tmp_path / "summary.txt"
    summary.write_text(
        "% time     seconds  usecs/call     calls    errors syscall\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        " 90.00    0.000900          30        30           fdatasync\n"
        " 10.00    0.000100          25         4         1 fsync\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        "100.00    0.001000          29        34         1 total\n")
    assert bench.strace_calls(summary) == 34
    summary.write_text("")  # a process that never synced prints no table
    assert bench.strace_calls(summary) == 0


def test_the_report_names_the_kit_without_the_machines_folders(tmp_path, monkeypatch):
    kit = tmp_path / "checkout" / "durable_kit"
    kit.mkdir(parents=True)
    result = {"kit": str(kit), "sqlite": "3.40.1", "levels": {}}
    monkeypatch.chdir(kit)
    assert bench.steps_report(result).splitlines()[0] == ". (SQLite 3.40.1)"
    notebooks = kit.parent / "notebooks"
    notebooks.mkdir()
    monkeypatch.chdir(notebooks)  # where a notebook's kernel runs
    assert bench.steps_report(result).splitlines()[0] == f"..{os.sep}durable_kit (SQLite 3.40.1)"
    elsewhere = tmp_path / "a" / "b"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)  # another branch of the tree: the whole path, as the JSON has it
    assert bench.steps_report(result).splitlines()[0] == f"{kit} (SQLite 3.40.1)"
