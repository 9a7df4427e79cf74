"""The checks a contributor expects: ruff and mypy over durable_kit/, with the settings in pyproject.toml."""
from __future__ import annotations

import sys

from conftest import ROOT, run_python


def test_ruff_finds_nothing_in_the_kit():
    done = run_python("-m", "ruff", "check", "--no-cache", "durable_kit")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing_in_the_kit(tmp_path):
    # The files and settings come from pyproject.toml; the cache goes to a temporary folder.
    done = run_python("-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache"), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found"), done.stdout


def test_both_checkers_report_a_planted_mistake(tmp_path):
    # A name that does not exist, and a call with the wrong type: each checker must see its own.
    planted = tmp_path / "planted.py"
    planted.write_text("import os\n\n\ndef answer() -> int:\n    return len(undefined_name)\n\n\n"
                       "def wrong() -> int:\n    return answer('one argument too many')\n")
    ruff = run_python("-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(planted))
    assert ruff.returncode == 1
    assert "F401" in ruff.stdout and "F821" in ruff.stdout, ruff.stdout  # unused import, undefined name
    mypy = run_python("-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
                      str(tmp_path / "mypy-cache"), str(planted), timeout=300)
    assert mypy.returncode == 1
    assert '[call-arg]' in mypy.stdout, mypy.stdout


def test_mypy_checks_against_the_oldest_supported_python(tmp_path):
    # datetime.UTC arrived in Python 3.11: the kit claims 3.10, so mypy must refuse it even on a newer Python.
    planted = tmp_path / "newer.py"
    planted.write_text("import datetime\n\nNOW = datetime.datetime.now(datetime.UTC)\n")
    mypy = run_python("-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
                      str(tmp_path / "mypy-cache"), str(planted), timeout=300)
    assert mypy.returncode == 1 and "UTC" in mypy.stdout, (sys.version, mypy.stdout)
