"""Notebook 08's research loop written as a Pydantic AI agent, made durable by Pydantic AI's DBOS integration.

The agent has the loop's tools (``search``, ``read``, ``note_finding``,
``ask_user``) and ends with the output tool ``finish``. Its model is a
``FunctionModel`` that decides like the kit's scripted model: it rebuilds the
loop's state from the message history (``rebuild``), asks the same script
(``ScriptedModel.decide``, billed in the same call ledger) and answers with one
tool call. The run is made durable by ``DBOSDurability``, inside our own
``@DBOS.workflow`` (``research_agent``), which then sends the answer to the
requester with a key (``send_answer``).

What the integration records, and what it leaves to us:

* every **model request** is a DBOS step: its response is recorded once it
  returns and replayed, not re-run, on recovery;
* a **function tool is not a step** unless we make it one: ``search`` and
  ``read`` reach the outside world, so they are decorated ``@DBOS.step``;
  ``note_finding`` and ``finish`` compute from the message history and run
  again on every replay, which is harmless because they are deterministic;
* ``ask_user`` waits with ``DBOS.recv`` in workflow code: the wait holds a
  thread in a live process; with no process it is a pending row, and an
  answer sent meanwhile (``DBOSClient.send``) is kept until it is received;
* state lives in the **message history**, which recovery rebuilds from the
  recorded model responses and tool outputs. A tool that kept state in a
  Python object (``deps``) would lose it when its step is replayed;
* a send is at least once: the key that makes it one delivery is ours.

The model's responses are Python objects, so this agent's DBOS runs keep
DBOS's default serializer (pickle), unlike the port's JSON
(``engine.launch(serializer=None)``).

Crash points: ``CrashPoints`` fires the boundaries the framework exposes as
hooks (``before_model:turn:N``, ``after_commit:turn:N`` once the model
response is recorded, ``after_commit:turn:N:<tool>`` once the tool returned);
the model fires ``after_activity:turn:N`` (answered, not recorded), the
outside tools ``after_activity:turn:N:<tool>`` (done, not recorded), the wait
``waiting:ask_user`` and the send ``after_send:send_answer``.
"""
from __future__ import annotations

import inspect
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from dbos import DBOS

from . import FRAMEWORK_MISSING

try:
    from pydantic_ai import Agent, RunContext, ToolOutput
except ImportError:  # the [graduate] extra brings it
    raise ImportError(FRAMEWORK_MISSING) from None
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ..agents.loop import LoopState, _source_call, final_answer, fixture_passage, load_case, search_filings
from ..agents.loop import note_finding as kit_note_finding
from ...world.scripted import SCRIPTED_MODEL
from .kit_loop import scripted_call, state_from_calls
from .loop_dbos import ANSWER_TOPIC, ask_person, send_answer  # noqa: F401  (ANSWER_TOPIC: for the command line)
from .points import boundary

CASE = "three_companies"  # the loop case with a question to the user

# The running workflow's inputs, for the model function (a FunctionModel sees messages, not deps).
_RUN: ContextVar[dict] = ContextVar("research_agent_run")


@dataclass
class Deps:
    """What every tool needs: the case and the ``world`` path the kit's fake services live beside."""

    case: str
    world: str


def turns_so_far(messages: list[ModelMessage]) -> int:
    """How many model responses the history holds: the number of the last turn."""
    return sum(isinstance(m, ModelResponse) for m in messages)


def rebuild(case: str, messages: list[ModelMessage]) -> tuple[LoopState, int]:
    """The kit's loop state folded from the message history (every tool call with a result), and the last turn."""
    results = {part.tool_call_id: part.content for m in messages if isinstance(m, ModelRequest)
               for part in m.parts if isinstance(part, ToolReturnPart)}
    calls = [(part.tool_name, part.args_as_dict(), results[part.tool_call_id])
             for m in messages if isinstance(m, ModelResponse) for part in m.parts
             if isinstance(part, ToolCallPart) and part.tool_call_id in results and part.tool_name != "finish"]
    return state_from_calls(case, calls), turns_so_far(messages)


def decide(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One model request: the scripted model's next action for the state rebuilt from ``messages``."""
    run = _RUN.get()
    state, turn = rebuild(run["case"], messages)
    tool, args = scripted_call(run["case"], run["world"], DBOS.workflow_id, state, turn + 1)
    boundary(f"after_activity:turn:{turn + 1}")  # the model answered; DBOS has not recorded the response yet
    return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=f"turn-{turn + 1}")],
                         model_name=SCRIPTED_MODEL)


