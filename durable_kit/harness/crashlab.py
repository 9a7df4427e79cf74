"""The crash lab: every boundary of any workflow, killed or paused in a real process, recovered and counted.

Give it a workflow kind and an input (the kit's or your own, from a module
named like ``--module``), or a list of inputs: one workflow each, all in one
journal. ``discover`` runs them once, cleanly, in child processes with
``DURABLE_KIT_TRACE`` set, and lists every fault point each workflow passed
(``faults.trip`` appends each one to the trace; in a journal of several
workflows a point is named with its own, ``after_send:hold in lab-2``).
``explore`` then runs a fresh copy for each point and each action in real
worker processes (``python -m durable_kit worker``): ``exit`` (``os._exit``)
and ``kill`` (SIGKILL) end the worker there; ``pause`` stops it there
(SIGSTOP), waits until its lease has expired by the database's clock, lets a
standby worker take over, then continues it (SIGCONT). New workers recover
the rest, approving, answering or cancelling wherever a workflow waits by
the policy you give, and the lab counts what every fake destination
received. ``fuzz`` arms random points in random trials and checks the
invariants (``INVARIANTS``) after each one. ``step_map`` classifies each
step of the clean run by what it touched.

The promise. The crash lab judges every effect per workflow and per key
against that workflow's strategy (requests and effects), and arms its points
in every workflow of the journal, not only the first. Each workflow's
effects at a destination, per key (per sending action for an unkeyed
effect), beyond or short of what the clean run made are judged by the
promise stated for that destination, or for that workflow (``PROMISES``):
``exactly-once`` (the default: as many effects as the clean run),
``at-most-once`` (fewer is allowed, more is a violation) or
``at-least-once`` (more is allowed, fewer is a violation). A promise that
does not hold is a violation of the invariant "effects as promised", whether
or not the effects carried keys; a repeat in one workflow and a loss in
another never cancel out. Requests are judged by the strategy the journal
recorded: a key reserved by ``send_at_most_once`` is sent at most once,
however many requests a destination deduplicated. Each workflow's effects
come in the clean run's order, and a cancelled workflow's compensations run
newest first, none skipped (``cancel_all`` cancels at the first wait).

Rows are plain dicts; ``durable_kit.workshop.lab.crashlab_charts`` turns them into
DataFrames and charts. Nothing here imports pandas or matplotlib.

What the lab counts is what each destination's own file says: the call
ledger (``x.calls.db``) by call kind, and every other file beside the
journal (``x.<name>.db``) by its requests and its effects (the rows of its
``effects``, ``refunds`` or ``deliveries`` table), each row with the
workflow and the action that sent it (``durable_kit.world.sender``; for a
send outside the kit's effect helpers, the workflow whose id begins its
key). Calls (a model's, a source's) may repeat under every promise: they are
counted, never judged.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .faults import TRACE_VARIABLE, arm, disarm_all
from ..core.journal import Journal, WorkflowError
from ..core.state import bring_due
from ..core.store import DB_NOW, immediate, now
from ..admin import open_wait
from ..change import COMPENSATION, cancel
from ..decisions import answer, approve, reject

# Where a workflow can end up once nothing more is due.
SETTLED = ("complete", "escalated", "stopped", "rejected", "failed", "cancelled", "paused", "blocked")
CRASHES = ("exit", "kill")
ACTIONS = (*CRASHES, "pause")
EXIT_CODES = {"exit": 13, "kill": -9}
FAULT_ACTIONS = {"exit": "exit", "kill": "kill", "pause": "stop"}  # the lab's action -> the fault armed
PAUSE_LEASE_SECONDS = 3.0  # every worker's lease in a trial that pauses: a pause lasts about this long
EFFECT_TABLES = ("effects", "refunds", "deliveries")  # the kit's fakes: a service, the payments, the notifier
PROMISES = {
    "exactly-once": "as many effects as the clean run: none more, none fewer",
    "at-most-once": "no more effects than the clean run; fewer (a lost effect) is allowed",
    "at-least-once": "no fewer effects than the clean run; more (a repeated effect) is allowed",
}
INVARIANTS = ("no committed step lost", "no committed output changed", "effects as promised",
              "requests as promised", "keyed effects at most once", "effects in order",
              "compensations newest first, once each", "final status as expected", "integrity_check ok")
CHILD_TIMEOUT = 120.0  # seconds a worker may take before the lab gives up on it

Policy = Callable[[dict], dict]
Promise = str | dict[str, str]


class CrashLabError(WorkflowError):
    """The lab could not start or finish a workflow for a reason other than the crash it injected."""


class LabInputError(CrashLabError, ValueError):
    """An action, a promise or an input the lab does not know; nothing was started."""


def approve_all(wait: dict) -> dict:
    """The default policy: approve every approval as ``crashlab``; a question needs ``answers(...)``."""
    if wait["kind"] == "approval":
        return {"approved": True, "by": "crashlab", "comment": ""}
    raise CrashLabError(f"the workflow asks {wait['request'].get('question')!r} (wait {wait['name']!r}); "
                        "give a policy that answers it, for example policy=answers('a narrower topic').")


def cancel_all(wait: dict) -> dict:
    """Cancel every workflow at its first approval or question, as ``crashlab``: its compensations then run."""
    return {"cancel": True, "by": "crashlab", "reason": "cancelled by the crash lab's policy"}


def reject_all(wait: dict) -> dict:
    """Reject every approval as ``crashlab``."""
    if wait["kind"] == "approval":
        return {"approved": False, "by": "crashlab", "comment": "rejected by the crash lab's policy"}
    return approve_all(wait)


def answers(text: str, approve: bool = True, by: str = "crashlab") -> Policy:
    """A policy that answers every question with ``text`` and approves (or rejects) every approval."""
    def policy(wait: dict) -> dict:
        if wait["kind"] == "clarification":
            return {"answer": text, "by": by}
        return {"approved": approve, "by": by, "comment": ""}
    return policy


def _named(promise, outer: bool = True) -> list[str] | None:
    """Every promise named in ``promise``: a string, or a dict of them (the outer dict's values may be dicts too)."""
    if isinstance(promise, str):
        return [promise]
    if not isinstance(promise, dict):
        return None
    named = []
    for value in promise.values():
        inner = _named(value, outer=False) if outer or isinstance(value, str) else None
        if inner is None:
            return None
        named += inner
    return named


def check_promise(promise: Promise) -> Promise:
    """``promise`` if every promise in it is one of ``PROMISES``; a ``ValueError`` that lists them otherwise."""
    named = _named(promise)
    if named is None or any(p not in PROMISES for p in named):
        raise LabInputError(f"a promise is one of {tuple(PROMISES)}, or a dict of them by destination name "
                            f"({{'cards': 'exactly-once', '*': 'at-least-once'}}) or by workflow id (each a promise "
                            f"or such a dict: {{'lab-2': {{'cards': 'at-most-once'}}}}), not {promise!r}")
    return promise


def promise_for(promise: Promise, destination: str, workflow_id: str | None = None) -> str:
    """The promise stated for one destination of one workflow: the string itself, or the dict's entry for the
    workflow (a promise, or a dict by destination), else for the destination, else ``*``, else exactly-once."""
    if isinstance(promise, str):
        return promise
    if workflow_id is not None and workflow_id in promise:
        return promise_for(promise[workflow_id], destination)
    stated = promise.get(destination, promise.get("*", "exactly-once"))
    return stated if isinstance(stated, str) else "exactly-once"


def workflow_ids(workflow_id: str, count: int) -> list[str]:
    """The ids of ``count`` workflows in one journal: ``lab-1``, ``lab-2``, ... (or ``x``, ``x-2``, ...)."""
    if count == 1:
        return [workflow_id]
    base, first = (workflow_id[:-2], 1) if workflow_id.endswith("-1") else (workflow_id, 2)
    return ([] if first == 1 else [workflow_id]) + [f"{base}-{n}" for n in range(first, count + 1)]


@dataclass
class Scenario:
    """The workflows to crash (one per input, all in one journal), the module, the policy and the promise."""

    kind: str
    inputs: list[dict]
    module: str | Path | None = None
    policy: Policy = approve_all
    ids: list[str] = field(default_factory=lambda: ["lab-1"])
    promise: Promise = "exactly-once"
    lease_seconds: float | None = None
    max_rounds: int = 12

    def where(self, workflow_id: str, point: str) -> str:
        """A fault point of one workflow: the point itself if the journal holds one workflow, else ``point in id``."""
        return point if len(self.ids) == 1 else f"{point} in {workflow_id}"

    def target(self, where: str) -> tuple[str, str]:
        """(workflow, point) of a name ``where`` gave; a plain point of a journal of several is a ``LabInputError``."""
        if len(self.ids) == 1:
            return self.ids[0], where
        for workflow_id in sorted(self.ids, key=len, reverse=True):
            if where.endswith(f" in {workflow_id}"):
                return workflow_id, where[:-len(f" in {workflow_id}")]
        raise LabInputError(f"{where!r}: with {len(self.ids)} workflows in the journal, name the workflow too, "
                            f"for example {self.where(self.ids[-1], where)!r}")

    def expand(self, points: list[str]) -> list[str]:
        """Each point named in every workflow of the journal (``after_send:x`` -> ``after_send:x in lab-1``, ...),
        a point already naming its workflow as it is."""
        named = []
        for point in points:
            try:
                self.target(point)
                named.append(point)
            except LabInputError:
                named += [self.where(w, point) for w in self.ids]
        return named


def scenario(kind: str, input: dict | list[dict], module: str | Path | None = None, policy: Policy = approve_all,
             workflow_id: str = "lab-1", promise: Promise = "exactly-once", lease_seconds: float | None = None,
             ) -> Scenario:
    """A ``Scenario`` from the public arguments: one workflow per input (a dict is one input)."""
    inputs = [input] if isinstance(input, dict) else list(input)
    if not inputs or not all(isinstance(i, dict) for i in inputs):
        raise LabInputError(f"{kind}: give the workflow's input as a dict, or a list of dicts (one workflow each), "
                         f"not {input!r}")
    return Scenario(kind, inputs, module, policy, workflow_ids(workflow_id, len(inputs)), check_promise(promise),
                    lease_seconds)


@dataclass
class Drive:
    """What happened to one copy of the workflows: each child's exit code, pauses, what held."""

    exit_codes: list[int] = field(default_factory=list)
    paused: int = 0
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --- child processes -------------------------------------------------------------------------------------

def _env(trace: Path | None) -> dict:
    env = dict(os.environ)
    env.pop(TRACE_VARIABLE, None)
    if trace is not None:
        env[TRACE_VARIABLE] = str(trace)
    return env


def _kit(args: list[str], trace: Path | None = None, timeout: float = CHILD_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "durable_kit", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=_env(trace))


def _stopped_or_ended(child: subprocess.Popen, timeout: float = CHILD_TIMEOUT) -> int | None:
    """Wait until the child ends (its exit code) or stops itself at a pause point (None)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status = os.waitpid(child.pid, os.WNOHANG | os.WUNTRACED)
        if pid:
            if os.WIFSTOPPED(status):
                return None
            child.returncode = os.waitstatus_to_exitcode(status)
            return child.returncode
        if time.monotonic() > deadline:
            child.kill()
            child.wait()
            raise CrashLabError(f"a worker took longer than {timeout:g} s and was killed")
        time.sleep(0.02)


def _lease_expired(db: Path, ids: list[str]) -> bool:
    with _read(db) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM workflows WHERE status = 'running' AND lease_expires_at >= {DB_NOW}"
                            f" AND id IN ({', '.join('?' * len(ids))})", ids).fetchone()[0] == 0


def _wait_for_expiry(db: Path, scenario: Scenario) -> None:
    # Only the stopped worker is alive, so a live lease is its own: wait until the database's clock passes it.
    deadline = time.monotonic() + CHILD_TIMEOUT
    while not _lease_expired(db, scenario.ids):
        if time.monotonic() > deadline:
            raise CrashLabError(f"a paused worker's lease did not expire within {CHILD_TIMEOUT:g} s")
        time.sleep(0.05)


def _worker(db: Path, scenario: Scenario, drove: Drive, trace: Path | None = None) -> int:
    """One worker, run until nothing is due; if it stops itself at a pause point, a standby takes over first.

    The stopped worker is continued (SIGCONT) once the standby has run; its
    exit code is returned, the standby's appended to ``drove.exit_codes``.
    """
    args = ["worker", "--db", db, "--until-idle"]
    if scenario.lease_seconds:
        args += ["--lease-seconds", scenario.lease_seconds]
    if scenario.module:
        args += ["--module", scenario.module]
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen([sys.executable, "-m", "durable_kit", *map(str, args)], stdout=subprocess.DEVNULL,
                                 stderr=errors, text=True, env=_env(trace))
        try:
            code = _stopped_or_ended(child)
            while code is None:  # stopped at a pause point: its lease runs out, a standby takes over
                drove.paused += 1
                try:
                    _wait_for_expiry(db, scenario)
                    drove.exit_codes.append(_worker(db, scenario, drove, trace))  # the standby
                finally:
                    child.send_signal(signal.SIGCONT)
                code = _stopped_or_ended(child)
        except BaseException:
            child.kill()  # never leave a stopped process behind
            child.wait()
            raise
        errors.seek(0)
        if code not in (0, *EXIT_CODES.values()):
            drove.notes.append(f"worker exited {code}: {errors.read().strip()[-400:]}")
    return code


def prepare(scenario: Scenario, folder: Path) -> Path:
    """Start the workflows once, from the command line, in ``folder/template.db``; every trial copies it."""
    template = folder / "template.db"
    for workflow_id, workflow_input in zip(scenario.ids, scenario.inputs):
        args: list = ["start", "--db", template, "--kind", scenario.kind, "--input", json.dumps(workflow_input),
                      "--id", workflow_id]
        if scenario.module:
            args += ["--module", scenario.module]
        started = _kit(args)
        if started.returncode != 0:
            raise CrashLabError(f"could not start {scenario.kind!r} with input {workflow_input}: "
                                f"{(started.stderr or started.stdout).strip()}")
    return template


def fresh_copy(template: Path, path: Path) -> Path:
    """A consistent copy of the started workflows' database (SQLite's backup API, never a raw file copy)."""
    source, target = sqlite3.connect(str(template)), sqlite3.connect(str(path))
    try:
        source.backup(target)
    finally:
        source.close(), target.close()
    return path


# --- reading what survived --------------------------------------------------------------------------------

@contextmanager
def _read(path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


def _ids(workflow_ids: str | list[str]) -> list[str]:
    return [workflow_ids] if isinstance(workflow_ids, str) else list(workflow_ids)


def _in(ids: list[str]) -> str:
    return f"IN ({', '.join('?' * len(ids))})"


def committed_outputs(db: Path, workflow_ids: str | list[str]) -> dict[tuple[str, str], str]:
    """Every completed step's output as stored (JSON text), by (workflow, step)."""
    ids = _ids(workflow_ids)
    with _read(db) as conn:
        return {(r["workflow_id"], r["name"]): r["output"] for r in conn.execute(
            f"SELECT workflow_id, name, output FROM steps WHERE workflow_id {_in(ids)} AND status = 'complete'",
            ids)}


