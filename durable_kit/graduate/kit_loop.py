"""The kit's agent loop (notebook 08) with one send at the end: the task the Pydantic AI agent does, on the kit.

``research_loop_send`` runs ``agents.loop.agent_loop`` on a case, then sends
the answer to the requester through the kit's notifier as the step
``send_answer``, under the key ``<workflow id>:send_answer``, between the
crash points ``before_send:send_answer`` and ``after_send:send_answer``. A
worker finds it with ``--module durable_kit.graduate.kit_loop``. This module
needs no DBOS.
"""
from __future__ import annotations

from ..agents.loop import agent_loop
from ..effects import effect_key, send_guarded
from ..fakes.notifier import Notifier
from ..journal import Workflow, workflow

REQUESTER = "analyst@example.com"


def answer_text(answer: dict) -> str:
    """The message the requester gets: how many findings, then each claim."""
    return f"{len(answer['findings'])} findings: " + " | ".join(f["claim"] for f in answer["findings"])


@workflow("research_loop_send", version="graduate-loop-1", inputs={"case": str})
def research_loop_send(wf: Workflow) -> dict:
    """The agent loop, then its answer sent once under a key that names the workflow and the action."""
    answer = agent_loop(wf)

    def send() -> dict:
        notifier = Notifier.beside(wf.db_path, dedupe=True)
        try:
            return send_guarded(wf, "send_answer", lambda: notifier.send(REQUESTER, answer_text(answer),
                                                                         effect_key(wf.id, "send_answer")))
        finally:
            notifier.close()

    return {**answer, "delivery": wf.execute_step("send_answer", send)}