@dataclass
class CrashPoints(AbstractCapability[Deps]):
    """The boundaries the framework exposes as hooks, each a named crash point for the child processes."""

    async def before_model_request(self, ctx: RunContext[Deps], request_context: Any) -> Any:
        boundary(f"before_model:turn:{turns_so_far(ctx.messages) + 1}")
        return request_context

    async def after_model_request(self, ctx: RunContext[Deps], *, request_context: Any, response: Any) -> Any:
        boundary(f"after_commit:turn:{turns_so_far(ctx.messages) + 1}")  # recorded by DBOS; not yet in ctx
        return response

    async def after_tool_execute(self, ctx: RunContext[Deps], *, call: ToolCallPart, tool_def: Any, args: Any,
                                 result: Any) -> Any:
        boundary(f"after_commit:turn:{turns_so_far(ctx.messages)}:{call.tool_name}")
        return result


# --- The tools. search and read reach the outside world: they are DBOS steps. ---

@DBOS.step(name="search")
async def search(ctx: RunContext[Deps], query: str, period: str | None = None) -> list[dict]:
    """Passage references (not their text) in the case's scope that match ``query`` and ``period``."""
    turn = turns_so_far(ctx.messages)
    _source_call(ctx.deps.world, DBOS.workflow_id, f"search {query} {period or 'any period'}")
    hits = search_filings(load_case(ctx.deps.case)["source_scope"], query, period)
    boundary(f"after_activity:turn:{turn}:search")
    return hits


@DBOS.step(name="read")
async def read(ctx: RunContext[Deps], passages: list[str]) -> dict:
    """The text of each passage, with its document, version and location."""
    turn = turns_so_far(ctx.messages)
    found = {}
    for passage_id in passages:
        _source_call(ctx.deps.world, DBOS.workflow_id, f"read {passage_id}")
        found[passage_id] = fixture_passage(passage_id)
    boundary(f"after_activity:turn:{turn}:read")
    return found


async def note_finding(ctx: RunContext[Deps], id: str, claim: str, cites: list[str], company: str = "",
                       period: str = "", gap: str = "") -> dict:
    """Keep a finding that cites passages already read; a citation not read is refused, by name."""
    state, turn = rebuild(ctx.deps.case, ctx.messages)
    args = {"id": id, "company": company, "period": period, "claim": claim, "cites": cites}
    return kit_note_finding(state.store, turn, {"args": args, "gap": gap})


async def ask_user(ctx: RunContext[Deps], question: str, gap: str = "") -> str:
    """Ask the person a question and wait for the answer (``DBOS.recv``, in workflow code)."""
    return await ask_person(question)


async def finish(ctx: RunContext[Deps], summary: str = "") -> dict:
    """The answer: a summary, every finding with its citations, and the cited passages themselves."""
    state, _ = rebuild(ctx.deps.case, ctx.messages)
    return final_answer(state, summary)


def make_agent(name: str, tools: list) -> Agent:
    """The research agent: the scripted FunctionModel, the loop's tools, ``finish`` as output, DBOS durability."""
    return Agent(FunctionModel(decide, model_name=SCRIPTED_MODEL), name=name, deps_type=Deps, tools=tools,
                 output_type=ToolOutput(finish, name="finish"), capabilities=[CrashPoints(), DBOSDurability()])


AGENT = make_agent("research_loop", [search, read, note_finding, ask_user])
# The same agent with search and read left as plain functions, as a tool is unless we decorate it.
PLAIN_TOOLS_AGENT = make_agent("research_loop_plain", [inspect.unwrap(search), inspect.unwrap(read), note_finding,
                                                       ask_user])


@DBOS.workflow(name="research_agent")
async def research_agent(case: str, world: str, tools_as_steps: bool = True) -> dict:
    """The research loop as a Pydantic AI agent run inside a DBOS workflow, then the answer sent once.

    With ``tools_as_steps=False`` the agent's search and read are plain
    functions: recovery runs them again, since no step recorded their output.
    """
    _RUN.set({"case": case, "world": world})
    agent = AGENT if tools_as_steps else PLAIN_TOOLS_AGENT
    result = await agent.run(load_case(case)["request"], deps=Deps(case, world))
    delivery = await send_answer(world, result.output)
    return {**result.output, "delivery": delivery}