def destination_files(db: Path) -> dict[str, Path]:
    """The outside world's files beside the journal, by name: ``x.calls.db`` is ``calls``."""
    prefix = f"{db.stem}."
    return {p.name[len(prefix):-3]: p for p in sorted(db.parent.glob(f"{db.stem}.*.db"))}


def destination_counts(db: Path, workflow_ids: str | list[str]) -> dict[str, int]:
    """What every destination beside the journal counted: ledger calls by kind (of these workflows), requests and effects."""
    ids = _ids(workflow_ids)
    counts: dict[str, int] = {}
    for name, path in destination_files(db).items():
        with _read(path) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "calls" in tables:
                for row in conn.execute(f"SELECT kind, COUNT(*) AS n FROM calls WHERE workflow_id {_in(ids)}"
                                        " GROUP BY kind ORDER BY kind", ids):
                    counts[f"{row['kind']} calls"] = row["n"]
                continue
            if "requests" in tables:
                counts[f"{name} requests"] = conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
            effects = next((t for t in EFFECT_TABLES if t in tables), None)
            if effects:
                counts[f"{name} effects"] = conn.execute(f"SELECT COUNT(*) FROM {effects}").fetchone()[0]
    return counts


def repeated_keys(db: Path) -> list[str]:
    """Keys that more than one effect carries at one destination: a keyed effect that happened twice."""
    found = []
    for name, path in destination_files(db).items():
        with _read(path) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            effects = next((t for t in EFFECT_TABLES if t in tables), None)
            if effects is None:
                continue
            for row in conn.execute(f"SELECT key, COUNT(*) AS n FROM {effects} WHERE key IS NOT NULL"
                                    " GROUP BY key HAVING COUNT(*) > 1 ORDER BY key"):
                found.append(f"{name}: key {row['key']!r} made {row['n']} effects")
    return found


