"""The kit's agent loop (notebook 08) with one send at the end: the task the Pydantic AI agent does, on the kit.

``research_loop_send`` runs ``agents.loop.agent_loop`` on a case, then sends
the answer to the requester through the kit's notifier as the step
``send_answer``, under the key ``<workflow id>:send_answer``, between the
crash points ``before_send:send_answer`` and ``after_send:send_answer``. A
worker finds it with ``--module durable_kit.workshop.graduate.kit_loop``. This module
needs no DBOS.
"""
from __future__ import annotations

from ..agents.loop import LoopState, agent_loop, load_case
from ...effects import effect_key, send_guarded
from ...world.notifier import Notifier
from ...world.scripted import ScriptedModel
from ...core.journal import Workflow, workflow

REQUESTER = "analyst@example.com"


def state_from_calls(case_name: str, calls: list[tuple[str, dict, object]]) -> LoopState:
    """The kit's loop state folded from the tool calls a framework's history holds: ``(tool, args, result)``, in order.

    One call per turn, as the script makes them; ``args`` may carry the
    ``gap`` the model worked on. A framework agent rebuilds its state this
    way on every replay, from recorded model responses and tool outputs.
    """
    state = LoopState(load_case(case_name))
    for turn, (tool, args, result) in enumerate(calls, start=1):
        args = dict(args)
        gap = args.pop("gap", "")
        state.apply(turn, {"tool": tool, "args": args, "gap": gap}, result)
    return state


TOOLS_WITH_GAP = ("note_finding", "ask_user")


def scripted_call(case_name: str, world: str, workflow_id: str, state: LoopState, turn: int) -> tuple[str, dict]:
    """One model call of the kit's script on ``state``, billed in the ledger beside ``world``: ``(tool, args)``.

    For ``note_finding`` and ``ask_user`` the args carry the ``gap`` the
    model works on, so a history of tool calls is enough to rebuild the state.
    """
    decision = ScriptedModel(load_case(case_name)["rules"], world, workflow_id).decide(state.model_input(turn))
    action = decision["action"]
    args = dict(action.get("args", {}))
    if action["tool"] in TOOLS_WITH_GAP:
        args["gap"] = action.get("gap", "")
    return action["tool"], args


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
