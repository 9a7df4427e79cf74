"""Notebook 08's research loop with the OpenAI Agents SDK, made durable by DBOS's integration (``dbos-openai-agents``).

The same task as ``pydantic_loop``, in the other framework: the loop's tools
as ``function_tool``s, ``finish`` as the tool the run stops at
(``StopAtTools``), and a model that decides like the kit's scripted model. The
model is a hand-written ``agents.Model``: it rebuilds the loop's state from
the input items it is given (function calls and their outputs) and asks the
same script (``kit_loop.scripted_call``). ``DBOSRunner.run`` inside our
``@DBOS.workflow`` makes every model call a DBOS step; as with Pydantic AI,
a tool is a step only if we decorate it ``@DBOS.step`` (search and read are).

The tools that compute from the history (``note_finding``, ``finish``) read
the state the run hooks rebuild before each model call
(``LoopHooks.on_llm_start``): hooks run in workflow code, so a replay
rebuilds it too, while the model's own code is skipped when its response is
replayed. Crash points: ``before_model:turn:N`` and ``after_commit:turn:N``
(hooks around the model call), ``after_activity:turn:N`` (inside the model),
``after_activity:turn:N:<tool>`` (inside search and read),
``after_commit:turn:N:<tool>`` (the tool's end hook), ``waiting:ask_user`` and
``after_send:send_answer``. No trace leaves the machine: tracing is disabled.
"""
import json
from contextvars import ContextVar
from typing import Any

from dbos import DBOS

from . import FRAMEWORK_MISSING

try:
    from agents import Agent, Model, ModelResponse, RunHooks, StopAtTools, Usage, function_tool, set_tracing_disabled
    from dbos_openai_agents import DBOSRunner
    from openai.types.responses import ResponseFunctionToolCall
except ImportError:  # the [graduate] extra brings them
    raise ImportError(FRAMEWORK_MISSING.replace("Pydantic AI", "the OpenAI Agents SDK")) from None

from ..agents.loop import _source_call, final_answer, fixture_passage, load_case, search_filings
from ..agents.loop import note_finding as kit_note_finding
from .kit_loop import scripted_call, state_from_calls
from .loop_dbos import ANSWER_TOPIC, ask_person, send_answer  # noqa: F401  (ANSWER_TOPIC: for the command line)
from .points import boundary

set_tracing_disabled(True)  # the SDK would otherwise try to upload traces to OpenAI


# The running workflow: its inputs, and the loop state the hooks rebuild before each model call.
_RUN: ContextVar[dict] = ContextVar("openai_research_run")


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def calls_in(items: list) -> list[tuple[str, dict, Any]]:
    """The tool calls with outputs in the model's input items, in order: ``(tool, args, result)``."""
    outputs = {_field(i, "call_id"): _field(i, "output") for i in items if _field(i, "type") == "function_call_output"}
    return [(_field(i, "name"), json.loads(_field(i, "arguments")), json.loads(outputs[_field(i, "call_id")]))
            for i in items if _field(i, "type") == "function_call" and _field(i, "call_id") in outputs]


def turn_of(call_id: str) -> int:
    """The turn a tool call belongs to, from the id the model gave it (``turn-4`` -> 4)."""
    return int(str(call_id).rsplit("-", 1)[-1])


class ScriptedResponses(Model):
    """A model for the OpenAI Agents SDK whose every answer is the kit's script's next tool call."""

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, **kwargs) -> ModelResponse:
        run = _RUN.get()
        items = input if isinstance(input, list) else []
        calls = calls_in(items)
        turn = len(calls) + 1
        tool, args = scripted_call(run["case"], run["world"], DBOS.workflow_id,
                                   state_from_calls(run["case"], calls), turn)
        boundary(f"after_activity:turn:{turn}")  # answered; DBOS has not recorded the response yet
        call = ResponseFunctionToolCall(type="function_call", call_id=f"turn-{turn}", name=tool,
                                        arguments=json.dumps(args), id=f"fc-{turn}", status="completed")
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the scripted model answers whole responses only")


class LoopHooks(RunHooks):
    """Rebuild the loop state before every model call (in workflow code); fire the boundaries as crash points."""

    async def on_llm_start(self, context, agent, system_prompt, input_items) -> None:
        run = _RUN.get()
        calls = calls_in(input_items)
        run["state"], run["turn"] = state_from_calls(run["case"], calls), len(calls) + 1
        boundary(f"before_model:turn:{run['turn']}")

    async def on_llm_end(self, context, agent, response) -> None:
        boundary(f"after_commit:turn:{_RUN.get()['turn']}")  # DBOS recorded the response

    async def on_tool_end(self, context, agent, tool, result) -> None:
        boundary(f"after_commit:turn:{_RUN.get()['turn']}:{tool.name}")


@function_tool
@DBOS.step(name="openai_search")
async def search(query: str, period: str | None = None) -> str:
    """Passage references (not their text) in the case's scope that match the query and period."""
    run = _RUN.get()
    _source_call(run["world"], DBOS.workflow_id, f"search {query} {period or 'any period'}")
    hits = search_filings(load_case(run["case"])["source_scope"], query, period)
    boundary(f"after_activity:turn:{run['turn']}:search")
    return json.dumps(hits)


@function_tool
@DBOS.step(name="openai_read")
async def read(passages: list[str]) -> str:
    """The text of each passage, with its document, version and location."""
    run = _RUN.get()
    found = {}
    for passage_id in passages:
        _source_call(run["world"], DBOS.workflow_id, f"read {passage_id}")
        found[passage_id] = fixture_passage(passage_id)
    boundary(f"after_activity:turn:{run['turn']}:read")
    return json.dumps(found)


@function_tool
async def note_finding(id: str, claim: str, cites: list[str], company: str = "", period: str = "",
                       gap: str = "") -> str:
    """Keep a finding that cites passages already read; a citation not read is refused, by name."""
    run = _RUN.get()
    args = {"id": id, "company": company, "period": period, "claim": claim, "cites": cites}
    return json.dumps(kit_note_finding(run["state"].store, run["turn"], {"args": args, "gap": gap}))


@function_tool
async def ask_user(question: str, gap: str = "") -> str:
    """Ask the person a question and wait for the answer (``DBOS.recv``, in workflow code)."""
    return json.dumps(await ask_person(question))


@function_tool
async def finish(summary: str = "") -> str:
    """The answer: a summary, every finding with its citations, and the cited passages themselves."""
    return json.dumps(final_answer(_RUN.get()["state"], summary))


AGENT = Agent(name="research_loop_openai", model=ScriptedResponses(),
              tools=[search, read, note_finding, ask_user, finish],
              tool_use_behavior=StopAtTools(stop_at_tool_names=["finish"]))


@DBOS.workflow(name="openai_research_agent")
async def research_agent(case: str, world: str) -> dict:
    """The research loop as an OpenAI Agents SDK agent run by ``DBOSRunner``, then the answer sent once."""
    _RUN.set({"case": case, "world": world, "state": None, "turn": 0})
    result = await DBOSRunner.run(AGENT, load_case(case)["request"], hooks=LoopHooks(), max_turns=20)
    answer = json.loads(result.final_output)
    delivery = await send_answer(world, answer)
    return {**answer, "delivery": delivery}
