"""Below the engine: secrets stay out of the journal. Redaction before anything is persisted.

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

Each shape is redacted whole: a key's tail with ``/``, ``+`` or ``=`` goes
with it, and a private key with no END line in the same text is redacted to
the end of that text. A value stored as JSON is redacted string by string,
after decoding, so no other field changes (``redact_value``: each string and
each key on its own, never a match across two strings; a secret split across
two strings is redacted in neither); a value whose keys would become the same
key once redacted is refused and nothing is stored (``Unredactable``). A
string under a key named ``aws_secret_access_key`` is redacted whole.

What it cannot do: recognise a secret that matches no pattern and was never
registered, or clean what was written before it was registered. Keep secrets
in the environment, never in a workflow's input.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

REDACTED = "[REDACTED]"
TAIL = r"[A-Za-z0-9_\-/+=]"  # what a key's tail may hold, / and + (base64) included: a key is redacted whole
_AWS_SECRET = r"(?i)(aws_secret_access_key['\"]?\s*[=:]\s*['\"]?)[A-Za-z0-9/+=]+"

# (text every match contains, the pattern, what replaces a match). The text is looked for first, which is quick
# (quickest when it is long, or one character);
# most patterns start with literal text too, which Python's regular expressions search for quickly, and a
# lookbehind after it stands for a leading word boundary (a leading \b would make every position a candidate).
PATTERNS = (
    ("sk-", rf"sk-(?<![A-Za-z0-9]sk-){TAIL}{{16,}}", REDACTED),                   # API keys of the sk- family
    ("k_live_", rf"(?<![A-Za-z0-9])[sr]k_live_{TAIL}{{10,}}", REDACTED),          # payment keys, secret or restricted
    ("k_test_", rf"(?<![A-Za-z0-9])[sr]k_test_{TAIL}{{10,}}", REDACTED),
    ("AIza", rf"AIza(?<![A-Za-z0-9]AIza){TAIL}{{30,}}", REDACTED),                # cloud API keys
    ("AKIA", r"AKIA(?<!\wAKIA)[0-9A-Z]{16}\b", REDACTED),                         # cloud access key ids
    ("ASIA", r"ASIA(?<!\wASIA)[0-9A-Z]{16}\b", REDACTED),                         # ... and temporary ones
    ("ccess_key", _AWS_SECRET, rf"\g<1>{REDACTED}"),                              # cloud secret keys, by their name
    ("CCESS_KEY", _AWS_SECRET, rf"\g<1>{REDACTED}"),
    (".eyJ", r"eyJ(?<![A-Za-z0-9_\-]eyJ)[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{2,}\.[A-Za-z0-9_\-/+=]*",
     REDACTED),                                                                   # JSON web tokens
    ("@", r"://[^\s/@\"'<>:]+:[^\s/\"'<>]*@", f"://{REDACTED}@"),              # user:password@ in a URL
    ("gh", r"gh[pousr]_(?<!\wgh[pousr]_)[A-Za-z0-9]{30,}", REDACTED),             # code-host tokens
    ("xox", r"xox[abprs]-(?<!\wxox[abprs]-)[A-Za-z0-9\-]{10,}", REDACTED),        # chat-app tokens
    ("earer", r"[Bb]earer(?<!\w[Bb]earer)\s+[A-Za-z0-9._~\-/+=]{16,}", REDACTED),  # bearer tokens in headers
    # A private key, to its END line; with no END line in the same text, to the end of the text.
    ("-----BEGIN", r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----|[\s\S]*)",
     REDACTED),
)
SECRET_KEYS = ("aws_secret_access_key",)  # a string stored under such a key (any case) is redacted whole

_registered: set[str] = set()


class Unredactable(ValueError):
    """A value cannot be redacted without losing part of it (two keys would become one); nothing was stored."""


def register_secret(value: str) -> None:
    """Redact ``value`` from everything this process writes from now on (values shorter than 6 are refused)."""
    if len(value) < 6:
        raise ValueError("a secret shorter than 6 characters cannot be redacted without damaging ordinary text")
    _registered.add(value)


Entry = tuple  # (the text every match contains, or None: always searched; the compiled pattern; its replacement)
Group = tuple  # (what a JSON text holds if one of its strings may match, the same as a pattern or None, entries)
_compiled_for: tuple[int, tuple[Entry, ...], tuple[Group, ...]] | None = None


def _patterns() -> tuple[tuple[Entry, ...], tuple[Group, ...]]:
    # Compiled again only when a secret was registered (secrets are only ever added).
    global _compiled_for
    if _compiled_for is None or _compiled_for[0] != len(_registered):
        extra = os.environ.get("DURABLE_KIT_REDACT_PATTERNS", "")
        _compiled_for = (len(_registered), *_compile(set(_registered), extra))
    return _compiled_for[1], _compiled_for[2]


def _compile(registered: set[str], extra_patterns: str) -> tuple[tuple[Entry, ...], tuple[Group, ...]]:
    # Registered values first, longest first, each as written and as it appears inside a JSON string.
    # In JSON text a string's characters may be escaped (a newline as \n, a quote as \"), so each group says
    # what to look for there: a registered value as JSON escapes it; a pattern's text, then the pattern without
    # its lookbehind (an escape may stand before a match), or, if it may match whitespace (which JSON writes as
    # an escape), its text alone.
    groups: list[Group] = []
    for value in sorted(registered, key=len, reverse=True):
        forms = sorted({value, json.dumps(value)[1:-1]}, key=len, reverse=True)
        groups.append((json.dumps(value)[1:-1], None, tuple((f, re.compile(re.escape(f)), REDACTED) for f in forms)))
    for anchor, pattern, replacement in PATTERNS:
        whitespace = r"\s" in pattern.replace(r"[^\s", "")  # \s outside a class that excludes it
        prefilter = None if whitespace else re.compile(re.sub(r"\(\?<!.*?\)", "", pattern))
        groups.append((anchor, prefilter, ((anchor, re.compile(pattern), replacement),)))
    groups += [(None, None, ((None, re.compile(p), REDACTED),)) for p in extra_patterns.splitlines() if p.strip()]
    return tuple(entry for group in groups for entry in group[2]), tuple(groups)


def _redact_with(text: str, entries: tuple[Entry, ...]) -> str:
    for anchor, pattern, replacement in entries:
        if anchor is None or anchor in text:
            text = pattern.sub(replacement, text)
    return text


def redact(text: str | None) -> str | None:
    """``text`` with every secret replaced by ``[REDACTED]`` (None stays None)."""
    if not text:
        return text
    return _redact_with(text, _patterns()[0])


def secrets_in_json(json_text: str) -> tuple[Entry, ...]:
    """The patterns that may match inside some string of ``json_text``; none (the usual case) means no secret is there.

    A quick look at the text: each pattern's literal text first, then the
    pattern itself where JSON's escapes cannot hide a match.
    """
    found: tuple[Entry, ...] = ()
    for anchor, prefilter, entries in _patterns()[1]:
        if anchor is None or (anchor in json_text and (prefilter is None or prefilter.search(json_text))):
            found += entries
    return found


def redact_value(value: Any, entries: tuple[Entry, ...] | None = None, path: str = "$") -> Any:
    """A JSON value with each string and key redacted on its own; ``value`` itself if nothing changed.

    ``entries`` (from ``secrets_in_json``) limits the patterns tried; every
    string under a key named in ``SECRET_KEYS`` is redacted whole. Raises
    ``Unredactable`` (naming the path, never the secret) if two keys of one
    object would become the same key, which would lose all but one.
    """
    entries = _patterns()[0] if entries is None else entries
    if isinstance(value, str):
        return _redact_with(value, entries)
    if isinstance(value, list):
        items = [redact_value(item, entries, f"{path}[{i}]") for i, item in enumerate(value)]
        return value if all(a is b for a, b in zip(items, value)) else items
    if not isinstance(value, dict):
        return value
    changed, cleaned = False, {}
    for key, item in value.items():
        new_key = _redact_with(key, entries)
        if isinstance(item, str) and key.lower() in SECRET_KEYS:
            new_item = REDACTED
        else:
            new_item = redact_value(item, entries, f"{path}.{new_key}")
        if new_key in cleaned:
            same = sum(1 for k in value if _redact_with(k, entries) == new_key)
            raise Unredactable(f"{same} keys of {path} become the same key, {new_key!r}, once secrets are redacted, "
                               "and all but one would be lost")
        changed = changed or new_key is not key or new_item is not item
        cleaned[new_key] = new_item
    return cleaned if changed else value
