"""A deterministic fake language model with structured outputs and counted tokens.

Answers come from ``data/topics.json`` (or are derived from the prompt when a
topic is not there), so every run is the same with no key and no network.
Every call is recorded in the ledger as ``model`` with its token usage.
"""
from __future__ import annotations

import json
from functools import lru_cache

from .ledger import Ledger
from . import data_dir

MODEL_NAME = "fake-llm-1"


@lru_cache(maxsize=1)
def load_topics() -> dict:
    """Known research topics, keyed by topic text."""
    raw = json.loads((data_dir() / "topics.json").read_text())
    return {entry["topic"]: entry for entry in raw["topics"]}


def count_tokens(value) -> int:
    """A stand-in tokenizer: one token per word of the JSON text."""
    return len(json.dumps(value, sort_keys=True).split())


class FakeLLM:
    """Offline model: each method is one model call that returns a JSON-ready dict."""

    name = MODEL_NAME

    def __init__(self, ledger: Ledger, workflow_id: str | None = None):
        self.ledger, self.workflow_id = ledger, workflow_id

    def _call(self, task: str, prompt: dict, output: dict) -> dict:
        self.ledger.record("model", task, self.workflow_id, count_tokens(prompt), count_tokens(output))
        return output

    def _topic(self, topic: str) -> dict:
        known = load_topics().get(topic)
        if known:
            return known
        words = [w.strip(".,?").lower() for w in topic.split() if len(w) > 3] or ["the question"]
        subtopics = [f"{words[0]} background", f"{words[-1]} evidence"]
        return {"subtopics": subtopics, "notes": {s: f"Notes on {s}." for s in subtopics},
                "recommendation": f"Study {topic} further before deciding."}

    def plan(self, topic: str) -> dict:
        """A research plan: the subtopics to research, or a question when the topic is too broad to plan."""
        known = self._topic(topic)
        if known.get("question"):
            return self._call("plan", {"topic": topic}, {"subtopics": [], "question": known["question"]})
        return self._call("plan", {"topic": topic}, {"subtopics": list(known["subtopics"])})

    def research(self, topic: str, subtopic: str) -> dict:
        """Findings for one subtopic."""
        note = self._topic(topic)["notes"].get(subtopic, f"Notes on {subtopic}.")
        return self._call("research", {"topic": topic, "subtopic": subtopic},
                          {"subtopic": subtopic, "finding": note})

    def analyze(self, topic: str, findings: list[dict]) -> dict:
        """An analysis that joins the findings."""
        summary = " ".join(f["finding"] for f in findings)
        return self._call("analyze", {"topic": topic, "findings": findings},
                          {"summary": summary, "subtopics_covered": len(findings)})

    def recommend(self, topic: str, analysis: dict) -> dict:
        """A recommendation with a confidence."""
        return self._call("recommend", {"topic": topic, "analysis": analysis},
                          {"recommendation": self._topic(topic)["recommendation"], "confidence": 0.8})

    def report(self, topic: str, analysis: dict, recommendation: dict) -> dict:
        """The final report."""
        body = f"{analysis['summary']} Recommendation: {recommendation['recommendation']}"
        return self._call("report", {"topic": topic, "analysis": analysis, "recommendation": recommendation},
                          {"title": f"Report: {topic}", "body": body})

    def summarize_passage(self, question: str, passage: dict) -> dict:
        """A finding that cites the passage it rests on."""
        first_sentence = passage["text"].split(". ")[0].rstrip(".") + "."
        claim = f"{passage['company']} ({passage['period']}): {first_sentence}"
        return self._call("summarize_passage", {"question": question, "passage": passage},
                          {"claim": claim, "evidence_id": passage["id"]})

    def recommend_refund(self, order: dict, rule: dict, evidence_ids: list[str],
                         repair_message: str | None = None) -> dict:
        """A structured refund recommendation citing evidence by id.

        For an order marked ``model_cites_unfetched_evidence`` the first answer
        also cites a document that was never fetched, as real models do; given a
        ``repair_message``, it cites only what it was shown.
        """
        cited = list(evidence_ids)
        if order.get("model_cites_unfetched_evidence") and repair_message is None:
            cited.append("policy:store-credit")
        prompt = {"order": order, "rule": rule, "evidence_ids": evidence_ids, "repair": repair_message}
        return self._call("recommend_refund", prompt, {
            "outcome": "refund",
            "amount": order["amount"],
            "rationale": f"{rule['text']} The customer wrote: \"{order['complaint']}\"",
            "confidence": 0.9 if order["reason"] != "changed_mind" else 0.7,
            "evidence": cited,
        })
