"""A model-based test of the whole kit: random sequences of operations in real processes, checked against a model.

Each sequence (one Hypothesis example) gets its own journal in a temporary
folder. Its rules act only through ``python -m durable_kit ...`` child
processes: start refunds (every delivery strategy), research reports (an
approval, a clarifying question) and bookings (``tests/model_kinds.py``: a
seat hold and a charge with compensations, an approval with or without a
deadline; some made to escalate, fail or pause after the charge, one cancelled
at its approval, one whose activity outruns its lease); start workers,
SIGKILL them, SIGSTOP one past its lease and SIGCONT it later; ``run``,
approve, reject and answer (the right wait, a wrong one, a repeat, a late
one, one on a final workflow), cancel (an escalation too), fork (a cancelled
workflow too) and resume; deploy a code change with or without ``patched``;
let time pass so deadlines and leases run out. After every rule the
invariants are checked against the committed rows and the destinations' own
books: what each destination received (every request names its workflow and
action; at most one per attempt of the step that sends it, a reserved key
once) and the order of each workflow's effects and compensations (newest
first, once each). At the end of a sequence every process is continued, one
worker runs, and every workflow must reach a final status or a wait a person
can see.

Profiles (``DURABLE_KIT_MODEL_PROFILE``): ``bounded`` (the default, part of
``python -m pytest``) runs a few short sequences; ``long`` runs sequences
until ``DURABLE_KIT_MODEL_MINUTES`` (default 20) have passed and prints the
totals. A failing sequence is shrunk by Hypothesis and printed as a short
list of rule calls.
"""
from __future__ import annotations

import json
import os
import re
import sys
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, invariant, multiple, precondition, rule,
                                 run_state_machine_as_test)

from model_world import LEASE_SECONDS, MODULE, Totals, World, decoded, wait_for

PROFILE = os.environ.get("DURABLE_KIT_MODEL_PROFILE", "bounded")
MINUTES = float(os.environ.get("DURABLE_KIT_MODEL_MINUTES", "20"))
STRATEGIES = ("naive", "reservation", "destination_key", "outbox", "reconciliation")
ORDERS = ("A-1001", "A-1002", "A-1003")  # A-1002 needs an approval; A-1003's model cites unfetched evidence once
TOPICS = ("supplier concentration risk", "our suppliers")  # the second is too broad: a clarifying question first
FINAL = ("complete", "escalated", "stopped", "rejected", "cancelled")
APPROVAL_WAIT = {"refund": "approval", "reviewed_report": "approval", "booking": "itinerary"}
CRASH_LIMIT = 3  # attempts whose process died before a step escalates (RetryPolicy max_attempts of every step here)
SETTLE_SECONDS = 90.0
CHURN_ROUNDS = 120 if PROFILE == "long" else 2  # the most workers one churn_workers call starts and ends
TROUBLES = ("escalate", "fail", "pause")  # what a troubled booking does after its charge (tests/model_kinds.py)
OUTRUN = re.compile(r"outr[au]n\b.*\blease", re.I)  # an escalation for an activity that outran its lease says so
DECISIONS = ("approved", "rejected", "answered")  # a saved decision's history event
COMPENSATION = "compensate:"  # a compensation's step (and its action): this prefix and the step it undoes

TOTALS = Totals()


def key(workflow_id: str, action: str) -> str:
    return f"{workflow_id}:{action}"


