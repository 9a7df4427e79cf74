"""The crash lab: every boundary of any workflow, killed in a real process, recovered and counted.

Give it a workflow kind and an input (the kit's or your own, from a module
named like ``--module``). ``discover`` runs it once, cleanly, in child
processes with ``DURABLE_KIT_TRACE`` set, and lists every fault point the run
passed (``faults.trip`` appends each one to the trace). ``explore`` then
runs a fresh copy of the workflow for each point and each way of dying
(``os._exit`` and SIGKILL) in real worker processes (``python -m durable_kit
worker``), recovers it with new workers, approving or answering wherever
it waits by the policy you give, and counts what every fake destination
received. ``fuzz`` arms random points in random trials and checks five
invariants after each one. ``step_map`` classifies each step of the clean
run by what it touched.

Rows are plain dicts; ``durable_kit.lab.crashlab_charts`` turns them into
DataFrames and charts. Nothing here imports pandas or matplotlib.

What the lab counts is what each destination's own file says: the call
ledger (``x.calls.db``) by call kind, and every other file beside the
journal (``x.<name>.db``) by its requests and its effects (the rows of its
``effects``, ``refunds`` or ``deliveries`` table).
"""
from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .faults import TRACE_VARIABLE, arm, disarm_all
from .journal import Journal, WorkflowError
from .store import immediate, now
from .waits import answer, approve, open_wait, reject

# Where a workflow can end up once nothing more is due.
SETTLED = ("complete", "escalated", "stopped", "rejected", "failed", "cancelled", "paused", "blocked")
ACTIONS = ("exit", "kill")
EXIT_CODES = {"exit": 13, "kill": -9}
EFFECT_TABLES = ("effects", "refunds", "deliveries")  # the kit's fakes: a service, the payments, the notifier
INVARIANTS = ("no committed step lost", "no committed output changed", "keyed effects at most once",
              "final status as expected", "integrity_check ok")

Policy = Callable[[dict], dict]


class CrashLabError(WorkflowError):
    """The lab could not start or finish a workflow for a reason other than the crash it injected."""


def approve_all(wait: dict) -> dict:
    """The default policy: approve every approval as ``crashlab``; a question needs ``answers(...)``."""
    if wait["kind"] == "approval":
        return {"approved": True, "by": "crashlab", "comment": ""}
    raise CrashLabError(f"the workflow asks {wait['request'].get('question')!r} (wait {wait['name']!r}); "
                        "give a policy that answers it, for example policy=answers('a narrower topic').")


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


@dataclass
class Scenario:
    """One workflow to crash: its kind, input, the module that defines it, and how people answer its waits."""

    kind: str
    input: dict
    module: str | Path | None = None
    policy: Policy = approve_all
    workflow_id: str = "lab-1"
    max_rounds: int = 12


@dataclass
class Drive:
    """What happened to one copy of the workflow: each child's exit code, the points that fired, what held."""

    exit_codes: list[int] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --- child processes -------------------------------------------------------------------------------------

