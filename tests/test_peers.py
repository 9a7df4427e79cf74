"""The same three-step crash experiment on the kit, DBOS and LangGraph, each in two real processes."""
from __future__ import annotations

import pytest

from durable_kit.workshop.peers import available, crash_experiment

from conftest import run_python


def test_the_kit_recovers_with_each_finished_step_run_once(tmp_path):
    row = crash_experiment("kit", tmp_path)
    assert row == {"engine": "kit", "first_exit": 13, "second_exit": 0, "step1": 1, "step2": 1, "step3": 1,
                   "finished_steps_rerun": 0}


@pytest.mark.skipif(not available("dbos"), reason='DBOS is not installed: pip install -e ".[engines]"')
def test_dbos_recovers_with_each_finished_step_run_once(tmp_path):
    row = crash_experiment("dbos", tmp_path)
    assert row == {"engine": "dbos", "first_exit": 13, "second_exit": 0, "step1": 1, "step2": 1, "step3": 1,
                   "finished_steps_rerun": 0}


@pytest.mark.skipif(not available("langgraph"), reason='LangGraph is not installed: pip install -e ".[engines]"')
def test_langgraph_sync_durability_reruns_no_finished_node(tmp_path):
    row = crash_experiment("langgraph", tmp_path, "sync")
    assert row == {"engine": "langgraph (sync)", "first_exit": 13, "second_exit": 0, "step1": 1, "step2": 1,
                   "step3": 1, "finished_steps_rerun": 0}


@pytest.mark.skipif(not available("langgraph"), reason='LangGraph is not installed: pip install -e ".[engines]"')
def test_langgraph_async_durability_may_rerun_the_last_finished_node(tmp_path):
    row = crash_experiment("langgraph", tmp_path, "async")
    # Its checkpoint is written while the next node runs: whether step 2's landed before the crash is a race.
    assert (row["first_exit"], row["second_exit"], row["step1"], row["step3"]) == (13, 0, 1, 1)
    assert row["step2"] in (1, 2) and row["finished_steps_rerun"] == row["step2"] - 1


def test_a_missing_engine_gives_a_row_that_says_how_to_install_it(monkeypatch, tmp_path):
    import durable_kit.workshop.peers as peers

    monkeypatch.setitem(peers.ENGINES, "dbos", "no_such_engine_package")
    assert not available("dbos")
    assert crash_experiment("dbos", tmp_path) == {
        "engine": "dbos", "skipped": 'dbos is not installed: pip install -e ".[engines]"'}


def test_peers_module_imports_no_engine_until_asked():
    done = run_python("-c", "import sys, durable_kit.workshop.peers; print(sorted({m.split('.')[0] for m in sys.modules} & "
                            "{'dbos', 'langgraph'}))")
    assert done.stdout.strip() == "[]", done.stderr
