"""Where cancellation, compensation and forks meet the other features, in real processes with exact counts.

A fork follows its original's recorded decisions (patches, outbox intents
and their deliveries) up to the fork point; every compensation runs, newest
first, and one that keeps failing pauses the workflow for a person instead
of skipping the older ones; a blocked workflow's cancellation is refused
with what to do; a cancellation is checked before a resolved decision is
returned; one that arrives during the last step is reported.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from durable_kit import Journal
from durable_kit.harness.faults import arm

from conftest import ROOT, dump, make_due, wait_until
from test_change import AWAIT_CANCEL, PATCHED, SENDER, V1, calls, effects, kit, worker, write


def steps_of(journal: Journal, workflow_id: str) -> dict[str, int]:
    return {s["name"]: s["attempts"] for s in journal.steps(workflow_id)}


def started(tmp_path: Path, source: str, kind: str, workflow_id: str) -> tuple[Path, Path]:
    """The journal and the module file of ``source``, with workflow ``workflow_id`` of ``kind`` started."""
    db, module = tmp_path / "journal.db", tmp_path / f"{kind}.py"
    module.write_text(source)
    kit("start", "--db", str(db), "--kind", kind, "--input", "{}", "--id", workflow_id, "--module", str(module))
    return db, module


# --- (2) a fork copies the patch decisions taken before its fork point ---

def test_a_fork_of_a_workflow_that_took_a_patched_path_follows_it_and_completes(tmp_path):
    db, module = tmp_path / "journal.db", write(tmp_path / "checkout.py", PATCHED, "v2")
    kit("start", "--db", str(db), "--kind", "checkout", "--input", "{}", "--id", "c1", "--module", str(module))
    worker(db, module)
    journal = Journal(db)
    assert journal.workflow("c1")["status"] == "complete"
    assert calls(db, "fraud_check") == ["c1:fraud_check"]

    kit("fork", "--db", str(db), "--workflow", "c1", "--up-to", "reserve", "--new-id", "c1-b", "--by", "Dana",
        "--module", str(module))
    kit("fork", "--db", str(db), "--workflow", "c1", "--up-to", "quote", "--new-id", "c1-q", "--by", "Dana",
        "--module", str(module))
    worker(db, module)
    assert [journal.workflow(w)["status"] for w in ("c1-b", "c1-q")] == ["complete", "complete"]
    # Past the patch: the decision is the original's, so fraud_check is reused and not sent again.
    assert steps_of(journal, "c1-b") == {"quote": 0, "patched:fraud-check": 0, "fraud_check": 0, "reserve": 0,
                                         "charge": 1, "notify": 1}
    # Before the patch: the fork decides for itself (no step recorded beyond it) and takes the new path.
    assert steps_of(journal, "c1-q") == {"quote": 0, "patched:fraud-check": 1, "fraud_check": 1, "reserve": 1,
                                         "charge": 1, "notify": 1}
    assert calls(db, "fraud_check") == ["c1:fraud_check", "c1-q:fraud_check"]
    assert calls(db, "reserve") == ["c1:reserve", "c1-q:reserve"]
    assert calls(db, "charge") == ["c1:charge", "c1-b:charge", "c1-q:charge"]


def test_a_fork_of_a_workflow_that_replayed_the_old_path_keeps_the_old_path(tmp_path):
    db, module = tmp_path / "journal.db", write(tmp_path / "checkout.py", V1, "v1")
    kit("start", "--db", str(db), "--kind", "checkout", "--input", "{}", "--id", "c1", "--module", str(module))
    arm(Journal(db).conn, "after_commit:charge", "exit")
    assert worker(db, module, expect=None).returncode == 13
    write(module, PATCHED, "v2")
    worker(db, module)  # c1 replays the old path under the patch and completes
    kit("fork", "--db", str(db), "--workflow", "c1", "--up-to", "charge", "--new-id", "c1-b", "--by", "Dana",
        "--module", str(module))
    worker(db, module)
    journal = Journal(db)
    assert journal.workflow("c1-b")["status"] == "complete"
    assert [s["output"] for s in journal.steps("c1-b") if s["name"] == "patched:fraud-check"] == [False]
    assert calls(db, "fraud_check") == []
    assert calls(db, "notify") == ["c1:notify", "c1-b:notify"]


# --- (3) a fork carries the outbox intents and deliveries before its fork point ---

OUTBOX = '''
from pathlib import Path
import durable_kit
from durable_kit import destination, send_via_outbox


@destination("seams.mailer")
def mailer(journal_path, payload, key):
    with Path(journal_path).with_suffix(".sent").open("a") as log:
        log.write(f"mail {key}\\n")
    return {"delivered": key}


@durable_kit.workflow("mailing")
def mailing(wf):
    wf.execute_step("draft", lambda: "hello")
    receipt = send_via_outbox(wf, "notify", "seams.mailer", {"to": "ops@example.com"})
    wf.execute_step("archive", lambda: "archived")
    return receipt
'''


def test_a_fork_past_an_outbox_step_reuses_its_intent_and_receipt_and_completes(tmp_path):
    db, module = started(tmp_path, OUTBOX, "mailing", "m1")
    worker(db, module)
    journal = Journal(db)
    assert journal.workflow("m1")["output"] == {"delivered": "m1:notify"}
    for up_to in ("notify", "archive"):
        kit("fork", "--db", str(db), "--workflow", "m1", "--up-to", up_to, "--new-id", f"m1-{up_to}", "--by", "Dana",
            "--module", str(module))
    worker(db, module)
    for up_to in ("notify", "archive"):
        fork = journal.workflow(f"m1-{up_to}")
        assert (fork["status"], fork["output"]) == ("complete", {"delivered": "m1:notify"}), fork
    assert calls(db, "mail") == ["m1:notify"]  # one intent, one delivery: the fork reused both
    assert steps_of(journal, "m1-notify") == {"draft": 0, "notify": 0, "archive": 1}
    kit("fork", "--db", str(db), "--workflow", "m1-notify", "--up-to", "archive", "--new-id", "m1-again", "--by",
        "Dana", "--module", str(module))  # a fork of a fork carries the receipt it was given
    worker(db, module)
    assert (journal.workflow("m1-again")["status"], calls(db, "mail")) == ("complete", ["m1:notify"])
    rows = dump(db)["outbox"]
    assert len(rows) == 1 and "'m1:notify'" in rows[0] and "'sent'" in rows[0]


def test_a_fork_past_an_outbox_step_not_yet_delivered_is_refused_and_changes_nothing(tmp_path):
    db, module = started(tmp_path, OUTBOX, "mailing", "m1")
    kit("run", "--db", str(db), "--workflow", "m1", "--module", str(module))  # a replay does not dispatch
    assert Journal(db).workflow("m1")["status"] == "waiting"
    before = dump(db)
    refused = kit("fork", "--db", str(db), "--workflow", "m1", "--up-to", "notify", "--new-id", "m1-b", "--by",
                  "Dana", "--module", str(module), expect=2)
    assert refused.stderr == (
        "error: workflow 'm1': the outbox delivery of step 'notify' (key m1:notify) is not sent yet, so a fork up "
        "to 'notify' would wait for it for ever. Fork once a worker has sent it, or up to a step before 'notify' "
        "(the fork then sends its own). Nothing was changed.\n")
    assert dump(db) == before


# --- (4) every compensation runs, newest first; one that keeps failing pauses the workflow ---

SAGA = SENDER + '''from durable_kit import Transient


def undo_s2(wf, output):
    send(wf, "undo_s2", "compensate:s2")
    if Path(wf.db_path).with_suffix(".broken").exists():
        raise Transient("the refund service answers 503")
    if Path(wf.db_path).with_suffix(".buggy").exists():
        raise KeyError("refund_id")
    return "undone"


@durable_kit.workflow("saga")
def saga(wf):
    wf.execute_step("s1", lambda: send(wf, "s1", "s1"), compensate=lambda out: send(wf, "undo_s1", "compensate:s1"))
    wf.execute_step("s2", lambda: send(wf, "s2", "s2"), compensate=lambda out: undo_s2(wf, out))
    wf.execute_step("s3", lambda: send(wf, "s3", "s3"), compensate=lambda out: send(wf, "undo_s3", "compensate:s3"))
    wf.wait_for_approval("go", {"plan": "three steps"})
    wf.execute_step("s4", lambda: send(wf, "s4", "s4"))
    return "done"
'''

PAUSED = ("cancelling: compensation 'compensate:s2' did not succeed ({why}); no older compensation runs before it "
          "does. Fix the cause, then resume it: it continues from this compensation.")


def saga_cancelled(tmp_path: Path) -> tuple[Path, Path]:
    db, module = started(tmp_path, SAGA, "saga", "w1")
    worker(db, module)
    assert Journal(db).workflow("w1")["status"] == "waiting"
    kit("cancel", "--db", str(db), "--workflow", "w1", "--by", "Dana", "--reason", "plan dropped")
    return db, module


def undo_calls(db: Path) -> tuple[int, int, int]:
    return len(calls(db, "undo_s3")), len(calls(db, "undo_s2")), len(calls(db, "undo_s1"))


def run_until_settled(db: Path, module: Path, workflow_id: str) -> str:
    """Run workers, making each retry due at once, until the workflow is no longer pending; its status."""
    for _ in range(12):
        worker(db, module)
        status = Journal(db).workflow(workflow_id)["status"]
        if status != "pending":
            return status
        make_due(db, workflow_id)
    raise AssertionError(f"{workflow_id} still pending after 12 workers")


def test_a_compensation_that_keeps_failing_pauses_the_workflow_and_resume_continues_from_it(tmp_path):
    db, module = saga_cancelled(tmp_path)
    db.with_suffix(".broken").touch()
    assert run_until_settled(db, module, "w1") == "paused"
    journal = Journal(db)
    wf = journal.workflow("w1")
    assert wf["error"] == PAUSED.format(why="Transient on attempt 5 of 5: the refund service answers 503")
    assert undo_calls(db) == (1, 5, 0)  # s3 undone, s2 tried five times, s1 not yet: never before s2
    assert journal.conn.execute("SELECT COUNT(*) FROM escalations").fetchone()[0] == 0
    again = kit("cancel", "--db", str(db), "--workflow", "w1", "--by", "Eli", "--reason", "again")
    assert again.stdout == ("w1: already being cancelled (requested by Dana: plan dropped; status paused); "
                            "nothing was changed\n")

    kit("resume", "--db", str(db), "--workflow", "w1", "--by", "ops")  # still broken: one more attempt, paused again
    worker(db, module)
    assert journal.workflow("w1")["status"] == "paused"
    assert undo_calls(db) == (1, 6, 0)

    db.with_suffix(".broken").unlink()  # fixed
    kit("resume", "--db", str(db), "--workflow", "w1", "--by", "ops")
    worker(db, module)
    wf = journal.workflow("w1")
    assert (wf["status"], wf["error"]) == ("cancelled", "cancelled by Dana: plan dropped")
    assert undo_calls(db) == (1, 7, 1)  # s3 was not undone again; s2 then s1
    assert [s["name"] for s in sorted(journal.steps("w1"), key=lambda s: s["position"])
            if s["name"].startswith("compensate:")] == ["compensate:s3", "compensate:s2", "compensate:s1"]
    assert steps_of(journal, "w1")["compensate:s3"] == 1
    assert calls(db, "s4") == []
    events = [(e["event"], e["detail"]) for e in journal.history("w1")
              if e["event"] in ("workflow_paused", "workflow_resumed", "workflow_cancelled")]
    assert events == [("workflow_paused", PAUSED.format(why="Transient on attempt 5 of 5: the refund service "
                                                            "answers 503")),
                      ("workflow_resumed", "from paused by ops"),
                      ("workflow_paused", PAUSED.format(why="Transient on attempt 6, after a resume: the refund "
                                                            "service answers 503")),
                      ("workflow_resumed", "from paused by ops"),
                      ("workflow_cancelled", "cancelled by Dana: plan dropped; compensated s3, s2, s1")]


def test_a_compensation_that_raises_a_bug_pauses_at_once_and_resume_after_the_fix_finishes(tmp_path):
    db, module = saga_cancelled(tmp_path)
    db.with_suffix(".buggy").touch()
    worker(db, module)
    journal = Journal(db)
    wf = journal.workflow("w1")
    assert (wf["status"], wf["error"]) == ("paused", PAUSED.format(
        why="unexpected KeyError (a bug to fix, not a failure class): 'refund_id'"))
    assert undo_calls(db) == (1, 1, 0)
    db.with_suffix(".buggy").unlink()
    kit("resume", "--db", str(db), "--workflow", "w1", "--by", "ops")
    worker(db, module)
    assert journal.workflow("w1")["status"] == "cancelled"
    assert undo_calls(db) == (1, 2, 1)


def test_a_compensation_whose_process_is_killed_every_time_pauses_and_skips_none(tmp_path):
    db, module = saga_cancelled(tmp_path)
    for attempt in range(5):  # SIGKILL right after each undo_s2 call, before its step is recorded
        arm(Journal(db).conn, "after_activity:compensate:s2", "kill")
        assert worker(db, module, expect=None).returncode == -signal.SIGKILL
    assert undo_calls(db) == (1, 5, 0)
    worker(db, module)  # the sixth replay finds five dead attempts: the crash limit, so it pauses
    journal = Journal(db)
    wf = journal.workflow("w1")
    assert (wf["status"], wf["error"]) == ("paused", PAUSED.format(
        why="Crashed on attempt 5 of 5: the process died during the attempt"))
    assert undo_calls(db) == (1, 5, 0)
    kit("resume", "--db", str(db), "--workflow", "w1", "--by", "ops")
    worker(db, module)
    assert journal.workflow("w1")["status"] == "cancelled"
    assert undo_calls(db) == (1, 6, 1)
    assert (effects(db, "undo_s3"), effects(db, "undo_s2"), effects(db, "undo_s1")) == (1, 1, 1)  # one key each


# --- (5) a blocked workflow's cancellation is refused with what to do ---

def test_cancelling_a_blocked_workflow_is_refused_with_what_to_do_and_changes_nothing(tmp_path):
    from test_change import crashed_v1, V2

    db, module = crashed_v1(tmp_path)
    write(module, V2["inserted"], "v2")
    worker(db, module)
    assert Journal(db).workflow("c1")["status"] == "blocked"
    before = dump(db)
    refused = kit("cancel", "--db", str(db), "--workflow", "c1", "--by", "Dana", "--reason", "stop", expect=2)
    assert refused.stderr == (
        "error: workflow 'c1' is blocked: its code no longer replays its recorded history, so the compensations "
        "of its steps cannot be found. Deploy code that replays it (for example behind patched), resume it, "
        "then cancel it. Nothing was changed.\n")
    assert dump(db) == before


def test_a_cancellation_saved_before_the_workflow_blocked_is_carried_out_once_it_replays_again(tmp_path):
    from test_change import crashed_v1, V2

    db, module = crashed_v1(tmp_path)  # its worker died after reserve: the workflow is still running
    kit("cancel", "--db", str(db), "--workflow", "c1", "--by", "Dana", "--reason", "stop")
    write(module, V2["inserted"], "v2")
    worker(db, module)
    assert Journal(db).workflow("c1")["status"] == "blocked"
    status = kit("status", "--db", str(db), "--workflow", "c1").stdout.splitlines()
    assert status[2] == ("  cancellation requested by Dana: stop; it compensates once resumed under code that "
                         "replays its history")
    write(module, PATCHED, "v2")
    kit("resume", "--db", str(db), "--workflow", "c1", "--by", "ops")
    worker(db, module)
    wf = Journal(db).workflow("c1")
    assert (wf["status"], wf["error"]) == ("cancelled", "cancelled by Dana: stop")
    assert (effects(db, "reserve"), effects(db, "fraud_check"), effects(db, "charge")) == (1, 0, 0)


BUGGY = SENDER + '''

@durable_kit.workflow("buggy")
def buggy(wf):
    wf.execute_step("s1", lambda: send(wf, "s1", "s1"), compensate=lambda out: send(wf, "undo_s1", "compensate:s1"))
    raise KeyError("a bug outside any step")
'''


def test_cancelling_a_workflow_whose_code_fails_past_its_last_step_compensates(tmp_path):
    db, module = started(tmp_path, BUGGY, "buggy", "f1")
    worker(db, module)
    journal = Journal(db)
    assert journal.workflow("f1")["status"] == "failed"
    kit("cancel", "--db", str(db), "--workflow", "f1", "--by", "Dana", "--reason", "stop")
    worker(db, module)  # the code raises again past every recorded step: the cancellation comes first
    wf = journal.workflow("f1")
    assert (wf["status"], wf["error"]) == ("cancelled", "cancelled by Dana: stop")
    assert (len(calls(db, "s1")), len(calls(db, "undo_s1"))) == (1, 1)


# --- (5) a cancellation that arrives during the last step is reported ---

LAST_STEP = AWAIT_CANCEL + '''
import durable_kit


@durable_kit.workflow("last_step")
def last_step(wf):
    wf.execute_step("prepare", lambda: "ready", compensate=lambda out: "undone")
    return wf.execute_step("send", lambda: wait_for_the_cancellation(wf))


@durable_kit.workflow("last_step_then_end")
def last_step_then_end(wf):
    wf.execute_step("prepare", lambda: "ready", compensate=lambda out: "undone")
    wf.execute_step("send", lambda: wait_for_the_cancellation(wf))
    wf.end("stopped", "nothing more to do")
'''


def cancelled_during_the_last_step(tmp_path, kind: str) -> Path:
    """Workflow l1 of ``kind``, cancelled by Dana while a worker runs its last step, run to the end; its journal."""
    db, module = started(tmp_path, LAST_STEP, kind, "l1")
    running = subprocess.Popen([sys.executable, "-m", "durable_kit", "worker", "--db", str(db), "--until-idle",
                                "--module", str(module)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    wait_until(lambda: any(s["name"] == "send" for s in Journal(db).steps("l1")), 60, "the last step to start")
    kit("cancel", "--db", str(db), "--workflow", "l1", "--by", "Dana", "--reason", "too slow")
    assert running.communicate(timeout=120)[0] and running.returncode == 0
    return db


@pytest.mark.parametrize("kind, ended", [("last_step", ("complete", "sent", None, "completed"))])
def test_a_cancellation_during_the_last_step_is_reported_as_too_late(tmp_path, kind, ended):
    db = cancelled_during_the_last_step(tmp_path, kind)
    journal = Journal(db)
    wf = journal.workflow("l1")
    status, output, error, said = ended
    assert (wf["status"], wf["output"], wf["error"]) == (status, output, error)
    assert [s["name"] for s in journal.steps("l1")] == ["prepare", "send"]  # nothing compensated
    too_late = f"{said} before the cancellation took effect (requested by Dana: too slow)"
    last = journal.history("l1")[-1]
    assert (last["event"], last["detail"]) == ("cancel_too_late", too_late)
    lines = kit("status", "--db", str(db), "--workflow", "l1").stdout.splitlines()
    assert lines[:2] == [f"l1 ({kind}, version {wf['version']}): {status}" + (f" - {error}" if error else ""),
                         f"  {too_late}"]
    history = kit("history", "--db", str(db), "--workflow", "l1").stdout
    assert history.count("before the cancellation took effect") == 1
    as_json = json.loads(kit("status", "--db", str(db), "--workflow", "l1", "--json").stdout)
    assert as_json["workflow"]["cancel_requested"] == {"by": "Dana", "reason": "too slow"}


def test_a_cancellation_during_the_last_step_of_code_that_then_ends_itself_cancels_it(tmp_path):
    journal = Journal(cancelled_during_the_last_step(tmp_path, "last_step_then_end"))
    wf = journal.workflow("l1")
    assert (wf["status"], wf["output"], wf["error"]) == ("cancelled", None, "cancelled by Dana: too slow")
    assert [s["name"] for s in journal.steps("l1")] == ["prepare", "send", "compensate:prepare"]
    last = journal.history("l1")[-1]  # end() is a boundary: the cancellation asked for before it wins
    assert (last["event"], last["detail"]) == ("workflow_cancelled",
                                               "cancelled by Dana: too slow; compensated prepare")


# --- (13) a cancellation is checked before a resolved decision is returned ---

APPROVE_LAST = SENDER + '''


@durable_kit.workflow("approve_last")
def approve_last(wf):
    wf.execute_step("charge", lambda: send(wf, "charge", "charge"),
                    compensate=lambda out: send(wf, "refund", "compensate:charge"))
    return wf.wait_for_approval("go", {"charge": "10 EUR"})
'''


def test_cancel_then_approve_then_a_worker_compensates_instead_of_completing(tmp_path):
    db, module = started(tmp_path, APPROVE_LAST, "approve_last", "a1")
    worker(db, module)
    kit("cancel", "--db", str(db), "--workflow", "a1", "--by", "Dana", "--reason", "changed mind")
    approved = kit("approve", "--db", str(db), "--workflow", "a1", "--by", "Eli", expect=2)
    assert approved.stdout == "" and approved.stderr == (
        "error: workflow 'a1' is being cancelled (requested by Dana: changed mind); its wait 'go' takes no decision "
        "now and nothing was saved.\n")
    worker(db, module)
    journal = Journal(db)
    wf = journal.workflow("a1")
    assert (wf["status"], wf["output"], wf["error"]) == ("cancelled", None, "cancelled by Dana: changed mind")
    assert (len(calls(db, "charge")), len(calls(db, "refund"))) == (1, 1)
    worker(db, module)  # final: every later worker leaves it
    assert (journal.workflow("a1")["status"], len(calls(db, "refund"))) == ("cancelled", 1)
