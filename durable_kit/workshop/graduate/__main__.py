"""``python -m durable_kit.workshop.graduate``: the ported agents on DBOS, in real processes.

``run`` and ``worker`` are the child processes the experiments start and
kill; ``crash-table``, ``two-workers`` and ``bench`` run whole experiments and
print their results.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from . import INSTALL_HINT


def database_url(value: str) -> str:
    """A DBOS system database URL, given either as a URL or as a SQLite file path."""
    from .engine import sqlite_url

    return value if "://" in value else sqlite_url(value)


def settle(until: str, timeout: float) -> None:
    """Wait until no workflow is running: all finished (``done``), or the rest wait for a message (``waiting``)."""
    from dbos import DBOS

    from .agents import WAITING_EVENT

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        open_ids = [w.workflow_id for w in DBOS.list_workflows(status=["PENDING", "ENQUEUED"])]
        if until == "waiting":
            open_ids = [i for i in open_ids if not DBOS.get_event(i, WAITING_EVENT, timeout_seconds=0)]
        if not open_ids:
            return
        time.sleep(0.05)
    raise TimeoutError(f"workflows still running after {timeout:g} s: {open_ids}")


def load_exercise(path: str, name: str) -> None:
    """Import the learner's file (its ``@DBOS.step`` registers before launch) and hand its step to the workflow."""
    from .agents import EXERCISE_STEP
    from .checks import load_function
    from .engine import boundary
    from ...world.payments import Payments

    EXERCISE_STEP["step"] = load_function(path, name)
    pay = Payments.refund

    def pay_then_boundary(self, *args, **kwargs):  # the crash point sits at the service's answer
        receipt = pay(self, *args, **kwargs)
        boundary("after_send:refund")
        return receipt

    Payments.refund = pay_then_boundary


def cmd_run(args) -> int:
    from dbos import DBOS, SetWorkflowID

    from . import agents, engine

    starts = {"refund": agents.refund_agent, "research_report": agents.research_report,
              "reviewed_report": agents.reviewed_report, "exercise_refund": agents.exercise_refund}
    inputs = json.loads(args.input) if args.input else {}
    if args.start:
        if args.start not in starts:
            sys.exit(f"no workflow {args.start!r} in the port; known: {sorted(starts)}")
        if not args.id:
            sys.exit(f"workflow {args.start!r}: give it an id with --id, so a restart can find it")
        if args.start == "refund":
            try:
                agents.check_strategy(inputs.get("strategy", ""), args.id)
            except ValueError as error:
                sys.exit(str(error))
    engine.arm_here(args.crash_at, args.action)
    if args.exercise:
        load_exercise(*args.exercise.rsplit(":", 1))
    engine.launch(database_url(args.db), args.executor_id)  # recovers this executor's pending workflows first
    if args.start:
        with SetWorkflowID(args.id):  # starting an id that exists attaches to it; nothing runs twice
            DBOS.start_workflow(starts[args.start], **inputs)
    settle(args.until, args.timeout)
    rows = [{"id": w.workflow_id, "status": w.status} for w in DBOS.list_workflows()]
    print(json.dumps(sorted(rows, key=lambda r: r["id"])), flush=True)
    engine.shutdown()
    os._exit(0)  # a workflow waiting for a message holds a thread; it stays pending in the database


def cmd_loop(args) -> int:
    from dbos import DBOS, SetWorkflowID

    from . import engine

    if args.plain_tools and args.framework != "pydantic":
        sys.exit("--plain-tools is for --framework pydantic")
    try:
        if args.framework == "pydantic":
            from . import pydantic_loop as framework
        else:
            from . import openai_loop as framework  # type: ignore[no-redef]  # the same names as pydantic_loop
    except ImportError as missing:
        sys.exit(str(missing))
    engine.arm_here(args.crash_at, args.action)
    engine.launch(database_url(args.db), args.executor_id, serializer=None)  # its model steps return objects
    if args.start:
        if not args.world:
            sys.exit(f"workflow {args.start!r}: give it --world, the file the fake services live beside")
        inputs = (args.case, str(Path(args.world).resolve())) + ((not args.plain_tools,)
                                                                 if args.framework == "pydantic" else ())
        with SetWorkflowID(args.start):  # starting an id that exists attaches to it; nothing runs twice
            DBOS.start_workflow(framework.research_agent, *inputs)
        if args.answer:  # kept by DBOS until the run's ask_user receives it, in this process or a later one
            DBOS.send(args.start, args.answer, topic=framework.ANSWER_TOPIC)
    settle(args.until, args.timeout)
    rows = [{"id": w.workflow_id, "status": w.status} for w in DBOS.list_workflows()]
    print(json.dumps(sorted(rows, key=lambda r: r["id"])), flush=True)
    # No DBOS.destroy(): it would cancel a waiting async workflow, and DBOS would record the cancellation as
    # the run's error. The process just ends; a waiting run stays pending in the database, as after a crash.
    os._exit(0)


def cmd_worker(args) -> int:
    from . import engine

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine.arm_here(args.crash_at, args.action)
    if args.agent == "pydantic":
        from . import pydantic_loop  # noqa: F401  (registers the research agent's workflow before launch)
    engine.launch(database_url(args.db), args.executor_id, {args.queue: args.concurrency},
                  serializer="json" if args.agent == "port" else None)
    print(f"ready {args.executor_id}", flush=True)
    stop.wait()
    engine.shutdown()
    os._exit(0)


def cmd_send(args) -> int:
    from .engine import client

    dbos_client = client(database_url(args.db))
    try:
        dbos_client.send(args.workflow, json.loads(args.message), topic=args.topic)
    finally:
        dbos_client.destroy()
    print(f"sent to {args.workflow} on {args.topic!r}")
    return 0


