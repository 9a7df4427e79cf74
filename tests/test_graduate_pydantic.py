"""The research loop on Pydantic AI and on the OpenAI Agents SDK, both on DBOS, killed at every boundary beside the kit's loop.

One module-scoped run of the crash table serves every count below. These
tests need the ``[graduate]`` extra (the README's test command installs it);
they are not skipped without it, since a missing framework must be seen.
"""
from __future__ import annotations

import pytest

from conftest import run_python

from durable_kit.workshop.graduate import FRAMEWORK_MISSING, INSTALL_HINT, require_dbos

require_dbos()

from durable_kit.workshop.graduate.loop_crashlab import (BOUNDARIES, PLAIN_TOOLS, loop_crash_table,  # noqa: E402
                                                loop_two_workers, paired_rows)
from durable_kit.workshop.graduate.postgres import PostgresUnavailable, start_postgres  # noqa: E402

CLEAN = {"model_calls": 8, "source_calls": 4, "deliveries": 1, "send_requests": 1}
# boundary -> (kit exit code, framework exit code, what changes from a clean run on both sides)
EXPECTED = {
    "no crash": (None, None, {}),
    "inside a tool call (search answered, not recorded)": (-9, -9, {"source_calls": 5}),
    "after a tool call, before the next model request": (13, 13, {}),
    "while waiting for the person's answer": (None, -9, {}),
    "inside a model request (answered, not recorded)": (13, 13, {"model_calls": 9}),
    "after a model request (recorded, its tool not run)": (13, 13, {}),
    "inside the send (delivered, not recorded)": (13, 13, {"send_requests": 2}),
}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    rows = loop_crash_table(tmp_path_factory.mktemp("loop-crash-table"))
    return {row["boundary"]: row for row in rows}


def test_the_table_has_every_boundary_and_the_plain_tools_row(table):
    assert list(table) == [*BOUNDARIES, PLAIN_TOOLS]
    assert set(EXPECTED) == set(BOUNDARIES)


@pytest.mark.parametrize("boundary", list(EXPECTED))
def test_both_repeat_the_same_work_at_each_boundary(table, boundary):
    row = table[boundary]
    kit_exit, framework_exit, changed = EXPECTED[boundary]
    assert (row["kit_exit_code"], row["framework_exit_code"]) == (kit_exit, framework_exit), row
    assert row["openai_exit_code"] == framework_exit, row
    for side in ("kit", "framework", "openai"):
        assert {key: row[f"{side}_{key}"] for key in CLEAN} == {**CLEAN, **changed}, (side, row)
        assert row[f"{side}_answer"] is True, (side, row)
    assert (row["kit_status"], row["framework_status"], row["openai_status"]) == ("complete", "SUCCESS", "SUCCESS")


def test_tools_left_undecorated_run_again_on_recovery(table):
    row = table[PLAIN_TOOLS]
    assert row["framework_exit_code"] == 13 and row["framework_status"] == "SUCCESS"
    # the model request of turn 4 repeats once; the search and the three reads before it all run again
    assert {key: row[f"framework_{key}"] for key in CLEAN} == {**CLEAN, "model_calls": 9, "source_calls": 8}
    assert row["framework_answer"] is True
    assert "kit_model_calls" not in row and "openai_model_calls" not in row


def test_paired_rows_read_kit_then_pydantic_ai_then_openai_agents(table):
    shown = {r["boundary"]: r for r in paired_rows(list(table.values()))}
    assert shown["inside the send (delivered, not recorded)"]["send requests"] == "2 / 2 / 2"
    assert shown["while waiting for the person's answer"]["exit code"] == "- / -9 / -9"
    assert shown[PLAIN_TOOLS]["tool calls (search, read)"] == "- / 8 / -"


def test_postgres_two_workers_one_killed_mid_run(tmp_path):
    try:
        server = start_postgres()
    except PostgresUnavailable as error:
        pytest.fail(f"PostgreSQL is needed for this test and could not start:\n{error}")
    try:
        result = loop_two_workers(server.url, tmp_path, runs=4)
    finally:
        server.stop()
    assert result["killed_worker_exit_code"] == -9
    assert (result["pending_after_drain"], result["stranded_on"], result["recovered_after_restart"]) == \
        (1, ["worker-1"], 1)
    assert (result["complete"], result["lost"]) == (4, 0)
    assert (result["model_calls"], result["source_calls"]) == (4 * 8 + 1, 4 * 4)  # one model request repeated
    assert (result["deliveries"], result["send_requests"]) == (4, 4)
    assert result["other_workers_stopped_cleanly"]


def test_without_the_framework_the_command_says_what_to_install_in_one_line(tmp_path):
    hide = "import sys; sys.modules['pydantic_ai'] = None; from durable_kit.workshop.graduate.__main__ import main; "
    child = run_python("-c", hide + f"main(['loop', '--db', {str(tmp_path / 'x.sqlite')!r}])")
    assert child.returncode == 1
    assert child.stderr.strip() == FRAMEWORK_MISSING
    assert INSTALL_HINT in FRAMEWORK_MISSING and "\n" not in FRAMEWORK_MISSING
    assert not (tmp_path / "x.sqlite").exists()


@pytest.mark.parametrize("hidden, module, framework", [("pydantic_ai", "pydantic_loop", "Pydantic AI"),
                                                      ("dbos_openai_agents", "openai_loop", "the OpenAI Agents SDK")])
def test_importing_an_agent_without_its_framework_raises_one_line(hidden, module, framework):
    child = run_python("-c", f"import sys; sys.modules[{hidden!r}] = None\n"
                             f"try:\n    import durable_kit.workshop.graduate.{module}\n"
                             "except ImportError as e:\n    print(e)")
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == FRAMEWORK_MISSING.replace("Pydantic AI", framework)
