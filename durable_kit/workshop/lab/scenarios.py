"""The same crash scenarios on the kit and on the engine in one file, in real processes: what each leaves behind.

Each scenario starts a workflow of ``FLOWS`` (one file of workflow code, written once per engine with only its
import line changed), runs workers as child processes (``python -m durable_kit worker`` for the kit,
``python -m durable_kit.workshop.lab.mini_worker`` for ``durable_kit.mini``), crashes, pauses or decides where
it says, and returns what a learner would observe: the workflow's status, its steps with their attempts, the
external calls counted outside the journal (a file beside it), the decisions, and what the crash or the pause
left. ``tests/test_mini.py`` asserts that both engines leave the same; notebook 06 runs the engine assembled from
the learner's parts the same way.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

ENGINES = {"kit": "durable_kit", "mini": "durable_kit.mini"}
LEASE = 1.0  # seconds: a dead owner's workflow waits this long on the engine that waits out every lease
SETTLED = ("complete", "failed", "escalated", "blocked", "waiting", "stopped", "rejected")

FLOWS = '''"""The scenarios' workflows. The engine is the one the next line imports; nothing else names it."""
import json, os, signal, time
from pathlib import Path

from {engine} import RetryPolicy, Transient, workflow


def outside(wf, step):
    """An external call, counted outside the journal (a line of <db>.calls); then a crash, if one is armed here."""
    with open(f"{{wf.db_path}}.calls", "a") as calls:
        calls.write(json.dumps({{"step": step, "pid": os.getpid(), "at": time.time()}}) + "\\n")
    crash(wf, f"after_activity:{{step}}")
    return {{"step": step, "pid": os.getpid()}}


def calls(wf, step):
    return sum(json.loads(line)["step"] == step for line in open(f"{{wf.db_path}}.calls"))


def crash(wf, point):
    """End this process where the harness armed ``point`` (a file beside the journal), once: exit 13 or SIGKILL."""
    armed = Path(f"{{wf.db_path}}.{{point}}")
    if armed.exists():
        action = armed.read_text()
        armed.unlink()
        os.kill(os.getpid(), signal.SIGKILL) if action == "kill" else os._exit(13)


@workflow("three_steps")
def three_steps(wf):
    for step in ("s1", "s2", "s3"):
        wf.execute_step(step, lambda step=step: outside(wf, step))
        crash(wf, f"after_commit:{{step}}")
    return {{"done": 3}}


@workflow("flaky")
def flaky(wf):
    def fetch():
        outside(wf, "fetch")
        if calls(wf, "fetch") == 1:
            raise Transient("503 on the first call")
        return {{"fetched": True}}
    return wf.execute_step("fetch", fetch, retry=RetryPolicy(max_attempts=3, base_delay=1.0))


@workflow("crash_loop")
def crash_loop(wf):
    def boom():
        outside(wf, "boom")
        os._exit(13)
    return wf.execute_step("boom", boom)


def gate(wf, step):
    """An external call that then waits for the harness to open <db>.gate-<step>."""
    done = outside(wf, step)
    while not Path(f"{{wf.db_path}}.gate-{{step}}").exists():
        time.sleep(0.02)
    return done


@workflow("gated")
def gated(wf):
    wf.execute_step("work", lambda: gate(wf, "work"))
    return wf.execute_step("then", lambda: gate(wf, "then"))


@workflow("long_activity")
def long_activity(wf):
    def work():
        done = outside(wf, "work")
        time.sleep(wf.input["seconds"])
        return done
    return wf.execute_step("work", work)


@workflow("approval")
def approval(wf):
    draft = wf.execute_step("draft", lambda: outside(wf, "draft"))
    decision = wf.wait_for_approval("review", {{"draft": draft["step"]}})
    if not decision["approved"]:
        return {{"published": False}}
    return wf.execute_step("publish", lambda: outside(wf, "publish"))


@workflow("timer")
def timer(wf):
    wf.execute_step("before", lambda: outside(wf, "before"))
    wf.sleep("cool_down", wf.input["seconds"])
    return wf.execute_step("after", lambda: outside(wf, "after"))


