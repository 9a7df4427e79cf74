"""Evaluating an answer, separately from recovering it: durability also preserves a wrong finding.

Two tracks:

* **Track one, deterministic** (``check_answer``): every finding's citation
  exists among the answer's passages, each finding names the company and the
  reporting period of the passages it cites, and every comparison the request
  asked for has a finding. Any program can decide these.
* **Track two, support** (``check_support``): does the cited text say what the
  claim says? Here decided by two rules over inspectable passages: every
  figure in the claim appears in a cited passage, and a claim that something
  *happened* (an interruption suffered, assembly halted) needs a cited
  sentence that reports an event without hedging ("could", "may", "until").
  Rules catch the fixtures' over-claims; they do not understand language. A
  ``judge`` (for example a model behind ``fakes.provider``) can be passed in:
  its verdict is recorded beside the rules' verdict, never instead of it, so a
  disputed claim goes back to the passages.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Callable

from ..world import data_dir


@lru_cache(maxsize=1)
def load_eval_cases() -> dict:
    """The curated support cases and the rules' word lists (``data/eval_cases.json``)."""
    return json.loads((data_dir() / "eval_cases.json").read_text())


def numbers_in(text: str) -> list[str]:
    """Figures in a text (``38%``, ``9``), not the digits of a period name such as ``FY2025``."""
    return re.findall(r"(?<![A-Za-z\d])\d+(?:\.\d+)?%?", text)


def sentences(text: str) -> list[str]:
    """The text split after each full stop or semicolon."""
    return [s.strip() for s in re.split(r"(?<=[.;])\s+", text) if s.strip()]


def _has_word(text: str, words: list[str]) -> list[str]:
    lowered = text.lower()
    return [w for w in words if re.search(rf"\b{re.escape(w)}\b", lowered)]


def check_support(claim: str, passages: list[dict], rules: dict | None = None,
                  judge: Callable[[str, list[dict]], dict] | None = None) -> dict:
    """Track two for one claim: ``{"supported", "problems", "judge"}``; the rules decide ``supported``."""
    rules = rules or load_eval_cases()["rules"]
    quotes = " ".join(p["quote"] for p in passages)
    problems = [f"the figure {n} is in no cited passage" for n in numbers_in(claim) if n not in numbers_in(quotes)]
    events = _has_word(claim, rules["event_words"])
    if events:
        reported = [s for p in passages for s in sentences(p["quote"])
                    if _has_word(s, rules["event_evidence"]) and not _has_word(s, rules["hedge_words"])]
        if not reported:
            hedged = [s for p in passages for s in sentences(p["quote"]) if _has_word(s, rules["hedge_words"])]
            problems.append(f"the claim says something happened ({', '.join(events)}), but no cited sentence "
                            "reports an event" + (f"; the passage only says: {hedged[-1]!r}" if hedged else ""))
    verdict = judge(claim, passages) if judge else None
    return {"supported": not problems, "problems": problems, "judge": verdict}


def check_answer(answer: dict, scope: dict) -> list[dict]:
    """Track one: rows ``{"check", "subject", "passed", "detail"}`` for references, company/period and coverage.

    ``answer`` is the loop's final answer (findings and cited passages);
    ``scope`` holds ``comparisons``: ``[company_id, period]`` pairs the request asked for.
    """
    passages = {p["id"]: p for p in answer["passages"]}
    rows = []
    for finding in answer["findings"]:
        missing = [p for p in finding["cites"] if p not in passages]
        rows.append({"check": "references exist", "subject": finding["id"], "passed": not missing,
                     "detail": f"missing {missing}" if missing else f"{len(finding['cites'])} cited, all present"})
        cited = [passages[p] for p in finding["cites"] if p in passages]
        wrong = [p["id"] for p in cited if p["company"] != finding["company"] or p["period"] != finding["period"]]
        rows.append({"check": "company and period", "subject": finding["id"], "passed": not wrong,
                     "detail": f"{finding['company']} {finding['period']}" + (f"; but {wrong} say otherwise"
                                                                              if wrong else "")})
    for company_id, period in scope["comparisons"]:
        covered = [f["id"] for f in answer["findings"] for p in f["cites"]
                   if p in passages and passages[p]["document"].startswith(f"{company_id}-")
                   and passages[p]["period"] == period]
        rows.append({"check": "comparison covered", "subject": f"{company_id} {period}", "passed": bool(covered),
                     "detail": f"by {sorted(set(covered))}" if covered else "no finding"})
    return rows


def support_rows(answer: dict, judge: Callable[[str, list[dict]], dict] | None = None) -> list[dict]:
    """Track two over every finding of an answer: ``{"finding", "supported", "problems"}`` rows."""
    passages = {p["id"]: p for p in answer["passages"]}
    rows = []
    for finding in answer["findings"]:
        result = check_support(finding["claim"], [passages[p] for p in finding["cites"] if p in passages],
                               judge=judge)
        rows.append({"finding": finding["id"], "supported": result["supported"],
                     "problems": "; ".join(result["problems"]), "judge": result["judge"]})
    return rows


def curated_rows(judge: Callable[[str, list[dict]], dict] | None = None) -> list[dict]:
    """Track two over the curated cases: each case's expected verdict beside the checker's."""
    data = load_eval_cases()
    rows = []
    for case in data["cases"]:
        result = check_support(case["claim"], [data["passages"][p] for p in case["cites"]], data["rules"], judge)
        rows.append({"case": case["id"], "expected": case["expected"],
                     "checker": "supported" if result["supported"] else "unsupported",
                     "problems": "; ".join(result["problems"])})
    return rows


def model_judge(model) -> Callable[[str, list[dict]], dict]:
    """A judge hook from any object with ``decide(context)`` returning a ``finish`` action with a verdict.

    The context asks whether the passages support the claim; the action's
    ``args`` should hold ``supported`` (bool) and ``reason``. Its verdict is
    advice beside the rules (see the module docstring).
    """
    def judge(claim: str, passages: list[dict]) -> dict:
        context = {"task": "Do these passages support the whole claim? Answer with the finish tool, "
                           "args {supported: true or false, reason: ...}.",
                   "claim": claim, "passages": passages, "tools": ["finish"]}
        args = model.decide(context, operation="judge")["action"].get("args", {})
        return {"supported": bool(args.get("supported")), "reason": str(args.get("reason", ""))}
    return judge
