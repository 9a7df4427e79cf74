"""Command line: ``python -m durable_kit COMMAND --help``."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def load_module(name: str) -> None:
    """Import the workflows' module: a Python file (its folder becomes importable too) or a module name.

    ``notebooks/scratch/travel.py`` imports that file, with ``notebooks/scratch``
    put first on ``sys.path`` so its sibling imports work; ``my_agents.travel``
    imports an installed or importable module.
    """

    path = Path(name)
    if path.suffix != ".py" and not path.exists():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as missing:
            sys.exit(f"cannot import {name!r}: no such file and no such module ({missing}). "
                     "Pass a .py file or an importable module name.")
        return
    if not path.is_file():
        sys.exit(f"cannot import {name}: no such file. Pass a .py file or an importable module name.")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        sys.exit(f"cannot import {name}: is it a Python file?")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def from_json_argument(text: str, flag: str, outcome: str):
    """Decode JSON given on the command line as ``flag``, or raise ``NotJSON`` saying what is wrong and what to give."""
    from .core.store import MAX_DEPTH, NotJSON, too_deep

    problem = None
    try:
        problem = too_deep(text)
        if problem is None:
            return json.loads(text)
    except RecursionError:
        problem = f"it is nested deeper than {MAX_DEPTH} levels"
    except json.JSONDecodeError as error:
        raise NotJSON(f"{flag} is not JSON ({error.msg} at character {error.pos}); {outcome} Quote it for the "
                      """shell, for example --input '{"order_id": "A-1002"}'.""") from None
    raise NotJSON(f"{flag} cannot be used ({problem}); {outcome} Give a flatter value (at most {MAX_DEPTH} levels "
                  "of lists and objects).")


def cmd_run(args) -> int:
    from .workshop import agents  # noqa: F401  (registers the built-in workflows)
    from .core.journal import Journal, run_workflow

    if args.module:
        load_module(args.module)
    output = run_workflow(Journal(args.db, create=False), args.workflow, take_over=args.take_over)
    print(json.dumps(output))
    return 0


def cmd_start(args) -> int:
    from .workshop import agents  # noqa: F401  (registers the built-in workflows)
    from .core.journal import WORKFLOWS, Journal

    if args.module:
        load_module(args.module)
    if args.kind not in WORKFLOWS:
        sys.exit(f"no workflow kind {args.kind!r}; known: {sorted(WORKFLOWS)}. Define it in a file and pass --module.")
    if args.input is None and args.topic is None:
        sys.exit("give the workflow's input: --topic TEXT for the research kinds, or --input JSON")
    workflow_input = (from_json_argument(args.input, "--input", "nothing was started.") if args.input
                      else {"topic": args.topic})
    workflow_id = Journal(args.db).start(args.kind, workflow_input, args.id)
    print(json.dumps({"workflow_id": workflow_id}) if args.json else workflow_id)
    return 0


def cmd_decide(args) -> int:
    """approve, reject and answer: save a person's decision on one wait and make the workflow runnable."""
    from .errors import WorkflowError
    from .core.journal import Journal
    from .redact import redact, redact_value
    from .admin import describe_outcome
    from .decisions import answer, approve, reject

    journal = Journal(args.db, create=False)
    try:
        if args.command == "answer":
            result = answer(journal, args.workflow, args.text, args.by, wait=args.wait)
        else:
            decide = approve if args.command == "approve" else reject
            result = decide(journal, args.workflow, args.by, args.comment, wait=args.wait)
    except WorkflowError as error:
        print(json.dumps({"error": redact(str(error))}) if args.json else f"error: {redact(str(error))}",
              file=sys.stdout if args.json else sys.stderr)
        return 2
    status = journal.workflow(args.workflow)["status"]
    result = redact_value(result)  # echoed as it was stored: a comment's secrets are never printed
    if args.json:
        print(json.dumps({"workflow_id": args.workflow, "decision": result, "status": status}))
    else:
        print(f"{describe_outcome(args.workflow, result)}; status {status}")
    return 0