def _owner(workflow_id: str | None, key: str | None, ids: list[str]) -> str | None:
    """The workflow a row belongs to: the one it names, else the one whose id begins its key (``lab-1:hold``)."""
    if workflow_id is not None or key is None:
        return workflow_id
    return next((i for i in sorted(ids, key=len, reverse=True) if key.startswith(f"{i}:")), None)


def sent(db: Path, workflow_ids: str | list[str]) -> list[dict]:
    """Every request and effect at every destination beside the journal (not the ledger), oldest first in each file.

    Each row: ``destination``, ``kind`` (``request`` or ``effect``), ``workflow`` (the one the row names, else the
    one whose id begins its key, else None), ``key``, ``action`` (of the effect helper that sent it),
    ``identity`` (the key, else ``action <name>``, else None) and ``at``.
    """
    ids, rows = _ids(workflow_ids), []
    for name, path in destination_files(db).items():
        with _read(path) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "calls" in tables:
                continue
            effects = next((t for t in EFFECT_TABLES if t in tables), None)
            for kind, table in (("request", "requests" if "requests" in tables else None), ("effect", effects)):
                if table is None:
                    continue
                columns = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
                named = {c: c if c in columns else "NULL" for c in ("key", "workflow_id", "action")}
                for r in conn.execute(f"SELECT {named['key']} AS key, {named['workflow_id']} AS workflow_id,"
                                      f" {named['action']} AS action, at FROM {table} ORDER BY rowid"):
                    rows.append({"destination": name, "kind": kind, "workflow": _owner(r["workflow_id"], r["key"], ids),
                                 "key": r["key"], "action": r["action"], "at": r["at"],
                                 "identity": r["key"] or (f"action {r['action']}" if r["action"] else None)})
    return rows


def tally(rows: list[dict], kind: str) -> dict[tuple, int]:
    """How many rows of ``kind`` (``request`` or ``effect``) each (destination, workflow, identity) holds."""
    found: dict[tuple, int] = {}
    for row in rows:
        if row["kind"] == kind:
            unit = (row["destination"], row["workflow"], row["identity"])
            found[unit] = found.get(unit, 0) + 1
    return found