def cmd_crash_table(args) -> int:
    from ..lab import scratch
    from .crashlab import refund_crash_table, research_crash_table

    folder = scratch("graduate-crash-table", args.folder)
    result = {"research": research_crash_table(folder), "refunds": refund_crash_table(folder)}
    print(json.dumps(result, indent=None if args.json else 1))
    return 0


def cmd_two_workers(args) -> int:
    from ..lab import scratch
    from .crashlab import two_workers
    from .postgres import start_postgres

    server = start_postgres()
    try:
        result = two_workers(server.url, scratch("graduate-two-workers", args.folder), args.workflows)
    finally:
        server.stop()
    print(json.dumps({"server": server.source, **result}, indent=None if args.json else 1))
    return 0


def cmd_bench(args) -> int:
    from .bench import measure

    result = measure(args.steps, postgres=args.postgres)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m durable_kit.workshop.graduate",
                                     description="The kit's agents ported to DBOS Transact, in real processes.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="launch DBOS (recovering this executor's pending workflows), optionally "
                                          "start one, and stop when nothing is running")
    run.add_argument("--db", required=True, help="a SQLite file, or a postgresql:// URL")
    run.add_argument("--start", help="workflow to start: refund, research_report, reviewed_report")
    run.add_argument("--id", help="the workflow id to start (starting it again attaches to it)")
    run.add_argument("--input", help='keyword arguments as JSON, e.g. \'{"topic": "...", "world": "w.db"}\'')
    run.add_argument("--crash-at", help="end this process at the named point, e.g. after_send:refund")
    run.add_argument("--action", default="exit", choices=["exit", "kill"], help="exit: os._exit(13); kill: SIGKILL")
    run.add_argument("--until", default="waiting", choices=["waiting", "done"],
                     help="waiting (default): stop when every workflow is finished or waits for a message; "
                          "done: wait until every workflow finished")
    run.add_argument("--executor-id", default="local", help="this process's executor id (default: local)")
    run.add_argument("--exercise", help="FILE:FUNCTION, a learner's refund step for the exercise_refund workflow")
    run.add_argument("--timeout", type=float, default=60.0)
    run.set_defaults(handler=cmd_run)

    loop = commands.add_parser("loop", help="the research loop as a framework agent on DBOS: launch (recovering "
                                            "this executor's pending runs), optionally start one, stop when idle")
    loop.add_argument("--db", required=True, help="a SQLite file, or a postgresql:// URL")
    loop.add_argument("--start", metavar="ID", help="start a run with this workflow id")
    loop.add_argument("--world", help="the file the kit's fake services live beside (with --start)")
    loop.add_argument("--answer", help="with --start: the person's answer, sent at once")
    loop.add_argument("--case", default="three_companies", help="a case of data/loop_cases.json")
    loop.add_argument("--framework", default="pydantic", choices=["pydantic", "openai"],
                      help="pydantic: Pydantic AI with DBOSDurability; openai: the OpenAI Agents SDK with DBOSRunner")
    loop.add_argument("--plain-tools", action="store_true", help="search and read as plain functions, not steps")
    loop.add_argument("--crash-at", help="end this process at the named point, e.g. after_activity:turn:4")
    loop.add_argument("--action", default="exit", choices=["exit", "kill"], help="exit: os._exit(13); kill: SIGKILL")
    loop.add_argument("--until", default="waiting", choices=["waiting", "done"])
    loop.add_argument("--executor-id", default="local")
    loop.add_argument("--timeout", type=float, default=60.0)
    loop.set_defaults(handler=cmd_loop)

    worker = commands.add_parser("worker", help="run a queue's workflows until SIGTERM")
    worker.add_argument("--db", required=True)
    worker.add_argument("--executor-id", required=True, help="unique per process; a restart reuses it")
    worker.add_argument("--queue", default="refunds")
    worker.add_argument("--concurrency", type=int, default=1, help="workflows this process runs at once")
    worker.add_argument("--crash-at", help="end this process at the named point")
    worker.add_argument("--action", default="kill", choices=["exit", "kill"])
    worker.add_argument("--agent", default="port", choices=["port", "pydantic"],
                        help="port: the ported agents (JSON); pydantic: the research loop as a Pydantic AI agent")
    worker.set_defaults(handler=cmd_worker)

    send = commands.add_parser("send", help="send a message (an approval, an answer) to a workflow")
    send.add_argument("--db", required=True)
    send.add_argument("--workflow", required=True)
    send.add_argument("--topic", default="approval")
    send.add_argument("--message", required=True, help='JSON, e.g. \'{"approved": true, "by": "Dana"}\'')
    send.set_defaults(handler=cmd_send)

    table = commands.add_parser("crash-table", help="the kit's crash experiments on both engines, side by side")
    table.add_argument("--folder", default="scratch", help="where the databases go (default: ./scratch)")
    table.add_argument("--json", action="store_true")
    table.set_defaults(handler=cmd_crash_table)

    two = commands.add_parser("two-workers", help="two DBOS workers on PostgreSQL, one killed mid-run")
    two.add_argument("--folder", default="scratch")
    two.add_argument("--workflows", type=int, default=6)
    two.add_argument("--json", action="store_true")
    two.set_defaults(handler=cmd_two_workers)

    bench = commands.add_parser("bench", help="cost of a step on the kit and on DBOS against raw SQLite")
    bench.add_argument("--steps", type=int, default=500)
    bench.add_argument("--postgres", action="store_true", help="also measure DBOS on PostgreSQL")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(handler=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import dbos  # noqa: F401
    except ImportError:
        sys.exit(f"DBOS Transact is not installed: {INSTALL_HINT}")
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
