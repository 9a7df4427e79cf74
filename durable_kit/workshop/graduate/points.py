"""Named crash points for the graduation's child processes: armed by a command line, fired by ``boundary``.

A child armed with ``--crash-at POINT`` ends the first time its code reaches
``boundary(POINT)``: ``os._exit(13)`` for ``exit``, SIGKILL for ``kill``. No
cleanup runs and nothing is flushed. The point is armed in this process only.
"""
from __future__ import annotations

import os
import signal

from ...harness.faults import CRASH_EXIT_CODE

# The one crash point armed in this process: point -> action.
_ARMED: dict[str, str] = {}


def arm_here(point: str | None, action: str = "exit") -> None:
    """Arm ``point`` in this process only: the first time code reaches it, the process ends."""
    _ARMED.clear()
    if point:
        if action not in ("exit", "kill"):
            raise ValueError(f"crash action must be 'exit' or 'kill', not {action!r}")
        _ARMED[point] = action


def boundary(point: str) -> None:
    """End this process here if ``point`` is armed: ``os._exit(13)`` for exit, SIGKILL for kill."""
    action = _ARMED.get(point)
    if action == "exit":
        os._exit(CRASH_EXIT_CODE)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