class KitModel(RuleBasedStateMachine):
    """The reference model: what each workflow may and must become, given the operations done to it."""

    workflows = Bundle("workflows")

    def __init__(self):
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="durable-kit-model-"))
        self.world = World(self.folder, TOTALS)
        TOTALS.sequences += 1
        self.expect: dict[str, dict] = {}  # per workflow: kind, strategy, order, what the model allows
        self.deaths: Counter = Counter()  # processes killed while they owned the workflow's running lease
        self.paused_over: Counter = Counter()  # owners stopped past their lease while running it
        self.completed: dict[tuple[str, str], str] = {}  # (workflow, step) -> its output when first seen complete
        self.first_effect: dict[tuple[str, str, str], float] = {}  # (workflow, destination, action) -> when
        self.finals: dict[str, tuple] = {}  # workflow -> (status, output) when first seen final
        self.orders_used: set[str] = set()
        self.count = 0
        self.patched_deploy = False
        self.trace: list[str] = []
        self.still_since: float | None = None
        self.alive = []  # the processes the model started and has not killed (running or stopped)

    # --- helpers ---

    def op(self) -> None:
        """Count one operation and add the calling rule, with its arguments, to this sequence's trace."""
        TOTALS.operations += 1
        frame = sys._getframe(1)
        names = frame.f_code.co_varnames[1:frame.f_code.co_argcount]
        self.trace.append(f"{frame.f_code.co_name}({', '.join(f'{n}={frame.f_locals[n]!r}' for n in names)})")

    def said(self, outcome: str) -> None:
        """What the last operation did, in its line of the trace."""
        self.trace[-1] += f"  # {outcome}"

    def failed(self, error: AssertionError) -> AssertionError:
        """The violation with the operations that led to it (the real processes may not repeat it exactly)."""
        TOTALS.checks_failed += 1
        return AssertionError(f"{error}\noperations of this sequence, in order:\n  " + "\n  ".join(self.trace))

    def new_id(self, label: str) -> str:
        self.count += 1
        return f"{label}-{self.count}"

    def start(self, workflow_id: str, kind: str, workflow_input: dict, **expect) -> str:
        done = self.world.cli("start", "--db", str(self.world.db), "--kind", kind, "--input",
                              json.dumps(workflow_input), "--id", workflow_id, "--module", str(MODULE))
        assert done.returncode == 0, f"start {workflow_id} failed: {done.stderr.strip()}"
        self.said(workflow_id)
        self.expect[workflow_id] = {"kind": kind, "input": workflow_input, "cancel_must_win": False,
                                    "decision": None, "block_allowed": False, "fork": False, "copied": set(),
                                    "must_end_cancelled": False, **expect}
        return workflow_id

    def row(self, workflow_id: str) -> dict:
        return self.world.snapshot()["workflows"][workflow_id]

    def note_deaths(self, interrupted: list[str]) -> None:
        for workflow_id in interrupted:
            self.deaths[workflow_id] += 1

    # --- starting workflows ---

    @rule(target=workflows, strategy=st.sampled_from(STRATEGIES), order=st.sampled_from(ORDERS))
    def start_refund(self, strategy, order):
        if order in self.orders_used:  # one refund per order per journal: the payment service counts by order
            return multiple()
        self.op()
        self.orders_used.add(order)
        return self.start(f"refund-{strategy}-{order}", "refund", {"order_id": order, "strategy": strategy},
                          strategy=strategy, order=order)

    @rule(target=workflows, topic=st.sampled_from(TOPICS))
    def start_report(self, topic):
        self.op()
        return self.start(self.new_id("report"), "reviewed_report", {"topic": topic})

    @rule(target=workflows, deadline=st.sampled_from([None, 1.0, 120.0]), step_seconds=st.sampled_from([0, 0.4]))
    def start_booking(self, deadline, step_seconds):
        self.op()
        workflow_input = {"trip": f"trip-{self.count + 1}", "deadline": deadline, "step_seconds": step_seconds}
        return self.start(self.new_id("booking"), "booking", workflow_input)

    @rule(target=workflows, trouble=st.sampled_from(TROUBLES))
    def start_troubled_booking(self, trouble):
        """A booking that holds and charges, then escalates, fails or pauses: for cancel, run, resume and fork."""
        self.op()
        workflow_input = {"trip": f"trip-{self.count + 1}", "trouble": trouble}
        return self.start(self.new_id("booking"), "booking", workflow_input)

    def drive(self, workflow_id: str, until, seconds: float = 30.0) -> str:
        """Until ``until(status)``: a live worker moves the workflow, else ``run`` does; its status at the end."""
        deadline = time.monotonic() + seconds
        while True:
            status = self.row(workflow_id)["status"]
            if until(status) or time.monotonic() > deadline:
                return status
            if not any(not p.paused for p in self.world.live()):
                self.world.cli("run", "--db", str(self.world.db), "--workflow", workflow_id, "--module", str(MODULE))
            else:
                time.sleep(0.2)

    @rule(target=workflows)
    def book_then_cancel_at_its_approval(self):
        """A booking driven to its approval, cancelled there and driven on: its compensations run, newest first.
        Then a person approves it anyway: refused, once the kit refuses decisions on final workflows."""
        self.op()
        workflow_id = self.start(self.new_id("booking"), "booking", {"trip": f"trip-{self.count + 1}"})
        reached = self.drive(workflow_id, lambda status: status not in ("pending", "running"))
        if reached != "waiting":
            self.said(f"{workflow_id} reached {reached}, not its approval")
            return workflow_id
        self.cancel_now(workflow_id)
        ended = self.drive(workflow_id, lambda status: status in FINAL)
        self.said(f"{workflow_id} cancelled at its approval, then {ended}")
        if ended in FINAL:
            self.decide_now(workflow_id, approve=True, name=APPROVAL_WAIT["booking"])
        return workflow_id

    @precondition(lambda self: not any(p.paused for p in self.alive))
    @rule(target=workflows)
    def outrun_the_lease(self):
        """A seat hold whose activity stops its process past the lease, with two workers: each attempt is taken
        over while its owner lives. The kit ends that loop (escalated, naming the cause) after CRASH_LIMIT
        takeovers of the step."""
        self.op()
        workflow_input = {"trip": f"trip-{self.count + 1}", "outrun_seconds": LEASE_SECONDS * 1.5}
        workflow_id = self.start(self.new_id("booking"), "booking", workflow_input)
        self.expect[workflow_id]["outruns"] = True
        while len(self.alive) < 2:
            self.alive.append(self.world.start_worker())
        limit = (CRASH_LIMIT + 2) * (LEASE_SECONDS * 2.5) + 10
        taken = lambda: self.takeovers(self.world.snapshot(), workflow_id).get("hold_seat", 0)  # noqa: E731
        wait_for(lambda: self.row(workflow_id)["status"] not in ("pending", "running") or taken() > CRASH_LIMIT + 1,
                 limit, poll=0.3)
        row, count = self.row(workflow_id), taken()
        self.said(f"{workflow_id} {row['status']} after {count} takeovers of hold_seat")
        if count >= CRASH_LIMIT:
            assert row["status"] == "escalated" and OUTRUN.search(row["error"] or ""), (
                f"{workflow_id}: hold_seat was taken over {count} times while its owner lived, yet it is "
                f"{row['status']} ({row['error']}); it should escalate after {CRASH_LIMIT}, naming the cause")
        return workflow_id

    @staticmethod
    def takeovers(snap: dict, workflow_id: str) -> Counter:
        """How many attempts of each step another owner took over while their process lived."""
        return Counter(step for step, event in snap["step_events"].get(workflow_id, [])
                       if event == "attempt_taken_over")

    # --- processes ---

    # Preconditions read the model's own list of processes, never the processes: Hypothesis replays a
    # sequence while shrinking it, and must see the same choices each time.

    @precondition(lambda self: len(self.alive) < 2)
    @rule()
    def start_worker(self):
        self.op()
        self.alive.append(self.world.start_worker())

    @precondition(lambda self: self.alive)
    @rule(which=st.integers(0, 1))
    def kill_worker(self, which):
        self.op()
        interrupted = self.world.kill(self.alive.pop(which % len(self.alive)))
        self.note_deaths(interrupted)
        self.said(f"interrupted {interrupted}")

    @precondition(lambda self: self.alive and not any(p.paused for p in self.alive))
    @rule(which=st.integers(0, 1))
    def pause_worker_past_its_lease(self, which):
        self.op()
        owned = self.world.pause(self.alive[which % len(self.alive)])
        self.said(f"it owned {owned}")
        time.sleep(LEASE_SECONDS * 1.5)  # past its lease: another worker may take its workflows over
        for workflow_id in owned:
            self.paused_over[workflow_id] += 1

    @precondition(lambda self: any(p.paused for p in self.alive))
    @rule()
    def continue_paused_worker(self):
        self.op()
        for proc in self.alive:
            if proc.paused:
                self.world.resume_process(proc)

    @precondition(lambda self: not self.alive)
    @rule(rounds=st.integers(2, CHURN_ROUNDS), gap=st.sampled_from([0.5, 0.9, 1.5]))
    def churn_workers(self, rounds, gap):
        """Two workers racing for the work, in quick succession: each round starts two and ends them ``gap`` s later.

        Every third round stops one of its two (SIGSTOP; the one that owns a
        workflow, if either does) instead of killing it, and the next rounds'
        workers take its workflows over once its lease runs out; past the
        lease it is continued (SIGCONT), or every third time killed; it races
        the next rounds' workers until the next one is continued. A booking
        whose steps take a second each is started whenever no workflow is
        pending or running, so the kills land on work. The invariants are
        checked after every round.
        """
        self.op()
        paused, pauses = None, 0
        for round_ in range(rounds):
            if not self.world.working():
                workflow_input = {"trip": f"trip-{self.count + 1}", "deadline": 1.0, "step_seconds": 1.0}
                self.start(self.new_id("booking"), "booking", workflow_input)
            pair = [self.world.start_worker(), self.world.start_worker()]
            time.sleep(gap)
            if paused is None and round_ % 3 == 2:
                pair.sort(key=lambda proc: not self.world.owned_by(proc.popen.pid))
                stopped = pair.pop(0)
                paused = (stopped, self.world.pause(stopped), time.monotonic())
                self.alive.append(stopped)
                pauses += 1
            for proc in pair:
                self.note_deaths(self.world.kill(proc))
            if paused and time.monotonic() - paused[2] > LEASE_SECONDS * 1.5:
                self.end_pause(*paused[:2], kill=pauses % 3 == 0)
                paused = None
            self.invariants_hold()  # after every round, not only after the rule: no state between goes unseen
        if paused:
            time.sleep(max(0.0, LEASE_SECONDS * 1.5 - (time.monotonic() - paused[2])))
            self.end_pause(*paused[:2], kill=False)
        self.said(f"{rounds} rounds, {pauses} paused")

    def end_pause(self, proc, owned: list[str], kill: bool) -> None:
        """End a stop that outlived the lease: the workflows the stopped worker owned were paused over."""
        for workflow_id in owned:
            self.paused_over[workflow_id] += 1
        if kill:
            self.alive.remove(proc)
            self.note_deaths(self.world.kill(proc))
            return
        self.world.resume_process(proc)
        for older in [p for p in self.alive if p is not proc]:  # one continued worker at a time races the rounds
            self.alive.remove(older)
            self.note_deaths(self.world.kill(older))

    @rule(seconds=st.sampled_from([0.3, 1.0, 2.5]))
    def let_time_pass(self, seconds):
        self.op()
        time.sleep(seconds)

    @precondition(lambda self: any(not p.paused for p in self.alive))
    @rule()
    def wait_until_idle(self):
        """Until no workflow is due or running (at most 20 s): the sequence's next operation meets a still world."""
        self.op()
        idle = wait_for(lambda: not self.world.busy(), 20.0)
        self.said("idle" if idle else "still busy after 20 s")

    @precondition(lambda self: self.world.code == "v1")
    @rule(patched=st.booleans())
    def deploy_code_change(self, patched):
        """Stop every old worker (SIGKILL) and run new code from now on: a fraud check after the seat hold."""
        self.op()
        while self.alive:
            self.note_deaths(self.world.kill(self.alive.pop()))
        self.world.code = "v2-patched" if patched else "v2-unpatched"
        self.patched_deploy = patched
        if not patched:  # a history written before the change may block: the model allows it, nothing more
            for workflow_id, row in self.world.snapshot()["workflows"].items():
                if row["status"] not in FINAL and self.expect[workflow_id]["kind"] == "booking":
                    self.expect[workflow_id]["block_allowed"] = True

    # --- people and commands on one workflow ---

    @rule(workflow_id=workflows)
    def run(self, workflow_id):
        self.op()
        before = self.world.snapshot()
        done = self.world.cli("run", "--db", str(self.world.db), "--workflow", workflow_id, "--module", str(MODULE))
        self.said(f"was {before['workflows'][workflow_id]['status']}; exit {done.returncode}")
        if done.returncode == -9:  # it outlived its timeout and was killed
            TOTALS.kills += 1
            self.deaths[workflow_id] += 1
        status = before["workflows"][workflow_id]["status"]
        if status in ("failed", "paused", "escalated"):
            new = self.world.snapshot()["events"][workflow_id][len(before["events"][workflow_id]):]
            if "replay_started" in new:  # a replay of it: the resume is in the history, before it
                assert "workflow_resumed" in new[:new.index("replay_started")], (
                    f"run replayed {status} {workflow_id} without a workflow_resumed event: {new}")
            else:
                assert done.returncode == 0 or "resume" in done.stdout + done.stderr, (
                    f"run of {status} {workflow_id} was refused without saying to use resume: {done.stderr}")

    @rule(workflow_id=workflows, approve=st.booleans(), wait=st.sampled_from(["right", "wrong", "unnamed"]))
    def decide(self, workflow_id, approve, wait):
        self.op()
        kind = self.expect[workflow_id]["kind"]
        self.decide_now(workflow_id, approve, {"right": APPROVAL_WAIT[kind], "wrong": "no-such-wait",
                                               "unnamed": None}[wait])

    def decide_now(self, workflow_id: str, approve: bool, name: str | None) -> None:
        """Approve or reject one workflow's wait ``name`` (None: the one it has) from the command line; check it."""
        kind = self.expect[workflow_id]["kind"]
        before = self.world.snapshot()
        opened = before["waits"].get((workflow_id, name or APPROVAL_WAIT[kind]))
        late = bool(opened and opened["status"] == "waiting" and opened["wake_at"] and opened["wake_at"] < time.time())
        args = ["approve" if approve else "reject", "--db", str(self.world.db), "--workflow", workflow_id,
                "--by", "Dana", "--json"] + (["--wait", name] if name else [])
        done = self.world.cli(*args)
        self.said(f"exit {done.returncode}: {(done.stdout or done.stderr).strip()[:160]}")
        after = self.world.snapshot()
        self.refused_if_final(args[0], workflow_id, before, after, done)
        waits_of = lambda snap: {k: v for k, v in snap["waits"].items() if k[0] == workflow_id}  # noqa: E731
        if done.returncode != 0:
            assert done.returncode in (2, 3), f"{args[0]} {workflow_id}: exit {done.returncode}: {done.stderr}"
            changed = {k: v for k, v in waits_of(after).items()
                       if v["kind"] == "approval" and v["decision"] is not None and "timed_out" not in v["decision"]
                       and waits_of(before).get(k, {}).get("decision") != v["decision"]}  # not a deadline passing
            assert not changed, f"{args[0]} {workflow_id} was refused ({done.stdout}{done.stderr}) but saved {changed}"
            return
        assert name != "no-such-wait", f"{args[0]} {workflow_id} --wait no-such-wait was accepted: {done.stdout}"
        assert not late, f"{args[0]} {workflow_id} was accepted after the wait's deadline had passed: {done.stdout}"
        result = json.loads(done.stdout)["decision"]
        if result["saved"] and before["workflows"][workflow_id]["status"] in FINAL:
            TOTALS.notes.append(f"a decision was saved on {before['workflows'][workflow_id]['status']} "
                                f"{workflow_id}: {done.stdout.strip()}")
        first = before["waits"].get((workflow_id, result["wait"]))
        if first is not None and first["status"] == "resolved":
            assert not result["saved"], f"{workflow_id}: a decided wait was decided again: {result}"
            assert decoded(first["decision"]).get("approved") == approve, (
                f"{workflow_id}: the opposite of the saved decision was accepted: {result}")
        if result["saved"]:
            self.expect[workflow_id]["decision"] = "approved" if approve else "rejected"

    def refused_if_final(self, command: str, workflow_id: str, before: dict, after: dict, done) -> None:
        """A decision on a final workflow is refused, naming its status, and saves nothing."""
        status = before["workflows"][workflow_id]["status"]
        if status not in FINAL:
            return
        said = done.stdout + done.stderr
        assert done.returncode in (2, 3) and status in said, (
            f"{command} of {status} {workflow_id}: exit {done.returncode}, {said.strip()[:200]}; it should be "
            f"refused with its status")
        decisions = lambda snap: [e for e in snap["events"].get(workflow_id, []) if e in DECISIONS]  # noqa: E731
        waits_of = lambda snap: {k: v for k, v in snap["waits"].items() if k[0] == workflow_id}  # noqa: E731
        assert decisions(after) == decisions(before) and waits_of(after) == waits_of(before), (
            f"{command} of {status} {workflow_id} was refused, yet something was saved")

    @rule(workflow_id=workflows, wait=st.sampled_from(["right", "wrong"]))
    def answer(self, workflow_id, wait):
        self.op()
        name = "clarify" if wait == "right" else "no-such-question"
        before = self.world.snapshot()
        done = self.world.cli("answer", "--db", str(self.world.db), "--workflow", workflow_id, "--wait", name,
                              "--text", "supplier concentration risk", "--by", "Dana", "--json")
        self.said(f"exit {done.returncode}")
        self.refused_if_final("answer", workflow_id, before, self.world.snapshot(), done)
        if wait == "wrong" or self.expect[workflow_id]["kind"] != "reviewed_report":
            assert done.returncode in (2, 3), f"answer {workflow_id} --wait {name} was accepted: {done.stdout}"

    @rule(workflow_id=workflows)
    def cancel(self, workflow_id):
        self.op()
        self.cancel_now(workflow_id)

    def cancel_now(self, workflow_id: str) -> None:
        """Cancel one workflow from the command line and note what the model then requires of it."""
        before = self.row(workflow_id)
        done = self.world.cli("cancel", "--db", str(self.world.db), "--workflow", workflow_id, "--by", "Dana",
                              "--reason", "plans changed", "--json")
        self.said(f"was {before['status']}; exit {done.returncode}: {(done.stdout or done.stderr).strip()[:120]}")
        if before["status"] == "escalated":
            # A person gives an escalation up: its compensations run newest first, once each, and it ends cancelled.
            assert done.returncode == 0, f"cancel of escalated {workflow_id} gave {done.returncode}: {done.stderr}"
            self.finals.pop(workflow_id, None)
            self.expect[workflow_id]["must_end_cancelled"] = True
        elif before["status"] in FINAL:
            assert done.returncode == 2, f"cancel of {before['status']} {workflow_id} gave {done.returncode}"
        if done.returncode == 0:
            status = json.loads(done.stdout)["status"]
            assert self.row(workflow_id)["cancel_requested"], f"cancel {workflow_id} said saved; nothing stored"
            if status != "running" and before["cancel_requested"] is None:
                self.expect[workflow_id]["cancel_must_win"] = True  # no replay was under way: it must stop

    @rule(workflow_id=workflows, which=st.integers(0, 5))
    def fork(self, workflow_id, which):
        """A fork is left to the workers (not drawn for later rules: whether it exists depends on the run)."""
        self.op()
        expect = self.expect[workflow_id]
        if expect["kind"] == "refund" and expect["strategy"] not in ("destination_key", "outbox"):
            self.said("not forked")
            return  # unkeyed refunds are counted by order: a fork would pay the same order again
        snap = self.world.snapshot()
        placed = {name: s["position"] for (w, name), s in snap["steps"].items()
                  if w == workflow_id and s["status"] == "complete" and s["position"] is not None}
        undone = [placed[name[len(COMPENSATION):]] for name in placed
                  if name.startswith(COMPENSATION) and name[len(COMPENSATION):] in placed]
        done_steps = sorted((position, name) for name, position in placed.items())  # a compensation too: refused
        if not done_steps:
            self.said("no completed step yet")
            return
        position, up_to = done_steps[which % len(done_steps)]
        new_id = self.new_id("fork")
        done = self.world.cli("fork", "--db", str(self.world.db), "--workflow", workflow_id, "--up-to", up_to,
                              "--new-id", new_id, "--by", "Dana", "--module", str(MODULE))
        self.said(f"{new_id} up to {up_to}: exit {done.returncode}")
        if up_to.startswith(COMPENSATION) or any(at <= position for at in undone):
            assert done.returncode in (2, 3) and new_id not in self.world.snapshot()["workflows"], (
                f"fork of {workflow_id} up to {up_to}, at or past a step its compensation undid: exit "
                f"{done.returncode}, {(done.stdout + done.stderr).strip()[:200]}; it should be refused, nothing made")
            return
        if done.returncode != 0:
            assert done.returncode == 3, f"fork {workflow_id} up to {up_to}: {done.stderr}"
            return
        copied = {name for at, name in done_steps if at <= position and not name.startswith(COMPENSATION)}
        self.expect[new_id] = {**expect, "cancel_must_win": False, "decision": None, "fork": True, "copied": copied,
                               "must_end_cancelled": False}

    @rule(workflow_id=workflows)
    def resume(self, workflow_id):
        self.op()
        before = self.row(workflow_id)["status"]
        done = self.world.cli("resume", "--db", str(self.world.db), "--workflow", workflow_id, "--by", "Dana")
        self.said(f"was {before}; exit {done.returncode}")
        if before == "escalated":  # a person acts on an escalation: it becomes pending, and its step gets one more try
            assert done.returncode == 0, f"resume of escalated {workflow_id} gave {done.returncode}: {done.stderr}"
            self.finals.pop(workflow_id, None)
        elif before in FINAL:
            assert done.returncode == 2, f"resume of {before} {workflow_id} gave {done.returncode}: {done.stdout}"

    # --- invariants ---

    @invariant()
    def invariants_hold(self):
        try:
            self.check(*self.observe())
        except AssertionError as error:
            raise self.failed(error) from None

    def observe(self) -> tuple[dict, list[dict]]:
        """The journal's committed rows and every destination's requests and effects, the destinations read first:
        a request they hold was sent by an attempt the journal had committed before it."""
        sent = self.world.sent()
        return self.world.snapshot(), sent

    def check(self, snap: dict, sent: list[dict]) -> None:
        for (workflow_id, name), step in snap["steps"].items():
            if (workflow_id, name) in self.completed:
                assert step["status"] == "complete" and step["output"] == self.completed[workflow_id, name], (
                    f"{workflow_id}: completed step {name!r} changed: {self.completed[workflow_id, name]} -> "
                    f"{step['status']} {step['output']}")
            elif step["status"] == "complete":
                self.completed[workflow_id, name] = step["output"]
        missing = [k for k in self.completed if k not in snap["steps"]]
        assert not missing, f"completed steps disappeared: {missing}"
        for workflow_id, row in snap["workflows"].items():
            self.check_workflow(workflow_id, row, snap)
        self.check_destinations(snap)
        self.check_requests(snap, sent)
        self.check_order(snap, sent)
        problems = self.world.integrity()
        assert not problems, f"integrity_check: {problems}"

    def check_workflow(self, workflow_id: str, row: dict, snap: dict) -> None:
        expect, status = self.expect[workflow_id], row["status"]
        if workflow_id in self.finals:
            assert (status, row["output"]) == self.finals[workflow_id], (
                f"{workflow_id}: final {self.finals[workflow_id]} changed to {status} {row['output']}")
        elif status in FINAL:
            self.finals[workflow_id] = (status, row["output"])
        if status == "escalated":
            reserved = "reserved by an attempt" in (row["error"] or "")
            needed = 1 if reserved else CRASH_LIMIT
            had = self.deaths[workflow_id] + (self.paused_over[workflow_id] if reserved else 0)
            takeovers = max(self.takeovers(snap, workflow_id).values(), default=0)
            outran = OUTRUN.search(row["error"] or "") and takeovers >= CRASH_LIMIT  # an activity that kept outrunning its lease, named as such
            assert had >= needed or outran or expect["input"].get("trouble") == "escalate", (
                f"{workflow_id} escalated ({row['error']}) with {self.deaths[workflow_id]} dead processes, "
                f"{self.paused_over[workflow_id]} paused past their lease and {takeovers} takeovers of one step; "
                f"it needs {needed} dead processes, or {CRASH_LIMIT} takeovers and a message that says the activity "
                "outran its lease")
        if status == "blocked":
            assert expect["block_allowed"], f"{workflow_id} blocked with no incompatible code change: {row['error']}"
        if status in FINAL and expect["cancel_must_win"]:
            assert status in ("cancelled", "escalated"), (
                f"{workflow_id}: cancelled while no replay ran, yet it ended {status} ({row['error']}); "
                f"history {snap['events'].get(workflow_id)}")
        if status in FINAL and expect["must_end_cancelled"]:
            assert status == "cancelled", (
                f"{workflow_id}: an escalation a person cancelled ended {status} ({row['error']}); "
                f"history {snap['events'].get(workflow_id)}")
        if status == "rejected":
            assert expect["decision"] in ("rejected", None) or expect["fork"], (
                f"{workflow_id} ended rejected after an approval")
        if expect["decision"] == "rejected" and status in FINAL:
            assert status in ("rejected", "cancelled", "stopped"), f"{workflow_id}: rejected, yet it ended {status}"
        compensations = sorted((s["position"], name[len(COMPENSATION):]) for (w, name), s in snap["steps"].items()
                               if w == workflow_id and name.startswith(COMPENSATION) and s["status"] == "complete")
        undone_at = [snap["steps"].get((workflow_id, name), {}).get("position") for _, name in compensations]
        assert undone_at == sorted(undone_at, key=lambda at: -(at or 0)), (  # newest first, in the journal too
            f"{workflow_id}: compensations ran {[n for _, n in compensations]}, undoing steps placed at {undone_at}: "
            "not newest first")
    def check_destinations(self, snap: dict) -> None:
        refunds = self.world.destination_rows("payments", "refunds")
        deliveries = self.world.destination_rows("notify", "deliveries")
        effects = {name: self.world.destination_rows(name, "effects") for name in ("seats", "cards", "tickets")}
        for workflow_id, expect in self.expect.items():
            status = snap["workflows"][workflow_id]["status"]
            if expect["kind"] == "refund" and expect["strategy"] != "naive":
                if expect["strategy"] in ("destination_key", "outbox"):
                    paid = sum(1 for r in refunds if r["key"] == key(workflow_id, "refund"))
                else:
                    paid = sum(1 for r in refunds if r["key"] is None and r["order_id"] == expect["order"])
                assert paid <= 1, f"{workflow_id} ({expect['strategy']}): {paid} refunds at the payment service"
                withdrawn = snap["outbox"].get(key(workflow_id, "refund"), {}).get("status") == "withdrawn"
                assert not (withdrawn and paid), f"{workflow_id}: its refund was withdrawn, yet {paid} was paid"
                if status == "complete":  # a fork past the refund reuses its original's receipt
                    assert paid + ("refund" in expect["copied"]) == 1, (
                        f"{workflow_id} ({expect['strategy']}) complete with {paid} refunds under its key")
            if expect["kind"] in ("refund", "reviewed_report") and expect.get("strategy") != "naive":
                told = sum(1 for d in deliveries if d["key"] == key(workflow_id, "notify"))
                assert told <= 1, f"{workflow_id}: {told} notifications delivered with its key"
            if expect["kind"] == "booking":
                made = Counter(e["key"] for service in effects.values() for e in service
                               if e["key"] and e["key"].startswith(workflow_id + ":"))
                steps = {name: s for (w, name), s in snap["steps"].items() if w == workflow_id}
                if status == "complete":
                    for action in ("hold_seat", "charge_card", "issue_ticket"):
                        assert made[key(workflow_id, action)] + (action in expect["copied"]) == 1, (
                            f"{workflow_id} complete; effects {dict(made)}; reused {expect['copied']}")
                if status in ("cancelled", "rejected", "stopped"):
                    assert made[key(workflow_id, "issue_ticket")] == 0, f"{workflow_id} {status} with a ticket"
                for action in ("hold_seat", "charge_card"):
                    undone = made[key(workflow_id, f"compensate:{action}")]
                    if status == "cancelled" and steps.get(action, {}).get("status") == "complete":
                        assert undone == 1, f"{workflow_id} cancelled; {action} undone {undone} times: {dict(made)}"
                    if status != "cancelled" and status in FINAL and status != "escalated":
                        assert undone == 0, f"{workflow_id} {status}, yet {action} was undone: {dict(made)}"

    def check_requests(self, snap: dict, sent: list[dict]) -> None:
        """What each destination received, not only what it kept: every request names the workflow and the action
        that sent it; a step's action is sent at most once per attempt of that step (an outbox row's, once per
        dispatch); a reserved key (``send_at_most_once``) at most once."""
        nameless = [r for r in sent if r["kind"] == "request" and not (r["workflow"] and r["action"])]
        assert not nameless, f"requests that name no workflow or action: {nameless[:3]}"
        requests = Counter((r["workflow"], r["action"]) for r in sent if r["kind"] == "request")
        for (workflow_id, action), received in sorted(requests.items()):
            expect = self.expect.get(workflow_id)
            if expect is None:
                continue
            outbox = snap["outbox"].get(key(workflow_id, action))
            tries = outbox["attempts"] if outbox else snap["steps"].get((workflow_id, action), {}).get("attempts") or 0
            where = "dispatches of its outbox row" if outbox else f"attempts of step {action!r}"
            assert received <= tries, (
                f"{workflow_id}: {received} requests for {action!r} at the destinations, after {tries} {where}")
            reserved = (expect["kind"] == "reviewed_report" and action == "notify") or (
                expect.get("strategy") == "reservation" and action in ("refund", "notify"))
            assert received <= 1 or not reserved, (
                f"{workflow_id}: its reserved {action!r} was sent {received} times; a reserved key is sent at most once")

    def check_order(self, snap: dict, sent: list[dict]) -> None:
        """Each workflow's effects in its code's order, by when each first happened at its destination: a booking
        holds, charges, then tickets; a refund pays, then tells; a compensation comes after what it undoes, the
        newest first, each once."""
        first: dict[tuple[str, str], float] = {}
        made: Counter = Counter()
        for row in sorted((r for r in sent if r["kind"] == "effect" and r["workflow"]), key=lambda r: r["at"]):
            first.setdefault((row["workflow"], row["action"]), row["at"])
            made[row["workflow"], row["action"]] += 1
        for workflow_id, expect in self.expect.items():
            at = {action: when for (w, action), when in first.items() if w == workflow_id}
            chains = {"booking": [["hold_seat", "charge_card", "issue_ticket"],
                                  ["hold_seat", "compensate:hold_seat"], ["charge_card", "compensate:charge_card"],
                                  ["compensate:charge_card", "compensate:hold_seat"]],
                      "refund": [["refund", "notify"]]}.get(expect["kind"], [])
            for chain in chains:
                present = [action for action in chain if action in at]
                assert present == sorted(present, key=at.get), (
                    f"{workflow_id}: effects happened {sorted(present, key=at.get)}; its order is {present}")
            for action in ("compensate:hold_seat", "compensate:charge_card"):
                assert made[workflow_id, action] <= 1, (
                    f"{workflow_id}: {action} made {made[workflow_id, action]} effects; a compensation undoes once")

    # --- the end of a sequence ---

    def settled(self, snap: dict) -> dict[str, str]:
        """Workflows not yet final nor in a wait a person can see, with why."""
        open_waits = {w for (w, _), v in snap["waits"].items()
                      if v["status"] == "waiting" and v["kind"] in ("approval", "clarification")}
        left = {}
        for workflow_id, row in snap["workflows"].items():
            status = row["status"]
            if status in FINAL or status == "paused" or (status == "blocked" and self.expect[workflow_id][
                    "block_allowed"]) or (status == "waiting" and workflow_id in open_waits) or (
                    status == "failed" and self.expect[workflow_id]["input"].get("trouble") == "fail"):
                continue
            left[workflow_id] = f"{status}: {row['error'] or ''}"
        return left

    def calm(self) -> bool:
        """True once every workflow has settled, or nothing can change any more (nothing running, due or scheduled)."""
        if not self.world.live():  # a worker must be running for the promise to apply
            self.world.start_worker()
        if not self.settled(self.world.snapshot()):
            return True
        if self.world.busy(horizon=SETTLE_SECONDS):
            self.still_since = None
            return False
        self.still_since = self.still_since or time.monotonic()
        return time.monotonic() - self.still_since > 1.0  # still for a second: stuck, not between two writes

    def teardown(self):
        try:
            for proc in self.world.live():
                if proc.paused:
                    self.world.resume_process(proc)
            wait_for(self.calm, SETTLE_SECONDS, poll=0.3)
            snap, sent = self.observe()
            TOTALS.ended.update(row["status"] for row in snap["workflows"].values())
            try:
                self.check(snap, sent)
            except AssertionError as error:
                raise self.failed(error) from None
            unsettled = self.settled(snap)
            if unsettled:
                raise self.failed(AssertionError("after the operations stopped, with a worker running, "
                                     f"these are neither final nor waiting for a person: {unsettled}; history "
                                     f"{ {w: snap['events'].get(w) for w in unsettled} }; leases "
                                     f"{self.world.diagnose(unsettled)}")) from None
        finally:
            self.world.live()  # notes workers that ended on their own
            TOTALS.notes.extend(self.world.exited)
            self.world.stop_all()
            shutil.rmtree(self.folder, ignore_errors=True)


