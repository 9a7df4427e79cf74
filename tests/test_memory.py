"""Agent memory: passage and finding identities, dangling references, resume_context, context selection."""
from __future__ import annotations

import pytest

from durable_kit.workshop.agents.loop import fixture_passage, note_finding
from durable_kit.workshop.memory import (DanglingReference, EvidenceConflict, EvidenceStore, Finding, Passage, count_words,
                                newest_findings, quote_hash, recall, resume_context, select_findings,
                                store_from_dict)

NORTHWIND = "northwind-fy2025-rf-07"


def store_with(*passage_ids: str) -> EvidenceStore:
    store = EvidenceStore()
    for passage_id in passage_ids:
        store.add_passage(fixture_passage(passage_id))
    return store


def test_a_passage_is_identified_by_document_version_location_and_its_words():
    passage = fixture_passage(NORTHWIND)
    assert {k: passage[k] for k in ("document", "version", "location")} == {
        "document": "northwind-annual-report", "version": "FY2025", "location": "risk-factors/07"}
    assert passage["quote_hash"] == quote_hash("  " + passage["quote"].upper().replace(" ", "\n ")) != quote_hash("x")
    store = store_with(NORTHWIND)
    store.add_passage(passage)  # the same words again: nothing changes
    assert len(store.passages) == 1
    changed = {**passage, "quote": passage["quote"].replace("38%", "41%")}
    with pytest.raises(EvidenceConflict, match=f"passage '{NORTHWIND}' is already stored"):
        store.add_passage(changed)
    assert store.passages[NORTHWIND].quote == passage["quote"]


def test_two_findings_may_cite_one_passage_and_keep_their_own_ids():
    store = store_with(NORTHWIND)
    store.add_finding({"id": "f-risk", "claim": "A single supplier is a risk.", "cites": [NORTHWIND]})
    store.add_finding({"id": "f-share", "claim": "It took 38% of spend.", "cites": [NORTHWIND]})
    assert sorted(store.findings) == ["f-risk", "f-share"]
    assert store_from_dict(store.to_dict()).to_dict() == store.to_dict()


def test_a_finding_whose_citation_does_not_resolve_is_an_error_naming_it():
    store = store_with(NORTHWIND)
    with pytest.raises(DanglingReference, match=r"finding 'f-tallis' cites \['tallis-fy2025-rf-04'\]"):
        store.add_finding({"id": "f-tallis", "claim": "One mill.", "cites": ["tallis-fy2025-rf-04"]})
    assert store.findings == {}
    # a store restored from saved state with a finding whose passage was never saved
    saved = {"passages": [fixture_passage(NORTHWIND)],
             "findings": [{"id": "f-mill", "claim": "One mill.", "cites": [NORTHWIND, "tallis-fy2025-rf-04"]}]}
    with pytest.raises(DanglingReference, match="finding 'f-mill' cites passage 'tallis-fy2025-rf-04'"):
        store_from_dict(saved)
    store.findings["f-mill"] = Finding("f-mill", "One mill.", ("tallis-fy2025-rf-04",))  # bypassing the check
    run = {"request": "r", "source_scope": {}, "user_input": []}
    with pytest.raises(DanglingReference, match="finding 'f-mill' cites passage 'tallis-fy2025-rf-04'"):
        resume_context(run, store, {}, [])


def test_the_loop_refuses_a_finding_that_cites_an_unread_passage():
    store = store_with(NORTHWIND)
    refused = note_finding(store, 4, {"tool": "note_finding", "gap": "tallis",
                                      "args": {"id": "f-tallis", "claim": "One mill.", "cites": ["tallis-fy2025-rf-04"]}})
    assert list(refused) == ["refused"] and "f-tallis" in refused["refused"] and store.findings == {}
    kept = note_finding(store, 4, {"tool": "note_finding", "gap": "northwind",
                                   "args": {"id": "f-n", "claim": "38%.", "cites": [NORTHWIND]}})
    assert kept == {"finding": {"id": "f-n", "claim": "38%.", "cites": [NORTHWIND], "gap": "northwind", "turn": 4}}


def test_resume_context_holds_request_scope_findings_gaps_plan_and_user_input():
    store = store_with(NORTHWIND)
    store.add_finding({"id": "f-n", "claim": "38% of spend.", "cites": [NORTHWIND], "gap": "northwind"})
    run = {"request": "Compare three companies.", "source_scope": {"companies": ["northwind"]},
           "user_input": ["FY2025"]}
    context = resume_context(run, store, {"tallis": "how Tallis describes it"},
                             [{"query": "carton board", "period": "FY2025"}])
    assert context["request"] == "Compare three companies."
    assert context["source_scope"] == {"companies": ["northwind"]}
    assert [f["id"] for f in context["findings"]] == ["f-n"]
    assert context["findings"][0]["evidence"][0]["quote_hash"] == store.passages[NORTHWIND].quote_hash
    assert context["unresolved_gaps"] == {"tallis": "how Tallis describes it"}
    assert context["planned_searches"]["suggested"] == [{"query": "carton board", "period": "FY2025"}]
    assert "change it" in context["planned_searches"]["note"]
    assert context["user_input"] == ["FY2025"]
    assert context["evidence_index"] == [NORTHWIND]


def long_run_store() -> EvidenceStore:
    """Turn 1 notes a contradiction on the Northwind gap; turns 2-30 note findings on other gaps."""
    store = store_with(NORTHWIND, "tallis-fy2025-rf-04")
    store.add_finding({"id": "f-contradiction", "claim": "The FY2025 share (38%) contradicts the summary's 31%.",
                       "cites": [NORTHWIND], "gap": "northwind", "turn": 1})
    for turn in range(2, 31):
        store.add_finding({"id": f"f-{turn:02d}", "claim": f"Carton observation number {turn}.",
                           "cites": ["tallis-fy2025-rf-04"], "gap": "tallis", "turn": turn})
    return store


def test_an_early_contradiction_is_not_crowded_out_of_the_context():
    store = long_run_store()
    one = count_words({**store.findings["f-02"].to_dict(),
                       "evidence": [store.passages["tallis-fy2025-rf-04"].to_dict()]})
    budget = 5 * one + 10  # room for about five findings out of thirty
    naive = [f.id for f in newest_findings(store, budget)]
    assert len(naive) == 5 and "f-contradiction" not in naive
    chosen, left_out = select_findings(store, "northwind", budget)
    assert "f-contradiction" in [f.id for f in chosen] and len(chosen) <= 5
    assert len(chosen) + len(left_out) == 30
    context = resume_context({"request": "r", "source_scope": {}, "user_input": []}, store, {}, [], budget,
                             current_gap="northwind")
    assert context["findings"][0]["id"] == "f-contradiction"
    assert count_words(context["findings"]) <= budget
    assert context["not_shown"]["findings"] == left_out
    # the rest of the store stays reachable through the recall tool
    assert [f["id"] for f in recall(store, left_out[0])["findings"]] == [left_out[0]]
    assert len(recall(store, "carton observation")["findings"]) == 29


def test_passage_round_trip_does_not_trust_a_stored_hash():
    data = {**fixture_passage(NORTHWIND), "quote_hash": "000000000000"}
    assert Passage(**{k: data[k] for k in ("id", "document", "version", "location", "quote")}).quote_hash != "0" * 12
    assert store_from_dict({"passages": [data]}).passages[NORTHWIND].quote_hash == fixture_passage(NORTHWIND)["quote_hash"]
