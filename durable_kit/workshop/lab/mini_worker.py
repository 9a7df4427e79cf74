"""A worker of the engine in one file, in a process of its own: ``python -m durable_kit.workshop.lab.mini_worker``.

``--module`` imports a Python file (its folder first on ``sys.path``, so it imports its neighbours) or a module by
name: the workflows to run. ``--part NAME=FILE:FUNCTION`` puts a function of your own in place of one of the four
parts the notebooks' exercises write (``run_step``, ``after_failure``, ``decide_wait``, ``fenced``), as
``mini.NAME = FUNCTION`` does: the engine looks each part up when it calls it.

    python -m durable_kit.workshop.lab.mini_worker --db work.db --module flows.py --until-idle \\
        --part run_step=scratch/02/my_step.py:my_run_step
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from ... import mini

PARTS = ("run_step", "after_failure", "decide_wait", "fenced")


def load(module: str) -> ModuleType:
    """Import ``module``: a ``.py`` file (its folder first on ``sys.path``) or an importable name."""
    if module.endswith(".py"):
        sys.path.insert(0, str(Path(module).resolve().parent))
        module = Path(module).stem
    return importlib.import_module(module)


def plug(part: str) -> None:
    """``NAME=FILE:FUNCTION``: put ``FUNCTION`` of ``FILE`` in the engine in place of its part ``NAME``."""
    name, _, where = part.partition("=")
    path, _, function = where.rpartition(":")
    if name not in PARTS or not path or not function:
        raise SystemExit(f"--part takes NAME=FILE:FUNCTION with NAME one of {', '.join(PARTS)}; got {part!r}")
    setattr(mini, name, getattr(load(path), function))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durable_kit.workshop.lab.mini_worker",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--module", action="append", default=[], help="a file or module of workflows (repeatable)")
    parser.add_argument("--part", action="append", default=[], help="NAME=FILE:FUNCTION, a part of your own")
    parser.add_argument("--once", action="store_true", help="one pass over the workflows due now, then stop")
    parser.add_argument("--until-idle", action="store_true", help="stop after a pass that found nothing due")
    parser.add_argument("--lease-seconds", type=float, default=mini.LEASE_SECONDS)
    parser.add_argument("--poll", type=float, default=0.2, help="seconds between looks when nothing is due")
    args = parser.parse_args(argv)
    for module in args.module:
        load(module)
    for part in args.part:
        plug(part)
    mini.run_worker(args.db, once=args.once, until_idle=args.until_idle, poll=args.poll,
                    lease_seconds=args.lease_seconds, log=lambda line: print(line, flush=True))
    print("worker stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
