"""The workshop's set-up check: ``python -m durable_kit check-setup`` and section 1 of notebook 00.

Each check tries the real thing (open a WAL database in the scratch folder,
start a child process and SIGKILL it, ...) and reports one line: ``ok`` or
``FAIL`` with what to do. Nothing here needs a network.
"""
from __future__ import annotations

import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

PYTHONS = ((3, 10), (3, 14))  # the oldest and the newest Python the lock (constraints.txt) and the README cover
PACKAGE_MINIMUMS = {"jupyterlab": (4, 0), "ipywidgets": (8, 0), "pandas": (2, 0), "matplotlib": (3, 7)}
SQLITE_MINIMUM = (3, 35)  # RETURNING (3.35) and upserts (3.24) are used by the journal
WIDGETS_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
DEFAULT_SCRATCH = Path(__file__).resolve().parents[2] / "notebooks" / "scratch"


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, whether it passed, what was found, and the fix."""

    name: str
    ok: bool
    found: str = ""
    fix: str = ""

    def line(self, details: bool = True) -> str:
        """``ok    NAME (found)`` or ``FAIL  NAME (found): fix``."""
        found = f" ({self.found})" if details and self.found else ""
        if self.ok:
            return f"ok    {self.name}{found}"
        return f"FAIL  {self.name}{found}: {self.fix}"


def _numbers(text: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Check:
    """A Python from 3.10 to 3.14: the versions the lock pins a wheel of every package for."""
    (oldest, newest), found = PYTHONS, ".".join(map(str, version))
    span = f"{oldest[0]}.{oldest[1]} to {newest[0]}.{newest[1]}"
    return Check(f"Python {span}", oldest <= version[:2] <= newest, found,
                 f"make a new venv with a Python from {span} (python.org, your package manager or conda), which "
                 "the workshop's lock covers, and install there")


def check_package(package: str, minimum: tuple[int, int]) -> Check:
    """An installed distribution at least ``minimum`` (major, minor)."""
    name = f"{package} {minimum[0]}.{minimum[1]} or newer"
    fix = ('run `python -m pip install -c constraints.txt -e ".[workshop]"` from the checkout, in the environment '
           "your kernel uses")
    try:
        found = version(package)
    except PackageNotFoundError:
        return Check(name, False, "not installed", fix)
    return Check(name, _numbers(found) >= minimum, found, fix)


def check_sqlite() -> Check:
    """SQLite new enough for RETURNING and upserts, and both actually work."""
    found = sqlite3.sqlite_version
    fix = ("this Python's sqlite3 is too old: use Python 3.10 to 3.14 from python.org or conda, "
           "whose SQLite is recent enough")
    if _numbers(found) < SQLITE_MINIMUM:
        return Check(f"SQLite {SQLITE_MINIMUM[0]}.{SQLITE_MINIMUM[1]} or newer", False, found, fix)
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)")
        conn.execute("INSERT INTO t VALUES ('a', 1) ON CONFLICT (k) DO NOTHING")
        (returned,) = conn.execute("UPDATE t SET v = v + 1 WHERE k = 'a' RETURNING v").fetchone()
        works = returned == 2
    except sqlite3.Error as error:
        works, found = False, f"{found}: {error}"
    finally:
        conn.close()
    return Check(f"SQLite {SQLITE_MINIMUM[0]}.{SQLITE_MINIMUM[1]} or newer, with RETURNING and upserts", works,
                 found, fix)


def check_scratch(folder: Path) -> Check:
    """The scratch folder can be created and written, and a database in it opens in WAL mode."""
    name = "scratch folder writable, SQLite WAL works there"
    fix = (f"make {folder} writable (or run the notebooks from a folder you own, not a read-only or "
           "network drive); WAL needs a local file system")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="setup-check-", dir=folder) as probe:
            conn = sqlite3.connect(Path(probe) / "probe.db")
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                conn.execute("CREATE TABLE t (x)")
                conn.execute("INSERT INTO t VALUES (1)")
                conn.commit()
            finally:
                conn.close()
    except (OSError, sqlite3.Error) as error:
        return Check(name, False, f"{type(error).__name__}: {error}", fix)
    return Check(name, mode == "wal", f"journal_mode {mode}", fix)


def check_posix_signals() -> Check:
    """SIGKILL, SIGSTOP, SIGCONT and SIGTERM exist: the crash lessons send them."""
    missing = [name for name in ("SIGKILL", "SIGSTOP", "SIGCONT", "SIGTERM") if not hasattr(signal, name)]
    return Check("POSIX signals (SIGKILL, SIGSTOP, SIGCONT, SIGTERM)", not missing,
                 f"missing {', '.join(missing)}" if missing else sys.platform,
                 "Windows has no SIGKILL or SIGSTOP: run the workshop inside WSL (Ubuntu), or on Binder")


def check_child_process() -> Check:
    """A child Python process starts, imports durable_kit, and ends by SIGKILL with exit code -9."""
    name = "a child process can be started and killed"
    fix = ("the notebooks start `python -m durable_kit ...` children and kill them: install the kit into this "
           "Python (pip install -e .) and run on Linux, macOS or WSL")
    if not hasattr(signal, "SIGKILL"):
        return Check(name, False, "no SIGKILL on this system", fix)
    try:
        child = subprocess.Popen([sys.executable, "-c", "import durable_kit, sys, time; print('up', flush=True); "
                                  "time.sleep(60)"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = child.stdout.readline().strip()
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=10)
    except (OSError, subprocess.SubprocessError) as error:
        return Check(name, False, f"{type(error).__name__}: {error}", fix)
    ok = said == "up" and child.returncode == -signal.SIGKILL
    return Check(name, ok, f"it said {said!r}, exit code {child.returncode}", fix)


def check_widgets_extension() -> Check:
    """The ipywidgets extension is installed where this environment's JupyterLab looks for extensions."""
    name = "JupyterLab widgets extension"
    fix = ("install ipywidgets into the environment that runs `jupyter lab` (python -m pip install -c constraints.txt "
           '-e ".[workshop]" there), then reload the browser tab')
    try:
        from jupyter_core.paths import jupyter_path
    except ImportError:
        return Check(name, False, "jupyter_core not installed", fix)
    for folder in jupyter_path("labextensions"):
        if (Path(folder) / WIDGETS_EXTENSION / "package.json").exists():
            return Check(name, True, WIDGETS_EXTENSION, fix)
    return Check(name, False, f"{WIDGETS_EXTENSION} not found", fix)


