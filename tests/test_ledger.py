"""The outside world: the call ledger, in its own file beside the journal."""
from __future__ import annotations

import pytest

from durable_kit import Journal, immediate
from durable_kit.world.ledger import Ledger, ledger_path

from conftest import dump


def test_ledger_path_sits_beside_the_database(tmp_path):
    assert ledger_path(tmp_path / "x.db") == tmp_path / "x.calls.db"
    assert ledger_path("runs/one.db").as_posix() == "runs/one.calls.db"


def test_beside_creates_a_separate_file(tmp_path):
    db = tmp_path / "x.db"
    Journal(db)
    ledger = Ledger.beside(db)
    ledger.record("model", "plan", "wf-1")
    assert ledger.path == tmp_path / "x.calls.db"
    assert "calls" in dump(tmp_path / "x.calls.db")
    assert "calls" not in dump(db)
    assert "steps" not in dump(tmp_path / "x.calls.db")


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger.beside(tmp_path / "x.db")
    ledger.record("model", "plan", "wf-1", input_tokens=10, output_tokens=4)
    ledger.record("source", "fetch doc-1", "wf-1")
    ledger.record("model", "research", "wf-1", input_tokens=7, output_tokens=20)
    ledger.record("model", "plan", "wf-2", input_tokens=100, output_tokens=1)
    return ledger


def test_counts_by_kind_and_workflow(ledger):
    assert ledger.count() == 4
    assert ledger.count("model") == 3
    assert ledger.count("source") == 1
    assert ledger.count(workflow_id="wf-1") == 3
    assert ledger.count("model", "wf-1") == 2
    assert ledger.count("model", "wf-3") == 0
    assert [c["operation"] for c in ledger.calls("model", "wf-1")] == ["plan", "research"]


def test_token_totals_count_model_calls_only(ledger):
    assert ledger.tokens("wf-1") == {"input_tokens": 17, "output_tokens": 24}
    assert ledger.tokens() == {"input_tokens": 117, "output_tokens": 25}
    assert ledger.tokens("wf-3") == {"input_tokens": 0, "output_tokens": 0}


def test_each_record_is_committed_at_once(ledger, tmp_path):
    # Another connection (another process, after a crash) sees every call.
    assert len(dump(tmp_path / "x.calls.db")["calls"]) == 4
    assert Ledger(ledger.path).count("model", "wf-2") == 1


def test_a_rolled_back_journal_transaction_keeps_the_ledger_record(tmp_path):
    db = tmp_path / "x.db"
    journal = Journal(db)
    ledger = Ledger.beside(db)
    with pytest.raises(RuntimeError):
        with immediate(journal.conn):
            ledger.record("model", "plan", "wf-1")
            raise RuntimeError("crash before the journal commit")
    assert ledger.count("model", "wf-1") == 1
