"""A scriptable fake model that picks an agent's next tool: deterministic, offline, billed in the ledger.

A script is a list of rules, tried in order; the first rule whose ``when``
holds on the model's input decides the next action. The same input always
gives the same action, so a run is repeatable with no key and no network,
and yet the model reacts to what it is shown: a new answer from the user or
a newly stored passage changes which rule fires.

Conditions a rule's ``when`` may use (all must hold; ``{}`` always holds):

=================  ==========================================================
``turn``           the turn number equals this
``used_tool``      some earlier turn used this tool (``not_used_tool``: none did)
``last_tool``      the previous turn used this tool
``mentions``       every listed text is in the request or a user answer
``not_mentions``   none of the listed texts is
``has_passages``   every listed passage id is in the evidence index
``lacks_passages`` at least one listed passage id is not
``has_findings``   every listed finding id is held (shown or not)
``lacks_findings`` at least one listed finding id is not held
=================  ==========================================================

A rule's ``action`` is returned as it is: ``{"tool": ..., "args": {...}}``
plus, optionally, ``plan`` (searches it suggests for later) and ``gap`` (the
gap it works on). Write your own scripts in a JSON file or a Python list and
pass them to ``ScriptedModel``.

Every answered call is appended to the call ledger as kind ``model`` with its
token usage; a call refused during an outage (``set_outage``) is appended as
``model_refused`` with no tokens and raises ``ProviderUnavailable``. The
ledger connection is opened per thread, so the model may be called from the
worker threads of a parallel step.
"""
from __future__ import annotations

import json
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from .ledger import Ledger, ledger_path
from . import beside, connect_outside
from . import data_dir
from .llm import count_tokens

SCRIPTED_MODEL = "scripted-1"

OUTAGE_SCHEMA = "CREATE TABLE IF NOT EXISTS outages (model TEXT PRIMARY KEY, reason TEXT NOT NULL)"

CONDITIONS = ("turn", "used_tool", "not_used_tool", "last_tool", "mentions", "not_mentions",
              "has_passages", "lacks_passages", "has_findings", "lacks_findings")


class ProviderUnavailable(RuntimeError):
    """The model provider refused the call (an outage, a rate limit); nothing was produced or billed."""


class ScriptExhausted(RuntimeError):
    """No rule of the script matched the model's input."""


@lru_cache(maxsize=1)
def load_prices() -> dict:
    """The price table ``data/prices.json``: per model, dollars per million input and output tokens."""
    return json.loads((data_dir() / "prices.json").read_text())


def cost_of(model: str, input_tokens: int, output_tokens: int) -> float:
    """Dollars for this many tokens at the price table's rates; a model not in the table is an error."""
    models = load_prices()["models"]
    if model not in models:
        raise KeyError(f"model {model!r} has no price in data/prices.json; known: {sorted(models)}")
    rate = models[model]
    return (input_tokens * rate["input_per_million"] + output_tokens * rate["output_per_million"]) / 1_000_000


def provider_path(db_path: str | Path) -> Path:
    """Where the fake provider keeps its outage switch: ``x.db`` -> ``x.provider.db``."""
    return beside(db_path, "provider")


def set_outage(db_path: str | Path, reason: str = "503 Service Unavailable", model: str = SCRIPTED_MODEL) -> None:
    """From now on the fake provider refuses every call for ``model`` until ``clear_outage``."""
    conn = connect_outside(provider_path(db_path), OUTAGE_SCHEMA)
    conn.execute("INSERT OR REPLACE INTO outages (model, reason) VALUES (?, ?)", (model, reason))
    conn.close()


def clear_outage(db_path: str | Path, model: str = SCRIPTED_MODEL) -> None:
    """The provider answers ``model`` again."""
    conn = connect_outside(provider_path(db_path), OUTAGE_SCHEMA)
    conn.execute("DELETE FROM outages WHERE model = ?", (model,))
    conn.close()


def _outage(db_path: Path, model: str) -> str | None:
    conn = connect_outside(provider_path(db_path), OUTAGE_SCHEMA)
    try:
        row = conn.execute("SELECT reason FROM outages WHERE model = ?", (model,)).fetchone()
        return row["reason"] if row else None
    finally:
        conn.close()


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def matches(when: dict, context: dict) -> bool:
    """Whether every condition of ``when`` holds on ``context`` (see the module's table)."""
    unknown = sorted(set(when) - set(CONDITIONS))
    if unknown:
        raise ValueError(f"unknown script conditions {unknown}; known: {list(CONDITIONS)}")
    tools = [step["tool"] for step in context.get("history", [])]
    said = " ".join([context.get("request", ""), *context.get("user_input", [])])
    passages = set(context.get("evidence_index", []))
    findings = {f["id"] for f in context.get("findings", [])} | set(context.get("not_shown", {}).get("findings", []))
    tests = {
        "turn": lambda v: context.get("turn") == v,
        "used_tool": lambda v: v in tools,
        "not_used_tool": lambda v: v not in tools,
        "last_tool": lambda v: bool(tools) and tools[-1] == v,
        "mentions": lambda v: all(text in said for text in _as_list(v)),
        "not_mentions": lambda v: not any(text in said for text in _as_list(v)),
        "has_passages": lambda v: set(_as_list(v)) <= passages,
        "lacks_passages": lambda v: not set(_as_list(v)) <= passages,
        "has_findings": lambda v: set(_as_list(v)) <= findings,
        "lacks_findings": lambda v: not set(_as_list(v)) <= findings,
    }
    return all(tests[key](value) for key, value in when.items())


class ScriptedModel:
    """A model whose every answer is the first matching rule of its script; calls are billed in the ledger.

    ``decide(context)`` is one model call. It returns ``{"action", "rule",
    "model", "usage"}``, where usage counts the input's and the action's
    words as tokens (the stand-in tokenizer of ``fakes.llm``).
    """

    name = SCRIPTED_MODEL

    def __init__(self, script: list[dict], db_path: str | Path, workflow_id: str | None = None,
                 name: str = SCRIPTED_MODEL):
        self.script, self.db_path, self.workflow_id, self.name = script, Path(db_path), workflow_id, name
        self._local = threading.local()  # one ledger connection per thread: SQLite connections stay in theirs

    @property
    def ledger(self) -> Ledger:
        if getattr(self._local, "ledger", None) is None:
            self._local.ledger = Ledger(ledger_path(self.db_path))
        return self._local.ledger

    def decide(self, context: dict, operation: str | None = None) -> dict:
        """One model call: the action of the first rule that matches ``context``."""
        operation = operation or (f"turn:{context['turn']}" if "turn" in context else "decide")
        reason = _outage(self.db_path, self.name)
        if reason is not None:
            self.ledger.record("model_refused", operation, self.workflow_id)
            raise ProviderUnavailable(f"{self.name} refused {operation}: {reason}")
        for number, rule in enumerate(self.script, start=1):
            if matches(rule.get("when", {}), context):
                action = rule["action"]
                usage = {"input_tokens": count_tokens(context), "output_tokens": count_tokens(action)}
                self.ledger.record("model", operation, self.workflow_id, **usage)
                return {"action": action, "rule": rule.get("name", f"rule {number}"), "model": self.name,
                        "usage": usage}
        raise ScriptExhausted(
            f"no rule of the script matched {operation} (workflow {self.workflow_id!r}); add a last rule with "
            "an empty 'when' (for example a finish) so every input gets an answer.")