def cmd_cancel(args) -> int:
    """Ask a workflow to stop at its next step boundary; a worker then runs its compensations."""
    from .change import cancel
    from .core.journal import Journal
    from .redact import redact_value

    row = cancel(Journal(args.db, create=False), args.workflow, args.by, args.reason)
    first = json.loads(row["cancel_requested"])
    if args.json:
        print(json.dumps({"workflow_id": args.workflow, "status": row["status"], "cancel_requested": first}))
    elif first != redact_value({"by": args.by, "reason": args.reason}):  # cancelling again keeps the first request
        print(f"{args.workflow}: already being cancelled (requested by {first['by']}: {first['reason']}; "
              f"status {row['status']}); nothing was changed")
    else:
        print(f"{args.workflow}: cancellation saved ({row['status']}); it stops at its next step boundary and "
              "undoes what it did, newest first")
    return 0


def cmd_fork(args) -> int:
    """Start a new workflow from another's journal up to a step; the original is left as it is."""
    from .workshop import agents  # noqa: F401  (registers the built-in workflows, for the version the fork records)
    from .change import fork
    from .core.journal import Journal

    if args.module:
        load_module(args.module)
    new_input = from_json_argument(args.input, "--input", "nothing was forked.") if args.input else None
    new_id = fork(Journal(args.db, create=False), args.workflow, args.new_id, args.up_to, args.by, new_input)
    print(json.dumps({"workflow_id": new_id, "forked_from": args.workflow, "up_to": args.up_to}) if args.json
          else f"{new_id}: forked from {args.workflow} up to {args.up_to}; a worker runs the rest")
    return 0


def cmd_purge(args) -> int:
    """Delete one finished workflow's stored data and rewrite the file (see ``admin.purge`` for the limits)."""
    from .admin import purge
    from .core.journal import Journal

    counts = purge(Journal(args.db, create=False), args.workflow)
    print(json.dumps({"workflow_id": args.workflow, "deleted": counts}) if args.json
          else f"{args.workflow}: deleted {sum(counts.values())} rows; the file was checkpointed and vacuumed. "
               "Copies elsewhere (backups, the ledger, destinations' files) are not touched.")
    return 0


def cmd_resume(args) -> int:
    """Resume a paused, failed, blocked or escalated workflow: the next worker replays it, reusing completed steps."""
    from .admin import resume
    from .core.journal import Journal

    row = resume(Journal(args.db, create=False), args.workflow, args.by)
    print(json.dumps({"workflow_id": args.workflow, "status": row["status"]}) if args.json
          else f"{args.workflow}: {row['status']}; a worker will replay it, reusing every completed step")
    return 0


# What a person can do about a workflow that no worker will pick up by itself.
STATUS_HINTS = {
    "failed": "failed: its code raised an error that is not a failure class (a bug, or output that is not JSON); "
              "no worker retries it. Fix the code, then `resume` it: completed steps are reused.",
    "blocked": "blocked: a replay asked for other steps than the journal recorded; nothing after that ran. Deploy "
               "code that replays the history (durable_kit.patched), then `resume` it, or `fork` it.",
    "paused": "paused: waiting for an outside service or a person's go-ahead; `resume` it when it can go on.",
    "escalated": "escalated: no worker retries it; fix the cause (see the error and `history`), then `resume` it: "
                 "the step gets one more attempt and completed steps are reused.",
}