FIRST = "draft"  # the renamed scenario deploys a copy of this file with another name here


@workflow("renamed")
def renamed(wf):
    wf.execute_step(FIRST, lambda: outside(wf, FIRST))
    wf.wait_for_approval("go", {{}})
    return wf.execute_step("publish", lambda: outside(wf, "publish"))
'''


class Run:
    """One scenario on one engine, in ``folder``: the journal, the workflow files and the workers it starts."""

    def __init__(self, engine: str, folder: Path, parts: dict[str, tuple[str, str]] | None = None,
                 lease: float = LEASE, timeout: float = 60):
        self.engine, self.lease, self.parts, self.timeout = engine, lease, parts or {}, timeout
        self.api = importlib.import_module(ENGINES[engine])
        folder.mkdir(parents=True, exist_ok=True)
        self.db, self.flows = folder / "work.db", folder / "flows.py"
        self.flows.write_text(FLOWS.format(engine=ENGINES[engine]))
        self.journal = self.api.Journal(self.db)

    def start(self, kind: str, input: dict | None = None, workflow_id: str = "w1") -> str:
        extra = {"registered_elsewhere": True} if self.engine == "kit" else {}  # only the workers import the flows
        return self.journal.start(kind, input or {}, workflow_id, **extra)

    def command(self, *options: str, flows: Path | None = None) -> list[str]:
        """The worker command of this run's engine, with this run's parts plugged in (the mini engine only)."""
        module, lease = str(flows or self.flows), str(self.lease)
        if self.engine == "kit":
            return [sys.executable, "-m", "durable_kit", "worker", "--db", str(self.db), "--module", module,
                    "--lease-seconds", lease, *options]
        parts = [f"--part={name}={path}:{function}" for name, (path, function) in self.parts.items()]
        return [sys.executable, "-m", "durable_kit.workshop.lab.mini_worker", "--db", str(self.db), "--module", module,
                "--lease-seconds", lease, *parts, *options]

    def worker(self, *options: str, flows: Path | None = None) -> subprocess.Popen:
        return subprocess.Popen(self.command(*options, flows=flows), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def settle(self, workflow_id: str = "w1", until: tuple[str, ...] = SETTLED, flows: Path | None = None,
               timeout: float | None = None) -> list[int]:
        """``--until-idle`` workers, one after another, until the workflow's status is in ``until``; their exit codes.

        A worker finds nothing due while a dead owner's lease lasts, or before a retry or timer time: the next tries."""
        timeout = timeout or self.timeout
        codes, deadline = [], time.monotonic() + timeout
        while not codes or self.status(workflow_id) not in until:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.engine}: {workflow_id} still {self.status(workflow_id)} after {timeout} s")
            done = subprocess.run(self.command("--until-idle", flows=flows), capture_output=True, text=True,
                                  timeout=timeout + 30)
            if done.stderr.strip() and done.returncode >= 0:
                raise RuntimeError(f"{self.engine} worker wrote to stderr: {done.stderr}")
            codes.append(done.returncode)
            if self.status(workflow_id) not in until:
                time.sleep(0.1)
        return codes

    def status(self, workflow_id: str = "w1") -> str:
        return self.journal.workflow(workflow_id)["status"]

    def calls(self) -> list[dict]:
        path = Path(f"{self.db}.calls")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def arm(self, point: str, action: str = "exit") -> None:
        Path(f"{self.db}.{point}").write_text(action)

    def seen(self, workflow_id: str = "w1", **extra) -> dict:
        """What a learner observes: status, steps with their attempts, calls per step, and ``extra``."""
        counted: dict[str, int] = {}
        for call in self.calls():
            counted[call["step"]] = counted.get(call["step"], 0) + 1
        steps = [[s["name"], s["status"], s["attempts"]] for s in self.journal.steps(workflow_id)]
        return {"status": self.status(workflow_id), "steps": steps, "calls": counted, **extra}


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.02)


def decided(decision: dict) -> list:
    return [decision["approved"], decision["by"], decision["comment"], decision["wait"], decision["saved"]]


# --- the twelve scenarios ------------------------------------------------------------------------------

def clean(run: Run) -> dict:
    run.start("three_steps")
    return run.seen(workers=run.settle())


def crash_after_activity(run: Run) -> dict:
    run.start("three_steps")
    run.arm("after_activity:s2", "exit")
    return run.seen(first_worker=run.settle()[0])


def crash_after_commit(run: Run) -> dict:
    run.start("three_steps")
    run.arm("after_commit:s2", "kill")
    return run.seen(first_worker=run.settle()[0])


def transient_retried(run: Run) -> dict:
    run.start("flaky")
    first = run.settle(until=("pending",))  # the failure left a retry time in the database, and its worker left
    due_at = run.journal.workflow("w1")["next_run_at"]
    early = run.settle(until=("pending", "complete"))  # a worker started before that time finds nothing due
    early_calls = len(run.calls()) if time.time() < due_at else 1  # (a loaded machine may reach the time first)
    run.settle()
    at = [call["at"] for call in run.calls()]
    return run.seen(first_worker=first, early_worker=early[:1], calls_before_the_retry_time=early_calls,
                    retry_after_its_delay=at[1] - at[0] >= 1.0)


def crash_loop(run: Run) -> dict:
    run.start("crash_loop")
    codes = run.settle()
    return run.seen(killed_workers=codes.count(13), last_worker=codes[-1])


def takeover_refused(run: Run) -> dict:
    """The owner is paused (SIGSTOP) in step ``work`` past its lease; a standby takes over, finishes ``work`` and
    waits in ``then``; the owner continues (SIGCONT) while the standby owns the workflow."""
    run.start("gated")
    owner, standby = run.worker("--until-idle"), None
    try:
        wait_until(lambda: len(run.calls()) == 1, "the owner's activity")
        owner.send_signal(signal.SIGSTOP)
        Path(f"{run.db}.gate-work").touch()
        standby = run.worker("--poll", "0.05")
        wait_until(lambda: [c["step"] for c in run.calls()][-1:] == ["then"], "the standby's second step")
    finally:
        owner.send_signal(signal.SIGCONT)
    wait_until(lambda: owner.poll() is not None or len(run.calls()) > 3, "the owner to stop or go on")
    Path(f"{run.db}.gate-then").touch()
    said, _ = owner.communicate(timeout=60)
    wait_until(lambda: run.status() == "complete", "the standby to complete the workflow")
    standby.send_signal(signal.SIGTERM)
    standby.communicate(timeout=60)
    who = {call["pid"]: name for call, name in zip(run.calls(), ["owner", "standby"])}
    return run.seen(owner_exit=owner.returncode, owner_said_lease_lost="lease lost" in said,
                    stored_by=[who.get(step["output"]["pid"]) for step in run.journal.steps("w1")])


def approval(run: Run) -> dict:
    run.start("approval")
    before = [run.settle(), run.status()]  # the worker reaches the wait and exits: no process holds it
    decision = run.api.approve(run.journal, "w1", by="Dana", comment="sources are sound", wait="review")
    return run.seen(before_the_decision=before, decisions=[decided(decision)], workers=run.settle())


def heartbeat_keeps_lease(run: Run) -> dict:
    run.start("long_activity", {"seconds": 2.5 * run.lease})
    owner = run.worker("--until-idle")
    wait_until(lambda: len(run.calls()) == 1, "the owner's activity")
    standby = run.worker()  # polls the whole time the activity runs, 2.5 leases long
    said, _ = owner.communicate(timeout=60)
    standby.send_signal(signal.SIGTERM)
    standby_said, _ = standby.communicate(timeout=60)
    return run.seen(owner_said=said.splitlines()[0], standby_ran_it="w1" in standby_said)


def durable_timer(run: Run) -> dict:
    run.start("timer", {"seconds": 1.0})
    reached = run.settle()
    wake_at = run.journal.workflow("w1")["next_run_at"]
    early = run.settle(until=("waiting", "complete"))  # before the time: nothing due
    early_calls = len(run.calls()) if time.time() < wake_at else 1  # (a loaded machine may reach the time first)
    run.settle(until=("complete",))
    at = {call["step"]: call["at"] for call in run.calls()}
    return run.seen(first_worker=reached, early_worker=early[:1], calls_before_the_time=early_calls,
                    after_the_time=at["after"] - at["before"] >= 1.0)


def renamed_step(run: Run) -> dict:
    run.start("renamed")
    run.settle()
    run.api.approve(run.journal, "w1", by="Dana", wait="go")
    changed = run.flows.with_name("flows_v2.py")
    changed.write_text(run.flows.read_text().replace('FIRST = "draft"', 'FIRST = "draft_v2"'))
    return run.seen(workers_on_the_changed_code=run.settle(flows=changed))


def worker_drains(run: Run) -> dict:
    for workflow_id in ("w1", "w2", "w3"):
        run.start("three_steps", workflow_id=workflow_id)
    done = subprocess.run(run.command("--until-idle"), capture_output=True, text=True, timeout=60)
    statuses = [run.status(workflow_id) for workflow_id in ("w1", "w2", "w3")]
    return run.seen(worker=done.returncode, statuses=statuses, calls_in_all=len(run.calls()))


def decided_twice(run: Run) -> dict:
    run.start("approval")
    run.settle()
    first = run.api.approve(run.journal, "w1", by="Dana", comment="", wait="review")
    again = run.api.approve(run.journal, "w1", by="Sam", comment="", wait="review")
    try:
        run.api.reject(run.journal, "w1", by="Eli", comment="too late", wait="review")
        late = "saved"
    except Exception as error:  # the engines' classes differ; their names say the same
        late = type(error).__name__
    return run.seen(decisions=[decided(first), decided(again)], late_rejection=late, workers=run.settle())


SCENARIOS: dict[str, Callable[[Run], dict]] = {
    "clean": clean,
    "crash after the activity": crash_after_activity,
    "crash after the commit": crash_after_commit,
    "transient failure retried": transient_retried,
    "crash loop escalates": crash_loop,
    "paused owner's write refused": takeover_refused,
    "approval": approval,
    "activity 2.5 leases long": heartbeat_keeps_lease,
    "durable timer": durable_timer,
    "renamed step blocks": renamed_step,
    "worker drains three": worker_drains,
    "wait decided twice": decided_twice,
}


THREE = [["s1", "complete", 1], ["s2", "complete", 1], ["s3", "complete", 1]]
ONCE_EACH = {"s1": 1, "s2": 1, "s3": 1}
APPROVED = [["draft", "complete", 1], ["publish", "complete", 1]]
# What the kit leaves in each scenario (tests/test_mini.py proves it, and that the engine in one file leaves the same).
EXPECTED: dict[str, dict[str, Any]] = {
    "clean": {"status": "complete", "steps": THREE, "calls": ONCE_EACH, "workers": [0]},
    "crash after the activity": {  # exit 13 after s2's call: s2 runs again, as attempt 2
        "status": "complete", "steps": [THREE[0], ["s2", "complete", 2], THREE[2]],
        "calls": {"s1": 1, "s2": 2, "s3": 1}, "first_worker": 13},
    "crash after the commit": {"status": "complete", "steps": THREE, "calls": ONCE_EACH, "first_worker": -9},
    "transient failure retried": {  # the retry time is a row: a worker before it finds nothing due
        "status": "complete", "steps": [["fetch", "complete", 2]], "calls": {"fetch": 2}, "first_worker": [0],
        "early_worker": [0], "calls_before_the_retry_time": 1, "retry_after_its_delay": True},
    "crash loop escalates": {  # three workers die in the step; the fourth escalates it without a call
        "status": "escalated", "steps": [["boom", "failed", 3]], "calls": {"boom": 3}, "killed_workers": 3,
        "last_worker": 0},
    "paused owner's write refused": {  # its activity ran, its write did not, and it started nothing more
        "status": "complete", "steps": [["work", "complete", 2], ["then", "complete", 1]],
        "calls": {"work": 2, "then": 1}, "owner_exit": 0, "owner_said_lease_lost": True,
        "stored_by": ["standby", "standby"]},
    "approval": {
        "status": "complete", "steps": APPROVED, "calls": {"draft": 1, "publish": 1},
        "before_the_decision": [[0], "waiting"], "decisions": [[True, "Dana", "sources are sound", "review", True]],
        "workers": [0]},
    "activity 2.5 leases long": {  # the heartbeat keeps the lease: the standby never takes the workflow
        "status": "complete", "steps": [["work", "complete", 1]], "calls": {"work": 1}, "owner_said": "w1: complete",
        "standby_ran_it": False},
    "durable timer": {
        "status": "complete", "steps": [["before", "complete", 1], ["after", "complete", 1]],
        "calls": {"before": 1, "after": 1}, "first_worker": [0], "early_worker": [0], "calls_before_the_time": 1,
        "after_the_time": True},
    "renamed step blocks": {  # nothing after the renamed step ran
        "status": "blocked", "steps": [["draft", "complete", 1]], "calls": {"draft": 1},
        "workers_on_the_changed_code": [0]},
    "worker drains three": {
        "status": "complete", "steps": THREE, "calls": {"s1": 3, "s2": 3, "s3": 3}, "worker": 0,
        "statuses": ["complete"] * 3, "calls_in_all": 9},
    "wait decided twice": {  # the second approval returns the first; a rejection after it is refused
        "status": "complete", "steps": APPROVED, "calls": {"draft": 1, "publish": 1},
        "decisions": [[True, "Dana", "", "review", True], [True, "Dana", "", "review", False]],
        "late_rejection": "DecisionConflict", "workers": [0]},
}
LEASES = {"activity 2.5 leases long": 3.0}  # a longer lease, so a loaded machine's late heartbeat still renews it


@contextmanager
def plugged(parts: dict[str, tuple[str, str]] | None) -> Iterator[None]:
    """In this process too, each of ``parts`` (``{name: (file, function)}``) in place of the engine's own, for the
    block: ``approve`` and ``reject`` run here, not in a worker, and call ``decide_wait``."""
    from ... import mini

    before = {name: getattr(mini, name) for name in parts or {}}
    for name, (path, function) in (parts or {}).items():
        setattr(mini, name, function_in(path, function))
    try:
        yield
    finally:
        for name, part in before.items():
            setattr(mini, name, part)


def function_in(path: str | Path, name: str) -> Callable:
    """Function ``name`` of the Python file at ``path``, read afresh (an edited file is read again)."""
    spec = importlib.util.spec_from_file_location(f"part_{Path(path).stem}_{time.monotonic_ns()}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def run(name: str, engine: str, folder: Path, parts: dict[str, tuple[str, str]] | None = None,
        timeout: float = 60) -> dict:
    """Scenario ``name`` on ``engine`` (``kit`` or ``mini``, with ``parts`` plugged in) in a fresh ``folder``."""
    scenario_run = Run(engine, Path(folder), parts, LEASES.get(name, LEASE), timeout)
    try:
        with plugged(parts):
            return SCENARIOS[name](scenario_run)
    finally:
        scenario_run.journal.conn.close()


def side_by_side(folder: Path, parts: dict[str, tuple[str, str]] | None = None,
                 names: list[str] | None = None) -> dict[str, dict[str, dict]]:
    """Every scenario (or ``names``) on both engines, two at a time: ``{scenario: {"kit": seen, "mini": seen}}``."""
    names = list(SCENARIOS) if names is None else names
    jobs = [(name, engine) for name in names for engine in ("kit", "mini")]
    with plugged(parts), ThreadPoolExecutor(max_workers=2) as pool:
        seen = pool.map(lambda job: run(job[0], job[1], Path(folder) / job[1] / job[0].replace(" ", "-"),
                                        parts if job[1] == "mini" else None), jobs)
        results: dict[str, dict[str, dict]] = {}
        for (name, engine), observed in zip(jobs, seen):
            results.setdefault(name, {})[engine] = observed
    return results