def check_jupyter_on_path() -> Check:
    """The ``jupyter-lab`` on PATH, if any, belongs to this Python: otherwise kernels run the wrong environment."""
    name = "the jupyter lab on PATH uses this Python"
    found = shutil.which("jupyter-lab")
    if found is None:
        return Check(name, True, "none on PATH: start it with `python -m jupyter lab`")
    prefix = Path(sys.prefix).resolve()
    fix = (f"{found} belongs to another Python: start JupyterLab with `python -m jupyter lab` from this "
           "environment, or install ipykernel here and pick this environment's kernel")
    if Path(found).resolve().is_relative_to(prefix):
        return Check(name, True, found)
    try:
        first_line = Path(found).read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return Check(name, False, found, fix)
    interpreter = first_line.removeprefix("#!").strip().split(" ")[0]
    ok = bool(interpreter) and Path(interpreter).resolve().is_relative_to(prefix)
    return Check(name, ok, found, fix)


def run_checks(scratch: str | Path | None = None, in_kernel: bool = False) -> list[Check]:
    """Every check, in the order the report prints them.

    ``in_kernel`` leaves out which ``jupyter lab`` is on PATH: inside a running
    kernel the server is already chosen, and the package checks show whether
    the kernel is this environment.
    """
    folder = Path(scratch) if scratch is not None else DEFAULT_SCRATCH
    checks: list[Callable[[], Check]] = [
        check_python,
        *[lambda p=p, m=m: check_package(p, m) for p, m in PACKAGE_MINIMUMS.items()],
        check_sqlite,
        lambda: check_scratch(folder),
        check_posix_signals,
        check_child_process,
        check_widgets_extension,
    ]
    if not in_kernel:
        checks.append(check_jupyter_on_path)
    return [check() for check in checks]


def report(results: list[Check], details: bool = True) -> str:
    """One line per check, then a summary line."""
    failed = sum(not r.ok for r in results)
    summary = "all checks passed" if not failed else f"{failed} of {len(results)} checks failed: fix them from the top"
    return "\n".join([*(r.line(details) for r in results), summary])


def main(scratch: str | Path | None = None, details: bool = True) -> int:
    """Print the report; exit code 0 when every check passed, 1 otherwise."""
    results = run_checks(scratch)
    print(report(results, details))
    return 0 if all(r.ok for r in results) else 1
