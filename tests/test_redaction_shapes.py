"""Credentials of every major provider, and values by their name, never reach a file or a printed line.

Each shape is planted in a workflow's input, a step's output, an error, a prompt the ledger records, a person's
comments and answers, and an outbox payload; workflows and the command line run in real processes; then every
file beside the journal and every printed line is searched for each planted secret. The kit's own keys, fencing
tokens and token counts stay as they were. All values are made up.
"""
from __future__ import annotations

import base64
import itertools
import json
import os
import random
import sqlite3
import subprocess
import sys

import pytest

from durable_kit.core.store import to_json
from durable_kit.redact import REDACTED, redact, redact_value

from conftest import ROOT


SEEDS = itertools.count(1)


def made_up(prefix: str, length: int, alphabet: str = "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789") -> str:
    """``prefix`` and ``length`` characters of ``alphabet`` in an order no earlier call used (no real key)."""
    draw = random.Random(next(SEEDS))
    return prefix + "".join(draw.choice(alphabet) for _ in range(length))


HEX = "0123456789abcdef"
DISCORD_ID = base64.b64encode(b"123456789012345678").decode()  # a bot's id, as Discord writes it in a token

# (what the shape is, the text planted, the secret in it that must be found nowhere)
SHAPES = [
    # source hosting
    ("GitHub classic token", "ghp_" + (v := made_up("", 36)), "ghp_" + v),
    ("GitHub app token", (v := made_up("ghs_", 36)), v),
    ("GitHub fine-grained token", (v := made_up("github_pat_11AB", 78, "AbCdEf0123456789_xYz")), v),
    ("GitLab token", (v := made_up("glpat-", 20, "AbCdEfGh_-0123456789")), v),
    ("GitLab routable token", (v := made_up("glpat-", 27) + ".01.0w1x2y3z4"), v),
    ("GitLab deploy token", (v := made_up("gldt-", 24)), v),
    # chat
    ("Slack bot token", (v := "xoxb-2345678901-3456789012345-" + made_up("", 24)), v),
    ("Slack user token", (v := "xoxp-2345678901-3456789012345-4567890123456-" + made_up("", 32, HEX)), v),
    ("Slack rotating token", (v := "xoxe.xoxp-1-" + made_up("Mi0y", 60)), v),
    ("Slack refresh token", (v := "xoxe-1-" + made_up("My0x", 60)), v),
    ("Slack session cookie token", (v := "xoxd-" + made_up("", 30) + "%2F" + made_up("", 20) + "%3D"), v),
    ("Slack app token", (v := "xapp-1-A0123456789-1234567890123-" + made_up("", 64, HEX)), v),
    ("Slack webhook URL", "https://hooks.slack.com/services/T0ABCDEF1/B0ABCDEF2/" + (v := made_up("", 24)), v),
    ("Discord bot token", (v := f"{DISCORD_ID}.GhT6aB.{made_up('', 38)}"), v),
    ("Discord bot header", f"Authorization: Bot {DISCORD_ID}.Xy1_zQ.{(v := made_up('', 27))}", v),
    ("Discord webhook URL", "https://discord.com/api/webhooks/1234567890123456789/" + (v := made_up("", 68)), v),
    ("Telegram bot token", "123456789:" + (v := made_up("AA", 33)), v),
    # model providers
    ("OpenAI key", (v := made_up("sk-", 48)), v),
    ("OpenAI project key", (v := made_up("sk-proj-", 64, "AbCdEf0123456789-_xYz")), v),
    ("Anthropic key", (v := made_up("sk-ant-api03-", 80, "AbCdEf0123456789-_xYz")), v),
    ("Hugging Face token", (v := made_up("hf_", 34)), v),
    ("Hugging Face organization token", (v := made_up("api_org_", 34)), v),
    ("Groq key", (v := made_up("gsk_", 52)), v),
    ("Replicate token", (v := made_up("r8_", 37)), v),
    ("xAI key", (v := made_up("xai-", 80)), v),
    ("Perplexity key", (v := made_up("pplx-", 48)), v),
    ("Google API key", (v := made_up("AIzaSy", 33, "AbCdEf0123456789-_xYz")), v),
    ("Google OAuth access token", (v := made_up("ya29.a0Af", 120, "AbCdEf0123456789-_xYz")), v),
    ("Google OAuth client secret", (v := made_up("GOCSPX-", 28)), v),
    ("Google OAuth refresh token", (v := made_up("1//0g", 98, "AbCdEf0123456789-_xYz")), v),
    # clouds
    ("AWS access key id", (v := "AKIA" + made_up("", 16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")), v),
    ("AWS temporary key id", (v := "ASIA" + made_up("", 16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")), v),
    ("AWS secret key by name", f"aws_secret_access_key = {(v := made_up('', 40, 'AbCdEf0123456789+/xYz'))}", v),
    ("AWS session token by name", f"AWS_SESSION_TOKEN={(v := made_up('IQoJb3JpZ2luX2Vj', 200))}", v),
    ("Azure storage connection string",
     "DefaultEndpointsProtocol=https;AccountName=plantedacct;AccountKey="
     f"{(v := made_up('', 86, 'AbCdEf0123456789+/xYz') + '==')};EndpointSuffix=core.windows.net", v),
    ("Azure Service Bus connection string",
     "Endpoint=sb://planted.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;"
     f"SharedAccessKey={(v := made_up('', 43, 'AbCdEf0123456789+/xYz') + '=')}", v),
    ("Azure SAS URL", "https://plantedacct.blob.core.windows.net/c/f.txt?sv=2022-11-02&ss=b&srt=o&sp=r"
                      f"&se=2030-01-01T00:00:00Z&sig={(v := made_up('', 40) + '%2B' + made_up('', 10) + '%3D')}", v),
    ("Azure AD client secret", (v := "abc8Q~" + made_up("", 34, "AbCdEf0123456789_.-~xYz")), v),
    ("GCP service-account key", json.dumps({
        "type": "service_account", "client_email": "planted@example.iam.gserviceaccount.com",
        "private_key": "-----BEGIN PRIVATE KEY-----\n" + (v := made_up("MIIEvQ", 64)) + "\n-----END PRIVATE KEY-----\n"}),
     v),
    ("Vault token", (v := made_up("hvs.", 90, "AbCdEf0123456789_-xYz")), v),
    ("DigitalOcean token", (v := made_up("dop_v1_", 64, HEX)), v),
    # package registries
    ("npm token", (v := made_up("npm_", 36)), v),
    ("PyPI token", (v := made_up("pypi-AgEIcHlwaS5vcmc", 120, "AbCdEf0123456789-_xYz")), v),
    ("Docker Hub token", (v := made_up("dckr_pat_", 27, "AbCdEf0123456789-_xYz")), v),
    ("RubyGems key", (v := made_up("rubygems_", 48, HEX)), v),
    # payments
    ("Stripe live secret key", (v := made_up("sk_live_", 99)), v),
    ("Stripe test secret key", (v := made_up("sk_test_", 99)), v),
    ("Stripe live restricted key", (v := made_up("rk_live_", 99)), v),
    ("Stripe test restricted key", (v := made_up("rk_test_", 99)), v),
    ("Stripe webhook secret", (v := made_up("whsec_", 32)), v),
    ("Square access token", (v := made_up("EAAAE", 59, "AbCdEf0123456789-_xYz")), v),
    ("Square legacy token", (v := made_up("sq0atp-", 22, "AbCdEf0123456789-_xYz")), v),
    ("Square application secret", (v := made_up("sq0csp-", 43, "AbCdEf0123456789-_xYz")), v),
    ("Braintree token", (v := "access_token$production$" + made_up("", 16, "abcdef0123456789xyz") + "$"
                               + made_up("", 32, HEX)), v),
    ("Shopify token", (v := made_up("shpat_", 32, HEX)), v),
    ("SendGrid key", (v := made_up("SG.", 22, "AbCdEf0123456789-_xYz") + "." + made_up("", 43)), v),
    ("Twilio auth token by name", f"TWILIO_AUTH_TOKEN={(v := made_up('', 32, HEX))}", v),
    ("Twilio credentials in a URL",
     f"https://AC{made_up('', 32, HEX)}:{(v := made_up('', 32, HEX) + 'tw')}@api.twilio.com/2010-04-01", v),
    # any issuer
    ("JSON web token", (v := "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkIn0." + made_up("", 43)), v),
    ("bearer token", f"Bearer {(v := made_up('', 40))}", v),
    ("private key", "-----BEGIN OPENSSH PRIVATE KEY-----\n" + (v := made_up("b3BlbnNzaC", 70))
                    + "\n-----END OPENSSH PRIVATE KEY-----", v),
    ("PGP private key", "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n" + (v := made_up("lQOYBF", 64))
                        + "\n-----END PGP PRIVATE KEY BLOCK-----", v),
    # connection strings and URLs with credentials
    ("PostgreSQL URL", f"postgres://app_user:{(v := 'Pg-' + made_up('', 18))}@db.example.com:5432/app", v),
    ("MongoDB SRV URL", f"mongodb+srv://admin:{(v := 'Mg-' + made_up('', 18))}@cluster0.example.net/app", v),
    ("Redis URL, empty user", f"redis://:{(v := 'Rd-' + made_up('', 18))}@cache.example.com:6379/0", v),
    ("AMQP URL", f"amqp://guest:{(v := 'Mq-' + made_up('', 18))}@rabbit.example.com:5672/vhost", v),
    ("ADO.NET connection string",
     f"Server=tcp:db.example.com,1433;Database=app;User ID=app;Password={(v := 'Ado-' + made_up('', 16))};", v),
    # query strings
    ("password in a query string", f"https://api.example.com/login?user=dana&password={(v := 'Qp-' + made_up('', 16))}"
                                   "&next=/home", v),
    ("api_key in a query string", f"https://api.example.com/v1/items?api_key={(v := 'Qk-' + made_up('', 20))}&page=2",
     v),
    ("token in a query string", f"wss://stream.example.com/feed?token={(v := 'Qt-' + made_up('', 20))}", v),
    ("access_token in a query string",
     f"https://graph.example.com/me?fields=id&access_token={(v := 'Qa-' + made_up('', 24))}", v),
    ("signed S3 URL", "https://bucket.s3.amazonaws.com/f?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date=20300101T000000Z"
                      f"&X-Amz-Signature={(v := made_up('', 64, HEX))}", v),
    # headers
    ("Authorization: Basic", f"Authorization: Basic {(v := base64.b64encode(b'dana:Planted-Basic-Pass').decode())}",
     v),
    ("Authorization: Bearer, lower case", f"authorization: bearer {(v := made_up('', 30))}", v),
    ("Proxy-Authorization", f"Proxy-Authorization: Basic {(v := base64.b64encode(b'proxy:Planted-Proxy').decode())}",
     v),
    ("X-Api-Key header", f"X-Api-Key: {(v := 'Hx-' + made_up('', 24))}", v),
    ("PRIVATE-TOKEN header", f"PRIVATE-TOKEN: {(v := 'Hp-' + made_up('', 20))}", v),
    # key=value and key: value
    ("password=", f"password={(v := 'Kv-' + made_up('', 14))}", v),
    ("PASSWORD quoted", f'DB_PASSWORD="{(v := "Kq-" + made_up("", 10) + " with spaces")}"', v),
    ("passwd:", f"passwd: {(v := 'Kw-' + made_up('', 14))}", v),
    ("client_secret:", f"client_secret: {(v := 'Kc-' + made_up('', 24))}", v),
    ("api_key=", f"api_key={(v := 'Ka-' + made_up('', 24))}", v),
    ("apiKey camel case", f"apiKey: '{(v := 'Kk-' + made_up('', 24))}'", v),
    ("access_token=", f"access_token={(v := 'Kt-' + made_up('', 24))}", v),
    ("refresh_token:", f"refresh_token: {(v := 'Kr-' + made_up('', 24))}", v),
    ("secret_key =", f"secret_key = '{(v := 'Ks-' + made_up('', 24))}'", v),
    ("GITHUB_TOKEN= without a shape", f"GITHUB_TOKEN={(v := made_up('', 40, HEX))}", v),
    ("token: with a credential's look", f"token: {(v := made_up('', 32))}", v),
    ("password in JSON text", json.dumps({"username": "dana", "password": (v := "Kj-" + made_up("", 14))}), v),
]
NEEDLES = sorted({piece for _, _, secret in SHAPES for piece in (secret, secret[-12:])})
# Values stored under JSON keys that name them secret: no shape, no name in the text itself.
UNDER_NAMES = {"password": "Jp-" + made_up("", 16), "client_secret": "Jc-" + made_up("", 16),
               "api_key": "Ja-" + made_up("", 16), "Authorization": "Basic " + made_up("", 20),
               "X-Api-Key": "Jx-" + made_up("", 16), "SecretAccessKey": "Js-" + made_up("", 16),
               "refresh_token": "Jr-" + made_up("", 16), "AccountKey": "Jk-" + made_up("", 16) + "=="}
NEEDLES_UNDER_NAMES = sorted(UNDER_NAMES.values())
DENSE = "-_.A?& " * 40
PROSE = ("The report draws on three sources: the quarterly filings, a customer survey and the support log. "
         "Each finding below cites the passage it rests on; the key numbers are in table 2 (A-1001, B-2002). ")


def test_the_planted_secrets_are_many_and_all_different():
    assert len(SHAPES) >= 80 and len({secret for _, _, secret in SHAPES}) == len(SHAPES)
    assert not any(secret in other for _, _, secret in SHAPES for _, _, other in SHAPES if other != secret)


@pytest.mark.parametrize("shape, text, secret", SHAPES, ids=[shape for shape, _, _ in SHAPES])
def test_each_shape_is_redacted_whole_alone_in_prose_and_in_json_and_redacting_again_changes_nothing(shape, text,
                                                                                                    secret):
    # Alone, in long prose (each character sparse: one pass over its places) and among many of each character.
    for planted in (text, f"{PROSE * 12}\n{text}\n{PROSE * 12}", f"note ({text}), and then", f"{DENSE}{text}{DENSE}"):
        once = redact(planted)
        assert secret not in once and secret[-12:] not in once and REDACTED in once, once
        assert redact(once) == once
    stored = to_json({"note": f"{PROSE}{text}", "nested": [{"value": text}]}, "w1", "s1", "output")
    assert secret not in stored and secret[-12:] not in stored and REDACTED in stored
    assert json.loads(stored)["note"].startswith(PROSE)  # only the secret is replaced


@pytest.mark.parametrize("name", sorted(UNDER_NAMES))
def test_a_string_stored_under_a_key_that_names_a_secret_is_redacted_whole_in_any_case(name):
    for key in (name, name.upper(), name.lower(), f"db_{name}"):
        value = {key: UNDER_NAMES[name], "region": "eu-west-1", "count": 3}
        stored = json.loads(to_json(value, "w1", "s1", "input"))
        assert stored == {key: REDACTED, "region": "eu-west-1", "count": 3}


# --- what the kit stores and prints of its own stays as it was ---

KEPT = [
    '{"key":"w1:refund"}', '{"destination":"refunds","key":"w1:refund"}', "w1:refund", "order-A-1001-refund-0000000001",
    '{"key":"order-A-1001-refund-0000000001","amount":42.5}', "key 'notify-1:notify'", "key=w1:refund",
    "(key w1:refund)", "outbox w1:refund not sent: Transient: try later", "lease lost to token 7",
    "fencing token 7, older than 8", '{"fencing_token":7,"key":"w1:refund"}', '{"token":7}', "token: 7", "token=12",
    '{"input_tokens":120,"output_tokens":40}', "120 tokens in, 40 tokens out", "input_tokens=120", "max_tokens: 4096",
    '{"idempotency_key":"order-A-1001-refund-0000000001"}', "idempotency_key=order-A-1001-refund-0000000001",
    "monkey=banana; hotkey=ctrl-k; turnkey: yes", "a password reset was requested; the secret of good soup",
    "passwords: 3 rotated", "secrets_in_json: none", "key_reserved", "attempt 1", "0 completed steps on record",
    "approved by Dana: go ahead", "https://docs.example.com:443/a@b", "mailto:dana@example.com",
    "task-scheduler-service-v2 and risk-management-framework", "see https://example.com/search?q=durable&page=2",
    "ratio 2.5: FULL at 1.02 fsyncs", "Basic Authorization is explained in section 2", "xBearer abcdefghijklmnop.q",
]


@pytest.mark.parametrize("text", KEPT)
def test_the_kits_own_keys_tokens_and_counts_and_ordinary_text_are_kept(text):
    assert redact(text) == text
    assert json.loads(to_json({"detail": text}, "w1", "s1", "output")) == {"detail": text}


def test_json_the_kit_stores_with_keys_and_tokens_is_stored_unchanged():
    values = [{"key": "w1:refund", "destination": "refunds"}, {"key": "w1:refund", "amount": 42.5, "token": 7},
              {"fencing_token": 7, "key": "order-A-1001-refund-0000000001"}, {"input_tokens": 120, "output_tokens": 40},
              {"key": "w1:notify", "recipient": "dana@example.com", "message": "Report: risk is ready"},
              {"tokens": {"in": 120, "out": 40}, "keys": ["w1:a", "w1:b"]}]
    for value in values:
        assert json.loads(to_json(value, "w1", "s1", "output")) == value
    assert redact_value({"key": "w1:refund", "token": "7"}) == {"key": "w1:refund", "token": "7"}


# --- planted everywhere, in real processes: nothing reaches a file or a printed line ---

KIT = [sys.executable, "-m", "durable_kit"]
NOTE = "\n".join(text for _, text, _ in SHAPES)

PLANTED_MODULE = '''
import durable_kit
from durable_kit import RetryPolicy, Transient, send_via_outbox
from durable_kit.world.ledger import Ledger
from durable_kit.world.notifier import Notifier


@durable_kit.destination("planted-notes")
def deliver(journal_path, payload, key):
    return Notifier.beside(journal_path, dedupe=True).send("dana", payload["message"], key)


@durable_kit.workflow("planted")
def planted(wf):
    note = wf.input["note"]
    ledger = Ledger.beside(wf.journal.path)
    wf.execute_step("prompt", lambda: ledger.record("model", f"prompt: summarize {note}", wf.id, 120, 40)
                    or {"tokens": 160}, {"prompt": note})
    wf.execute_step("echo", lambda: {"said": note, "credentials": wf.input["credentials"]})
    decision = wf.wait_for_approval("go", {"summary": f"about to use {note}"})
    answer = wf.ask("which", f"Which of these keys? {note}")
    send_via_outbox(wf, "notify", "planted-notes", {"message": f"{answer} {decision['comment']}", **wf.input})
    def call():
        raise Transient(f"provider said: invalid key in {note}")
    return wf.execute_step("call", call, retry=RetryPolicy(max_attempts=2, base_delay=0))
'''


def kit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*KIT, *args], cwd=ROOT, capture_output=True, text=True, timeout=180, env=dict(os.environ))


def test_every_shape_planted_everywhere_reaches_no_file_beside_the_journal_and_no_printed_line(tmp_path):
    module, db = tmp_path / "planted.py", tmp_path / "journal.db"
    module.write_text(PLANTED_MODULE)
    printed: list[str] = []

    def run(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
        done = kit(*args)
        printed.extend([done.stdout, done.stderr])
        assert done.returncode == expect, (args, done.stdout[-2000:], done.stderr[-2000:])
        return done

    workflow_input = json.dumps({"note": NOTE, "credentials": UNDER_NAMES})
    for workflow_id in ("p1", "p2"):
        run("start", "--db", str(db), "--kind", "planted", "--input", workflow_input, "--id", workflow_id,
            "--module", str(module))
    # Held open, so that no process's exit checkpoints the write-ahead logs away before they are read.
    keep = [sqlite3.connect(db)]
    keep[0].execute("SELECT count(*) FROM workflows").fetchone()
    run("worker", "--db", str(db), "--until-idle", "--module", str(module))
    for name in ("journal.calls.db",):
        keep.append(sqlite3.connect(tmp_path / name))
        keep[-1].execute("SELECT count(*) FROM sqlite_master").fetchone()
    run("approve", "--workflow", "p1", "--db", str(db), "--by", "Dana", "--comment", f"go ahead with {NOTE}")
    run("reject", "--workflow", "p2", "--db", str(db), "--by", "Dana", "--comment", f"not with {NOTE}", "--json")
    run("approve", "--workflow", "p2", "--db", str(db), "--by", "Dana", "--comment", f"go with {NOTE}", expect=2)
    run("worker", "--db", str(db), "--until-idle", "--module", str(module))
    run("answer", "--workflow", "p1", "--db", str(db), "--by", "Dana", "--text", f"use {NOTE}")
    run("answer", "--workflow", "p2", "--db", str(db), "--by", "Dana", "--text", f"use {NOTE}", "--json")
    for _ in range(3):
        run("worker", "--db", str(db), "--until-idle", "--module", str(module))
    for workflow_id in ("p1", "p2"):
        for command in ("status", "history"):
            for flags in ((), ("--json",)):
                run(command, "--workflow", workflow_id, "--db", str(db), *flags)

    conn = sqlite3.connect(db)
    statuses = dict(conn.execute("SELECT id, status FROM workflows"))
    sent = conn.execute("SELECT count(*) FROM outbox WHERE status = 'sent'").fetchone()[0]
    conn.close()
    assert statuses == {"p1": "escalated", "p2": "escalated"} and sent == 2
    files = sorted(p for p in tmp_path.iterdir() if p.is_file() and p.name != "planted.py")
    assert {p.name for p in files} >= {"journal.db", "journal.db-wal", "journal.calls.db", "journal.calls.db-wal",
                                       "journal.notify.db"}
    found = {(p.name, needle): p.read_bytes().count(needle.encode()) for p in files
             for needle in NEEDLES + NEEDLES_UNDER_NAMES}
    found.update({("printed", needle): sum(text.count(needle) for text in printed)
                  for needle in NEEDLES + NEEDLES_UNDER_NAMES})
    on_disk = b"".join(p.read_bytes() for p in files)
    for connection in keep:
        connection.close()
    assert {key: count for key, count in found.items() if count} == {}
    # The planted text was stored and printed, redacted: each place holds a [REDACTED] for every shape.
    assert on_disk.count(REDACTED.encode()) >= 8 * len(SHAPES)
    assert sum(text.count(REDACTED) for text in printed) >= 8 * len(SHAPES)


# --- the decision a person's action returns ---

WAITING_MODULE = '''
import durable_kit


@durable_kit.workflow("asks")
def asks(wf):
    wf.wait_for_approval("go", {"what": "x"})
    return wf.ask("which", "which one?")
'''


def test_the_decision_returned_by_approve_reject_and_answer_is_the_stored_one_with_secrets_redacted(tmp_path):
    module, db = tmp_path / "asks.py", tmp_path / "journal.db"
    module.write_text(WAITING_MODULE)
    done = subprocess.run([sys.executable, "-c", f'''
import json, sys
import durable_kit
from durable_kit import Journal, approve, reject, answer, run_workflow
sys.path.insert(0, {str(tmp_path)!r})
import asks
note = sys.stdin.read()
journal = Journal({str(db)!r})
returned = []
for workflow_id in ("d1", "d2"):
    journal.start("asks", {{}}, workflow_id)
    run_workflow(journal, workflow_id)
returned.append(approve(journal, "d1", "Dana", f"go ahead with {{note}}"))
returned.append(reject(journal, "d2", "Dana", f"not with {{note}}"))
run_workflow(journal, "d1")
returned.append(answer(journal, "d1", f"use {{note}}", "Dana"))
print(json.dumps(returned))
'''], input=NOTE, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    returned = json.loads(done.stdout)
    assert [d["saved"] for d in returned] == [True, True, True]
    assert {needle for needle in NEEDLES if needle in done.stdout} == set()
    assert returned[0]["comment"] == f"go ahead with {redact(NOTE)}"
    assert returned[2]["answer"] == f"use {redact(NOTE)}"


def test_the_same_answer_again_with_a_secret_in_it_saves_nothing_and_is_not_refused(tmp_path):
    module, db = tmp_path / "asks.py", tmp_path / "journal.db"
    module.write_text(WAITING_MODULE)
    assert kit("start", "--db", str(db), "--kind", "asks", "--input", "{}", "--id", "d1",
               "--module", str(module)).returncode == 0
    assert kit("worker", "--db", str(db), "--until-idle", "--module", str(module)).returncode == 0
    assert kit("approve", "--workflow", "d1", "--db", str(db), "--by", "Dana").returncode == 0
    assert kit("worker", "--db", str(db), "--until-idle", "--module", str(module)).returncode == 0
    text = f"use {SHAPES[0][1]}"
    first = kit("answer", "--workflow", "d1", "--db", str(db), "--by", "Dana", "--text", text, "--json")
    again = kit("answer", "--workflow", "d1", "--db", str(db), "--by", "Dana", "--text", text, "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["decision"]["saved"] is False
