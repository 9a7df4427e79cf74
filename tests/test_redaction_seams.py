"""Redaction and bad input at the seams, in real processes: secrets of every common shape never reach a file or a
printed line, redaction never changes a value beyond its secrets, and bad input is refused before it is written."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from durable_kit.admin import read_only

from conftest import ROOT

KIT = [sys.executable, "-m", "durable_kit"]


def kit(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*KIT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def no_traceback_one_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def rows(db: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


# --- every common key shape, planted everywhere a secret can enter ---

# Made-up values of each shape (none is a real key).
STRIPE = "sk_live_51HqLyjWDarjtT1zdp7dcXyZ0aBcD"
STRIPE_RESTRICTED = "rk_live_51HxYzAbCdEfGhIjKlMnOpQrS"
GOOGLE = "AIzaSyA1b2C3d4E5f6G7h8I9j0K-LmNoPqRsTu_"
AWS_ID = "AKIAQ2W3E4R5T6Y7U8I9"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkRhbmEifQ"
       ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
URL_PASSWORD = "hunter2-Correct-Horse"
URL = f"postgres://admin:{URL_PASSWORD}@db.example.com:5432/app"
SLASHED = "sk-abcdefghijklmnop/qrstuvwx+yz0123=="  # a key whose tail has / and +
BEARER = "Bearer abcdefghijklmnop/qrs+tuvw="
OPENAI = "sk-proj-canary0123456789ABCDEF"
HOSTED = "ghp_" + "Zx9" * 12
CHAT = "xoxb-1234567890-abcdefghij"
TOKEN = "opaque-token-9f8e7d6c5b4a"  # no shape at all: a secret only because the workflow names it (wf.secret)

PLANTED = [STRIPE, STRIPE_RESTRICTED, GOOGLE, AWS_ID, f"aws_secret_access_key={AWS_SECRET}", JWT, URL, SLASHED,
           BEARER, OPENAI, HOSTED, CHAT]
NOTE = "; ".join(PLANTED)
# What must not be found, anywhere: each secret whole, and its last 12 characters (a tail left after a cut).
NEEDLES = sorted({piece for secret in [STRIPE, STRIPE_RESTRICTED, GOOGLE, AWS_ID, AWS_SECRET, JWT, URL_PASSWORD,
                                       SLASHED, BEARER, OPENAI, HOSTED, CHAT, TOKEN]
                  for piece in (secret, secret[-12:])})
REDACTED_NOTE = "; ".join(["[REDACTED]"] * 4 + ["aws_secret_access_key=[REDACTED]", "[REDACTED]",
                                                  "postgres://[REDACTED]@db.example.com:5432/app"]
                          + ["[REDACTED]"] * 5)

PLANTED_MODULE = '''
import durable_kit
from durable_kit import RetryPolicy, Transient
from durable_kit.world.llm import FakeLLM
from durable_kit.world.ledger import Ledger


@durable_kit.workflow("planted")
def planted(wf):
    token = wf.secret("PLANTED_TOKEN")
    note = wf.input["note"]
    ledger = Ledger.beside(wf.journal.path)
    # A tool call the ledger records with its query, as the agent loop's search does.
    wf.execute_step("search", lambda: ledger.record("source", f"search {note}", wf.id) or {"hits": 0},
                    {"query": note})
    prompt = f"Summarize for the user. Context: {note}. Authorization: {token}"
    wf.execute_step("ask_model", lambda: FakeLLM(ledger, wf.id).research(prompt, "risk"), {"prompt": prompt})
    wf.wait_for_approval("go", {"summary": f"about to use {note}"})
    wf.ask("which", f"Which of these keys? {note}")
    def call():
        raise Transient(f"provider said: invalid key in {note}; token {token}")
    return wf.execute_step("call", call, retry=RetryPolicy(max_attempts=2, base_delay=0))
'''


def test_no_planted_secret_reaches_the_journal_its_log_the_ledger_or_any_printed_line(tmp_path):
    module, db = tmp_path / "planted.py", tmp_path / "journal.db"
    module.write_text(PLANTED_MODULE)
    env = {"PLANTED_TOKEN": TOKEN}
    printed: list[str] = []

    def run(*args: str) -> subprocess.CompletedProcess:
        done = kit(*args, env=env)
        printed.extend([done.stdout, done.stderr])
        return done

    for workflow_id in ("p1", "p2"):
        assert run("start", "--db", str(db), "--kind", "planted", "--input", json.dumps({"note": NOTE}),
                   "--id", workflow_id, "--module", str(module)).returncode == 0
    # Held open, so that no process's exit checkpoints the write-ahead logs away before they are read.
    keep_journal = sqlite3.connect(db)
    keep_journal.execute("SELECT count(*) FROM workflows").fetchone()
    assert run("worker", "--db", str(db), "--until-idle", "--module", str(module)).returncode == 0
    keep_ledger = sqlite3.connect(tmp_path / "journal.calls.db")
    keep_ledger.execute("SELECT count(*) FROM calls").fetchone()
    approved = run("approve", "--workflow", "p1", "--db", str(db), "--by", "Dana", "--comment", f"go ahead with {NOTE}")
    rejected = run("reject", "--workflow", "p2", "--db", str(db), "--by", "Dana", "--comment", f"not with {NOTE}", "--json")
    again = run("approve", "--workflow", "p2", "--db", str(db), "--by", "Dana", "--comment", f"go ahead with {NOTE}")
    assert (approved.returncode, rejected.returncode, again.returncode) == (0, 0, 2)
    assert approved.stdout == f"p1, wait 'go': saved: approved by Dana: go ahead with {REDACTED_NOTE}; status pending\n"
    assert json.loads(rejected.stdout)["decision"]["comment"] == f"not with {REDACTED_NOTE}"
    run("worker", "--db", str(db), "--until-idle", "--module", str(module))
    for workflow_id, flags in (("p1", ()), ("p2", ("--json",))):
        assert run("answer", "--workflow", workflow_id, "--db", str(db), "--by", "Dana", "--text", f"use {NOTE}",
                   *flags).returncode == 0
    for _ in range(3):
        run("worker", "--db", str(db), "--until-idle", "--module", str(module))
    for workflow_id in ("p1", "p2"):
        for command in ("status", "history"):
            for flags in ((), ("--json",)):
                assert run(command, "--workflow", workflow_id, "--db", str(db), *flags).returncode == 0

    journal = read_only(db)
    assert [journal.workflow(w)["status"] for w in ("p1", "p2")] == ["escalated", "escalated"]
    assert journal.workflow("p1")["input"] == {"note": REDACTED_NOTE}
    assert [s["input"] for s in journal.steps("p1")][:2] == [
        {"query": REDACTED_NOTE},
        {"prompt": f"Summarize for the user. Context: {REDACTED_NOTE}. Authorization: [REDACTED]"}]
    assert journal.steps("p1")[2]["error"] == (f"Transient: provider said: invalid key in {REDACTED_NOTE}; "
                                               "token [REDACTED]")
    assert rows(tmp_path / "journal.calls.db", "SELECT operation FROM calls WHERE kind = 'source' ORDER BY seq") == [
        (f"search {REDACTED_NOTE}",), (f"search {REDACTED_NOTE}",)]
    journal.close()
    files = sorted(p for p in tmp_path.iterdir() if p.is_file() and p.name != "planted.py")
    assert {p.name for p in files} >= {"journal.db", "journal.db-wal", "journal.calls.db", "journal.calls.db-wal"}
    found = {(p.name, needle): p.read_bytes().count(needle.encode()) for p in files for needle in NEEDLES}
    found.update({("printed", needle): sum(text.count(needle) for text in printed) for needle in NEEDLES})
    keep_journal.close()
    keep_ledger.close()
    assert {key: count for key, count in found.items() if count} == {}
    assert sum("[REDACTED]" in text for text in printed) >= 10  # the planted text was printed, redacted


@pytest.mark.parametrize("text, expected", [
    (f"key: {STRIPE}.", "key: [REDACTED]."),
    (f"key: {STRIPE_RESTRICTED}.", "key: [REDACTED]."),
    (f"key: {GOOGLE}", "key: [REDACTED]"),
    (f"AWS_SECRET_ACCESS_KEY = {AWS_SECRET}\nregion = eu", "AWS_SECRET_ACCESS_KEY = [REDACTED]\nregion = eu"),
    (f"{{'aws_secret_access_key': '{AWS_SECRET}'}}", "{'aws_secret_access_key': '[REDACTED]'}"),
    (f"token={JWT}&next=1", "token=[REDACTED]&next=1"),
    (f"see {URL}", "see postgres://[REDACTED]@db.example.com:5432/app"),
    (f"key {SLASHED} end", "key [REDACTED] end"),
    (f"Authorization: {BEARER}", "Authorization: [REDACTED]"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIBcut off", "[REDACTED]"),  # no END line: redacted to the end
    ("task-scheduler-service-v2 and risk-management-framework", "task-scheduler-service-v2 and "
                                                               "risk-management-framework"),
    ("https://docs.example.com:443/a@b", "https://docs.example.com:443/a@b"),
])
def test_each_shape_is_redacted_wholly_in_text_and_ordinary_text_is_kept(text, expected):
    from durable_kit.redact import redact

    assert redact(text) == expected


# --- redaction works on decoded values, never across JSON strings ---

BEGIN, END = "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----"


@pytest.mark.parametrize("value, stored", [
    ({"a": BEGIN, "b": "keep me", "c": END}, {"a": "[REDACTED]", "b": "keep me", "c": END}),
    ({"a": [BEGIN], "b": {"c": END}, "d": 3}, {"a": ["[REDACTED]"], "b": {"c": END}, "d": 3}),
    ({"a": "x", "b": f"{BEGIN}\nMIIB\n{END}", "c": "y"}, {"a": "x", "b": "[REDACTED]", "c": "y"}),
])
def test_a_pattern_spanning_two_json_strings_changes_no_other_field(tmp_path, value, stored):
    db = tmp_path / "journal.db"
    done = kit("start", "--db", str(db), "--kind", "refund", "--input", json.dumps({"order_id": "A-1001", **value}),
               "--id", "r1")
    assert done.returncode == 0, done.stderr
    # The BEGIN line alone is redacted to the end of its own string; the strings after it are kept.
    assert read_only(db).workflow("r1")["input"] == {"order_id": "A-1001", **stored}


def test_a_secret_in_a_key_is_redacted_and_keys_that_would_collide_are_refused_with_nothing_stored(tmp_path):
    db = tmp_path / "journal.db"
    one = {"order_id": "A-1001", "keys": {OPENAI: 1, "plain": 2}}
    assert kit("start", "--db", str(db), "--kind", "refund", "--input", json.dumps(one), "--id", "r1").returncode == 0
    assert read_only(db).workflow("r1")["input"]["keys"] == {"[REDACTED]": 1, "plain": 2}
    two = {"order_id": "A-1001", "keys": {OPENAI: 1, HOSTED: 2}}
    done = kit("start", "--db", str(db), "--kind", "refund", "--input", json.dumps(two), "--id", "r2")
    assert done.returncode == 2
    assert no_traceback_one_line(done) == (
        "error: workflow 'r2': the workflow input cannot be stored safely: 2 keys of $.keys become the same key, "
        "'[REDACTED]', once secrets are redacted, and all but one would be lost. Keep secrets out of keys (put them "
        "in values), then try again. Nothing was written.")
    assert rows(db, "SELECT id FROM workflows") == [("r1",)]
    assert OPENAI not in done.stderr + done.stdout and HOSTED not in done.stderr + done.stdout


def test_a_string_under_a_key_named_aws_secret_access_key_is_redacted_whole_and_nothing_else_changes():
    from durable_kit.core.store import to_json

    value = {"aws_secret_access_key": "x" * 40, "AWS_SECRET_ACCESS_KEY": ["kept: a list, not a key's text"],
             "region": "eu-west-1", "note": f"see {URL}"}
    assert json.loads(to_json(value, "w1", "s1", "output")) == {
        "aws_secret_access_key": "[REDACTED]", "AWS_SECRET_ACCESS_KEY": ["kept: a list, not a key's text"],
        "region": "eu-west-1", "note": "see postgres://[REDACTED]@db.example.com:5432/app"}
    assert to_json({"plain": "nothing to redact here"}, "w1", "s1", "output") == '{"plain":"nothing to redact here"}'


# --- bad input is refused before anything is written ---

DEADLINES = '''
import durable_kit


@durable_kit.workflow("deadlines")
def deadlines(wf):
    seconds = float(wf.input["seconds"])
    if wf.input["kind"] == "timer":
        wf.sleep("nap", seconds)
        return "slept"
    return wf.wait_for_approval("go", {"what": "x"}, deadline=seconds)
'''


@pytest.mark.parametrize("kind, seconds", [("approval", "nan"), ("approval", "inf"), ("approval", "1e308"),
                                           ("approval", "-1"), ("timer", "nan"), ("timer", "inf")])
def test_a_deadline_that_is_not_a_finite_time_fails_the_workflow_clearly_and_saves_no_wait(tmp_path, kind, seconds):
    module, db = tmp_path / "deadlines.py", tmp_path / "journal.db"
    module.write_text(DEADLINES)
    assert kit("start", "--db", str(db), "--kind", "deadlines", "--input", json.dumps({"kind": kind,
               "seconds": seconds}), "--id", "d1", "--module", str(module)).returncode == 0
    worker = kit("worker", "--db", str(db), "--until-idle", "--module", str(module))
    name, what = ("nap", "timer's seconds") if kind == "timer" else ("go", "deadline")
    message = (f"workflow 'd1', wait {name!r}: the {what} must be a finite number of seconds from 0 to 3155760000 "
               f"(100 years), not {float(seconds)!r}. Give a number in that range"
               + (", or no deadline at all" if kind == "approval" else "") + ", then `resume` it.")
    assert worker.stdout.splitlines() == [f"d1: {message}", "d1: failed", "worker stopped"]
    assert rows(db, "SELECT status, error FROM workflows") == [("failed", f"WorkflowError: {message}")]
    assert rows(db, "SELECT count(*) FROM waits") == [(0,)]
    assert rows(db, "SELECT count(*) FROM history WHERE event LIKE 'waiting_for_%'") == [(0,)]


def test_a_retry_budget_that_is_not_a_whole_number_of_at_least_0_is_refused_with_nothing_written(tmp_path):
    db = tmp_path / "journal.db"
    done = python(f'''
import json
import durable_kit.workshop.agents
from durable_kit import Journal
from durable_kit.errors import WorkflowError
journal = Journal({str(db)!r})
said = []
for budget in (-1, float("nan"), 2.5, True, 10**30):
    try:
        journal.start("refund", {{"order_id": "A-1001"}}, "b1", retry_budget=budget)
        said.append("started")
    except WorkflowError as error:
        said.append(str(error))
print(json.dumps(said))
''')
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said == [f"workflow 'b1' of kind 'refund': retry_budget must be a whole number of retries from 0 to "
                    f"1000000, not {shown}. Give one in that range (the default is 10). Nothing was started."
                    for shown in ("-1", "nan", "2.5", "True", str(10**30))]
    assert rows(db, "SELECT count(*) FROM workflows") == [(0,)]


@pytest.mark.parametrize("depth", [300, 50_000])
def test_json_nested_too_deep_on_the_command_line_is_refused_in_one_line(tmp_path, depth):
    db = tmp_path / "journal.db"
    nested = "[" * depth + "]" * depth
    done = kit("start", "--db", str(db), "--kind", "refund", "--input", json.dumps({"order_id": "A-1001"})[:-1]
               + f', "deep": {nested}}}', "--id", "n1")
    assert done.returncode == 2
    line = no_traceback_one_line(done)
    assert line == ("error: --input cannot be used (it is nested deeper than 200 levels); nothing was started. "
                    "Give a flatter value (at most 200 levels of lists and objects)."), line
    assert not db.exists() or rows(db, "SELECT count(*) FROM workflows") == [(0,)]


DEEP_OUTPUT = '''
import durable_kit
from durable_kit import RetryPolicy


@durable_kit.workflow("deep")
def deep(wf):
    def build():
        value = []
        for _ in range(5000):
            value = [value]
        return value
    wf.execute_step("first", lambda: "fine")
    return wf.execute_step("build", build, retry=RetryPolicy(max_attempts=3, base_delay=0))
'''


def test_an_output_nested_5000_deep_fails_its_step_once_with_a_clear_error_and_a_consistent_journal(tmp_path):
    module, db = tmp_path / "deep.py", tmp_path / "journal.db"
    module.write_text(DEEP_OUTPUT)
    assert kit("start", "--db", str(db), "--kind", "deep", "--input", "{}", "--id", "e1",
               "--module", str(module)).returncode == 0
    for _ in range(2):
        worker = kit("worker", "--db", str(db), "--until-idle", "--module", str(module))
        assert "RecursionError" not in worker.stdout + worker.stderr and "Traceback" not in worker.stderr
    message = ("NotJSON: workflow 'e1', step 'build': the activity's output cannot be stored as JSON (it is nested "
               "deeper than 200 levels). Use a flatter value (at most 200 levels of lists and objects). The output "
               "was not stored; the step runs again on the next replay.")
    assert rows(db, "SELECT name, status, attempts, error, output FROM steps ORDER BY position") == [
        ("first", "complete", 1, None, '"fine"'), ("build", "failed", 1, message, None)]
    assert rows(db, "SELECT status, error FROM workflows") == [("failed", message)]
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]


def test_status_says_plainly_when_no_module_the_kit_loads_registers_the_kind(tmp_path):
    db = tmp_path / "journal.db"
    done = python(f"from durable_kit import Journal; "
                  f"Journal({str(db)!r}).start('ghost', {{}}, 'g1', registered_elsewhere=True)")
    assert done.returncode == 0, done.stderr
    worker = kit("worker", "--db", str(db), "--until-idle")
    assert worker.stdout.count("g1: its kind 'ghost' is registered by no module in this worker") == 1
    status = kit("status", "--workflow", "g1", "--db", str(db))
    assert status.returncode == 0
    assert status.stdout.splitlines()[:2] == [
        "g1 (ghost, version not recorded): pending",
        "  its kind 'ghost' is not one of the kit's own: only a worker started with --module FILE, where FILE "
        "registers 'ghost', runs it (a worker without it leaves it pending and says so)."]