def cmd_status(args) -> int:
    from .workshop import agents  # noqa: F401  (registers the built-in workflows: a kind none of them is, is said so)
    from .admin import open_wait, read_only
    from .core.journal import WORKFLOWS

    journal = read_only(args.db)
    wf = journal.workflow(args.workflow)
    steps = [{**{key: step[key] for key in ("name", "status", "attempts", "error", "next_attempt_at", "position")},
              "versions": json.loads(step["versions"]) if step["versions"] else None}
             for step in journal.steps(args.workflow)]
    waiting = open_wait(journal, args.workflow)
    waiting_for = waiting and {key: waiting[key] for key in ("name", "kind", "request", "wake_at")}
    if args.json:
        from .workshop.agents.loop import usage_for_status
        print(json.dumps({"workflow": {**{k: wf[k] for k in ("id", "kind", "status", "error", "next_run_at",
                                                             "retries_used", "retry_budget", "output", "version")},
                                       "origin": json.loads(wf["origin"]) if wf["origin"] else None,
                                       "cancel_requested": json.loads(wf["cancel_requested"])
                                       if wf["cancel_requested"] else None},
                          "waiting_for": waiting_for, "steps": steps, **usage_for_status(args.db, wf)}))
        return 0
    print(f"{wf['id']} ({wf['kind']}, version {wf['version'] or 'not recorded'}): {wf['status']}"
          + (f" - {wf['error']}" if wf["error"] else ""))
    if wf["status"] in STATUS_HINTS:
        print(f"  {STATUS_HINTS[wf['status']]}")
    if wf["status"] == "pending" and wf["kind"] not in WORKFLOWS:
        print(f"  its kind {wf['kind']!r} is not one of the kit's own: only a worker started with --module FILE, "
              f"where FILE registers {wf['kind']!r}, runs it (a worker without it leaves it pending and says so).")
    if wf["origin"]:
        origin = json.loads(wf["origin"])
        print(f"  forked from {origin['workflow']} up to step {origin['up_to']} by {origin['by']}")
    if wf["cancel_requested"] and wf["status"] != "cancelled":
        from .change import too_late
        from .core.state import FINAL_STATUSES

        request = json.loads(wf["cancel_requested"])
        print(f"  {too_late(wf['status'], request)}" if wf["status"] in FINAL_STATUSES
              else f"  cancellation requested by {request['by']}: {request['reason']}"
              + ("; it compensates once resumed under code that replays its history" if wf["status"] == "blocked"
                 else ""))
    if waiting_for:
        print(f"  waiting for {waiting_for['kind']} {waiting_for['name']!r}")
        for key, value in (waiting_for["request"] or {}).items():
            text = value if isinstance(value, str) else json.dumps(value)
            print(f"    {key}: {text if len(text) <= 100 else text[:97] + '...'}")
    for step in steps:
        line = f"  {step['name']:<32} {step['status']:<9} attempts {step['attempts']}"
        if step["next_attempt_at"]:
            line += f"  next attempt in {max(0.0, step['next_attempt_at'] - time.time()):.1f} s"
        if step["error"]:
            line += f"  last error: {step['error']}"
        if step["versions"]:
            line += "  versions " + ", ".join(f"{k}={v}" for k, v in sorted(step["versions"].items()))
        print(line)
    from .workshop.agents.loop import usage_lines
    for line in usage_lines(args.db, wf):
        print(line)
    return 0


def cmd_history(args) -> int:
    from .admin import read_only

    journal = read_only(args.db)
    journal.workflow(args.workflow)  # a clear error for an unknown id, not an empty history
    events = [{key: e[key] for key in ("seq", "step", "event", "detail", "pid", "at")}
              for e in journal.history(args.workflow)]
    if args.json:
        print(json.dumps(events))
        return 0
    for e in events:
        print(f"{e['seq']:>4}  {e['event']:<22} {e['step'] or '':<30} {e['detail'] or ''}")
    return 0