def _kit(args: list[str], trace: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(TRACE_VARIABLE, None)
    if trace is not None:
        env[TRACE_VARIABLE] = str(trace)
    return subprocess.run([sys.executable, "-m", "durable_kit", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _worker(db: Path, scenario: Scenario, trace: Path | None = None) -> subprocess.CompletedProcess:
    args = ["worker", "--db", db, "--until-idle"]
    if scenario.module:
        args += ["--module", scenario.module]
    return _kit(args, trace)


def prepare(scenario: Scenario, folder: Path) -> Path:
    """Start the workflow once, from the command line, in ``folder/template.db``; every trial copies it."""
    template = folder / "template.db"
    args = ["start", "--db", template, "--kind", scenario.kind, "--input", json.dumps(scenario.input),
            "--id", scenario.workflow_id]
    if scenario.module:
        args += ["--module", scenario.module]
    started = _kit(args)
    if started.returncode != 0:
        raise CrashLabError(f"could not start {scenario.kind!r} with input {scenario.input}: "
                            f"{(started.stderr or started.stdout).strip()}")
    return template


def fresh_copy(template: Path, path: Path) -> Path:
    """A consistent copy of the started workflow's database (SQLite's backup API, never a raw file copy)."""
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


def committed_outputs(db: Path, workflow_id: str) -> dict[str, str]:
    """Every completed step's output as stored (JSON text), by step name."""
    with _read(db) as conn:
        return {r["name"]: r["output"] for r in conn.execute(
            "SELECT name, output FROM steps WHERE workflow_id = ? AND status = 'complete'", (workflow_id,))}


def destination_files(db: Path) -> dict[str, Path]:
    """The outside world's files beside the journal, by name: ``x.calls.db`` is ``calls``."""
    prefix = f"{db.stem}."
    return {p.name[len(prefix):-3]: p for p in sorted(db.parent.glob(f"{db.stem}.*.db"))}


def destination_counts(db: Path, workflow_id: str) -> dict[str, int]:
    """What every destination beside the journal counted: ledger calls by kind, requests and effects."""
    counts: dict[str, int] = {}
    for name, path in destination_files(db).items():
        with _read(path) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "calls" in tables:
                for row in conn.execute("SELECT kind, COUNT(*) AS n FROM calls WHERE workflow_id = ?"
                                        " GROUP BY kind ORDER BY kind", (workflow_id,)):
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


def observe(db: Path, workflow_id: str) -> dict:
    """The workflow's final state, what every destination counted, and SQLite's own integrity check."""
    with _read(db) as conn:
        wf = conn.execute("SELECT status, output, error FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        events = conn.execute("SELECT step, event, detail FROM history WHERE workflow_id = ? ORDER BY seq",
                              (workflow_id,)).fetchall()
    return {"status": wf["status"], "error": wf["error"], "output": wf["output"],
            "steps": committed_outputs(db, workflow_id),
            "counts": destination_counts(db, workflow_id), "repeated_keys": repeated_keys(db),
            "integrity": integrity,
            "fired": [e["detail"].rsplit(" (", 1)[0] for e in events if e["event"] == "fault_fired"],
            "reconciled": sorted({e["step"] for e in events if e["event"] == "reconciled"})}


# --- driving one copy to the end --------------------------------------------------------------------------

def _make_due(db: Path, workflow_id: str) -> None:
    # The lab's clock runs fast: a timer or a retry schedule that would wait is due now.
    journal = Journal(db)
    try:
        with immediate(journal.conn):
            journal.conn.execute("UPDATE waits SET wake_at = ? WHERE workflow_id = ? AND kind = 'timer'"
                                 " AND status = 'waiting'", (now(), workflow_id))
            journal.conn.execute("UPDATE steps SET next_attempt_at = ? WHERE workflow_id = ?"
                                 " AND next_attempt_at IS NOT NULL", (now(), workflow_id))
            journal.conn.execute("UPDATE workflows SET next_run_at = ? WHERE id = ? AND next_run_at > ?",
                                 (now(), workflow_id, now()))
    finally:
        journal.close()


def _decide(db: Path, scenario: Scenario, wait: dict) -> None:
    decision = scenario.policy(wait)
    journal = Journal(db)
    try:
        if wait["kind"] == "clarification":
            answer(journal, scenario.workflow_id, decision["answer"], decision["by"], wait=wait["name"])
        elif decision["approved"]:
            approve(journal, scenario.workflow_id, decision["by"], decision.get("comment", ""), wait=wait["name"])
        else:
            reject(journal, scenario.workflow_id, decision["by"], decision.get("comment", ""), wait=wait["name"])
    finally:
        journal.close()


def _status(db: Path, workflow_id: str) -> str:
    with _read(db) as conn:
        return conn.execute("SELECT status FROM workflows WHERE id = ?", (workflow_id,)).fetchone()[0]


def _next_move(db: Path, scenario: Scenario) -> str:
    """Settle the workflow's state between two workers: decide a wait, fast-forward a timer, or say it is done."""
    journal = Journal(db)
    try:
        row = journal.workflow(scenario.workflow_id)
        waiting = open_wait(journal, scenario.workflow_id) if row["status"] == "waiting" else None
    finally:
        journal.close()
    if row["status"] in SETTLED:
        return "settled"
    if waiting and waiting["kind"] in ("approval", "clarification"):
        _decide(db, scenario, waiting)
        return "decided"
    if row["status"] in ("pending", "waiting") and (row["next_run_at"] or 0) > now():
        _make_due(db, scenario.workflow_id)
        return "fast-forwarded"
    return "run again"


def drive(db: Path, scenario: Scenario, crashes: list[tuple[str, str]] = (), trace: Path | None = None) -> Drive:
    """Arm ``crashes`` (point, action), then run workers in child processes until the workflow settles.

    Between workers the policy decides open waits and timers are made due.
    After every worker the committed step outputs are compared with every
    earlier snapshot: a step once committed must stay committed, unchanged.
    """
    result, seen, idle = Drive(), {}, 0
    journal = Journal(db)
    try:
        for point, action in crashes:
            arm(journal.conn, point, action)
    finally:
        journal.close()
    for _ in range(scenario.max_rounds):
        child = _worker(db, scenario, trace)
        result.exit_codes.append(child.returncode)
        if child.returncode not in (0, *EXIT_CODES.values()):
            result.notes.append(f"worker exited {child.returncode}: {child.stderr.strip()[-400:]}")
            if result.exit_codes[-2:] == [child.returncode] * 2:  # the same failure twice: no crash the lab armed
                break
        outputs = committed_outputs(db, scenario.workflow_id)
        for name, output in seen.items():
            if name not in outputs:
                result.violations.append(f"no committed step lost: {name!r} was committed, then gone")
            elif outputs[name] != output:
                result.violations.append(f"no committed output changed: {name!r} changed")
        seen = {**seen, **outputs}
        move = _next_move(db, scenario)
        if move == "settled":
            break
        idle = idle + 1 if child.returncode == 0 and move == "run again" else 0
        if idle == 2:  # two clean workers in a row left it unsettled: the lab cannot move it further
            result.notes.append(f"stuck: {_status(db, scenario.workflow_id)} after two clean workers")
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

def read_trace(trace: Path, workflow_id: str) -> list[str]:
    """The points one workflow passed, in the order first reached, each once."""
    points: list[str] = []
    if trace.exists():
        for line in trace.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            if entry["workflow_id"] == workflow_id and entry["point"] not in points:
                points.append(entry["point"])
    return points


def discover(scenario: Scenario, folder: Path) -> tuple[list[str], dict]:
    """Run the workflow cleanly with tracing on; return its fault points and what the clean run left.

    The points are those the trace lists (every point the run tripped), first
    reached first, each once. A point on a path the clean run did not take
    (a rejection, a retry) is not listed: explore other inputs to reach it.
    """
    template = prepare(scenario, folder)
    clean_db = fresh_copy(template, folder / "clean.db")
    trace = folder / "clean.trace.jsonl"
    trace.unlink(missing_ok=True)
    drove = drive(clean_db, scenario, trace=trace)
    baseline = observe(clean_db, scenario.workflow_id)
    if drove.notes or any(drove.exit_codes):
        raise CrashLabError(f"the clean run of {scenario.kind!r} did not run cleanly (worker exit codes "
                            f"{drove.exit_codes}): {' | '.join(dict.fromkeys(drove.notes))}")
    return read_trace(trace, scenario.workflow_id), {**baseline, "template": template, "db": clean_db}


# --- one crash, observed and judged -----------------------------------------------------------------------

def invariant_violations(final: dict, drove: Drive, expected_status: str) -> list[str]:
    """The five invariants, each violation named: steps kept, outputs unchanged, keys once, status, integrity."""
    found = list(dict.fromkeys(drove.violations))
    found += [f"keyed effects at most once: {k}" for k in final["repeated_keys"]]
    if final["status"] != expected_status:
        found.append(f"final status as expected: {final['status']}, expected {expected_status}")
    if final["integrity"] != "ok":
        found.append(f"integrity_check ok: {final['integrity']}")
    return found


def differences(final: dict, baseline: dict) -> dict[str, int]:
    """Each count minus the clean run's: above zero is repeated work, below zero is work that never happened."""
    names = sorted(set(final["counts"]) | set(baseline["counts"]))
    return {n: final["counts"].get(n, 0) - baseline["counts"].get(n, 0) for n in names}


def crash_once(scenario: Scenario, template: Path, db: Path, crashes: list[tuple[str, str]],
               baseline: dict, expected_status: str) -> dict:
    """A fresh copy of the workflow, crashed at ``crashes`` and recovered; one row of counts and judgements."""
    fresh_copy(template, db)
    drove = drive(db, scenario, crashes)
    final = observe(db, scenario.workflow_id)
    violations = invariant_violations(final, drove, expected_status)
    extra = differences(final, baseline)
    effects_changed = [f"{n} {d:+d}" for n, d in extra.items() if n.endswith(" effects") and d]
    return {
        "crashed": [c for c in drove.exit_codes if c != 0],
        "fired": final["fired"],
        "counts": final["counts"],
        "repeated": extra,
        "artifacts_stored": len(final["steps"]),
        "status": final["status"],
        "error": final["error"],
        "output_as_clean": final["output"] == baseline["output"],
        "effects_as_clean": not effects_changed,
        "effects_changed": effects_changed,
        "invariants_held": not violations,
        "violations": violations,
        "reconciled": final["reconciled"],
        "notes": drove.notes,
        "children": len(drove.exit_codes),
    }


def _folder(folder: str | Path | None):
    if folder is None:
        return tempfile.TemporaryDirectory(prefix="durable-kit-crashlab-")
    Path(folder).mkdir(parents=True, exist_ok=True)
    return nullcontext(str(folder))


def explore(kind: str, input: dict, *, module: str | Path | None = None, policy: Policy = approve_all,
            actions: tuple[str, ...] = ACTIONS, points: list[str] | None = None,
            expected_status: str | None = None, folder: str | Path | None = None, parallel: int = 1,
            workflow_id: str = "lab-1") -> list[dict]:
    """Crash a fresh copy of the workflow at every point it passes, by every action; one row each.

    The first row (``point`` = ``clean``) is the clean run everything is
    compared with. Each other row: the point and action, the exit code of
    the worker that died (13 for ``exit``, -9 for ``kill``; 0 if the point
    was never reached), the counts at every destination and their difference
    from the clean run, the steps stored, the final status, and whether the
    five invariants held (``violations`` names any that did not).
    """
    for action in actions:
        if action not in ACTIONS:
            raise ValueError(f"explore crashes by {ACTIONS}, not {action!r}")
    scenario = Scenario(kind, input, module, policy, workflow_id)
    with _folder(folder) as where:
        where = Path(where)
        found, baseline = discover(scenario, where)
        expected = expected_status or baseline["status"]
        cells = [(i, point, action) for i, point in enumerate(found if points is None else points)
                 for action in actions]

        def cell(args) -> dict:
            i, point, action = args
            row = crash_once(scenario, baseline["template"], where / f"p{i:02d}-{action}.db", [(point, action)],
                             baseline, expected)
            return {"point": point, "action": action,
                    "exit_code": next(iter(row["crashed"]), 0), **row}

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:  # the children are separate processes
            rows = list(pool.map(cell, cells))
    clean = {"point": "clean", "action": "none", "exit_code": 0, "crashed": [], "fired": [],
             "counts": baseline["counts"], "repeated": {n: 0 for n in baseline["counts"]},
             "artifacts_stored": len(baseline["steps"]), "status": baseline["status"], "error": baseline["error"],
             "output_as_clean": True,
             "effects_as_clean": True, "effects_changed": [], "invariants_held": baseline["integrity"] == "ok",
             "violations": [], "reconciled": baseline["reconciled"], "notes": [], "children": 0}
    return [clean, *rows]


def summary_row(row: dict) -> dict:
    """One explore row, flat: point, action, exit code, every count, what was stored, status and judgements."""
    return {"point": row["point"], "action": row["action"], "exit_code": row["exit_code"], **row["counts"],
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
    scenario = Scenario(kind, input, module, policy, workflow_id)
    with _folder(folder) as where:
        _, baseline = discover(scenario, Path(where))
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

def fuzz(kind: str, input: dict, *, trials: int = 100, seed: int = 0, max_kills: int = 2,
         module: str | Path | None = None, policy: Policy = approve_all, expected_status: str | None = None,
         folder: str | Path | None = None, progress: bool = False, workflow_id: str = "lab-1") -> dict:
    """``trials`` fresh copies, each armed at 1 to ``max_kills`` random points with random actions; the tally.

    After every trial the five invariants are checked (``INVARIANTS``): no
    committed step lost and no committed output changed (compared after
    every worker), keyed effects at most once at every destination, the
    final status the clean run reached, and ``PRAGMA integrity_check``.
    Effects beyond or short of the clean run's are counted apart
    (``trials_with_extra_effects``, ``trials_with_lost_effects``): an
    unkeyed duplicate breaks no invariant of the kit, only the world's.
    The same ``seed`` arms the same points in the same trials.
    """
    chooser = random.Random(seed)
    scenario = Scenario(kind, input, module, policy, workflow_id)
    with _folder(folder) as where:
        where = Path(where)
        points, baseline = discover(scenario, where)
        expected = expected_status or baseline["status"]
        rows = []
        bar = _progress(trials, progress)
        for trial in range(trials):
            crashes = [(p, chooser.choice(ACTIONS)) for p in
                       chooser.sample(points, min(len(points), chooser.randint(1, max_kills)))]
            db = where / f"trial-{trial:05d}.db"
            row = crash_once(scenario, baseline["template"], db, crashes, baseline, expected)
            rows.append({"trial": trial, "armed": crashes, **row})
            if row["invariants_held"]:
                for path in [db, *destination_files(db).values()]:
                    for suffix in ("", "-wal", "-shm"):
                        Path(f"{path}{suffix}").unlink(missing_ok=True)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    return {"kind": kind, "input": input, "seed": seed, "points": points, "rows": rows,
            **summarize(rows, points)}


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience: without tqdm the run is the same, only quieter
        return None
    return tqdm(total=total, unit="trial", file=sys.stderr)


def summarize(rows: list[dict], points: list[str]) -> dict:
    """The fuzz tally: trials, kills, violations by invariant, the kill-point histogram."""
    by_invariant = {name: sum(1 for r in rows if any(v.startswith(name) for v in r["violations"]))
                    for name in INVARIANTS}
    histogram = {p: sum(r["fired"].count(p) for r in rows) for p in points}
    return {"trials": len(rows), "kills": sum(len(r["crashed"]) for r in rows),
            "children": sum(r["children"] for r in rows),
            "trials_with_violations": sum(1 for r in rows if not r["invariants_held"]),
            "violations_by_invariant": by_invariant,
            "trials_with_extra_effects": sum(1 for r in rows if any(
                d > 0 for n, d in r["repeated"].items() if n.endswith(" effects"))),
            "trials_with_lost_effects": sum(1 for r in rows if any(
                d < 0 for n, d in r["repeated"].items() if n.endswith(" effects"))),
            "statuses": {s: sum(1 for r in rows if r["status"] == s) for s in sorted({r["status"] for r in rows})},
            "kill_points": histogram}


def fuzz_report(result: dict) -> dict:
    """The fuzz result without its per-trial rows: what the command line prints."""
    return {k: v for k, v in result.items() if k != "rows"}
