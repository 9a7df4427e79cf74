"""Optional: a real model behind the same ``decide(context)`` interface as ``ScriptedModel``.

Any OpenAI-compatible chat-completions endpoint, spoken with the standard
library (``urllib``), configured only by environment variables:

* ``DURABLE_KIT_LLM_BASE_URL``: for example ``https://api.example.com/v1``
* ``DURABLE_KIT_LLM_MODEL``: the model name the endpoint expects
* ``DURABLE_KIT_LLM_API_KEY``: sent as a bearer token (optional for a local server)

Nothing in the workshop's tests or notebooks calls a network: they use the
scripted fake. Start a loop with input ``{"case": ..., "model": "provider"}``
to use this adapter instead. Each answered call is billed in the call ledger
as ``model`` with the usage the endpoint reports; a refusal (HTTP 429 or 5xx,
no connection) raises ``ProviderUnavailable``, which the loop turns into a
*paused* workflow. An answer that is not one JSON action raises ``ValueError``.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from .ledger import Ledger, ledger_path
from .scripted import ProviderUnavailable

ENVIRONMENT = ("DURABLE_KIT_LLM_BASE_URL", "DURABLE_KIT_LLM_MODEL", "DURABLE_KIT_LLM_API_KEY")

INSTRUCTIONS = (
    "You are a research agent. You receive the saved state of a research task as JSON. Answer with one JSON "
    "object and nothing else: {\"tool\": one of the listed tools, \"args\": {...}, \"gap\": the gap it works on, "
    "\"plan\": [searches to do later]}. search args: query, period. read args: passages (ids from "
    "evidence_index or the last search). note_finding args: id, claim, company, period, cites (passage ids you "
    "read). ask_user args: question. recall args: query. finish args: summary. Planned searches are suggestions: "
    "change them when the user's input or new evidence calls for it. Cite only passages you have read."
)


class ProviderNotConfigured(RuntimeError):
    """The adapter's environment variables are not set; no request was sent."""


class OpenAICompatibleModel:
    """``decide(context)`` through an OpenAI-compatible ``/chat/completions`` endpoint."""

    def __init__(self, base_url: str, model: str, api_key: str | None, db_path: str | Path,
                 workflow_id: str | None = None, timeout: float = 60):
        self.base_url, self.name, self.api_key = base_url.rstrip("/"), model, api_key
        self.db_path, self.workflow_id, self.timeout = Path(db_path), workflow_id, timeout

    @classmethod
    def from_environment(cls, db_path: str | Path, workflow_id: str | None = None) -> "OpenAICompatibleModel":
        """Configured from ``DURABLE_KIT_LLM_*``; ``ProviderNotConfigured`` naming what is missing otherwise."""
        base_url, model = os.environ.get(ENVIRONMENT[0]), os.environ.get(ENVIRONMENT[1])
        missing = [name for name, value in zip(ENVIRONMENT[:2], (base_url, model)) if not value]
        if missing:
            raise ProviderNotConfigured(
                f"the real-model adapter needs {' and '.join(missing)} (and usually {ENVIRONMENT[2]}); "
                "set them, or run the loop with the scripted fake model (the default), which needs no network.")
        return cls(base_url, model, os.environ.get(ENVIRONMENT[2]), db_path, workflow_id)

    def decide(self, context: dict, operation: str | None = None) -> dict:
        """One model call; returns ``{"action", "rule", "model", "usage"}`` like ``ScriptedModel.decide``."""
        operation = operation or f"turn:{context.get('turn', '?')}"
        body = {"model": self.name, "temperature": 0, "response_format": {"type": "json_object"},
                "messages": [{"role": "system", "content": INSTRUCTIONS},
                             {"role": "user", "content": json.dumps(context, sort_keys=True)}]}
        request = urllib.request.Request(f"{self.base_url}/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": f"Bearer {self.api_key}"}
                                                     if self.api_key else {})})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                reply = json.loads(response.read())
        except urllib.error.HTTPError as error:
            if error.code == 429 or error.code >= 500:
                raise ProviderUnavailable(f"{self.name} answered HTTP {error.code} to {operation}") from error
            raise
        except (urllib.error.URLError, TimeoutError) as error:
            raise ProviderUnavailable(f"{self.name} did not answer {operation}: {error}") from error
        reported = reply.get("usage") or {}
        usage = {"input_tokens": reported.get("prompt_tokens", 0), "output_tokens": reported.get("completion_tokens", 0)}
        ledger = Ledger(ledger_path(self.db_path))
        ledger.record("model", operation, self.workflow_id, **usage)
        ledger.close()
        text = reply["choices"][0]["message"]["content"]
        try:
            action = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{self.name} answered {operation} with text that is not one JSON action: "
                             f"{text[:200]!r}") from error
        if not isinstance(action, dict) or "tool" not in action:
            raise ValueError(f"{self.name} answered {operation} without a 'tool': {text[:200]!r}")
        return {"action": action, "rule": "provider", "model": self.name, "usage": usage}
