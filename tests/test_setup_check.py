"""The set-up check, run as a learner runs it: one line per check, pass or fail with the fix."""
from __future__ import annotations

import sqlite3
import sys

from conftest import run_python

from durable_kit.workshop import setup_check

CHECK_NAMES = ["Python 3.10 to 3.14", "jupyterlab 4.0 or newer", "ipywidgets 8.0 or newer", "pandas 2.0 or newer",
               "matplotlib 3.7 or newer", "SQLite 3.35 or newer, with RETURNING and upserts",
               "scratch folder writable, SQLite WAL works there", "POSIX signals (SIGKILL, SIGSTOP, SIGCONT, SIGTERM)",
               "a child process can be started and killed", "JupyterLab widgets extension",
               "the jupyter lab on PATH uses this Python"]


def test_every_check_passes_here_one_line_each(tmp_path):
    done = run_python("-m", "durable_kit", "check-setup", "--scratch", str(tmp_path / "scratch"))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(CHECK_NAMES) + 1
    for line, name in zip(lines, CHECK_NAMES):
        assert line.startswith(f"ok    {name}"), line
    assert lines[-1] == "all checks passed"
    # The probe database was made and removed: the scratch folder exists and is empty.
    assert list((tmp_path / "scratch").iterdir()) == []


def test_an_unwritable_scratch_folder_fails_with_its_fix(tmp_path):
    # A path below a regular file cannot be created, even by root (chmod would not stop root).
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file, not a folder")
    done = run_python("-m", "durable_kit", "check-setup", "--scratch", str(blocker / "scratch"))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAIL")]
    assert len(failed) == 1, done.stdout
    assert failed[0].startswith("FAIL  scratch folder writable, SQLite WAL works there (")
    assert f"make {blocker / 'scratch'} writable" in failed[0]
    assert lines[-1] == f"1 of {len(CHECK_NAMES)} checks failed: fix them from the top"


def test_a_missing_package_and_an_old_version_fail_with_the_install_command():
    missing = setup_check.check_package("no-such-distribution-for-the-workshop", (1, 0))
    assert not missing.ok
    assert missing.line() == ("FAIL  no-such-distribution-for-the-workshop 1.0 or newer (not installed): "
                              'run `python -m pip install -c constraints.txt -e ".[workshop]"` from the checkout, in '
                              "the environment your kernel uses")
    too_old = setup_check.check_package("pytest", (999, 0))
    assert not too_old.ok and too_old.line().startswith("FAIL  pytest 999.0 or newer (")


def test_the_python_check_accepts_the_range_the_lock_covers_and_names_it():
    for version in ((3, 10, 0), (3, 11, 7), (3, 14, 2)):
        assert setup_check.check_python(version).line() == f"ok    Python 3.10 to 3.14 ({'.'.join(map(str, version))})"
    for version in ((3, 9, 18), (3, 15, 0)):
        result = setup_check.check_python(version)
        assert not result.ok
        assert result.line().startswith(f"FAIL  Python 3.10 to 3.14 ({'.'.join(map(str, version))}): make a new venv "
                                        "with a Python from 3.10 to 3.14")
    assert setup_check.check_python().found == ".".join(map(str, sys.version_info[:3]))


def test_the_sqlite_check_runs_the_features_it_names():
    result = setup_check.check_sqlite()
    assert result.ok and result.found == sqlite3.sqlite_version


def test_the_child_process_check_really_kills_a_child():
    result = setup_check.check_child_process()
    assert result.ok
    assert result.found == "it said 'up', exit code -9"


def test_a_notebook_kernel_leaves_out_the_path_check_and_prints_no_machine_details(tmp_path):
    results = setup_check.run_checks(tmp_path / "scratch", in_kernel=True)
    assert [r.name for r in results] == CHECK_NAMES[:-1]
    text = setup_check.report(results, details=False)
    assert text.splitlines() == [f"ok    {name}" for name in CHECK_NAMES[:-1]] + ["all checks passed"]
