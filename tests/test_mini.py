"""The engine in one file against the kit: twelve crash scenarios in real processes leave the same behind on both.

``durable_kit.mini`` is what notebooks 02, 03, 04 and 06 build. Each scenario runs on both engines at once (the
same workflow code, only its import line changed) and must leave what the kit leaves, written out in
``scenarios.EXPECTED``: status, steps with their attempts, external calls counted outside the journal,
decisions, and what each crash or pause left.
"""
from __future__ import annotations

import ast
import inspect
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import durable_kit
from durable_kit import mini
from durable_kit.workshop.lab import scenarios

from conftest import ROOT

def test_there_are_twelve_scenarios_and_each_has_its_expectation():
    assert list(scenarios.EXPECTED) == list(scenarios.SCENARIOS) and len(scenarios.EXPECTED) == 12


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_both_engines_leave_what_the_kit_leaves(name, tmp_path):
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two engines at once, each in its own folder
        kit, one_file = pool.map(lambda engine: scenarios.run(name, engine, tmp_path / engine), ("kit", "mini"))
    assert kit == scenarios.EXPECTED[name]
    assert one_file == kit


def test_the_engine_is_one_file_of_at_most_320_lines_on_the_standard_library():
    path = ROOT / "durable_kit" / "mini.py"
    source = path.read_text()
    assert sum(1 for line in source.splitlines() if line.strip()) <= 320
    assert max(len(line) for line in source.splitlines()) <= 120
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the engine in one file imports nothing of the kit"
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


COVERED = ["workflow", "Journal", "Journal.start", "Journal.workflow", "Journal.steps", "Workflow.execute_step",
           "Workflow.wait_for_approval", "Workflow.sleep", "run_workflow", "approve", "reject", "RetryPolicy",
           "Transient", "run_worker"]


def resolve(module, dotted: str):
    found = module
    for part in dotted.split("."):
        found = getattr(found, part)
    return found


@pytest.mark.parametrize("name", COVERED)
def test_each_covered_name_takes_the_kit_s_parameters(name):
    """Every parameter of the one-file engine's name is the kit's, same kind, same default: code written for the kit
    that uses only what the engine covers runs on it unchanged."""
    kit, one_file = resolve(durable_kit, name), resolve(mini, name)
    if inspect.isclass(kit) and issubclass(kit, BaseException):
        assert issubclass(one_file, Exception) == issubclass(kit, Exception)
        return
    kit_parameters = inspect.signature(kit).parameters
    for parameter in inspect.signature(one_file).parameters.values():
        assert parameter.name in kit_parameters, (name, parameter.name)
        theirs = kit_parameters[parameter.name]
        assert (parameter.kind, parameter.default) == (theirs.kind, theirs.default), (name, parameter, theirs)
    required = [p.name for p in kit_parameters.values() if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    assert required == [p for p in inspect.signature(one_file).parameters if p in required], name


def test_the_four_parts_are_looked_up_when_called(tmp_path, monkeypatch):
    """A part assigned to the module is the one the engine runs: how a learner's function is plugged in."""
    ran = []

    def recording_run_step(wf, name, activity):
        ran.append(name)
        return mini.run_step.__wrapped__(wf, name, activity)

    recording_run_step.__wrapped__ = mini.run_step
    monkeypatch.setattr(mini, "run_step", recording_run_step)
    monkeypatch.setitem(mini.WORKFLOWS, "two", lambda wf: [wf.execute_step(n, lambda n=n: n) for n in ("a", "b")])
    journal = mini.Journal(tmp_path / "parts.db")
    journal.start("two", {}, "t1")
    assert mini.run_workflow(journal, "t1") == ["a", "b"] and ran == ["a", "b"]
    assert mini.run_workflow(journal, "t1") == ["a", "b"] and ran == ["a", "b"]  # final: not replayed
