"""The engine: waits for people and for time are rows; decisions are final; no worker is held."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

import durable_kit
import durable_kit.workshop.agents  # noqa: F401  (registers research_report and reviewed_report)
from durable_kit import Journal, Workflow, WorkflowError, resume, run_workflow
from durable_kit.core import waits as waits_module
from durable_kit.admin import describe_outcome, open_wait, waits
from durable_kit.decisions import DecisionConflict, NotWaiting, answer, approve, reject
from durable_kit.core.leases import new_owner
from durable_kit.core.worker import due_workflows, run_due

from conftest import ROOT, dump, grant, plain

DRAFT = {"text": "draft 1"}


@pytest.fixture
def journal(db):
    return Journal(db)


@pytest.fixture
def gated(journal, kinds):
    """Start 'g1' of a throwaway kind (draft, approval 'gate', publish) and run it to the wait.

    Returns the list of drafts the publish step received, so a test can see whether it ran.
    """
    kind = kinds("gated")
    published = []

    @durable_kit.workflow(kind)
    def gated_flow(wf):
        draft = wf.execute_step("draft", lambda: DRAFT)
        decision = wf.wait_for_approval("gate", {"draft": draft})
        if not decision["approved"]:
            wf.end("rejected", f"rejected by {decision['by']}")
        wf.execute_step("publish", lambda: published.append(draft) or "published")
        return decision

    journal.start(kind, {}, "g1")
    assert run_workflow(journal, "g1") is None
    return published


def events(journal, workflow_id) -> list[str]:
    return [e["event"] for e in journal.history(workflow_id)]


def quiet(_message):
    pass


# --- reaching a wait ---

def test_reaching_an_approval_saves_one_open_wait_and_no_run_time(journal, gated):
    wf = journal.workflow("g1")
    assert (wf["status"], wf["next_run_at"]) == ("waiting", None)
    (wait,) = waits(journal, "g1")
    assert {k: wait[k] for k in ("workflow_id", "name", "kind", "request", "status", "decision", "wake_at",
                                 "resolved_at")} == {
        "workflow_id": "g1", "name": "gate", "kind": "approval", "request": {"draft": DRAFT},
        "status": "waiting", "decision": None, "wake_at": None, "resolved_at": None}
    assert open_wait(journal, "g1") == wait
    history = journal.history("g1")
    assert (history[-1]["event"], history[-1]["step"]) == ("waiting_for_approval", "gate")
    assert gated == []

    # Nothing is due: a worker has nothing to claim and nothing to hold.
    assert due_workflows(journal) == []
    assert grant(journal.conn, "g1", new_owner()) is None
    before = dump(journal.path)
    assert run_due(journal, quiet) == 0
    assert dump(journal.path) == before


def test_replaying_a_waiting_workflow_keeps_one_wait_and_runs_nothing_again(journal, gated):
    assert run_workflow(journal, "g1") is None
    assert run_workflow(journal, "g1") is None
    assert journal.workflow("g1")["status"] == "waiting"
    assert len(waits(journal, "g1")) == 1
    assert events(journal, "g1").count("waiting_for_approval") == 1
    assert {s["name"]: s["attempts"] for s in journal.steps("g1")} == {"draft": 1}
    assert gated == []


# --- approve ---

def test_approve_saves_the_decision_and_makes_the_workflow_due(journal, gated):
    result = approve(journal, "g1", "ana", "looks right")
    decision = plain(result)
    assert decision == {"approved": True, "by": "ana", "comment": "looks right"}
    assert (result["wait"], result["saved"]) == ("gate", True)
    wf = journal.workflow("g1")
    assert wf["status"] == "pending" and wf["next_run_at"] <= time.time()
    (wait,) = waits(journal, "g1")
    assert (wait["status"], wait["decision"]) == ("resolved", decision)
    assert wait["resolved_at"] is not None
    assert open_wait(journal, "g1") is None
    last = journal.history("g1")[-1]
    assert (last["event"], last["step"], last["detail"]) == ("approved", "gate", "approved by ana: looks right")
    assert due_workflows(journal) == ["g1"]

    assert run_due(journal, quiet) == 1
    wf = journal.workflow("g1")
    assert (wf["status"], wf["output"]) == ("complete", decision)
    assert gated == [DRAFT]
    assert {s["name"]: s["attempts"] for s in journal.steps("g1")} == {"draft": 1, "publish": 1}
    assert run_due(journal, quiet) == 0


def test_the_decision_and_the_status_change_commit_together(journal, gated):
    # A trigger refuses the status change: the decision written just before it must roll back with it.
    journal.conn.execute("CREATE TRIGGER refuse_pending BEFORE UPDATE OF status ON workflows"
                         " WHEN NEW.status = 'pending' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    before = dump(journal.path)
    with pytest.raises(sqlite3.IntegrityError, match="refused by the test"):
        approve(journal, "g1", "ana")
    assert dump(journal.path) == before
    assert open_wait(journal, "g1")["status"] == "waiting"
    assert journal.workflow("g1")["status"] == "waiting"

    journal.conn.execute("DROP TRIGGER refuse_pending")
    assert approve(journal, "g1", "ana")["approved"] is True
    assert journal.workflow("g1")["status"] == "pending"


def test_the_same_decision_again_returns_the_first_and_writes_nothing(journal, gated):
    first = approve(journal, "g1", "ana", "looks right")
    assert first["saved"] is True
    first = {**first, "saved": False}  # what every repeat returns: the first decision, and nothing saved
    before = dump(journal.path)
    assert approve(journal, "g1", "bob", "me too") == first
    assert approve(journal, "g1", "ana") == first
    assert approve(journal, "g1", "ana", wait="gate") == first
    assert dump(journal.path) == before
    assert describe_outcome("g1", first).startswith("g1, wait 'gate': already approved by ana at ")
    assert describe_outcome("g1", first).endswith("; nothing saved")

    run_due(journal, quiet)
    assert journal.workflow("g1")["status"] == "complete"
    before = dump(journal.path)
    assert approve(journal, "g1", "bob") == first
    assert dump(journal.path) == before
    assert gated == [DRAFT]


def test_a_second_rejection_returns_the_first(journal, gated):
    first = reject(journal, "g1", "bob", "not yet")
    before = dump(journal.path)
    assert reject(journal, "g1", "cy", "agreed") == {**first, "saved": False}
    assert plain(first) == {"approved": False, "by": "bob", "comment": "not yet"}
    assert dump(journal.path) == before


@pytest.mark.parametrize("first, second, saved", [(approve, reject, "approved by ana"),
                                                  (reject, approve, "rejected by ana")],
                         ids=["reject-after-approve", "approve-after-reject"])
def test_a_different_decision_is_a_conflict_and_changes_nothing(journal, gated, first, second, saved):
    first(journal, "g1", "ana", "final")
    for run_it in (False, True):  # before and after the workflow ran on with the first decision
        if run_it:
            run_due(journal, quiet)
            assert journal.workflow("g1")["status"] in ("complete", "rejected")
        before = dump(journal.path)
        with pytest.raises(DecisionConflict) as raised:
            second(journal, "g1", "bob", "other")
        message = str(raised.value)
        assert "workflow 'g1'" in message and "wait 'gate'" in message
        assert f"the decision saved first ({saved}: final) is final" in message
        assert "nothing was changed" in message
        assert dump(journal.path) == before


# --- deciding what is not waiting ---

def test_approving_a_workflow_before_its_first_run_changes_nothing(journal, gated):
    journal.start(journal.workflow("g1")["kind"], {}, "g2")
    before = dump(journal.path)
    for decide in (approve, reject):
        with pytest.raises(NotWaiting, match=r"workflow 'g2' is not waiting for approval "
                                             r"\(its status is 'pending'\); nothing was changed"):
            decide(journal, "g2", "ana")
    assert dump(journal.path) == before


def test_approving_a_workflow_that_never_waits_changes_nothing(journal):
    journal.start("research_report", {"topic": "a one-part question"}, "r1")
    assert run_workflow(journal, "r1")["recommendation"] == "Proceed."
    assert waits(journal, "r1") == []
    before = dump(journal.path)
    for decide in (approve, reject):
        with pytest.raises(NotWaiting, match=r"workflow 'r1' is not waiting for approval "
                                             r"\(its status is 'complete'\)"):
            decide(journal, "r1", "ana")
    with pytest.raises(NotWaiting, match="'r1' is not waiting for clarification"):
        answer(journal, "r1", "anything", "ana")
    assert dump(journal.path) == before


def test_deciding_a_workflow_that_does_not_exist_changes_nothing(journal, gated):
    before = dump(journal.path)
    for decide in (lambda: approve(journal, "nope", "ana"), lambda: reject(journal, "nope", "ana"),
                   lambda: answer(journal, "nope", "a topic", "ana")):
        with pytest.raises(WorkflowError, match=r"no workflow 'nope' in journal\.db; check the id") as raised:
            decide()
        assert not isinstance(raised.value, NotWaiting)
    assert dump(journal.path) == before


def test_answering_a_workflow_that_waits_for_approval_changes_nothing(journal, gated):
    before = dump(journal.path)
    with pytest.raises(NotWaiting, match=r"'g1' is not waiting for clarification \(its status is 'waiting'\)"):
        answer(journal, "g1", "a topic", "ana")
    assert dump(journal.path) == before


@pytest.mark.parametrize("by", ["", "   "], ids=["empty", "blank"])
def test_a_decision_needs_someone_who_decides(journal, gated, by):
    before = dump(journal.path)
    for decide in (lambda: approve(journal, "g1", by), lambda: reject(journal, "g1", by, "why"),
                   lambda: answer(journal, "g1", "a topic", by)):
        with pytest.raises(WorkflowError, match=r"workflow 'g1': say who decides \(a name\); nothing was changed"):
            decide()
    assert dump(journal.path) == before
    assert journal.workflow("g1")["status"] == "waiting"


def test_reject_resumes_the_workflow_which_ends_rejected(journal, gated):
    assert plain(reject(journal, "g1", "bob")) == {"approved": False, "by": "bob", "comment": ""}
    assert journal.workflow("g1")["status"] == "pending"
    last = journal.history("g1")[-1]
    assert (last["event"], last["detail"]) == ("rejected", "rejected by bob")
    assert run_due(journal, quiet) == 1
    wf = journal.workflow("g1")
    assert (wf["status"], wf["error"], wf["output"]) == ("rejected", "rejected by bob", None)
    assert gated == []
    assert "publish" not in {s["name"] for s in journal.steps("g1")}
    before = dump(journal.path)
    assert run_due(journal, quiet) == 0
    assert run_workflow(journal, "g1") is None  # a final status: returns the stored output, runs nothing
    assert dump(journal.path) == before


# --- clarifications ---

def test_an_answer_is_what_ask_returns_and_is_final(journal, kinds):
    kind = kinds()

    @durable_kit.workflow(kind)
    def asking(wf):
        topic = wf.ask("clarify", "Which topic?")
        return wf.execute_step("use", lambda: f"researching {topic}")

    journal.start(kind, {}, "q1")
    assert run_workflow(journal, "q1") is None
    wait = open_wait(journal, "q1")
    assert (wait["kind"], wait["request"]) == ("clarification", {"question": "Which topic?"})
    assert journal.workflow("q1")["next_run_at"] is None

    before = dump(journal.path)
    for empty in ("", "  \n"):
        with pytest.raises(WorkflowError, match="'q1': the answer is empty"):
            answer(journal, "q1", empty, "ana")
    assert dump(journal.path) == before

    first = answer(journal, "q1", "pumps", "ana")
    assert plain(first) == {"answer": "pumps", "by": "ana"}
    assert journal.history("q1")[-1]["detail"] == "answered by ana: pumps"
    before = dump(journal.path)
    assert answer(journal, "q1", "pumps", "bob") == {**first, "saved": False}
    with pytest.raises(DecisionConflict, match=r"'q1', wait 'clarify': the decision saved first \(answered by ana: pumps\) is final"):
        answer(journal, "q1", "valves", "bob")
    assert dump(journal.path) == before

    run_due(journal, quiet)
    assert journal.workflow("q1")["output"] == "researching pumps"


# --- durable timers ---

def timer_flow(kinds, ran: list, seconds: float = 1.0) -> str:
    kind = kinds("timer")

    @durable_kit.workflow(kind)
    def cool_down(wf):
        first = wf.execute_step("before", lambda: ran.append("before") or "warm")
        wf.sleep("cool_down", seconds)
        return [first, wf.execute_step("after", lambda: ran.append("after") or "cooled")]

    return kind


def test_a_timer_is_stored_once_and_passes_only_when_its_time_has_come(journal, kinds):
    ran = []
    journal.start(timer_flow(kinds, ran), {}, "t1")
    reached = time.time()
    assert run_workflow(journal, "t1") is None
    (wait,) = waits(journal, "t1")
    assert (wait["kind"], wait["status"], wait["request"]) == ("timer", "waiting", {"seconds": 1.0})
    assert reached + 1.0 <= wait["wake_at"] <= time.time() + 1.0
    wf = journal.workflow("t1")
    assert (wf["status"], wf["next_run_at"]) == ("waiting", wait["wake_at"])
    assert ran == ["before"]

    # Before its time: not due, not claimable, and a replay does not pass it or move it.
    assert due_workflows(journal) == []
    assert grant(journal.conn, "t1", new_owner()) is None
    assert run_due(journal, quiet) == 0
    assert run_workflow(journal, "t1") is None
    assert waits(journal, "t1") == [wait]
    wf = journal.workflow("t1")
    assert (wf["status"], wf["next_run_at"]) == ("waiting", wait["wake_at"])
    assert ran == ["before"]
    assert [s["name"] for s in journal.steps("t1")] == ["before"]
    assert events(journal, "t1").count("waiting_for_timer") == 1
    assert "timer_fired" not in events(journal, "t1")

    time.sleep(max(0.0, wait["wake_at"] - time.time()) + 0.02)
    assert due_workflows(journal) == ["t1"]
    assert run_due(journal, quiet) == 1
    wf = journal.workflow("t1")
    assert (wf["status"], wf["output"]) == ("complete", ["warm", "cooled"])
    assert ran == ["before", "after"]
    (fired,) = waits(journal, "t1")
    assert (fired["status"], fired["wake_at"], fired["decision"]) == ("resolved", wait["wake_at"], None)
    assert events(journal, "t1").count("timer_fired") == 1
    assert due_workflows(journal) == []


def test_a_timer_holds_no_process_and_fires_in_a_later_worker(tmp_path, journal):
    module = tmp_path / "cooling.py"
    module.write_text(
        "from durable_kit import workflow\n\n"
        "@workflow('test_waits.cooling')\n"
        "def cooling(wf):\n"
        "    first = wf.execute_step('before', lambda: 'warm')\n"
        "    wf.sleep('cool_down', 3600.0)\n"
        "    return [first, wf.execute_step('after', lambda: 'cooled')]\n")

    def worker() -> list[str]:
        done = subprocess.run([sys.executable, "-m", "durable_kit", "worker", "--db", str(journal.path),
                               "--until-idle", "--module", str(module)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    journal.start("test_waits.cooling", {}, "t1", registered_elsewhere=True)
    assert worker() == ["t1: waiting", "worker stopped"]
    (wait,) = waits(journal, "t1")
    assert wait["wake_at"] > time.time()
    assert journal.workflow("t1")["next_run_at"] == wait["wake_at"]

    before = dump(journal.path)
    assert worker() == ["worker stopped"]  # a new process before the time (an hour away, however slow): nothing
    assert dump(journal.path) == before

    # The hour passes: the saved time moves back. The later worker fires the timer only if it reads the saved
    # time; had its replay computed a new one (now + 3600), it would wait again.
    journal.conn.execute("UPDATE waits SET wake_at = wake_at - 3600 WHERE workflow_id = 't1'")
    journal.conn.execute("UPDATE workflows SET next_run_at = next_run_at - 3600 WHERE id = 't1'")
    assert worker() == ["t1: complete", "worker stopped"]
    assert journal.workflow("t1")["output"] == ["warm", "cooled"]
    assert waits(journal, "t1")[0]["wake_at"] == wait["wake_at"] - 3600  # the later process kept the saved time
    assert {s["name"]: s["attempts"] for s in journal.steps("t1")} == {"before": 1, "after": 1}


# --- wait names ---

def test_a_wait_name_saved_for_one_kind_cannot_be_reused_for_another(journal, kinds):
    kind = kinds()
    version = {"code": "timer"}

    @durable_kit.workflow(kind)
    def changing(wf):
        if version["code"] == "timer":
            wf.sleep("gate", 60)
        elif version["code"] == "approval":
            wf.wait_for_approval("gate", {"draft": 1})
        else:
            wf.ask("gate", "Which?")

    journal.start(kind, {}, "w1")
    assert run_workflow(journal, "w1") is None
    saved = dump(journal.path)["waits"]
    for code in ("approval", "clarification"):
        version["code"] = code
        with pytest.raises(WorkflowError, match=f"workflow 'w1': wait 'gate' was saved with kind 'timer', "
                                                f"not '{code}'"):
            run_workflow(journal, "w1")
        assert dump(journal.path)["waits"] == saved
        resume(journal, "w1", by="ops")  # failed by the refusal: resumed under the next version of the code


def test_a_wait_kind_must_be_known(journal, kinds):
    kind = kinds()

    @durable_kit.workflow(kind)
    def napping(wf):
        waits_module.wait_for(wf, "nap", "nap")

    journal.start(kind, {}, "w1")
    with pytest.raises(ValueError, match="a wait's kind is one of"):
        run_workflow(journal, "w1")
    assert waits(journal, "w1") == []


def twice_approved(wf):
    wf.wait_for_approval("gate", {"n": 1})
    wf.wait_for_approval("gate", {"n": 2})


def step_then_wait(wf):
    wf.execute_step("cool", lambda: 1)
    wf.sleep("cool", 60)


def wait_then_step(wf):
    wf.sleep("cool", 0)
    wf.execute_step("cool", lambda: 1)


def twice_slept(wf):
    wf.sleep("pause", 0)
    wf.sleep("pause", 0)


@pytest.mark.parametrize("flow, name, waits_saved", [(twice_approved, "gate", 1), (step_then_wait, "cool", 0),
                                                     (wait_then_step, "cool", 1), (twice_slept, "pause", 1)],
                         ids=["two-approvals", "step-then-wait", "wait-then-step", "two-timers"])
def test_a_name_used_twice_in_one_run_is_refused(journal, kinds, flow, name, waits_saved):
    kind = kinds()
    durable_kit.workflow(kind)(flow)
    journal.start(kind, {}, "w1")
    for _ in range(3):  # run until the duplicate is reached (after an approval or a zero timer)
        if (wait := open_wait(journal, "w1")) and wait["kind"] == "approval":
            approve(journal, "w1", "ana")
        try:
            run_workflow(journal, "w1")
        except WorkflowError as error:
            assert f"step {name!r} was already executed in this run" in str(error)
            break
    else:
        pytest.fail("the duplicate name was never refused")
    assert journal.workflow("w1")["status"] == "failed"
    assert len(waits(journal, "w1")) == waits_saved


# --- a decision racing a replay ---

def test_an_approval_saved_while_a_replay_reaches_the_wait_is_not_lost(journal, gated, monkeypatch):
    """Replaying a waiting workflow (``run``, a notebook) reads its open wait, then marks it waiting again.

    If a person approves between that read and that write, the decision is
    saved and the workflow must still run on: not stay *waiting* with no run
    time and no open wait, where no worker will ever pick it up.
    """
    real_write = Workflow._fenced
    other = Journal(journal.path)  # the person's process
    decided, writes = [], []

    @contextmanager
    def approval_lands_first(wf, *args, **kwargs):
        # Write 1 is wait_for's, after its first read of the wait (the grant recorded the replay's start).
        writes.append(1)
        if len(writes) == 1:
            decided.append(approve(other, "g1", "ana"))
        with real_write(wf, *args, **kwargs) as conn:
            yield conn

    monkeypatch.setattr(Workflow, "_fenced", approval_lands_first)
    run_workflow(journal, "g1")
    monkeypatch.undo()
    assert [plain(d) for d in decided] == [{"approved": True, "by": "ana", "comment": ""}]
    assert waits(journal, "g1")[0]["status"] == "resolved"

    run_due(journal, quiet)
    wf = journal.workflow("g1")
    assert wf["status"] == "complete", (
        f"the approval was saved but the workflow is {wf['status']!r} with next_run_at {wf['next_run_at']!r} "
        "and no open wait: no worker will ever run it")
    assert gated == [DRAFT]
