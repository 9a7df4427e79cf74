"""The agent loop (notebook 08): a model picks the next tool every turn, on the step journal.

``agent_loop`` runs one case of ``data/loop_cases.json``. Each turn:

1. the model's input is rebuilt from saved state only (``memory.resume_context``):
   the request, the source scope, the findings with their passages, the open
   gaps, the planned searches (as suggestions) and the user's answers;
2. the model call is the step ``turn:N``; it returns one action;
3. the action's tool runs as steps named from the same turn: ``turn:N:search``,
   ``turn:N:read:<passage>`` (one step per passage, run in parallel),
   ``turn:N:note_finding``, ``turn:N:recall``, ``turn:N:finish``, or the wait
   ``turn:N:ask_user`` (a clarification that holds no process).

The sequence of steps is not known in advance, yet replay is plain: code
between steps is deterministic, so a replay re-walks the same decisions from
the journal, turn by turn, and the first turn without a stored output runs
for real. A provider outage during a model turn pauses the workflow (status
*paused*); ``durable_kit.resume`` makes it runnable again.

``usage`` reports what the run cost across every attempt (from the call
ledger, which no crash resets) and its execution time apart from its time
waiting for a person or a provider.
"""
from __future__ import annotations

import json
import os
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from ... import Journal, Workflow, execute_parallel, read_only, waits, workflow
from ...world import data_dir
from ...world.scripted import SCRIPTED_MODEL, ProviderUnavailable, ScriptedModel, cost_of
from ...world.sources import load_filings
from ...world.ledger import Ledger, ledger_path
from ..memory import DanglingReference, EvidenceStore, Passage, recall, resume_context

TOOLS = ("search", "read", "note_finding", "ask_user", "recall", "finish")


@lru_cache(maxsize=1)
def load_cases() -> dict:
    """The loop's fixture cases and scripts (``data/loop_cases.json``)."""
    return json.loads((data_dir() / "loop_cases.json").read_text())


def load_case(name: str) -> dict:
    """One case, with its script's rules under ``rules``; an unknown name is a clear error."""
    cases = load_cases()
    if name not in cases["cases"]:
        raise KeyError(f"no loop case {name!r} in data/loop_cases.json; known: {sorted(cases['cases'])}")
    case = dict(cases["cases"][name])
    return {**case, "rules": cases["scripts"][case["script"]]}


# ---- the outside world: the filing source as search and read --------------------------------------------------

def fixture_passage(passage_id: str) -> dict:
    """A filing passage with its identity: document, version (the period), location, quote."""
    for company in load_filings().values():
        for filing in company["filings"]:
            for passage in filing["passages"]:
                if passage["id"] == passage_id:
                    number = passage_id.rsplit("-", 1)[-1]
                    return Passage(id=passage_id, document=f"{company['id']}-annual-report", version=filing["period"],
                                   location=f"{passage['section'].lower().replace(' ', '-')}/{number}",
                                   quote=passage["text"], company=company["name"], period=filing["period"]).to_dict()
    raise KeyError(f"no fixture passage {passage_id!r}")


def search_filings(scope: dict, query: str, period: str | None = None) -> list[dict]:
    """Passage references (not their text) in scope that match ``query`` and ``period``, sorted by id."""
    words = [w for w in query.lower().split() if len(w) > 3]
    hits = []
    for company_id in scope["companies"]:
        company = load_filings()[company_id]
        for filing in company["filings"]:
            if filing["period"] not in scope["periods"] or (period and filing["period"] != period):
                continue
            for passage in filing["passages"]:
                if any(w[:6] in passage["text"].lower() for w in words):
                    hits.append({"id": passage["id"], "company": company["name"], "period": filing["period"]})
    return sorted(hits, key=lambda hit: hit["id"])


def _source_call(db_path: Path, workflow_id: str, operation: str) -> None:
    # Opened here, in the calling thread: a branch of a parallel step must not share a connection.
    ledger = Ledger(ledger_path(db_path))
    ledger.record("source", operation, workflow_id)
    ledger.close()


# ---- the loop's state, rebuilt from stored outputs on every replay ---------------------------------------------

