"""Below the engine: secrets stay out of the journal. Redaction before anything is persisted.

A journal keeps everything for good: inputs, outputs, error messages, the
history, escalation records. A deleted row's bytes also stay readable in the
file's free pages and in the write-ahead log until they are overwritten. So a
secret must never be written at all: every text the kit persists passes
through ``redact`` first, and what it replaces cannot be recovered from the
database afterwards.

Three kinds of secret are replaced by ``[REDACTED]``:

* text shaped like a credential (``SHAPES``): source hosts' tokens (GitHub
  ``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_`` and fine-grained
  ``github_pat_``; GitLab ``glpat-``, ``gldt-``, ``glrt-``, ``glrtr-``,
  ``glptt-``, ``glcbt-``, ``gloas-``, ``glsoat-``, ``glffct-``, ``glimt-``,
  ``glagent-``, ``glft-``); chat (Slack ``xox`` and a letter, ``xoxe.xoxp-``
  and ``xapp-`` tokens and ``hooks.slack.com`` webhook paths; Discord bot
  tokens and ``/api/webhooks/`` paths; Telegram bot tokens after the bot's
  id); model providers (``sk-`` keys: OpenAI ``sk-``, ``sk-proj-``,
  Anthropic ``sk-ant-`` and others of that family; Hugging Face ``hf_`` and
  ``api_org_``; Groq ``gsk_``; Replicate ``r8_``; xAI ``xai-``; Perplexity
  ``pplx-``); clouds (Google ``AIza`` keys, ``ya29.`` access tokens,
  ``GOCSPX-`` client secrets, ``1//0`` refresh tokens; AWS ``AKIA`` and
  ``ASIA`` key ids; Azure AD client secrets, ``Q~`` after three characters and
  a digit; Vault ``hvs.``, ``hvb.``, ``hvr.``; DigitalOcean ``dop_v1_``,
  ``doo_v1_``, ``dor_v1_``); package registries (npm ``npm_``, PyPI
  ``pypi-Ag``, Docker Hub ``dckr_pat_``, RubyGems ``rubygems_``); payments
  (Stripe ``sk_`` and ``rk_`` keys, live and test, and ``whsec_``; Square
  ``EAAA``, ``sq0atp-``, ``sq0csp-``; Braintree ``access_token$``; Shopify
  ``shpat_``, ``shpss_``, ``shpca_``, ``shppa_``; SendGrid ``SG.``); JSON web
  tokens; ``Bearer`` tokens (any case); private keys (PEM, OpenSSH, PGP); and
  a URL's ``user:password@``, the user possibly empty (``postgres://``,
  ``mongodb+srv://``, ``redis://:password@``, ``amqp://``);
* values by their name, in any case (``NAMES``): after a name ending in
  ``password``, ``passwd``, ``passphrase``, ``pwd`` or ``secret``, or in
  ``key`` or ``token`` right after ``api``, ``access``, ``auth``,
  ``bearer``, ``bot``, ``client``, ``private``, ``refresh``, ``secret``,
  ``security``, ``session``, ``signing``, ``account``, ``master``,
  ``encryption``, ``webhook``, ``app``, ``sas`` or ``vault`` (joined by
  nothing, ``_``, ``-`` or ``.``: ``api_key``, ``X-Api-Key``,
  ``AccountKey``, ``client_secret``, ``access_token``), then ``=`` or ``:``,
  the value: quoted, to its closing quote; unquoted, to the next whitespace,
  quote, comma, ``;``, ``&``, ``<``, ``>``, ``}`` or ``]``; so ``key=value``
  and ``key: value`` text, query strings, connection strings and headers. An
  ``Authorization`` or ``Proxy-Authorization`` value goes with its scheme
  (``Basic``, ``Bearer``, ``Bot``). A query-string parameter named
  ``token``, ``key``, ``sig``, ``signature``, ``X-Amz-Signature`` or
  ``X-Goog-Signature`` goes to the next ``&`` or ``#``. After ``token`` (alone
  or after ``_``, ``-`` or ``.``, as in ``GITHUB_TOKEN``) and ``=`` or ``:``,
  a value of 16 or more letters, digits and ``_-.+/=~%`` with a letter and a
  digit goes (a fencing token or a count stays). A non-empty string stored
  under a JSON key whose name ends in one of these names, or in
  ``authorization``, goes whole (``SECRET_NAMES``; a bare ``key`` or
  ``token``, such as an idempotency key or a fencing token, is no such
  name). Any regular expressions listed one per line in
  ``$DURABLE_KIT_REDACT_PATTERNS`` are added; they are read when the
  patterns are compiled: at the first redaction and after each new secret, so
  set it before the process starts;
* values a workflow names as secret in this process (``register_secret``,
  or ``Workflow.secret(NAME)``, which reads an environment variable).

Each shape is redacted whole: a key's tail with ``/``, ``+`` or ``=`` goes
with it, and a private key with no END line in the same text is redacted to
the end of that text. A value stored as JSON is redacted string by string,
after decoding, so no other field changes (``redact_value``: each string and
each key on its own, never a match across two strings; a secret split across
two strings is redacted in neither); a value whose keys would become the same
key once redacted is refused and nothing is stored (``Unredactable``). An
outbox payload is sent as it was stored, so a secret in it arrives redacted.

What it cannot do: recognise a secret that has none of these shapes, stands
after none of these names and was never registered (a password in a
sentence, a value under a bare ``key``, a key that looks like no provider's);
see the rest of a value past a stop above, or a URL's password that holds an
unescaped ``/``, quote, ``<`` or ``>``; or clean what was written before it
was registered. Keep secrets in the environment, never in a workflow's
input.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, NamedTuple

REDACTED = "[REDACTED]"
TAIL = r"[A-Za-z0-9_\-/+=]"  # what a key's tail may hold, / and + (base64) included: a key is redacted whole
TOKEN = r"[A-Za-z0-9_\-]"  # base64url
ALNUM = r"[A-Za-z0-9]"


def _prefixed(character: str, prefix: str, tail: str, least: int) -> tuple:
    # A row of SHAPES: ``prefix`` (literal text first, then a lookbehind standing for a word boundary before it),
    # then ``least`` or more characters of ``tail``.
    literal = re.escape(prefix)
    return character, prefix, rf"{literal}(?<![A-Za-z0-9]{literal}){tail}{{{least},}}", REDACTED


# Shapes, searched in the text as it is: (a character every match holds; a text every match holds, or several, one
# of which it holds; the pattern; what replaces a match; and, where a text lacks the character, what stands around
# it in a match). The character is looked for first, so most texts never get past the first look. For a character
# that many shapes hold (GATED) and that a text holds sparsely, one pass over the text finds every place it stands
# as it does in some shape; otherwise the shapes' texts are looked for one by one. Most patterns start with literal text too, which Python's regular
# expressions search for quickly, and a lookbehind after it stands for a leading word boundary (a leading \b would
# make every position a candidate).
SHAPES = (
    # A private key, to its END line; with no END line in the same text, to the end of the text.
    ("-", "-----BEGIN ", r"-----BEGIN [A-Z ]*PRIVATE KEY(?: BLOCK)?-----"
                            r"(?:[\s\S]*?-----END [A-Z ]*PRIVATE KEY(?: BLOCK)?-----|[\s\S]*)", REDACTED),
    # A URL's user:password@ (the user may be empty), and webhook URLs, whose path is the secret.
    (":", "://", r"://[^\s/@\"'<>:]*:[^\s/\"'<>]*@", f"://{REDACTED}@"),
    ("/", "hooks.slack.com/", r"(hooks\.slack\.com/)[A-Za-z0-9_/\-]+", rf"\g<1>{REDACTED}"),
    ("/", "/api/webhooks/", r"(/api/webhooks/)[A-Za-z0-9_/\-]+", rf"\g<1>{REDACTED}"),
    # Source hosts.
    ("_", "gh", r"gh[pousr]_(?<!\wgh[pousr]_)[A-Za-z0-9]{30,}", REDACTED, r"(?<=gh[pousr]_)"),
    ("_", "github_pat_", r"github_pat_(?<!\wgithub_pat_)[A-Za-z0-9_]{22,}", REDACTED),
    ("-", "gl",
     r"gl(?<![A-Za-z0-9]gl)(?:pat|dt|rt|rtr|ptt|cbt|oas|soat|ffct|imt|agent|ft)-[A-Za-z0-9_\-.]{20,}", REDACTED,
     r"(?:(?<=gl[a-z]{2}-)|(?<=gl[a-z]{3}-)|(?<=gl[a-z]{4}-)|(?<=glagent-))"),
    # Chat: Slack; a Discord bot token (the bot's id in base64: its decimal digits make each group of four
    # characters one of these), a timestamp and a signature; a Telegram bot's token after its id.
    ("-", "xox", r"xox[a-z](?<!\wxox[a-z])(?:\.xox[a-z])?-[A-Za-z0-9_\-%]{10,}", REDACTED, r"(?<=xox[a-z]-)"),
    ("-", "xapp-", r"xapp-(?<!\wxapp-)\d-[A-Za-z0-9\-]{10,}", REDACTED),
    (".", re.compile(rf"\.{TOKEN}{{6}}\.{TOKEN}{{27}}"),
     rf"[MNO](?<![\w\-][MNO])[DTjz][AEIMQUYcgk][w-z0-5](?:[MNO][DTjz][AEIMQUYcgk][w-z0-5]){{4,5}}"
     rf"(?:[MNO][DTjz][AEIMQUYcgk]|[MNO][AQgw])?={{0,2}}\.{TOKEN}{{6}}\.{TOKEN}{{27,}}", REDACTED),
    (":", ":AA", rf":AA(?<=\d:AA){TOKEN}{{30,}}", f":{REDACTED}"),
    # Model providers.
    _prefixed("-", "sk-", TAIL, 16),  # sk-, sk-proj-, sk-ant-, ...
    _prefixed("_", "hf_", ALNUM, 30),
    _prefixed("_", "api_org_", ALNUM, 30),
    _prefixed("_", "gsk_", ALNUM, 40),
    _prefixed("_", "r8_", ALNUM, 30),
    _prefixed("-", "xai-", ALNUM, 40),
    _prefixed("-", "pplx-", ALNUM, 40),
    # Clouds.
    _prefixed("A", "AIza", TAIL, 30),
    _prefixed(".", "ya29.", r"[A-Za-z0-9_\-.]", 20),
    _prefixed("-", "GOCSPX-", TOKEN, 20),
    ("/", "1//0", rf"1//0(?<![A-Za-z0-9/]1//0){TOKEN}{{30,}}", REDACTED),
    ("A", ("AKIA", "ASIA"), r"A(?:KIA|SIA)(?<!\wA[KS]IA)[0-9A-Z]{16}\b", REDACTED),
    ("~", "Q~", r"(?<![A-Za-z0-9_~.\-])[A-Za-z0-9_~.\-]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}", REDACTED),
    (".", "hv", rf"hv[sbr]\.(?<![A-Za-z0-9]hv[sbr]\.){TOKEN}{{20,}}", REDACTED, r"(?<=hv[sbr]\.)"),
    ("_", "_v1_", r"do[opr]_v1_(?<![A-Za-z0-9]do[opr]_v1_)[a-f0-9]{64}", REDACTED),
    # Package registries.
    _prefixed("_", "npm_", ALNUM, 30),
    _prefixed("-", "pypi-Ag", TOKEN, 50),
    _prefixed("_", "dckr_pat_", TOKEN, 20),
    ("_", "rubygems_", r"rubygems_(?<![A-Za-z0-9]rubygems_)[a-f0-9]{48}", REDACTED),
    # Payments.
    ("_", ("k_live_", "k_test_"), rf"(?<![A-Za-z0-9])[sr]k_(?:live|test)_{TAIL}{{10,}}", REDACTED),
    _prefixed("_", "whsec_", TAIL, 20),
    ("-", "sq0", rf"sq0(?<![A-Za-z0-9]sq0)(?:atp|csp)-{TOKEN}{{22,}}", REDACTED, r"(?<=sq0[a-z]{3}-)"),
    _prefixed("A", "EAAA", TAIL, 50),
    ("$", "access_token$", r"access_token\$(?:production|sandbox)\$[0-9a-z]{16}\$[0-9a-f]{32}", REDACTED),
    ("_", "shp", r"shp(?<![A-Za-z0-9]shp)(?:at|ss|ca|pa)_[a-fA-F0-9]{32}", REDACTED, r"(?<=shp[a-z]{2}_)"),
    (".", "SG.", rf"SG\.(?<![A-Za-z0-9]SG\.){TOKEN}{{16,}}\.{TOKEN}{{30,}}", REDACTED),
    # JSON web tokens, of any issuer.
    (".", ".eyJ", r"eyJ(?<![A-Za-z0-9_\-]eyJ)[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{2,}\.[A-Za-z0-9_\-/+=]*", REDACTED),
)

# Values by their name, in any case: searched in the text's lower-case copy, and what the group "value" matched is
# replaced by [REDACTED].
QUALIFIERS = ("api", "access", "auth", "bearer", "bot", "client", "private", "refresh", "secret", "security",
              "session", "signing", "account", "master", "encryption", "webhook", "app", "sas", "vault")
SEPARATOR = r"[\"']?[ \t]*[:=][ \t]*"  # after a name: its closing quote, blanks, = or :, blanks
IN_JSON = r"[\s\"'\\t]*[:=]"  # the same in JSON text, where a quote or a tab may be escaped
STOPS = r"[^\s\"'`,;&<>}\]]+"  # an unquoted value runs to the next blank, quote, comma, ;, &, <, >, } or ]
# A value: quoted, up to its closing quote; else up to a stop (a value already redacted stays as it is).
VALUE = r"(?P<q>[\"'])?(?P<value>(?(q)(?:(?!(?P=q))[^\\\r\n]|\\.)+|(?:\[redacted\]|{stops})))(?(q)(?P=q))"


def _named(name: str, text: str | tuple[str, ...], value: str = VALUE.format(stops=STOPS), after: tuple[str, ...] = ()) -> tuple:
    # A row of NAMES: ``name`` (literal text first, quick to search), a separator and a value; in JSON text, the
    # name then its separator.
    return ":=", text, rf"{name}(?={SEPARATOR}){SEPARATOR}{value}", name + IN_JSON, after


# A key or a token is secret after a qualifier, joined by nothing, _, - or . (api_key, apikey, x-api-key, AccountKey).
QUALIFIED = tuple(qualifier + joint for qualifier in QUALIFIERS for joint in ("", "_", "-", "."))
CREDENTIAL = r"[\"']?(?P<value>(?=[a-z0-9_.+/=~%\-]*[0-9])(?=[a-z0-9_.+/=~%\-]*[a-z])[a-z0-9_.+/=~%\-]{16,})"
QUERY = r"(?=(?i:(?:x-amz-|x-goog-)?(?:token|key|sig|signature))=)"  # after ? or &: a parameter so named
# (characters, one of which every match holds; a text every match holds, or several, one of which it holds; the
# pattern; what JSON text holding a match matches; what the text before a match ends with, one of them; and,
# instead of the texts, what stands around a gated character in a match.)
NAMES = (
    _named("authorization", "authorization", VALUE.format(stops=rf"(?:[a-z][\w\-]*[ \t]+)?{STOPS}")),  # its scheme
    _named("pass(?:word|wd|phrase)", ("passw", "passp")),
    _named("pwd", "pwd"),
    _named("secret", "secret"),
    _named(r"key(?<=[a-z_.\-]key)", "key", after=QUALIFIED),
    _named(r"token(?<=[a-z_.\-]token)", "token", after=QUALIFIED),
    (":=", "token", rf"token(?<![a-z0-9]token){SEPARATOR}{CREDENTIAL}",             # GITHUB_TOKEN=, token:
     rf"token(?<![a-z0-9]token){IN_JSON}", ()),
    ("?&", ("token=", "key=", "sig=", "signature="),                                   # in a URL's query string
     r"=(?:(?<=[?&]token=)|(?<=[?&]key=)|(?<=[?&]sig=)|(?<=[?&]signature=)|(?<=[?&]x-amz-signature=)"
     r"|(?<=[?&]x-goog-signature=))(?P<value>[^\s&#\"'<>]+)", None, (), (("?", QUERY), ("&", QUERY))),
    ("", "bearer", r"(?P<value>bearer(?<!\w.{6})\s+[a-z0-9._~\-/+=]{16,})", None, ()),
)
GATED = "-_.A?&"  # characters that many rules' matches hold: one pass over the places one stands finds them all,
SPARSE = 32  # if it stands less than once in this many characters (else the rules' texts are looked for, faster)
# A string stored under a JSON key that ends so (in lower case) is redacted whole.
SECRET_NAMES = ("password", "passwd", "passphrase", "pwd", "secret", "authorization",
                *(qualified + word for qualified in QUALIFIED for word in ("key", "token")))

_registered: set[str] = set()


class Unredactable(ValueError):
    """A value cannot be redacted without losing part of it (two keys would become one); nothing was stored."""


def register_secret(value: str) -> None:
    """Redact ``value`` from everything this process writes from now on (values shorter than 6 are refused)."""
    if len(value) < 6:
        raise ValueError("a secret shorter than 6 characters cannot be redacted without damaging ordinary text")
    _registered.add(value)


class Rule(NamedTuple):
    """One pattern, what any text holding a match holds, and what JSON text holding one looks like."""
    holds: str  # characters, one of which every match holds ("": none is known)
    lower: bool  # the pattern is searched in the text's lower-case copy
    pattern: re.Pattern
    after: tuple[str, ...]  # what the text before a match ends with, one of them (): anything
    replacement: str | None  # None: what the group "value" matched is replaced by [REDACTED]
    in_json: re.Pattern | None  # what JSON text holding a match matches, searched alike (None: what was looked for)


# How a text is looked at before any rule's pattern is searched in it:
Gates = tuple  # ((a character, one pattern for what stands around it in a match of any rule, {group: rule},
#                  ((whether in lower case, a text, the rules that need it), ...)), ...)
Scans = tuple  # ((characters or "", whether in lower case, ((a text, the rules that need it), ...)), ...)
_compiled_for: tuple[int, tuple] | None = None


def _patterns() -> tuple[tuple[Rule, ...], Gates, Scans]:
    # Compiled again only when a secret was registered (secrets are only ever added).
    global _compiled_for
    if _compiled_for is None or _compiled_for[0] != len(_registered):
        extra = os.environ.get("DURABLE_KIT_REDACT_PATTERNS", "")
        _compiled_for = (len(_registered), _compile(set(_registered), extra))
    return _compiled_for[1]


def _mark(character: str, texts: tuple) -> str:
    # What stands around ``character`` in a match, from the texts (each holding it) that every match holds one of.
    marks = []
    for text in texts:
        if not isinstance(text, str):  # a quick pattern that starts with the character
            marks.append(f"(?={text.pattern[len(re.escape(character)):]})")
            continue
        at = text.index(character)
        marks.append(f"(?<={re.escape(text[:at + 1])})" + (f"(?={re.escape(text[at + 1:])})" if text[at + 1:] else ""))
    return "(?:" + "|".join(marks) + ")"


def _compile(registered: set[str], extra_patterns: str) -> tuple[tuple[Rule, ...], Gates, Scans]:
    # Registered values first, longest first, each as written and as it appears inside a JSON string.
    # In JSON text a string's characters may be escaped (a newline as \n, a quote as \"), so each rule says what
    # JSON text holding a match looks like: a registered value as JSON escapes it (one of its texts); a name, then
    # quotes and blanks, perhaps escaped, then = or :; a shape's pattern without its lookbehinds (an escape may
    # stand before a match), or, if it may match whitespace (which JSON writes as an escape), its texts alone.
    rules: list[Rule] = []
    marks: dict[str, list[tuple[str, int]]] = {}
    scans: dict[tuple[str, bool], dict[Any, list[int]]] = {}
    dense: dict[str, dict[tuple[bool, Any], list[int]]] = {}  # a gated character's rules by their texts
    for value in sorted(registered, key=len, reverse=True):
        forms = sorted({value, json.dumps(value)[1:-1]}, key=len, reverse=True)
        for form in forms:
            scans.setdefault(("", False), {}).setdefault(form, []).append(len(rules))
        rules.append(Rule("", False, re.compile("|".join(map(re.escape, forms))), (), REDACTED, None))
    for character, texts, pattern, replacement, *mark in SHAPES:
        whitespace = re.search(r"\\s|\\n| ", pattern.replace(r"[^\s", ""))
        in_json = None if whitespace else re.compile(re.sub(r"\(\?<[!=].*?\)", "", pattern))
        texts = texts if isinstance(texts, tuple) else (texts,)
        if character in GATED:
            marks.setdefault(character, []).append((mark[0] if mark else _mark(character, texts), len(rules)))
            for text in texts:
                dense.setdefault(character, {}).setdefault((False, text), []).append(len(rules))
        else:
            for text in texts:
                scans.setdefault((character, False), {}).setdefault(text, []).append(len(rules))
        rules.append(Rule(character, False, re.compile(pattern), (), replacement, in_json))
    for holds, texts, pattern, in_json, after, *gated in NAMES:
        for character, mark in gated[0] if gated else ():
            marks.setdefault(character, []).append((mark, len(rules)))
            for text in texts if isinstance(texts, tuple) else (texts,):
                dense.setdefault(character, {}).setdefault((True, text), []).append(len(rules))
        for text in () if gated else (texts if isinstance(texts, tuple) else (texts,)):
            scans.setdefault((holds, True), {}).setdefault(text, []).append(len(rules))
        rules.append(Rule(holds, True, re.compile(pattern), after, None, in_json and re.compile(in_json)))
    for extra in extra_patterns.splitlines():
        if extra.strip():
            scans.setdefault(("", False), {}).setdefault("", []).append(len(rules))  # "" is in every text
            rules.append(Rule("", False, re.compile(extra), (), REDACTED, None))
    gates = tuple((character, re.compile(re.escape(character) + "(?:" + "|".join(
                       f"{mark}(?P<r{index}>)" for mark, index in members) + ")"), {f"r{i}": i for _, i in members},
                   tuple((lower, text, tuple(indexes)) for (lower, text), indexes in dense[character].items()))
                  for character, members in marks.items())
    return tuple(rules), gates, tuple((holds, lower, tuple((text, tuple(indexes)) for text, indexes in texts.items()))
                                      for (holds, lower), texts in scans.items())


def _lower(text: str) -> str:
    # Lower case, one character for one (a character whose lower case is longer stays), so positions line up.
    low = text.lower()
    return low if len(low) == len(text) else "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


def _rules_in(text: str) -> tuple[list[Rule], str | None]:
    # The rules ``text`` may hold a match of, in order, and its lower-case copy if one was made: for each gated
    # character it holds, one pass over the places that character stands as in a match of some rule; then, for the
    # other rules, their characters and their texts.
    rules, gates, scans = _patterns()
    found = []
    low = None
    for character, gate, groups, texts in gates:
        if character not in text:
            continue
        if text.count(character) * SPARSE < len(text):  # a pass over its few places
            first = gate.search(text)
            if first is not None:
                found += [groups[match.lastgroup] for match in gate.finditer(text, first.start())]
            continue
        for lower, piece, indexes in texts:  # too many places: the rules' texts, one by one
            if lower and low is None:
                low = _lower(text)
            if piece in (low if lower else text) if piece.__class__ is str else piece.search(text):
                found += indexes
    for holds, lower, texts in scans:
        if holds and holds[0] not in text and holds[-1] not in text:  # at most two characters
            continue
        if lower and low is None:
            low = _lower(text)
        for piece, indexes in texts:
            if piece in (low if lower else text):
                found += indexes
    return ([rules[index] for index in sorted(set(found))] if found else []), low


def _qualified(rule: Rule, match: re.Match, low: str) -> bool:
    # Whether the text before a match ends as the rule needs (one of ``rule.after``; anything if it names none).
    return not rule.after or low.endswith(rule.after, 0, match.start())


def _apply(rule: Rule, text: str, low: str | None = None) -> str:
    # ``text`` with the rule's matches replaced; ``low``, if given, is its lower-case copy.
    if rule.replacement is not None:
        return rule.pattern.sub(rule.replacement, text)
    pieces, last = [], 0
    low = _lower(text) if low is None else low
    for match in rule.pattern.finditer(low):
        if not _qualified(rule, match, low):
            continue
        start, end = match.span("value")
        pieces += (text[last:start], REDACTED)
        last = end
    return "".join(pieces) + text[last:] if pieces else text


def redact(text: str | None) -> str | None:
    """``text`` with every secret replaced by ``[REDACTED]`` (None stays None)."""
    if not text:
        return text
    rules, low = _rules_in(text)
    for rule in rules:
        redacted = _apply(rule, text, low)
        if redacted is not text:
            text, low = redacted, None
    return text


def secrets_in_json(json_text: str) -> tuple[Rule, ...]:
    """The rules that may match inside some string of ``json_text``; none (the usual case) means no secret is there.

    A quick look at the text: each rule's characters and literal texts
    first, then what JSON text holding a match looks like.
    """
    found = []
    rules, low = _rules_in(json_text)
    for rule in rules:
        if rule.in_json is not None:
            if rule.lower and low is None:
                low = _lower(json_text)
            where = low if rule.lower else json_text
            if rule.after:
                if not any(_qualified(rule, match, where) for match in rule.in_json.finditer(where)):
                    continue
            elif rule.in_json.search(where) is None:
                continue
        found.append(rule)
    return tuple(found)


def _redact_with(text: str, rules: tuple[Rule, ...]) -> str:
    # One string of a JSON value: each rule whose characters it holds.
    for rule in rules:
        if not rule.holds or rule.holds[0] in text or rule.holds[-1] in text:
            text = _apply(rule, text)
    return text


def redact_value(value: Any, rules: tuple[Rule, ...] | None = None, path: str = "$") -> Any:
    """A JSON value with each string and key redacted on its own; ``value`` itself if nothing changed.

    ``rules`` (from ``secrets_in_json``) limits the patterns tried; every
    non-empty string under a key that ends with one of ``SECRET_NAMES`` (in
    lower case) is redacted whole. Raises ``Unredactable`` (naming the path,
    never the secret) if two keys of one object would become the same key,
    which would lose all but one.
    """
    rules = _patterns()[0] if rules is None else rules
    if isinstance(value, str):
        return _redact_with(value, rules)
    if isinstance(value, list):
        items = [redact_value(item, rules, f"{path}[{i}]") for i, item in enumerate(value)]
        return value if all(a is b for a, b in zip(items, value)) else items
    if not isinstance(value, dict):
        return value
    changed, cleaned = False, {}
    for key, item in value.items():
        new_key = _redact_with(key, rules)
        if isinstance(item, str) and item and item != REDACTED and key.lower().endswith(SECRET_NAMES):
            new_item = REDACTED
        else:
            new_item = redact_value(item, rules, f"{path}.{new_key}")
        if new_key in cleaned:
            same = sum(1 for k in value if _redact_with(k, rules) == new_key)
            raise Unredactable(f"{same} keys of {path} become the same key, {new_key!r}, once secrets are redacted, "
                               "and all but one would be lost")
        changed = changed or new_key is not key or new_item is not item
        cleaned[new_key] = new_item
    return cleaned if changed else value
