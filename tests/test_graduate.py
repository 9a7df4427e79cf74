"""The agents ported to DBOS, in real processes: crash counts beside the kit's, approval by send, PostgreSQL workers.

These tests need the ``[graduate]`` extra. They are not skipped without it:
the README's test command installs it, and a missing engine must be seen.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from conftest import run_python

from durable_kit.workshop.graduate import require_dbos

require_dbos()  # a clear ImportError naming the install command, never a skip

from durable_kit.workshop.graduate.checks import load_function, verdict_for  # noqa: E402
from durable_kit.workshop.graduate.crashlab import (approval_run, dbos_refund_cell, refund_crash_table,  # noqa: E402
                                           research_crash_table, two_workers)
from durable_kit.workshop.graduate.postgres import ENV_VAR, PostgresUnavailable, start_postgres  # noqa: E402


def test_import_durable_kit_does_not_import_dbos():
    child = run_python("-c", "import sys, durable_kit, durable_kit.workshop.graduate; print('dbos' in sys.modules)")
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "False"


def test_refund_port_counts_match_the_kit_at_every_crash_point(tmp_path):
    rows = refund_crash_table(tmp_path, strategies=("naive", "destination_key"),
                              crash_points=("after_payment", "during_notification"))
    assert len(rows) == 4
    assert all(row["same_counts"] for row in rows), rows
    cell = {(r["strategy"], r["crash_point"]): r for r in rows}
    naive = cell[("naive", "after_payment")]
    assert (naive["dbos_payment_calls"], naive["dbos_refunds_at_destination"]) == (2, 2)  # paid twice without a key
    keyed = cell[("destination_key", "after_payment")]
    assert (keyed["dbos_payment_calls"], keyed["dbos_refunds_at_destination"]) == (2, 1)  # the key held
    assert cell[("naive", "during_notification")]["dbos_notifications_delivered"] == 2
    assert cell[("destination_key", "during_notification")]["dbos_notifications_delivered"] == 1
    assert {r["dbos_status"] for r in rows} == {"complete"}
    assert {r["dbos_exit_code"] for r in rows} == {13}


def test_research_port_repeats_only_the_unrecorded_step(tmp_path):
    rows = {r["point"]: r for r in research_crash_table(tmp_path, ("research done, not recorded",
                                                                   "analysis recorded"))}
    for point, calls in (("after_activity:research:single sourcing", 8), ("after_commit:analyze", 7)):
        row = rows[point]
        assert (row["kit_model_calls"], row["dbos_model_calls"]) == (calls, calls), row
        assert (row["kit_steps_stored"], row["dbos_steps_stored"]) == (7, 7), row
        assert row["dbos_exit_code"] == 13 and row["dbos_status"] == "complete"


def test_approval_sent_while_no_process_runs_is_received_after_restart(tmp_path):
    run = approval_run(tmp_path)
    assert run["kit"]["while_waiting"] == "waiting"
    assert run["dbos"]["while_waiting"] == "pending" and run["dbos"]["exit_code"] == 13
    for side in ("kit", "dbos"):
        assert run[side]["model_calls"] == 7, run
        assert run[side]["notifications_delivered"] == 1, run
        assert run[side]["status"] == "complete", run


def test_port_refuses_a_strategy_it_does_not_have_and_writes_nothing(tmp_path):
    db = tmp_path / "refused.dbos.sqlite"
    child = run_python("-m", "durable_kit.workshop.graduate", "run", "--db", str(db), "--start", "refund", "--id", "r-1",
                       "--input", json.dumps({"order_id": "A-1001", "strategy": "outbox", "world": "w.db"}))
    assert child.returncode != 0
    assert "'r-1'" in child.stderr and "destination_key" in child.stderr
    assert not db.exists()


def test_step_outputs_are_stored_as_json_not_pickle(tmp_path):
    assert dbos_refund_cell(tmp_path, "destination_key", "after_payment")["refunds_at_destination"] == 1
    conn = sqlite3.connect(str(tmp_path / "dbos-destination_key-after_payment.dbos.sqlite"))
    try:
        rows = conn.execute("SELECT function_name, output, serialization FROM operation_outputs").fetchall()
    finally:
        conn.close()
    assert len(rows) >= 5
    assert {serialization for _, _, serialization in rows} == {"portable_json"}
    receipt = next(json.loads(output) for name, output, _ in rows if name == "refund")
    assert receipt["refund_id"] == "R-0001"


@pytest.fixture
def postgres():
    """A fresh PostgreSQL database for one test; the server (if started here) is stopped and removed after."""
    try:
        server = start_postgres()
    except PostgresUnavailable as error:
        pytest.fail(f"PostgreSQL is needed for this test and could not start:\n{error}")
    yield server
    server.stop()
    if server.folder is not None:
        assert not Path(server.folder).exists(), "the server's folder was left behind"


def test_two_workers_on_postgres_lose_nothing_when_one_is_killed(postgres, tmp_path):
    result = two_workers(postgres.url, tmp_path, workflows=6)
    assert result["killed_worker_exit_code"] == -9
    assert result["pending_after_drain"] == 1 and result["stranded_on"] == ["worker-1"]
    assert result["recovered_after_restart"] == 1
    assert (result["complete"], result["lost"]) == (6, 0)
    assert result["payment_calls"] == 7  # the killed attempt's payment was sent again, with the same key
    assert result["refunds_at_destination"] == 6 and result["notifications_delivered"] == 6
    assert result["other_workers_stopped_cleanly"]


def test_postgres_helper_says_why_and_how_to_fix(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "postgresql://nobody:wrong@127.0.0.1:1/postgres")
    with pytest.raises(PostgresUnavailable) as raised:
        start_postgres()
    message = str(raised.value)
    assert ENV_VAR in message and "Fix:" in message and "pgserver" in message


def write(path: Path, body: str) -> Path:
    path.write_text("from dbos import DBOS\nfrom durable_kit.world.payments import Payments\n\n\n" + body)
    return path


def test_exercise_check_fails_no_key_and_a_constant_key_and_passes_the_workflow_key(tmp_path):
    unkeyed = write(tmp_path / "unkeyed.py", "@DBOS.step()\ndef pay_unkeyed(world, order_id, amount):\n"
                                             "    return Payments.beside(world).refund(order_id, amount, None)\n")
    keyed = write(tmp_path / "keyed.py", "@DBOS.step()\ndef pay_keyed(world, order_id, amount):\n"
                                         "    return Payments.beside(world).refund(order_id, amount, "
                                         "f'{DBOS.workflow_id}:refund')\n")
    constant = write(tmp_path / "constant.py", "@DBOS.step()\ndef pay_constant(world, order_id, amount):\n"
                                               "    return Payments.beside(world).refund(order_id, amount, 'refund')\n")
    stub = write(tmp_path / "stub.py", "@DBOS.step()\ndef pay_stub(world, order_id, amount):\n"
                                       "    key = None  # TODO: a key the payment service can deduplicate\n"
                                       "    return Payments.beside(world).refund(order_id, amount, key)\n")
    assert verdict_for(load_function(stub, "pay_stub")).startswith("not yet: the key is still None")
    assert verdict_for(load_function(unkeyed, "pay_unkeyed")).startswith("not quite: 3 refunds for 2 workflows")
    said = verdict_for(load_function(constant, "pay_constant"))  # one key for every workflow: the second is lost
    assert said.startswith("not quite: 1 refund for 2 workflows") and "Hint:" in said and "DBOS.workflow_id" in said
    assert verdict_for(load_function(keyed, "pay_keyed")).startswith("pass: 2 workflows, 3 calls")


def test_loading_an_edited_file_again_warns_nothing(tmp_path):
    import logging

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("dbos").addHandler(handler)
    try:
        path = write(tmp_path / "again.py", "@DBOS.step()\ndef pay_again(world, order_id, amount):\n"
                                            "    return None\n")
        load_function(path, "pay_again")
        path.write_text(path.read_text().replace("return None", "return {}"))
        assert load_function(path, "pay_again")  # the learner's edit, run again
    finally:
        logging.getLogger("dbos").removeHandler(handler)
    assert not [message for message in seen if "Duplicate registration" in message], seen


def test_bench_prints_ratios():
    child = run_python("-m", "durable_kit.workshop.graduate", "bench", "--steps", "20", "--json")
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert {"kit_vs_raw", "dbos_sqlite_vs_raw", "dbos_sqlite_vs_kit"} <= set(result)
    assert all(value > 0 for key, value in result.items() if key.endswith("_us_per_step"))


def test_the_crash_chart_counts_every_request_against_the_clean_run_and_one_answer():
    from durable_kit.workshop.graduate.loop_crashlab import BOUNDARIES, PLAIN_TOOLS, chart_series

    def cell(side, model, source, send, delivered):
        return {f"{side}_model_calls": model, f"{side}_source_calls": source, f"{side}_send_requests": send,
                f"{side}_deliveries": delivered}

    rows = [{"boundary": "no crash", **cell("kit", 8, 4, 1, 1), **cell("framework", 8, 4, 1, 1)},
            {"boundary": list(BOUNDARIES)[6], **cell("kit", 8, 4, 2, 1), **cell("framework", 8, 4, 2, 1)},
            {"boundary": PLAIN_TOOLS, **cell("framework", 9, 8, 1, 2)}]
    series = chart_series(rows)
    assert series["labels"] == ["no crash", "in the send", "no crash", "in the send", "in a model call, plain tools"]
    assert series["groups"] == ["the kit"] * 2 + ["Pydantic AI"] * 3
    assert (series["calls"], series["stored"]) == ([13, 14, 13, 14, 18], [1, 1, 1, 1, 2])
    assert (series["needed"], series["kept_needed"]) == (13, 1)  # a second answer would be drawn red
    with pytest.raises(ValueError, match="first row must be the clean run"):
        chart_series(rows[1:])
