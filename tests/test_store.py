"""The engine: the SQLite file, its durability settings, transactions and strict JSON."""
from __future__ import annotations

import datetime
import sqlite3

import pytest

from durable_kit import NotJSON, SchemaMismatch, immediate
from durable_kit.core.store import connect
from durable_kit.core.store import SCHEMA_VERSION, from_json, to_json

from conftest import dump

# PRAGMA synchronous reports a number.
SYNC_LEVEL = {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}


def test_connect_uses_wal_and_full_sync_by_default(db):
    conn = connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_LEVEL["FULL"]


@pytest.mark.parametrize("level", ["normal", "NORMAL", "EXTRA", "OFF"])
def test_synchronous_is_configurable(db, level):
    conn = connect(db, synchronous=level)
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_LEVEL[level.upper()]


def test_invalid_synchronous_level_is_refused_before_opening(db):
    with pytest.raises(ValueError, match="synchronous must be one of"):
        connect(db, synchronous="SOMETIMES")
    assert not db.exists()


def test_schema_version_is_recorded_once(db):
    connect(db).close()
    connect(db).close()  # reopening must not add a second row
    rows = sqlite3.connect(db).execute("SELECT version FROM schema_version").fetchall()
    assert rows == [(SCHEMA_VERSION,)]


def test_other_schema_version_raises_schema_mismatch(db):
    connect(db).close()
    raw = sqlite3.connect(db)
    raw.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    raw.commit()
    raw.close()
    before = dump(db)
    with pytest.raises(SchemaMismatch) as info:
        connect(db)
    message = str(info.value)
    assert str(SCHEMA_VERSION + 1) in message and str(SCHEMA_VERSION) in message
    assert "use a new database file" in message
    assert dump(db) == before


def test_immediate_commits_the_whole_block(db):
    conn = connect(db)
    with immediate(conn):
        conn.execute("INSERT INTO faults (point, action) VALUES ('a', 'exit')")
        conn.execute("INSERT INTO faults (point, action) VALUES ('b', 'kill')")
    assert dump(db)["faults"] == sorted([repr(("a", "exit", 0.0, "*")), repr(("b", "kill", 0.0, "*"))])


def test_immediate_rolls_back_on_exception(db):
    conn = connect(db)
    before = dump(db)
    with pytest.raises(KeyError):
        with immediate(conn):
            conn.execute("INSERT INTO faults (point, action) VALUES ('a', 'exit')")
            raise KeyError("boom")
    assert dump(db) == before
    assert not conn.in_transaction
    # The connection is usable afterwards.
    with immediate(conn):
        conn.execute("INSERT INTO faults (point, action) VALUES ('a', 'exit')")
    assert dump(db)["faults"] == [repr(("a", "exit", 0.0, "*"))]  # armed for any workflow


def test_immediate_holds_the_write_lock_from_the_start(db):
    first, second = connect(db), connect(db, busy_timeout_ms=50)
    with immediate(first):
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            second.execute("BEGIN IMMEDIATE")


def test_to_json_round_trips_plain_values():
    value = {"b": [1, 2.5, None, True], "a": {"nested": "é"}}
    text = to_json(value, "wf", "step", "value")
    assert from_json(text) == value
    assert text.index('"a"') < text.index('"b"')  # sorted keys: one spelling per value
    assert from_json(None) is None


@pytest.mark.parametrize("value, problem", [
    ({"scores": [0.5, float("nan")]}, "$.scores[1] is nan"),
    ({"scores": [float("inf")]}, "$.scores[0] is inf"),
    ({"tags": {"a", "b"}}, "$.tags is a set"),
    ({"when": datetime.datetime(2025, 1, 1)}, "$.when is a datetime"),
    ({"by_year": {2025: "x"}}, "$.by_year has a key of type int"),
    ({"flags": {True: "x"}}, "$.flags has a key of type bool"),
    ([{"k": {(1, 2): "x"}}], "$[0].k has a key of type tuple"),
])
def test_to_json_rejects_non_json_naming_workflow_step_and_path(value, problem):
    with pytest.raises(NotJSON) as info:
        to_json(value, "wf-7", "research:a", "activity's output")
    message = str(info.value)
    assert "workflow 'wf-7'" in message
    assert "step 'research:a'" in message
    assert problem in message
    assert "Nothing was written" in message


def test_not_json_is_a_type_error():
    assert issubclass(NotJSON, TypeError)


def test_to_json_rejects_a_value_that_contains_itself():
    loop = {"items": []}
    loop["items"].append(loop)
    with pytest.raises(NotJSON, match="Nothing was written"):
        to_json(loop, "wf", "s", "value")


def test_to_json_accepts_one_object_referenced_twice():
    shared = {"id": 1}
    assert from_json(to_json([shared, {"again": shared}], "wf", "s", "value")) == [{"id": 1}, {"again": {"id": 1}}]