COMMON = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=True)


def violations_in(error: BaseException) -> list[str]:
    """The model's own messages inside what Hypothesis raised (a flaky replay wraps them in a group)."""
    found, todo, seen = [], [error], set()
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, AssertionError) and "operations of this sequence" in str(current):
            found.append(str(current))
        todo += [*getattr(current, "exceptions", ()), current.__cause__, current.__context__]
    return found or [f"{type(error).__name__}: {error}"]


def print_totals(capsys, started: float) -> None:
    with capsys.disabled():
        print(f"\nmodel-based test ({PROFILE}, {time.monotonic() - started:.0f} s): {TOTALS.line()}")
        for note in TOTALS.notes[:10]:
            print(f"  {note}")


def test_the_kit_against_its_model(capsys):
    started = time.monotonic()
    try:
        if PROFILE == "long":  # every failing sequence is reported (shrunk), then the search goes on
            failures = []
            while time.monotonic() - started < MINUTES * 60:
                try:
                    run_state_machine_as_test(KitModel, settings=settings(max_examples=3, stateful_step_count=40,
                                                                          **COMMON))
                except Exception as error:  # noqa: BLE001  (any failure of a sequence, reported below)
                    TOTALS.violations += 1
                    failures.append(error)
                    with capsys.disabled():
                        print(f"\nfailing sequence {len(failures)}:\n" + "\n".join(violations_in(error)), flush=True)
            if failures:
                raise failures[0]
        else:
            try:
                run_state_machine_as_test(KitModel, settings=settings(max_examples=6, stateful_step_count=20,
                                                                      **COMMON))
            except Exception as error:
                TOTALS.violations += 1
                with capsys.disabled():  # the model's own words, even when a replay in real processes went otherwise
                    print("\nfailing sequence:\n" + "\n".join(violations_in(error)), flush=True)
                raise
    finally:
        print_totals(capsys, started)
