"""Floor 1: secrets stay out of the journal. Redaction before anything is persisted.

A journal keeps everything for good: inputs, outputs, error messages, the
history, escalation records. A deleted row's bytes also stay readable in the
file's free pages and in the write-ahead log until they are overwritten. So a
secret must never be written at all: every text the kit persists passes
through ``redact`` first, and what it replaces cannot be recovered from the
database afterwards.

Two kinds of secret are replaced by ``[REDACTED]``:

* text that looks like a credential (``PATTERNS``, plus any regular
  expressions listed one per line in ``$DURABLE_KIT_REDACT_PATTERNS``);
* values a workflow names as secret in this process (``register_secret``,
  or ``Workflow.secret(NAME)``, which reads an environment variable).

What it cannot do: recognise a secret that matches no pattern and was never
registered, or clean what was written before it was registered. Keep secrets
in the environment, never in a workflow's input.
"""
from __future__ import annotations

import json
import os
import re
from functools import lru_cache

REDACTED = "[REDACTED]"

PATTERNS = (
    r"sk-[A-Za-z0-9_\-]{16,}",                      # API keys of the sk- family
    r"\bAKIA[0-9A-Z]{16}\b",                        # cloud access key ids
    r"\bgh[pousr]_[A-Za-z0-9]{30,}",                # code-host tokens
    r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",             # chat-app tokens
    r"\b[Bb]earer\s+[A-Za-z0-9._\-]{16,}",         # bearer tokens in headers
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
)

_registered: set[str] = set()


def register_secret(value: str) -> None:
    """Redact ``value`` from everything this process writes from now on (values shorter than 6 are refused)."""
    if len(value) < 6:
        raise ValueError("a secret shorter than 6 characters cannot be redacted without damaging ordinary text")
    _registered.add(value)


@lru_cache(maxsize=8)
def _compiled(registered: frozenset[str], extra_patterns: str) -> re.Pattern:
    extra = [p for p in extra_patterns.splitlines() if p.strip()]
    forms = {form for value in registered for form in (value, json.dumps(value)[1:-1])}  # raw, and inside JSON
    literal = [re.escape(v) for v in sorted(forms, key=len, reverse=True)]
    return re.compile("|".join([*literal, *PATTERNS, *extra]))


def redact(text: str | None) -> str | None:
    """``text`` with every secret replaced by ``[REDACTED]`` (None stays None)."""
    if not text:
        return text
    pattern = _compiled(frozenset(_registered), os.environ.get("DURABLE_KIT_REDACT_PATTERNS", ""))
    return pattern.sub(REDACTED, text)
