"""Agent memory: evidence and findings with identities, and the context a resumed run starts from.

A transcript mixes tentative claims, failed searches and final findings. A
resumed agent needs records instead:

* a **passage** is evidence: a quotation from one document at one version and
  one location, with a hash of its normalized text, so that the same location
  read again with different words is caught, not silently merged;
* a **finding** is a claim with its own identity that cites one or more
  passages (two findings may cite the same passage and say different things).

``resume_context`` builds the next model input from the original request, the
source scope, the retained findings (each with the passages it rests on),
the unresolved gaps, the planned searches and the user's input. It never
depends on a provider response that was cut off: only what is in the store.
A finding whose citation is not in the store is an error that names it.

For long runs ``select_findings`` picks what fits a budget, relevant to the
current gap first, and ``recall`` reaches the rest of the store as a tool.
Everything here is plain data: JSON in, JSON out, no database.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any


class MemoryRefused(ValueError):
    """Base class: the evidence store refused a change; it is unchanged."""


class DanglingReference(MemoryRefused):
    """A finding cites a passage the evidence store does not hold."""


class EvidenceConflict(MemoryRefused):
    """A passage id came back with different words: a new version must get its own identity."""


def quote_hash(text: str) -> str:
    """The first 12 hex digits of SHA-256 of the text with whitespace and case normalized."""
    normalized = " ".join(text.split()).lower()
    return hashlib.sha256(normalized.encode()).hexdigest()[:12]


def count_words(value: Any) -> int:
    """The budget's unit: words of the value's JSON text (the fake model's tokens)."""
    return len(json.dumps(value, sort_keys=True).split())


@dataclass(frozen=True)
class Passage:
    """One quotation: which document, which version, where in it, and what it says."""

    id: str
    document: str
    version: str
    location: str
    quote: str
    company: str = ""
    period: str = ""

    @property
    def quote_hash(self) -> str:
        return quote_hash(self.quote)

    def to_dict(self) -> dict:
        return {**asdict(self), "quote_hash": self.quote_hash}


@dataclass(frozen=True)
class Finding:
    """A claim with its own id, the passages it cites, and the gap it answers."""

    id: str
    claim: str
    cites: tuple[str, ...]
    company: str = ""
    period: str = ""
    gap: str = ""
    turn: int = 0

    def to_dict(self) -> dict:
        return {**asdict(self), "cites": list(self.cites)}


@dataclass
class EvidenceStore:
    """Passages and findings by id. Adding is checked: the store never holds a dangling citation."""

    passages: dict[str, Passage] = field(default_factory=dict)
    findings: dict[str, Finding] = field(default_factory=dict)

    def add_passage(self, passage: Passage | dict) -> Passage:
        """Store a passage; the same id with the same words is a no-op, with other words an ``EvidenceConflict``."""
        passage = passage if isinstance(passage, Passage) else passage_from_dict(passage)
        held = self.passages.get(passage.id)
        if held is not None and held.quote_hash != passage.quote_hash:
            raise EvidenceConflict(
                f"passage {passage.id!r} is already stored with quote hash {held.quote_hash}, and was read again "
                f"with {passage.quote_hash}: the document changed. Store the new text under an id with its new "
                "version; findings that cite the old one keep citing the old words.")
        self.passages.setdefault(passage.id, passage)
        return self.passages[passage.id]

    def add_finding(self, finding: Finding | dict) -> Finding:
        """Store a finding whose every citation is a stored passage; else ``DanglingReference`` and no change."""
        finding = finding if isinstance(finding, Finding) else finding_from_dict(finding)
        missing = [p for p in finding.cites if p not in self.passages]
        if not finding.cites or missing:
            raise DanglingReference(
                f"finding {finding.id!r} cites {missing or 'no passage'}, which the evidence store does not hold; "
                "read the passage first (or cite one that was read), then note the finding again.")
        self.findings[finding.id] = finding
        return finding

    def check_references(self) -> None:
        """Raise ``DanglingReference`` naming the first finding whose citation does not resolve."""
        for finding in self.findings.values():
            for passage_id in finding.cites:
                if passage_id not in self.passages:
                    raise DanglingReference(
                        f"finding {finding.id!r} cites passage {passage_id!r}, which is not in the evidence store: "
                        "a model given this claim could not inspect it. Restore the passage from saved evidence, "
                        "or drop the finding.")

    def to_dict(self) -> dict:
        """The store as JSON-ready data (``store_from_dict`` reads it back)."""
        return {"passages": [p.to_dict() for p in self.passages.values()],
                "findings": [f.to_dict() for f in self.findings.values()]}


def passage_from_dict(data: dict) -> Passage:
    """A ``Passage`` from its dict (the ``quote_hash`` key, if present, is recomputed, not trusted)."""
    return Passage(**{k: data[k] for k in ("id", "document", "version", "location", "quote")},
                   company=data.get("company", ""), period=data.get("period", ""))


def finding_from_dict(data: dict) -> Finding:
    """A ``Finding`` from its dict."""
    return Finding(id=data["id"], claim=data["claim"], cites=tuple(data["cites"]), company=data.get("company", ""),
                   period=data.get("period", ""), gap=data.get("gap", ""), turn=data.get("turn", 0))


def store_from_dict(data: dict) -> EvidenceStore:
    """Rebuild a store; a finding citing a passage that is not there raises ``DanglingReference``."""
    store = EvidenceStore()
    for passage in data.get("passages", []):
        store.add_passage(passage)
    for finding in data.get("findings", []):
        store.findings[finding["id"]] = finding_from_dict(finding)
    store.check_references()
    return store


def _relevance(finding: Finding, current_gap: str | None) -> int:
    return 1 if current_gap and finding.gap == current_gap else 0


def select_findings(store: EvidenceStore, current_gap: str | None, budget: int | None) -> tuple[list[Finding], list[str]]:
    """Findings for the next input within ``budget`` words: relevant to ``current_gap`` first, then newest.

    Returns the selected findings (in the order they were noted) and the ids
    left out. Relevance wins over recency, so an early finding on the current
    gap (a contradiction, say) is kept while later, unrelated ones are left out.
    Nothing is lost: ``recall`` reaches every finding.
    """
    ranked = sorted(store.findings.values(), key=lambda f: (-_relevance(f, current_gap), -f.turn, f.id))
    chosen, used = [], 0
    for finding in ranked:
        cost = count_words(_with_evidence(store, finding))
        if budget is not None and used + cost > budget:
            continue
        chosen.append(finding)
        used += cost
    order, kept = list(store.findings), {c.id for c in chosen}
    chosen.sort(key=lambda f: order.index(f.id))
    return chosen, [finding_id for finding_id in order if finding_id not in kept]


def newest_findings(store: EvidenceStore, budget: int) -> list[Finding]:
    """The naive selection, for comparison: the newest findings that fit ``budget`` words."""
    chosen, used = [], 0
    for finding in sorted(store.findings.values(), key=lambda f: -f.turn):
        cost = count_words(_with_evidence(store, finding))
        if used + cost > budget:
            break
        chosen.append(finding)
        used += cost
    return chosen


def _with_evidence(store: EvidenceStore, finding: Finding) -> dict:
    return {**finding.to_dict(), "evidence": [store.passages[p].to_dict() for p in finding.cites]}


def resume_context(run: dict, store: EvidenceStore, gaps: dict[str, str], planned_searches: list[dict],
                   budget: int | None = None, current_gap: str | None = None) -> dict:
    """The next model input, built only from saved state; ``DanglingReference`` if a finding does not resolve.

    ``run`` holds ``request``, ``source_scope`` and ``user_input`` (a list of
    answers, oldest first). ``gaps`` are the unresolved ones, by id. Planned
    searches are passed as suggestions: new input or evidence may change them.
    """
    store.check_references()
    selected, left_out = select_findings(store, current_gap, budget)
    return {
        "request": run["request"],
        "source_scope": run["source_scope"],
        "findings": [_with_evidence(store, f) for f in selected],
        "unresolved_gaps": dict(gaps),
        "current_gap": current_gap,
        "planned_searches": {"suggested": list(planned_searches),
                             "note": "a plan from an earlier turn; change it if new input or evidence says so"},
        "user_input": list(run.get("user_input") or []),
        "evidence_index": sorted(store.passages),
        "not_shown": {"findings": left_out, "how": "call the recall tool to read any of them"},
    }


def recall(store: EvidenceStore, query: str) -> dict:
    """The store as a tool: findings and passages whose id or text contains ``query`` (case-insensitive)."""
    needle = query.lower()
    findings = [_with_evidence(store, f) for f in store.findings.values()
                if needle in f.id.lower() or needle in f.claim.lower() or needle in f.gap.lower()]
    passages = [p.to_dict() for p in store.passages.values() if needle in p.id.lower() or needle in p.quote.lower()]
    return {"query": query, "findings": findings, "passages": passages}