def cmd_worker(args) -> int:
    from .workshop import agents  # noqa: F401  (registers the built-in workflows)
    from .redact import redact
    from .core.worker import FilesChanged, run_worker

    if args.module:
        load_module(args.module)
    try:
        run_worker(args.db, once=args.once, until_idle=args.until_idle, poll=args.poll,
                   lease_seconds=args.lease_seconds, leases=not args.no_leases, trust_pids=not args.expiry_only,
                   log=lambda message: print(redact(message), flush=True))
    except FilesChanged as fault:  # a storage fault that no waiting clears: exit 3, like the others
        print(f"error: {redact(str(fault))}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(3)  # no clean-up that could checkpoint a log other processes no longer read into their file
    return 0


def cmd_fragile(args) -> int:
    from .workshop.agents.fragile import research_in_memory

    print(json.dumps(research_in_memory(args.db, args.topic)))
    return 0


def cmd_checkpoint_agent(args) -> int:
    from .workshop.agents.checkpoints import research_filing

    status = research_filing(args.db, args.run, args.company, args.period, not args.source_down)
    print(status)
    return 0


WORKER_KEYS = ("scenario", "workers", "workflows", "activity_runs", "duplicate_runs", "stale_writes_rejected",
               "takeover_seconds")
MATRIX_KEYS = ("strategy", "crash_point", "payment_calls", "refunds_at_destination", "receipts_stored",
               "notifications_delivered", "status")


def cmd_demo(args) -> int:
    with tempfile.TemporaryDirectory(prefix="durable-kit-") as folder:
        if args.name == "checkpoints":
            from .workshop.agents.checkpoints import run_all, summary_rows

            rows = summary_rows(run_all(folder))
        elif args.name == "refunds":
            from .workshop.agents.refunds import crash_matrix

            rows = [{key: row[key] for key in MATRIX_KEYS} for row in crash_matrix(folder)]
        else:
            from .workshop.agents.shared_work import run_all as worker_scenarios

            rows = [{key: row[key] for key in WORKER_KEYS} for row in worker_scenarios(folder)]
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            print("  ".join(f"{k}={v}" for k, v in row.items()))
    return 0


def cmd_arm(args) -> int:
    from .harness.faults import arm
    from .core.store import connect

    arm(connect(args.db), args.point, args.action, args.seconds)
    print(json.dumps({"point": args.point, "action": args.action, "seconds": args.seconds}) if args.json
          else f"armed {args.point} ({args.action}) in {args.db}")
    return 0


# One-shot demo faults by name: (point, action).
DEMO_FAULTS = {
    "slow-next-step": ("next_step", "delay"),
    "fail-next-step": ("next_step", "fail"),
    "crash-after-notify": ("after_activity:notify", "exit"),
    "crash-after-reserve": ("before_send:notify", "exit"),
}


def cmd_fault(args) -> int:
    args.point, args.action = DEMO_FAULTS[args.name]
    if args.name == "slow-next-step" and not args.seconds:
        sys.exit("slow-next-step needs --seconds N")
    return cmd_arm(args)


def cmd_check_setup(args) -> int:
    from .workshop.setup_check import main as check_setup

    return check_setup(args.scratch)


def cmd_reset_scratch(args) -> int:
    from .workshop.lab.student import reset_scratch

    for folder in reset_scratch(args.notebooks):
        print(f"removed {folder}")
    return 0


def cmd_crashlab(args) -> int:
    from .harness import crashlab

    workflow_input = json.loads(args.input)
    if args.workflows > 1 and isinstance(workflow_input, dict):
        workflow_input = [workflow_input] * args.workflows
    promise = json.loads(args.promise) if args.promise.startswith("{") else args.promise
    policy = crashlab.answers(args.answer, approve=not args.reject) if args.answer else (
        crashlab.reject_all if args.reject else crashlab.approve_all)
    common = {"module": args.module, "policy": policy}
    lab = {**common, "actions": tuple(args.actions.split(",")), "promise": promise,
           "lease_seconds": args.lease_seconds}
    if args.mode == "fuzz":
        result = crashlab.fuzz_report(crashlab.fuzz(args.kind, workflow_input, trials=args.trials, seed=args.seed,
                                                    max_kills=args.max_kills, progress=not args.no_progress, **lab))
        print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
        return 0
    if args.mode == "steps":
        rows = crashlab.step_map(args.kind, workflow_input, **common)
    else:
        rows = [crashlab.summary_row(row) for row in crashlab.explore(args.kind, workflow_input, **lab)]
    print(json.dumps(rows) if args.json else "\n".join("  ".join(f"{k}={v}" for k, v in r.items()) for r in rows))
    return 0


def seconds(minimum: float = 0.0, maximum: float = 3600.0):
    """An argparse type: a number of seconds from ``minimum`` to ``maximum`` (an hour unless given)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{text} seconds: give a number from {minimum:g} to {maximum:g}")
        return value
    return parse


def workflow_command(commands, name: str, help_text: str, handler) -> argparse.ArgumentParser:
    """A subcommand about one workflow: ``--db``, ``--workflow`` and ``--json``, then its own options."""
    command = commands.add_parser(name, help=help_text)
    command.add_argument("--db", required=True, help="journal database file")
    command.add_argument("--workflow", required=True, help="workflow id")
    command.add_argument("--json", action="store_true", help="print JSON")
    command.set_defaults(handler=handler)
    return command


def build_parser() -> argparse.ArgumentParser:
    from .core.leases import LEASE_SECONDS_MAX

    parser = argparse.ArgumentParser(prog="python -m durable_kit", description="A small durable executor on SQLite.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="replay one workflow from its first line to the end")
    run.add_argument("--db", required=True, help="journal database file")
    run.add_argument("--workflow", required=True, help="workflow id")
    run.add_argument("--module", help="a Python file that registers more workflows")
    run.add_argument("--take-over", action="store_true",
                     help="run it even while another process holds a live lease on it: the new token fences that "
                          "owner out (its attempt is not counted as a crash); without it, `run` is refused")
    run.set_defaults(handler=cmd_run)

    start = commands.add_parser("start", help="start a workflow (by default a reviewed research report); prints its id")
    start.add_argument("--db", required=True)
    start.add_argument("--topic", help='the research topic, for example "supplier concentration risk"')
    start.add_argument("--kind", default="reviewed_report",
                       help="reviewed_report (default) waits for approval and notifies; research_report does not; "
                            "refund takes --input '{\"order_id\": \"A-1002\", \"strategy\": \"outbox\"}'")
    start.add_argument("--input", help="the workflow's input as JSON (instead of --topic)")
    start.add_argument("--module", help="a Python file that registers more workflows")
    start.add_argument("--id", help="workflow id (default: a new random one)")
    start.add_argument("--json", action="store_true")
    start.set_defaults(handler=cmd_start)

    workflow_command(commands, "status", "a workflow's status and its steps table", cmd_status)
    workflow_command(commands, "history", "a workflow's append-only event history", cmd_history)

    for name, help_text in [("approve", "approve the recommendation a workflow waits on"),
                            ("reject", "reject it: the workflow ends as rejected, with no report")]:
        decide = workflow_command(commands, name, help_text, cmd_decide)
        decide.add_argument("--by", required=True, help="who decides (saved with the decision)")
        decide.add_argument("--comment", default="", help="why (optional)")
        decide.add_argument("--wait", help="the approval wait you decide (see `status`); needed once a workflow "
                                           "has had more than one, so a repeated command never decides a later one")

    answer = workflow_command(commands, "answer", "answer the clarifying question a workflow waits on", cmd_decide)
    answer.add_argument("--text", required=True, help="the answer")
    answer.add_argument("--by", required=True, help="who answers")
    answer.add_argument("--wait", help="the question you answer (see `status`); needed once a workflow has asked "
                                       "more than one")

    cancel = workflow_command(commands, "cancel", "cancel a workflow: it stops at its next step and undoes its "
                                                  "effects", cmd_cancel)
    cancel.add_argument("--by", required=True, help="who cancels (saved in the history)")
    cancel.add_argument("--reason", required=True, help="why")

    fork = workflow_command(commands, "fork", "start a new workflow from another's completed steps up to one step "
                                              "(the original is left unchanged)", cmd_fork)
    fork.add_argument("--up-to", required=True, help="the last completed step the fork reuses")
    fork.add_argument("--new-id", required=True, help="the new workflow's id")
    fork.add_argument("--by", required=True, help="who forks it (saved in the history)")
    fork.add_argument("--input", help="a new input as JSON (default: the original's)")
    fork.add_argument("--module", help="a Python file that registers more workflows")

    workflow_command(commands, "purge", "delete one finished workflow's stored data and rewrite the file", cmd_purge)

    resume = workflow_command(commands, "resume", "resume a paused, failed, blocked or escalated workflow from its "
                                                  "last completed step", cmd_resume)
    resume.add_argument("--by", required=True, help="who resumes it (saved in the history)")

    worker = commands.add_parser("worker", help="claim due workflows and run them; SIGTERM stops it cleanly")
    worker.add_argument("--db", required=True)
    mode = worker.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one pass over the workflows due now, then stop")
    mode.add_argument("--until-idle", action="store_true", help="stop when nothing is due")
    worker.add_argument("--poll", type=seconds(minimum=0.01), default=0.2,
                        help="seconds between looks when nothing is due")
    worker.add_argument("--lease-seconds", type=seconds(minimum=0.3, maximum=LEASE_SECONDS_MAX), default=10.0,
                        help="how long a claim lasts without a heartbeat (renewed every third of it)")
    worker.add_argument("--expiry-only", action="store_true",
                        help="take over a dead worker's workflows only when its lease expires, even if its process "
                             "is visibly gone from this machine (as workers on other machines must)")
    worker.add_argument("--no-leases", action="store_true",
                        help="UNSAFE, for notebook 06's demonstration: take back every running workflow at start "
                             "and write without fencing tokens")
    worker.add_argument("--module", help="a Python file that registers more workflows")
    worker.set_defaults(handler=cmd_worker)

    fragile = commands.add_parser("fragile", help="notebook 00's in-memory agent (saves nothing)")
    fragile.add_argument("--db", required=True, help="database holding armed crash points")
    fragile.add_argument("--topic", required=True)
    fragile.set_defaults(handler=cmd_fragile)

    agent = commands.add_parser("checkpoint-agent", help="one attempt of notebook 01's filings research")
    agent.add_argument("--db", required=True)
    agent.add_argument("--run", default="filings-1", help="research run id")
    agent.add_argument("--company", default="northwind", help="northwind, harbor-lane or tallis")
    agent.add_argument("--period", help="FY2024 or FY2025; leave out to be asked")
    agent.add_argument("--source-down", action="store_true", help="the filing source does not answer")
    agent.set_defaults(handler=cmd_checkpoint_agent)

    demo = commands.add_parser("demo", help="run a notebook's scenarios in real child processes")
    demo.add_argument("name", choices=["checkpoints", "refunds", "workers"],
                      help="checkpoints: notebook 01's seven scenarios; refunds: notebook 05's crash matrix; "
                           "workers: notebook 06's four scenarios with two worker processes")
    demo.add_argument("--json", action="store_true", help="print one JSON array")
    demo.set_defaults(handler=cmd_demo)

    arm = commands.add_parser("arm", help="arm a crash point for the next process that reaches it")
    arm.add_argument("--db", required=True)
    arm.add_argument("--point", required=True,
                     help="next_step, after_activity:STEP or after_commit:STEP (for example after_commit:analyze)")
    arm.add_argument("--action", default="exit", choices=["exit", "kill", "fail", "delay"],
                     help="exit: os._exit(13); kill: SIGKILL; fail: a transient error; delay: sleep --seconds")
    arm.add_argument("--seconds", type=seconds(), default=0, help="how long 'delay' sleeps")
    arm.add_argument("--json", action="store_true")
    arm.set_defaults(handler=cmd_arm)

    fault = commands.add_parser("fault", help="arm a one-shot demo fault by name")
    fault.add_argument("name", choices=sorted(DEMO_FAULTS), help=(
        "slow-next-step: the next step sleeps --seconds first; fail-next-step: it fails once (transient); "
        "crash-after-notify: the worker dies after the notification is sent, before the notify step is "
        "recorded; crash-after-reserve: it dies after reserving the notification key, before sending"))
    fault.add_argument("--db", required=True)
    fault.add_argument("--seconds", type=seconds(), default=0, help="for slow-next-step")
    fault.add_argument("--json", action="store_true")
    fault.set_defaults(handler=cmd_fault)

    setup = commands.add_parser("check-setup", help="check Python, packages, SQLite, processes, signals and widgets")
    setup.add_argument("--scratch", help="the scratch folder to test (default: notebooks/scratch in this checkout)")
    setup.set_defaults(handler=cmd_check_setup)

    reset = commands.add_parser("reset-scratch", help="delete every notebook scratch folder (databases, files)")
    reset.add_argument("--notebooks", help="the notebooks folder (default: notebooks/ in this checkout)")
    reset.set_defaults(handler=cmd_reset_scratch)
    crashlab = commands.add_parser("crashlab", help="crash any workflow at every boundary, or at random ones")
    crashlab.add_argument("mode", choices=["explore", "fuzz", "steps"],
                          help="explore: every fault point by exit and SIGKILL, one row each; fuzz: random kills "
                               "with invariants checked after each trial; steps: the step map of a clean run")
    crashlab.add_argument("--kind", required=True, help="the workflow kind (registered by the kit or --module)")
    crashlab.add_argument("--input", default="{}", help="the workflow's input as JSON")
    crashlab.add_argument("--module", help="a Python file or importable module that registers the kind")
    crashlab.add_argument("--trials", type=int, default=100, help="fuzz: how many trials")
    crashlab.add_argument("--seed", type=int, default=0, help="fuzz: the same seed arms the same points")
    crashlab.add_argument("--max-kills", type=int, default=2, help="fuzz: kills armed per trial, at most")
    crashlab.add_argument("--actions", default="exit,kill",
                          help="exit, kill and/or pause (SIGSTOP past the lease while a standby takes over, then "
                               "SIGCONT), comma-separated")
    crashlab.add_argument("--promise", default="exactly-once",
                          help="what the effects at each destination promise: exactly-once, at-most-once, "
                               "at-least-once, or a JSON object of them by destination name")
    crashlab.add_argument("--workflows", type=int, default=1,
                          help="how many workflows of this input in one journal (or give --input a JSON list)")
    crashlab.add_argument("--lease-seconds", type=seconds(0.1, LEASE_SECONDS_MAX), default=None,
                          help="every worker's lease (with pause, default 3 s: a pause lasts about this long)")
    crashlab.add_argument("--answer", help="answer every clarifying question with this text")
    crashlab.add_argument("--reject", action="store_true", help="reject every approval (default: approve)")
    crashlab.add_argument("--no-progress", action="store_true", help="fuzz: no progress bar on stderr")
    crashlab.add_argument("--json", action="store_true", help="print JSON")
    crashlab.set_defaults(handler=cmd_crashlab)
    return parser


# Shown as escapes, never raw, on a terminal: control characters (but tab and newline), bidirectional and other
# invisible formatting characters (which can make text read in another order), and lone surrogates.
_INVISIBLE = [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), 0xAD, 0x061C, 0x180E, *range(0x200B, 0x2010),
              *range(0x2028, 0x202F), *range(0x2060, 0x2070), 0xFEFF, *range(0xFFF9, 0xFFFC), *range(0xD800, 0xE000)]
ESCAPES = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in _INVISIBLE}


class Printable:
    """A text stream that writes what ``ESCAPES`` lists as escapes (``\\u202e``), so a name, a comment or an
    error shows on a terminal as it was given, never reordered, hidden or rewritten by the characters it holds."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(text.translate(ESCAPES))

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def undecodable_argument(args: argparse.Namespace) -> str | None:
    """One line for the first argument that was not UTF-8 (Python kept its bytes as lone surrogates), or None."""
    for name, value in vars(args).items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                return (f"--{name.replace('_', '-')} is not valid UTF-8 text (it holds the byte "
                        f"0x{ord(value[error.start]) - 0xDC00:02x}); nothing was changed. Give it in UTF-8.")
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import sqlite3

    from .errors import SettingError, WorkflowError, describe_storage_fault
    from .redact import redact
    from .core.store import NotJSON, SchemaMismatch, StorageFault

    streams = sys.stdout, sys.stderr
    sys.stdout = Printable(sys.stdout)
    if args.command != "crashlab":  # its progress bar draws itself with carriage returns
        sys.stderr = Printable(sys.stderr)
    try:
        problem = undecodable_argument(args)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        return args.handler(args)
    # A clear message; nothing was changed.
    except (WorkflowError, StorageFault, SchemaMismatch, NotJSON, SettingError) as error:
        print(f"error: {redact(str(error))}", file=sys.stderr)
        return 2
    except sqlite3.Error as error:  # the storage itself: one line with the path, never a traceback
        print(f"error: {describe_storage_fault(error, getattr(args, 'db', 'the database'))}", file=sys.stderr)
        return 3
    except BrokenPipeError:  # the reader left early (for example `| head`): not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        sys.stdout, sys.stderr = streams


if __name__ == "__main__":
    sys.exit(main())