class LoopState:
    """What the agent knows: evidence, findings, open gaps, planned searches, answers, what it did."""

    def __init__(self, case: dict):
        self.run = {"request": case["request"], "source_scope": case["source_scope"], "user_input": []}
        self.store = EvidenceStore()
        self.gaps = dict(case["gaps"])
        self.planned: list[dict] = []
        self.history: list[dict] = []
        self.last_result: Any = None
        self.budget = case.get("context_budget")

    def current_gap(self) -> str | None:
        return next(iter(self.gaps), None)

    def model_input(self, turn: int) -> dict:
        """The next model call's input: ``resume_context`` plus the turn, what was done, and the last result."""
        context = resume_context(self.run, self.store, self.gaps, self.planned, self.budget, self.current_gap())
        return {"turn": turn, **context, "history": list(self.history), "last_result": self.last_result,
                "tools": list(TOOLS)}

    def apply(self, turn: int, action: dict, result: Any) -> None:
        """Fold one turn's action and tool result into the state (deterministic: it runs on every replay)."""
        tool = action["tool"]
        if "plan" in action:
            self.planned = list(action["plan"])
        if tool == "read":
            for passage in result.values():
                self.store.add_passage(passage)
        elif tool == "note_finding" and "finding" in result:
            self.store.add_finding(result["finding"])
            self.gaps.pop(result["finding"]["gap"], None)
        elif tool == "ask_user":
            self.run["user_input"].append(result)
            self.gaps.pop(action.get("gap", ""), None)
        self.history.append({"turn": turn, "tool": tool})
        self.last_result = result if tool != "read" else {"read": sorted(result)}


def make_model(wf: Workflow, case: dict):
    """The scripted fake, or with input ``{"model": "provider"}`` the optional real-model adapter."""
    if wf.input.get("model", "scripted") == "provider":
        from ...world.provider import OpenAICompatibleModel
        return OpenAICompatibleModel.from_environment(wf.db_path, wf.id)
    return ScriptedModel(case["rules"], wf.db_path, wf.id)


def use_tool(wf: Workflow, turn: int, action: dict, state: LoopState) -> Any:
    """Run the action's tool as steps (or a wait) named from the turn; return the tool's result."""
    tool, args, prefix = action["tool"], action.get("args", {}), f"turn:{turn}"
    db_path, scope = wf.db_path, state.run["source_scope"]
    if tool == "search":
        def search():
            _source_call(db_path, wf.id, f"search {args['query']} {args.get('period') or 'any period'}")
            return search_filings(scope, args["query"], args.get("period"))
        return wf.execute_step(f"{prefix}:search", search, args)
    if tool == "read":
        def read(passage_id: str):
            _source_call(db_path, wf.id, f"read {passage_id}")
            return fixture_passage(passage_id)
        names = {f"{prefix}:read:{p}": p for p in args["passages"]}
        outputs = execute_parallel(wf, {name: (lambda p=p: read(p)) for name, p in names.items()},
                                      {name: {"passage": p} for name, p in names.items()})
        return {names[name]: passage for name, passage in outputs.items()}
    if tool == "note_finding":
        return wf.execute_step(f"{prefix}:note_finding", lambda: note_finding(state.store, turn, action), args)
    if tool == "ask_user":
        return wf.ask(f"{prefix}:ask_user", args["question"])
    if tool == "recall":
        return wf.execute_step(f"{prefix}:recall", lambda: recall(state.store, args["query"]), args)
    if tool == "finish":
        return wf.execute_step(f"{prefix}:finish", lambda: final_answer(state, args.get("summary", "")))
    raise ValueError(f"workflow {wf.id!r}, step {prefix!r}: the model chose {tool!r}, which is not a tool; "
                     f"tools are {list(TOOLS)}")


def note_finding(store: EvidenceStore, turn: int, action: dict) -> dict:
    """The finding to keep, or the reason it was refused (a citation the store does not hold), for the model."""
    finding = {**action["args"], "gap": action.get("gap", ""), "turn": turn}
    probe = EvidenceStore(passages=dict(store.passages), findings=dict(store.findings))
    try:
        probe.add_finding(finding)
    except DanglingReference as refused:
        return {"refused": str(refused)}
    return {"finding": finding}