def counts_by_workflow(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Requests and effects at every destination, per workflow (``None``: rows no workflow could be named for)."""
    found: dict = {}
    for row in rows:
        name = f"{row['destination']} {row['kind']}s"
        counts = found.setdefault(row["workflow"], {})
        counts[name] = counts.get(name, 0) + 1
    return {w: dict(sorted(c.items())) for w, c in sorted(found.items(), key=lambda item: str(item[0]))}


def effect_order(rows: list[dict]) -> dict[str | None, list[tuple]]:
    """Each workflow's effects in the order they first happened (by time, across destinations), each once."""
    found: dict = {}
    for row in sorted((r for r in rows if r["kind"] == "effect"), key=lambda r: r["at"]):
        seen = found.setdefault(row["workflow"], [])
        unit = (row["destination"], row["identity"])
        if unit not in seen:
            seen.append(unit)
    return found


def compensations(db: Path, workflow_ids: str | list[str]) -> dict[str, list[tuple[str, int | None]]]:
    """Each workflow's completed compensations in the order they ran (by position): (step undone, its position)."""
    ids, found = _ids(workflow_ids), {}
    with _read(db) as conn:
        steps = {(r["workflow_id"], r["name"]): r for r in conn.execute(
            f"SELECT workflow_id, name, status, position FROM steps WHERE workflow_id {_in(ids)}", ids)}
    for (workflow_id, name), row in sorted(steps.items(), key=lambda item: (item[0][0], item[1]["position"] or 0)):
        if name.startswith(COMPENSATION) and row["status"] == "complete":
            undone = steps.get((workflow_id, name[len(COMPENSATION):]))
            found.setdefault(workflow_id, []).append((name[len(COMPENSATION):], undone and undone["position"]))
    return found


def observe(db: Path, workflow_ids: str | list[str], scenario: Scenario | None = None) -> dict:
    """The workflows' final states, what every destination counted, and SQLite's own integrity check.

    ``status`` is the workflows' one status if they share it, else each
    workflow's (``lab-1: complete; lab-2: failed``); ``statuses`` by id.
    ``sent`` is every request and effect with its workflow (``sent``);
    ``fired`` names each fault that fired as ``scenario.where`` does.
    """
    ids = _ids(workflow_ids)
    where = scenario.where if scenario is not None else (lambda workflow_id, point: point)
    with _read(db) as conn:
        rows = {r["id"]: r for r in conn.execute(f"SELECT id, status, output, error FROM workflows WHERE id {_in(ids)}",
                                                 ids)}
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        events = conn.execute(f"SELECT workflow_id, step, event, detail FROM history WHERE workflow_id {_in(ids)}"
                              " ORDER BY seq", ids).fetchall()
    statuses = {i: rows[i]["status"] for i in ids}
    shared = set(statuses.values())
    one = len(ids) == 1
    return {"status": shared.pop() if len(shared) == 1 else "; ".join(f"{i}: {s}" for i, s in statuses.items()),
            "statuses": statuses,
            "error": rows[ids[0]]["error"] if one else {i: rows[i]["error"] for i in ids if rows[i]["error"]},
            "output": rows[ids[0]]["output"] if one else {i: rows[i]["output"] for i in ids},
            "steps": committed_outputs(db, ids),
            "counts": destination_counts(db, ids), "repeated_keys": repeated_keys(db),
            "sent": sent(db, ids), "compensations": compensations(db, ids),
            "reserved": sorted({(e["workflow_id"], e["step"]) for e in events if e["event"] == "key_reserved"}),
            "integrity": integrity,
            "fired": [where(e["workflow_id"], e["detail"].rsplit(" (", 1)[0]) for e in events
                      if e["event"] == "fault_fired"],
            "refused": sum(1 for e in events if e["event"] == "stale_write_refused"),
            "reconciled": sorted({e["step"] for e in events if e["event"] == "reconciled"})}


# --- driving one copy to the end --------------------------------------------------------------------------

def _make_due(db: Path, workflow_id: str) -> None:
    # The lab's clock runs fast: a timer or a retry schedule that would wait is due now.
    journal = Journal(db)
    try:
        with immediate(journal.conn):
            journal.conn.execute("UPDATE waits SET wake_at = ? WHERE workflow_id = ? AND kind = 'timer'"
                                 " AND status = 'waiting'", (now(), workflow_id))
            bring_due(journal.conn, workflow_id, now())
    finally:
        journal.close()


def _decide(db: Path, scenario: Scenario, workflow_id: str, wait: dict) -> None:
    decision = scenario.policy(wait)
    journal = Journal(db)
    try:
        if decision.get("cancel"):
            cancel(journal, workflow_id, decision["by"], decision.get("reason", ""))
        elif wait["kind"] == "clarification":
            answer(journal, workflow_id, decision["answer"], decision["by"], wait=wait["name"])
        elif decision["approved"]:
            approve(journal, workflow_id, decision["by"], decision.get("comment", ""), wait=wait["name"])
        else:
            reject(journal, workflow_id, decision["by"], decision.get("comment", ""), wait=wait["name"])
    finally:
        journal.close()


def _statuses(db: Path, ids: list[str]) -> str:
    with _read(db) as conn:
        return ", ".join(f"{r['id']} {r['status']}" for r in conn.execute(
            f"SELECT id, status FROM workflows WHERE id {_in(ids)} ORDER BY id", ids))


def _next_move(db: Path, scenario: Scenario) -> str:
    """Settle the workflows' state between two workers: decide waits, fast-forward timers, or say all are done."""
    moves = []
    for workflow_id in scenario.ids:
        journal = Journal(db)
        try:
            row = journal.workflow(workflow_id)
            waiting = open_wait(journal, workflow_id) if row["status"] == "waiting" else None
        finally:
            journal.close()
        if row["status"] in SETTLED:
            continue
        if waiting and waiting["kind"] in ("approval", "clarification"):
            _decide(db, scenario, workflow_id, waiting)
            moves.append("decided")
        elif row["status"] in ("pending", "waiting") and (row["next_run_at"] or 0) > now():
            _make_due(db, workflow_id)
            moves.append("fast-forwarded")
        else:
            moves.append("run again")
    if not moves:
        return "settled"
    return next((m for m in ("decided", "fast-forwarded") if m in moves), "run again")


def drive(db: Path, scenario: Scenario, crashes: list[tuple[str, str]] | tuple = (), trace: Path | None = None) -> Drive:
    """Arm ``crashes`` (point, action), each in its one workflow, then run workers in child processes until every
    workflow settles.

    Between workers the policy decides open waits and timers are made due.
    After every worker the committed step outputs are compared with every
    earlier snapshot: a step once committed must stay committed, unchanged.
    """
    result, seen, idle = Drive(), {}, 0
    journal = Journal(db)
    try:
        for where, action in crashes:
            workflow_id, point = scenario.target(where)
            arm(journal.conn, point, FAULT_ACTIONS[action], workflow_id=workflow_id)
    finally:
        journal.close()
    for _ in range(scenario.max_rounds):
        code = _worker(db, scenario, result, trace)
        result.exit_codes.append(code)
        if code not in (0, *EXIT_CODES.values()) and result.exit_codes[-2:] == [code] * 2:
            break  # the same failure twice: no crash the lab armed
        outputs = committed_outputs(db, scenario.ids)
        for (workflow_id, name), output in seen.items():
            where = name if len(scenario.ids) == 1 else f"{workflow_id}/{name}"
            if (workflow_id, name) not in outputs:
                result.violations.append(f"no committed step lost: {where!r} was committed, then gone")
            elif outputs[(workflow_id, name)] != output:
                result.violations.append(f"no committed output changed: {where!r} changed")
        seen = {**seen, **outputs}
        move = _next_move(db, scenario)
        if move == "settled":
            break
        idle = idle + 1 if code == 0 and move == "run again" else 0
        if idle == 2:  # two clean workers in a row left it unsettled: the lab cannot move it further
            result.notes.append(f"stuck: {_statuses(db, scenario.ids)} after two clean workers")
            break
    else:
        result.notes.append(f"not settled after {scenario.max_rounds} workers")
    journal = Journal(db)
    try:
        disarm_all(journal.conn)
    finally:
        journal.close()
    return result


# --- discovery -------------------------------------------------------------------------------------------

def read_trace(trace: Path, scenario: Scenario) -> list[str]:
    """The points the workflows passed, in the order first reached, each once per workflow (named by
    ``scenario.where``: in a journal of several workflows, ``after_send:hold in lab-2``)."""
    points = []
    if trace.exists():
        for line in trace.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            if entry["workflow_id"] in scenario.ids:
                where = scenario.where(entry["workflow_id"], entry["point"])
                if where not in points:
                    points.append(where)
    return points


def discover(scenario: Scenario, folder: Path) -> tuple[list[str], dict]:
    """Run the workflows cleanly with tracing on; return their fault points and what the clean run left.

    The points are those the trace lists (every point the run tripped), first
    reached first, each once per workflow. A point on a path the clean run did
    not take (a rejection, a retry) is not listed: explore other inputs to reach it.
    """
    template = prepare(scenario, folder)
    clean_db = fresh_copy(template, folder / "clean.db")
    trace = folder / "clean.trace.jsonl"
    trace.unlink(missing_ok=True)
    drove = drive(clean_db, scenario, trace=trace)
    baseline = observe(clean_db, scenario.ids, scenario)
    if drove.notes or any(drove.exit_codes):
        raise CrashLabError(f"the clean run of {scenario.kind!r} did not run cleanly (worker exit codes "
                            f"{drove.exit_codes}): {' | '.join(dict.fromkeys(drove.notes))}")
    return read_trace(trace, scenario), {**baseline, "template": template, "db": clean_db}


# --- one crash, observed and judged -----------------------------------------------------------------------

def _beyond(made: int, clean: int, stated: str) -> str | None:
    """What ``made`` against ``clean`` breaks of the promise ``stated``, or None if it keeps it."""
    if made > clean and stated != "at-least-once":
        return f"{made - clean} more than {stated} allows"
    if made < clean and stated != "at-most-once":
        return f"{clean - made} fewer than {stated} allows"
    return None


def promise_violations(counts: dict[str, int], baseline: dict[str, int], promise: Promise) -> list[str]:
    """Each destination whose effects (totals, as in ``counts``), against the clean run's, break the promise
    stated for it; named.

    Every effect counts, keyed or not: two charges where the clean run made
    one break ``exactly-once`` and ``at-most-once``; none where it made one
    break ``exactly-once`` and ``at-least-once``. ``invariant_violations``
    judges the same way per workflow and per key.
    """
    found = []
    for name in sorted(set(counts) | set(baseline)):
        if not name.endswith(" effects"):
            continue
        destination, made, clean = name[:-len(" effects")], counts.get(name, 0), baseline.get(name, 0)
        verdict = _beyond(made, clean, promise_for(promise, destination))
        if verdict:
            found.append(f"effects as promised: {destination} made {made} effects, the clean run {clean}: {verdict}")
    return found


def _unit_name(unit: tuple, many_workflows: bool, identities: dict[tuple, set]) -> str:
    """A destination, with its workflow if the journal holds several and its key (or action) if it has several."""
    destination, workflow_id, identity = unit
    name = destination
    if many_workflows:
        name += f" for {workflow_id}" if workflow_id is not None else " for no workflow it could name"
    if identity is not None and len(identities[destination, workflow_id]) > 1:
        name += f" with key {identity!r}" if not identity.startswith("action ") else f" by {identity}"
    return name


def effect_violations(final: list[dict], baseline: list[dict], promise: Promise, ids: list[str]) -> list[str]:
    """Every effect judged per workflow and per key (or sending action) against the clean run's, by the promise
    stated for that workflow's destination: a repeat in one workflow and a loss in another never cancel out."""
    made, clean = tally(final, "effect"), tally(baseline, "effect")
    units = sorted(set(made) | set(clean), key=lambda u: tuple(str(part) for part in u))
    identities: dict[tuple, set] = {}
    for destination, workflow_id, identity in units:
        identities.setdefault((destination, workflow_id), set()).add(identity)
    found = []
    for unit in units:
        verdict = _beyond(made.get(unit, 0), clean.get(unit, 0), promise_for(promise, unit[0], unit[1]))
        if verdict:
            found.append(f"effects as promised: {_unit_name(unit, len(ids) > 1, identities)} made "
                         f"{made.get(unit, 0)} effects, the clean run {clean.get(unit, 0)}: {verdict}")
    return found


def request_violations(final: dict) -> list[str]:
    """Requests beyond what the sending strategy promises: a key reserved in the journal (``send_at_most_once``)
    is sent at most once, wherever it goes, keyed or not."""
    found = []
    for workflow_id, action in final["reserved"]:
        sends: dict[str, int] = {}
        for row in final["sent"]:
            if row["kind"] == "request" and row["workflow"] == workflow_id and (
                    row["action"] == action or row["key"] == f"{workflow_id}:{action}"):
                sends[row["destination"]] = sends.get(row["destination"], 0) + 1
        for destination, n in sorted(sends.items()):
            if n > 1:
                found.append(f"requests as promised: {destination} received {n} requests for {workflow_id}'s "
                             f"reserved {action!r}: a reserved key is sent at most once")
    return found


def order_violations(final: dict, baseline: dict) -> list[str]:
    """Each workflow's effects in the clean run's order (those both runs made, by when each first happened)."""
    now, then = effect_order(final["sent"]), effect_order(baseline["sent"])
    found = []
    for workflow_id in sorted(set(now) & set(then), key=str):
        both = set(now[workflow_id]) & set(then[workflow_id])
        came = [u for u in now[workflow_id] if u in both]
        expected = [u for u in then[workflow_id] if u in both]
        if came != expected:
            said = lambda units: ", ".join(f"{d} {i or ''}".strip() for d, i in units)  # noqa: E731
            found.append(f"effects in order: {workflow_id}'s effects came {said(came)}; the clean run's "
                         f"{said(expected)}")
    return found


def compensation_violations(final: dict, baseline: dict) -> list[str]:
    """Each workflow's compensations newest first (the steps they undo, latest placed first), and, where both
    runs ended cancelled, each compensation of the clean run done, once: a crash skips none."""
    found = []
    for workflow_id, undone in final["compensations"].items():
        positions = [position for _, position in undone]
        if None in positions or positions != sorted(positions, reverse=True) or len(set(positions)) < len(positions):
            newest_first = [name for name, _ in sorted(undone, key=lambda u: -(u[1] or 0))]
            found.append(f"compensations newest first, once each: {workflow_id} undid "
                         f"{', '.join(name for name, _ in undone)}; newest first is {', '.join(newest_first)}")
    for workflow_id, status in final["statuses"].items():
        if status == baseline["statuses"].get(workflow_id) == "cancelled":
            missing = ({n for n, _ in baseline["compensations"].get(workflow_id, [])}
                       - {n for n, _ in final["compensations"].get(workflow_id, [])})
            if missing:
                found.append(f"compensations newest first, once each: {workflow_id} ended cancelled without "
                             f"undoing {', '.join(sorted(missing))}")
    return found


def invariant_violations(final: dict, drove: Drive, expected: dict[str, str], baseline: dict,
                         promise: Promise = "exactly-once") -> list[str]:
    """The invariants (``INVARIANTS``), each violation named: steps kept, outputs unchanged, effects as promised
    per workflow and key, reserved sends once, keys once, effects in order, compensations newest first, status,
    integrity."""
    ids = list(final["statuses"])
    found = list(dict.fromkeys(drove.violations))
    found += effect_violations(final["sent"], baseline["sent"], promise, ids)
    found += request_violations(final)
    found += [f"keyed effects at most once: {k}" for k in final["repeated_keys"]]
    found += order_violations(final, baseline)
    found += compensation_violations(final, baseline)
    for workflow_id, status in final["statuses"].items():
        if status != expected[workflow_id]:
            who = "" if len(expected) == 1 else f"{workflow_id} "
            found.append(f"final status as expected: {who}{status}, expected {expected[workflow_id]}")
    if final["integrity"] != "ok":
        found.append(f"integrity_check ok: {final['integrity']}")
    return found


def clean_violations(baseline: dict) -> list[str]:
    """What the clean run broke by itself: a reserved key sent twice, a keyed effect twice, compensations out of
    order, ``integrity_check``. The rest is judged against the clean run, so it holds there by definition."""
    found = request_violations(baseline) + [f"keyed effects at most once: {k}" for k in baseline["repeated_keys"]]
    found += compensation_violations(baseline, baseline)
    if baseline["integrity"] != "ok":
        found.append(f"integrity_check ok: {baseline['integrity']}")
    return found


def differences(final: dict, baseline: dict) -> dict[str, int]:
    """Each count minus the clean run's: above zero is repeated work, below zero is work that never happened."""
    names = sorted(set(final["counts"]) | set(baseline["counts"]))
    return {n: final["counts"].get(n, 0) - baseline["counts"].get(n, 0) for n in names}


def effects_changed(final: dict, baseline: dict) -> list[str]:
    """Each destination's effects beyond or short of the clean run's (per workflow, in a journal of several)."""
    if len(final["statuses"]) == 1:
        return [f"{n} {d:+d}" for n, d in differences(final, baseline).items() if n.endswith(" effects") and d]
    now, then = counts_by_workflow(final["sent"]), counts_by_workflow(baseline["sent"])
    changed = []
    for workflow_id in sorted(set(now) | set(then), key=str):
        mine, clean = now.get(workflow_id, {}), then.get(workflow_id, {})
        for name in sorted(set(mine) | set(clean)):
            delta = mine.get(name, 0) - clean.get(name, 0)
            if name.endswith(" effects") and delta:
                changed.append(f"{name} {delta:+d} for {workflow_id}")
    return changed


def _expected(baseline: dict, expected_status: str | None) -> dict[str, str]:
    return {i: expected_status or s for i, s in baseline["statuses"].items()}


def crash_once(scenario: Scenario, template: Path, db: Path, crashes: list[tuple[str, str]],
               baseline: dict, expected_status: str | None = None) -> dict:
    """A fresh copy of the workflows, crashed (or paused) at ``crashes`` (each a point as ``scenario.where``
    names it, and an action) and recovered; one row of counts and judgements."""
    fresh_copy(template, db)
    drove = drive(db, scenario, crashes)
    final = observe(db, scenario.ids, scenario)
    violations = invariant_violations(final, drove, _expected(baseline, expected_status), baseline,
                                      scenario.promise)
    changed = effects_changed(final, baseline)
    made, clean = tally(final["sent"], "effect"), tally(baseline["sent"], "effect")
    return {
        "crashed": [c for c in drove.exit_codes if c != 0],
        "paused": drove.paused,
        "fired": final["fired"],
        "counts": final["counts"],
        "by_workflow": counts_by_workflow(final["sent"]),
        "repeated": differences(final, baseline),
        "artifacts_stored": len(final["steps"]),
        "status": final["status"],
        "error": final["error"],
        "output_as_clean": final["output"] == baseline["output"],
        "effects_as_clean": not changed,
        "effects_changed": changed,
        "effects_beyond": sum(max(0, made.get(u, 0) - clean.get(u, 0)) for u in set(made) | set(clean)),
        "effects_short": sum(max(0, clean.get(u, 0) - made.get(u, 0)) for u in set(made) | set(clean)),
        "invariants_held": not violations,
        "violations": violations,
        "refused": final["refused"],
        "reconciled": final["reconciled"],
        "notes": drove.notes,
        "children": len(drove.exit_codes),
    }


def _folder(folder: str | Path | None):
    if folder is None:
        return tempfile.TemporaryDirectory(prefix="durable-kit-crashlab-")
    Path(folder).mkdir(parents=True, exist_ok=True)
    return nullcontext(str(folder))


def _check_actions(actions: tuple[str, ...]) -> None:
    for action in actions:
        if action not in ACTIONS:
            raise LabInputError(f"the crash lab crashes or pauses by {ACTIONS}, not {action!r}")


def _lease(actions: tuple[str, ...], lease_seconds: float | None) -> float | None:
    return lease_seconds or (PAUSE_LEASE_SECONDS if "pause" in actions else None)


def explore(kind: str, input: dict | list[dict], *, module: str | Path | None = None, policy: Policy = approve_all,
            actions: tuple[str, ...] = CRASHES, points: list[str] | None = None,
            expected_status: str | None = None, folder: str | Path | None = None, parallel: int = 1,
            workflow_id: str = "lab-1", promise: Promise = "exactly-once",
            lease_seconds: float | None = None) -> list[dict]:
    """Crash (or pause) a fresh copy of the workflows at every point they pass, by every action; one row each.

    ``input`` is one workflow's input, or a list of inputs: one workflow
    each, all in one journal (ids ``lab-1``, ``lab-2``, ...), and every point
    is crashed in each workflow that passes it. ``points`` may name points
    (``after_send:hold``: in every workflow) or a point of one workflow
    (``after_send:hold in lab-2``). The first row (``point`` = ``clean``) is
    the clean run everything is compared with (its ``violations``: what it
    broke by itself, ``clean_violations``). Each other row: the point,
    the workflow it was armed in and the action, the exit code of the worker
    that died (13 for ``exit``, -9 for ``kill``; 0 if none died: the point
    was never reached, or the action was ``pause``), ``paused`` (how many
    workers were stopped and continued), the counts at every destination and
    their difference from the clean run (``by_workflow``: per workflow), the
    steps stored, the final status, and whether the invariants held
    (``violations`` names any that did not), effects judged per workflow and
    per key by ``promise``. With ``pause`` every worker's lease is
    ``lease_seconds`` (``PAUSE_LEASE_SECONDS`` unless given).
    """
    _check_actions(actions)
    lab = scenario(kind, input, module, policy, workflow_id, promise, _lease(actions, lease_seconds))
    with _folder(folder) as where:
        where = Path(where)
        found, baseline = discover(lab, where)
        cells = [(i, point, action) for i, point in enumerate(found if points is None else lab.expand(points))
                 for action in actions]

        def cell(args) -> dict:
            i, named, action = args
            armed_in, point = lab.target(named)
            row = crash_once(lab, baseline["template"], where / f"p{i:02d}-{action}.db", [(named, action)],
                             baseline, expected_status)
            return {"point": point, "workflow": armed_in, "action": action,
                    "exit_code": next(iter(row["crashed"]), 0), **row}

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:  # the children are separate processes
            rows = list(pool.map(cell, cells))
    judged = clean_violations(baseline)
    clean = {"point": "clean", "workflow": None, "action": "none", "exit_code": 0, "crashed": [], "paused": 0,
             "fired": [], "counts": baseline["counts"], "by_workflow": counts_by_workflow(baseline["sent"]),
             "repeated": {n: 0 for n in baseline["counts"]},
             "artifacts_stored": len(baseline["steps"]), "status": baseline["status"], "error": baseline["error"],
             "output_as_clean": True,
             "effects_as_clean": True, "effects_changed": [], "effects_beyond": 0, "effects_short": 0,
             "invariants_held": not judged, "violations": judged, "refused": baseline["refused"],
             "reconciled": baseline["reconciled"], "notes": [],
             "children": 0}
    return [clean, *rows]


def summary_row(row: dict) -> dict:
    """One explore row, flat: point, workflow, action, exit code, every count, what was stored, status and
    judgements."""
    return {"point": row["point"], "workflow": row["workflow"], "action": row["action"],
            "exit_code": row["exit_code"], **row["counts"],
            "artifacts_stored": row["artifacts_stored"], "status": row["status"],
            "invariants_held": row["invariants_held"], "effects_as_clean": row["effects_as_clean"],
            "violations": "; ".join(row["violations"])}


# --- the step map ----------------------------------------------------------------------------------------

def _calls_in(db: Path, workflow_id: str) -> list[dict]:
    """Every request any destination received during the clean run, with the time it arrived."""
    calls = []
    for name, path in destination_files(db).items():
        with _read(path) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "calls" in tables:
                calls += [{"destination": r["kind"], "kind": r["kind"], "at": r["at"], "key": None}
                          for r in conn.execute("SELECT kind, at FROM calls WHERE workflow_id = ?", (workflow_id,))]
            elif "requests" in tables:
                columns = {r[1] for r in conn.execute("PRAGMA table_info(requests)")}
                key = "key" if "key" in columns else "NULL"
                calls += [{"destination": name, "kind": "effect", "at": r["at"], "key": r["key"]}
                          for r in conn.execute(f"SELECT {key} AS key, at FROM requests")]
    return calls


def step_map(kind: str, input: dict, *, module: str | Path | None = None, policy: Policy = approve_all,
             rows: list[dict] | None = None, verify: bool = True, folder: str | Path | None = None,
             workflow_id: str = "lab-1") -> list[dict]:
    """Each step and wait of a clean run, marked by what it touched; each side effect with its identity.

    A step is a *model decision* if it called the model, a *read* if it
    called a source, a *side effect* if a destination beside the journal
    received a request while it ran (or it put a row in the outbox), and
    *deterministic computation* if it touched nothing outside. Waits are
    *human events* (approvals, questions), *timers*, or the outbox's
    deliveries. A side effect's identity is the key it sent (``none`` if it
    sent none). Its reconciliation method is read from the journal (an
    outbox row, a reserved key) or from what a crash right after its send
    did (``explore``'s ``rows``, or with ``verify`` a crash at
    ``after_activity:<step>`` of each such step, run here): the destination
    deduplicated the key, the replay asked first (``reconciled``), or nothing
    did (``none``, flagged).
    """
    if not isinstance(input, dict):
        raise LabInputError(f"{kind}: the step map is of one workflow: give its input as a dict, not {input!r}")
    with _folder(folder) as where:
        _, baseline = discover(scenario(kind, input, module, policy, workflow_id), Path(where))
        db = baseline["db"]
        calls = _calls_in(db, workflow_id)
        journal = Journal(db)
        try:
            steps = journal.steps(workflow_id)
            history = journal.history(workflow_id)
            outbox = {r["action"]: dict(r) for r in journal.conn.execute(
                "SELECT action, key, destination FROM outbox WHERE workflow_id = ?", (workflow_id,))}
            waits = [dict(r) for r in journal.conn.execute(
                "SELECT name, kind, created_at FROM waits WHERE workflow_id = ? ORDER BY created_at", (workflow_id,))]
        finally:
            journal.close()
    reserved = {e["step"] for e in history if e["event"] == "key_reserved"}
    if rows is None and verify:
        senders = [s["name"] for s in steps if s["status"] == "complete" and s["name"] not in outbox
                   and s["name"] not in reserved and any(
                       c["kind"] == "effect" and s["started_at"] <= c["at"] <= s["completed_at"] for c in calls)]
        if senders:
            rows = explore(kind, input, module=module, policy=policy, actions=("exit",), workflow_id=workflow_id,
                           points=[f"after_activity:{name}" for name in senders])
    entries = []
    for step in steps:
        if step["status"] != "complete":
            continue
        touched = [c for c in calls if step["started_at"] <= c["at"] <= step["completed_at"]]
        kinds = {c["kind"] for c in touched}
        effects = [c for c in touched if c["kind"] == "effect"]
        if step["name"] in outbox or effects:
            keys = sorted({c["key"] for c in effects if c["key"]} | (
                {outbox[step["name"]]["key"]} if step["name"] in outbox else set()))
            nature = "side effect"
            destinations = sorted({c["destination"] for c in effects} | (
                {outbox[step["name"]]["destination"]} if step["name"] in outbox else set()))
            method = _method(step["name"], keys, destinations, step["name"] in outbox,
                             step["name"] in reserved, rows)
        else:
            nature = ("model decision" if "model" in kinds else "read" if kinds else "deterministic computation")
            keys, destinations, method = [], sorted(kinds), ""
        entries.append({"at": step["started_at"], "name": step["name"], "kind": nature,
                        "touches": ", ".join(destinations) or "nothing outside",
                        "identity": ", ".join(keys) if nature == "side effect" else "",
                        "reconciliation": method,
                        "flagged": nature == "side effect" and method == "none"})
    for wait in waits:
        if wait["kind"] == "delivery":
            continue  # the outbox's receipt: its step above is the side effect
        nature = "timer" if wait["kind"] == "timer" else "human event"
        entries.append({"at": wait["created_at"], "name": wait["name"], "kind": nature,
                        "touches": wait["kind"], "identity": "", "reconciliation": "", "flagged": False})
    return [{k: v for k, v in e.items() if k != "at"} for e in sorted(entries, key=lambda e: e["at"])]


def _method(step: str, keys: list[str], destinations: list[str], outboxed: bool, reserved: bool,
            rows: list[dict] | None) -> str:
    if outboxed:
        return "outbox: resent with its key until marked sent; the destination must deduplicate"
    if reserved:
        return "reserved key: at most once; a crash before the send loses it"
    if rows is not None:
        after = [r for r in rows if r["point"] in (f"after_send:{step}", f"after_activity:{step}")]
        if after:
            if any(step in r["reconciled"] for r in after):
                return "asks the destination first (reconciliation)"
            repeated = [r for r in after if any(d > 0 for n, d in r["repeated"].items()
                                                if n.endswith(" effects") and n[:-8] in destinations)]
            if not repeated:
                return "destination deduplicates the key" if keys else "no repeat seen after a crash"
            return "none"
    return "key sent; unverified: pass explore's rows" if keys else "none"


# --- random kills -----------------------------------------------------------------------------------------

def fuzz(kind: str, input: dict | list[dict], *, trials: int = 100, seed: int = 0, max_kills: int = 2,
         module: str | Path | None = None, policy: Policy = approve_all, expected_status: str | None = None,
         folder: str | Path | None = None, progress: bool = False, workflow_id: str = "lab-1",
         actions: tuple[str, ...] = CRASHES, promise: Promise = "exactly-once",
         lease_seconds: float | None = None) -> dict:
    """``trials`` fresh copies, each armed at 1 to ``max_kills`` random points with random actions; the tally.

    ``input`` is one workflow's input or a list (one workflow each, in one
    journal; the points are drawn from every workflow's, ``after_send:hold in
    lab-2``); ``actions`` may include ``pause``. After every trial the
    invariants are checked (``INVARIANTS``): no committed step lost and no
    committed output changed (compared after every worker), effects as
    promised (every effect beyond or short of the clean run's, per workflow
    and per key, judged by ``promise``), requests as promised (a reserved key
    sent at most once), keyed effects at most once, each workflow's effects
    in the clean run's order, compensations newest first and none skipped,
    the final status the clean run reached, and ``PRAGMA integrity_check``.
    Effects beyond or short of the clean run's are also counted apart
    (``trials_with_extra_effects``, ``trials_with_lost_effects``), whatever
    the promise. The same ``seed`` arms the same points in the same trials.
    """
    _check_actions(actions)
    chooser = random.Random(seed)
    lab = scenario(kind, input, module, policy, workflow_id, promise, _lease(actions, lease_seconds))
    with _folder(folder) as where:
        where = Path(where)
        points, baseline = discover(lab, where)
        rows = []
        bar = _progress(trials, progress)
        for trial in range(trials):
            crashes = [(p, chooser.choice(actions)) for p in
                       chooser.sample(points, min(len(points), chooser.randint(1, max_kills)))]
            db = where / f"trial-{trial:05d}.db"
            row = crash_once(lab, baseline["template"], db, crashes, baseline, expected_status)
            rows.append({"trial": trial, "armed": crashes, **row})
            if row["invariants_held"]:
                for path in [db, *destination_files(db).values()]:
                    for suffix in ("", "-wal", "-shm"):
                        Path(f"{path}{suffix}").unlink(missing_ok=True)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    return {"kind": kind, "input": input, "workflows": len(lab.ids), "promise": lab.promise, "seed": seed,
            "points": points, "rows": rows, **summarize(rows, points)}


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience: without tqdm the run is the same, only quieter
        return None
    return tqdm(total=total, unit="trial", file=sys.stderr)


def summarize(rows: list[dict], points: list[str]) -> dict:
    """The fuzz tally: trials, kills, pauses, violations by invariant, the histogram of points that fired."""
    by_invariant = {name: sum(1 for r in rows if any(v.startswith(name) for v in r["violations"]))
                    for name in INVARIANTS}
    histogram = {p: sum(r["fired"].count(p) for r in rows) for p in points}
    return {"trials": len(rows), "kills": sum(len(r["crashed"]) for r in rows),
            "pauses": sum(r.get("paused", 0) for r in rows),
            "children": sum(r["children"] for r in rows),
            "trials_with_violations": sum(1 for r in rows if not r["invariants_held"]),
            "violations_by_invariant": by_invariant,
            "trials_with_extra_effects": sum(1 for r in rows if r["effects_beyond"]),
            "trials_with_lost_effects": sum(1 for r in rows if r["effects_short"]),
            "statuses": {s: sum(1 for r in rows if r["status"] == s) for s in sorted({r["status"] for r in rows})},
            "kill_points": histogram}


def fuzz_report(result: dict) -> dict:
    """The fuzz result without its per-trial rows: what the command line prints."""
    return {k: v for k, v in result.items() if k != "rows"}
