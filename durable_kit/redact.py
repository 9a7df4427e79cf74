"""Floor 1: secrets stay out of the journal. Redaction before anything is persisted.

A journal keeps everything for good: inputs, outputs, error messages, the
history, escalation records. A deleted row's bytes also stay readable in the
file's free pages and in the write-ahead log until they are overwritten. So a
secret must never be written at all: every text the kit persists passes
through ``redact`` first, and what it replaces cannot be recovered from the
database afterwards.

Two kinds of secret are replaced by ``[REDACTED]``:

* text that looks like a credential (``PATTERNS``, plus any regular
  expressions listed one per line in ``$DURABLE_KIT_REDACT_PATTERNS``, read
  when the patterns are compiled: at the first redaction and after each new
  secret, so set it before the process starts);
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

REDACTED = "[REDACTED]"

# (text every match contains, the pattern). The text is looked for first, which is quick; each pattern starts
# with literal text too, which Python's regular expressions search for quickly, and a lookbehind after it
# stands for a leading word boundary (a leading \b would make every position of the text a candidate).
PATTERNS = (
    ("sk-", r"sk-[A-Za-z0-9_\-]{16,}"),                                       # API keys of the sk- family
    ("AKIA", r"AKIA(?<!\wAKIA)[0-9A-Z]{16}\b"),                               # cloud access key ids
    ("gh", r"gh[pousr]_(?<!\wgh[pousr]_)[A-Za-z0-9]{30,}"),                    # code-host tokens
    ("xox", r"xox[abprs]-(?<!\wxox[abprs]-)[A-Za-z0-9\-]{10,}"),               # chat-app tokens
    ("Bearer", r"Bearer(?<!\wBearer)\s+[A-Za-z0-9._\-]{16,}"),                 # bearer tokens in headers
    ("bearer", r"bearer(?<!\wbearer)\s+[A-Za-z0-9._\-]{16,}"),
    ("-----BEGIN", r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
)

_registered: set[str] = set()


def register_secret(value: str) -> None:
    """Redact ``value`` from everything this process writes from now on (values shorter than 6 are refused)."""
    if len(value) < 6:
        raise ValueError("a secret shorter than 6 characters cannot be redacted without damaging ordinary text")
    _registered.add(value)


_compiled_for: tuple[int, tuple[tuple[str | None, re.Pattern], ...]] | None = None


def _patterns() -> tuple[tuple[str | None, re.Pattern], ...]:
    # Compiled again only when a secret was registered (secrets are only ever added).
    global _compiled_for
    if _compiled_for is None or _compiled_for[0] != len(_registered):
        extra = os.environ.get("DURABLE_KIT_REDACT_PATTERNS", "")
        _compiled_for = (len(_registered), _compile(set(_registered), extra))
    return _compiled_for[1]


def _compile(registered: set[str], extra_patterns: str) -> tuple[tuple[str | None, re.Pattern], ...]:
    # Registered values first, longest first, each as written and as it appears inside a JSON string.
    forms = sorted({form for value in registered for form in (value, json.dumps(value)[1:-1])}, key=len, reverse=True)
    extra = [(None, p) for p in extra_patterns.splitlines() if p.strip()]  # no known text: always searched
    return tuple((anchor, re.compile(pattern))
                 for anchor, pattern in [*((form, re.escape(form)) for form in forms), *PATTERNS, *extra])


def redact(text: str | None) -> str | None:
    """``text`` with every secret replaced by ``[REDACTED]`` (None stays None)."""
    if not text:
        return text
    for anchor, pattern in _patterns():
        if anchor is None or anchor in text:
            text = pattern.sub(REDACTED, text)
    return text