def final_answer(state: LoopState, summary: str) -> dict:
    """The answer: a summary, every finding with its citations, and the cited passages themselves."""
    state.store.check_references()
    cited = sorted({p for f in state.store.findings.values() for p in f.cites})
    return {"summary": summary, "findings": [f.to_dict() for f in state.store.findings.values()],
            "passages": [state.store.passages[p].to_dict() for p in cited],
            "user_input": list(state.run["user_input"])}


@workflow("agent_loop", version="agent-loop-1", inputs={"case": str})
def agent_loop(wf: Workflow) -> dict:
    """Turn after turn: rebuild the input from saved state, ask the model (a step), run its tool (steps)."""
    case = load_case(wf.input["case"])
    state, model = LoopState(case), make_model(wf, case)
    for turn in range(1, case["max_turns"] + 1):
        context = state.model_input(turn)
        try:
            decision = wf.execute_step(f"turn:{turn}", lambda: model.decide(context), context)
        except ProviderUnavailable as outage:
            wf.pause(f"turn {turn}: {outage}")
        action = decision["action"]
        result = use_tool(wf, turn, action, state)
        if action["tool"] == "finish":
            return result
        state.apply(turn, action, result)
    wf.end("stopped", f"no answer after {case['max_turns']} turns: start again with a larger max_turns")


def replay_state(journal: Journal, workflow_id: str, upto_turn: int | None = None) -> LoopState:
    """The loop's state after ``upto_turn`` (default: every stored turn), rebuilt from the journal alone."""
    workflow_row = journal.workflow(workflow_id)
    state = LoopState(load_case(workflow_row["input"]["case"]))
    outputs = {s["name"]: s["output"] for s in journal.steps(workflow_id) if s["status"] == "complete"}
    answers = {w["name"]: w["decision"]["answer"] for w in _resolved_waits(journal, workflow_id)}
    turn = 1
    while f"turn:{turn}" in outputs and (upto_turn is None or turn <= upto_turn):
        action = outputs[f"turn:{turn}"]["action"]
        prefix, tool = f"turn:{turn}", action["tool"]
        if tool == "read":
            result = {name.rsplit(":", 1)[1]: out for name, out in outputs.items() if name.startswith(f"{prefix}:read:")}
            if len(result) < len(action["args"]["passages"]):
                break
        elif tool == "ask_user":
            if f"{prefix}:ask_user" not in answers:
                break
            result = answers[f"{prefix}:ask_user"]
        elif f"{prefix}:{tool}" in outputs:
            result = outputs[f"{prefix}:{tool}"]
        else:
            break
        if tool == "finish":
            break
        state.apply(turn, action, result)
        turn += 1
    return state


def _resolved_waits(journal: Journal, workflow_id: str) -> list[dict]:
    return [{"name": w["name"], "decision": w["decision"]} for w in waits(journal, workflow_id)
            if w["status"] == "resolved"]


# ---- cost and time across attempts -----------------------------------------------------------------------------

def usage(db_path: str | Path, workflow_id: str, model: str = SCRIPTED_MODEL) -> dict:
    """What a workflow's model calls cost across every attempt, and where its time went.

    Tokens, calls and cost come from the call ledger, which is appended on
    every answered call and never rewritten, so no crash or resumption resets
    them; ``repeated_model_calls`` counts calls beyond the first per operation.
    Cost uses ``model``'s rates in ``data/prices.json`` for every call (None
    if the table has no price for it).
    ``execution_seconds`` sums, over replays, the time from a replay's start to
    the event that stopped it (a wait, a pause, the end) or, if its process
    died, to the last event that process recorded. ``waiting_for_person_seconds`` sums approvals and
    clarifications from asked to answered (or to now), and
    ``waiting_for_provider_seconds`` sums paused spans from paused to resumed
    (or to now). Times are wall-clock readings, for people, not for replay.
    """
    journal = read_only(db_path)  # `status` reads it, even under a paused writer
    try:
        journal.workflow(workflow_id)  # a clear error for an unknown id
        calls, refused = [], 0
        if ledger_path(db_path).exists():  # read only: a status query must not create the ledger
            ledger = Ledger(ledger_path(db_path))
            calls, refused = ledger.calls("model", workflow_id), ledger.count("model_refused", workflow_id)
            ledger.close()
        tokens_in = sum(c["input_tokens"] for c in calls)
        tokens_out = sum(c["output_tokens"] for c in calls)
        events = journal.history(workflow_id)
        return {"model_calls": len(calls), "repeated_model_calls": len(calls) - len({c["operation"] for c in calls}),
                "refused_model_calls": refused, "input_tokens": tokens_in, "output_tokens": tokens_out,
                "model": model, "cost_usd": _cost_or_none(model, tokens_in, tokens_out),
                "execution_seconds": _execution_seconds(events),
                "waiting_for_person_seconds": _person_seconds(journal, workflow_id),
                "waiting_for_provider_seconds": _spans(events, "workflow_paused", "workflow_resumed")}
    finally:
        journal.close()


