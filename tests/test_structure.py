"""The kit's shape: no import cycle, a core that imports nothing above it, one public API the notebooks and agents use."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import durable_kit

from conftest import ROOT, run_python

PACKAGE = ROOT / "durable_kit"
BELOW_THE_CORE = {"durable_kit.errors", "durable_kit.redact"}  # what the core may import from outside itself


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in it (a function's body and TYPE_CHECKING too)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("durable_kit")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if not base.startswith("durable_kit"):
                continue
            for alias in node.names:  # `from . import waits` names a module; `from .store import now` a name
                candidate = f"{base}.{alias.name}"
                found.add(candidate if module_path(candidate) else base)
    return {name for name in found if module_path(name)} - {here}


def module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def graph() -> dict[str, set[str]]:
    return {module_name(path): imports_of(path) for path in PACKAGE.rglob("*.py")}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every module that can reach itself through imports, with one such path."""
    found = []
    for start in sorted(edges):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges.get(node, ())):
                if nxt == start:
                    found.append(path + [start])
                    stack = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return found


def test_the_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})[0] == ["a", "b", "c", "a"]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    assert cycles(graph()) == []


def test_the_core_imports_nothing_above_it():
    edges = graph()
    above = {module: sorted(name for name in imported if not name.startswith("durable_kit.core")
                            and name not in BELOW_THE_CORE)
             for module, imported in edges.items() if module.startswith("durable_kit.core")}
    assert {module: names for module, names in above.items() if names} == {}
    below = {module: sorted(edges[module] - BELOW_THE_CORE) for module in BELOW_THE_CORE}
    assert below == {module: [] for module in BELOW_THE_CORE}


def test_the_public_api_is_the_engine():
    names = set(durable_kit.__all__)
    assert {"workflow", "Workflow", "Journal", "run_workflow", "run_worker", "approve", "send_via_outbox",
            "RetryPolicy", "Lease", "cancel", "fork"} <= names
    harness_and_world = {"arm", "trip", "tracing", "explore", "fuzz", "step_map", "FakeLLM", "ScriptedModel",
                         "Ledger", "Payments", "run_in_child", "connect"}
    assert names & harness_and_world == set()


def test_importing_the_kit_loads_no_harness_world_or_workshop():
    heavy = ["pandas", "matplotlib", "ipywidgets", "numpy", "durable_kit.harness.crashlab", "durable_kit.world",
             "durable_kit.workshop.lab", "durable_kit.workshop.agents", "durable_kit.world.ledger", "durable_kit.harness.runner"]
    done = run_python("-c", f"import sys, durable_kit; print([m for m in {heavy!r} if m in sys.modules])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


FROM_KIT = re.compile(r"^\s*from (durable_kit[\w.]*) import (\([^)]*\)|[^\n]*)", re.M)


def engine_internals(source: str) -> list[str]:
    """Names ``source`` imports that are not the public API: a private name of ``durable_kit``, or any from its core.

    Reading the engine's own text (``inspect.getsource(durable_kit.core...)``) is allowed: that is not using it.
    """
    public = set(durable_kit.__all__)
    found = []
    for module, names in FROM_KIT.findall(source):
        names = [n.strip().split(" as ")[0] for n in names.strip("()").replace("\n", " ").split(",") if n.strip()]
        if module == "durable_kit":
            found += [f"durable_kit.{n}" for n in names if n not in public and not module_path(f"durable_kit.{n}")]
        elif module.startswith("durable_kit.core") or module in ("durable_kit.effects", "durable_kit.change"):
            found += [f"{module}.{n}" for n in names]
    for line in source.splitlines():
        if re.search(r"durable_kit\.core\b", line) and not re.search(r"inspect\.get\w+\(durable_kit\.core", line) \
                and not line.lstrip().startswith(("#", "import durable_kit", "from durable_kit")):
            found.append(line.strip())
    return found


def test_the_internals_check_finds_what_it_should():
    assert engine_internals("from durable_kit.core.leases import grant\n") == ["durable_kit.core.leases.grant"]
    assert engine_internals("from durable_kit import Journal, connect\n") == ["durable_kit.connect"]
    assert engine_internals("x = durable_kit.core.store.DB_NOW\n") == ["x = durable_kit.core.store.DB_NOW"]
    assert engine_internals("from durable_kit import Journal\nprint(inspect.getsource(durable_kit.core.leases.grant))\n") \
        == []


def test_notebooks_and_the_shipped_agents_use_only_public_names():
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        source = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
        if engine_internals(source):
            found[path.name] = engine_internals(source)
    for path in sorted((PACKAGE / "workshop" / "agents").glob("*.py")):
        source = path.read_text().replace("from ... import", "from durable_kit import")
        source = re.sub(r"from \.\.\.(\w)", r"from durable_kit.\1", source)
        if engine_internals(source):
            found[str(path.relative_to(ROOT))] = engine_internals(source)
    assert found == {}


def test_the_readme_names_the_core_as_the_engine_to_read_and_maps_every_file():
    text = (ROOT / "README.md").read_text()
    assert "**The engine is `durable_kit/core/`**" in text
    section = text[text.index("### Where to read the kit"):text.index("## Your own agent")]
    files = [path for folder in ("", "core", "world", "harness", "workshop") for path in sorted((PACKAGE / folder).glob("*.py"))
             if path.name != "__init__.py"]
    missing = [str(path.relative_to(PACKAGE)) for path in files
               if f"`{path.relative_to(PACKAGE)}`" not in section and f"`{path.name}`" not in section]
    folders = [f"{path.relative_to(PACKAGE)}/" for path in sorted(PACKAGE.iterdir()) + sorted((PACKAGE / "workshop").iterdir())
               if path.is_dir() and path.name not in ("core", "__pycache__")
               and f"`{path.name}/`" not in section]
    assert (missing, folders) == ([], [])


# The layers, lowest first: a module imports only from its own layer and those below it.
LAYERS = [("durable_kit.errors", "durable_kit.redact"), ("durable_kit.core",),
          ("durable_kit.decisions", "durable_kit.effects", "durable_kit.change", "durable_kit.parallel", "durable_kit.admin"),
          ("durable_kit.world",), ("durable_kit.harness",),
          ("durable_kit.workshop", "durable_kit.mini"),  # the engine in one file imports nothing; the workshop uses it
          ("durable_kit.__main__", "durable_kit.bench")]


def layer_of(module: str) -> int | None:
    return next((i for i, names in enumerate(LAYERS) for name in names
                 if module == name or module.startswith(name + ".")), None)


def test_every_module_imports_only_from_its_layer_and_below():
    upward = [(module, imported) for module, imports in graph().items() for imported in imports
              if layer_of(module) is not None and layer_of(imported) is not None
              and layer_of(imported) > layer_of(module)]
    assert upward == []
    assert layer_of("durable_kit.world.ledger") == 3 and layer_of("durable_kit.workshop.lab.checks") == 5
    unplaced = [module for module in graph() if layer_of(module) is None and module != "durable_kit"]
    assert unplaced == []