STOP_EVENTS = ("waiting_for_approval", "waiting_for_clarification", "waiting_for_timer", "workflow_paused",
               "replay_suspended", "workflow_completed", "workflow_failed", "workflow_stopped",
               "workflow_escalated", "workflow_rejected")


def _cost_or_none(model: str, tokens_in: int, tokens_out: int) -> float | None:
    try:
        return round(cost_of(model, tokens_in, tokens_out), 6)
    except KeyError:  # a model the price table does not list: the tokens are known, the cost is not
        return None


def _execution_seconds(events: list[dict]) -> float:
    # A replay runs from its replay_started event to the event that stopped it, or, if its process died,
    # to the last event that process wrote.
    total, start, pid, last = 0.0, None, None, None
    for event in events:
        if event["event"] == "replay_started":
            if start is not None:
                total += last - start
            start, pid, last = event["at"], event["pid"], event["at"]
        elif start is not None and event["pid"] == pid:
            last = event["at"]
            if event["event"] in STOP_EVENTS:
                total, start = total + last - start, None
    return total + (last - start if start is not None else 0.0)


def _person_seconds(journal: Journal, workflow_id: str) -> float:
    rows = journal.conn.execute("SELECT created_at, resolved_at FROM waits WHERE workflow_id = ?"
                                " AND kind IN ('approval', 'clarification')", (workflow_id,))
    return sum((r["resolved_at"] or time.time()) - r["created_at"] for r in rows)


def _spans(events: list[dict], opened: str, closed: str) -> float:
    total, since = 0.0, None
    for event in events:
        if event["event"] == opened and since is None:
            since = event["at"]
        elif event["event"] == closed and since is not None:
            total, since = total + event["at"] - since, None
    return total + (time.time() - since if since is not None else 0.0)


def usage_for_status(db_path: str | Path, workflow: dict) -> dict:
    """``{"usage": usage(...)}`` for an agent loop, for ``status --json``; ``{}`` for any other kind."""
    if workflow["kind"] != "agent_loop":
        return {}
    real = workflow.get("input", {}).get("model") == "provider"
    model = os.environ.get("DURABLE_KIT_LLM_MODEL", "unconfigured") if real else SCRIPTED_MODEL
    return {"usage": usage(db_path, workflow["id"], model)}


def usage_lines(db_path: str | Path, workflow: dict) -> list[str]:
    """Two lines for ``status``: cost across attempts and the time split (agent loops only; else none)."""
    used = usage_for_status(db_path, workflow).get("usage")
    if used is None:
        return []
    return [f"  usage across attempts: {used['model_calls']} model calls ({used['repeated_model_calls']} repeated,"
            f" {used['refused_model_calls']} refused), {used['input_tokens']} tokens in,"
            f" {used['output_tokens']} out, " + (f"${used['cost_usd']:.4f}" if used["cost_usd"] is not None
                                                  else f"no price for {used['model']} in data/prices.json"),
            f"  time: executing {used['execution_seconds']:.1f} s, waiting for a person"
            f" {used['waiting_for_person_seconds']:.1f} s, waiting for a provider"
            f" {used['waiting_for_provider_seconds']:.1f} s"]


# ---- counting repeated work -----------------------------------------------------------------------------------

def activity_runs(db_path: str | Path, workflow_id: str) -> dict[str, int]:
    """How often each answered outside call was made, by ledger operation (``turn:3``, ``read <passage>``)."""
    ledger = Ledger(ledger_path(db_path))
    runs: dict[str, int] = {}
    for call in ledger.calls(workflow_id=workflow_id):
        if call["kind"] in ("model", "source"):
            runs[call["operation"]] = runs.get(call["operation"], 0) + 1
    ledger.close()
    return runs
