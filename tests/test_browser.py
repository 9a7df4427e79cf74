"""A real browser: JupyterLab on loopback, Chromium driven by Playwright, runs notebook 04 and clicks Approve.

The test depends on no cell position: it runs every cell, reads from the
notebook's databases which workflow waits on an open approval, finds the
rendered panel that names that workflow, clicks its button labelled Approve,
and reads the database again.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
HOW_TO_GET_IT = ("needs Chromium and Playwright: `sudo apt-get install chromium` (Debian/Ubuntu) and "
                 "`python -m pip install playwright` (no `playwright install` needed)")
OPEN_APPROVALS = ("SELECT w.id FROM workflows w JOIN waits x ON x.workflow_id = w.id"
                  " WHERE w.status = 'waiting' AND x.kind = 'approval' AND x.status = 'waiting' ORDER BY w.id")


def require_browser():
    """Skip with one line saying how to get the browser; under CI, fail instead of skipping."""
    missing = []
    if not CHROMIUM.exists():
        missing.append(str(CHROMIUM))
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package")
    if not missing:
        return
    message = f"missing {' and '.join(missing)}: this test {HOW_TO_GET_IT}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def open_approvals(folder: Path) -> dict[str, Path]:
    """Every workflow in the notebook's databases that waits on an open approval: id -> database."""
    found = {}
    for db in sorted(folder.rglob("*.db")):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = conn.execute(OPEN_APPROVALS).fetchall()
        except sqlite3.Error:  # a ledger or another file without the journal's tables
            rows = []
        finally:
            conn.close()
        found.update({row[0]: db for row in rows})
    return found


def workflow_state(db: Path, workflow_id: str) -> tuple[str, str, str | None]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        status = conn.execute("SELECT status FROM workflows WHERE id = ?", (workflow_id,)).fetchone()[0]
        wait = conn.execute("SELECT status, decision FROM waits WHERE workflow_id = ? AND kind = 'approval'"
                            " ORDER BY created_at DESC LIMIT 1", (workflow_id,)).fetchone()
        return status, wait[0], wait[1]
    finally:
        conn.close()


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab serving a copy of notebook 04 from tmp_path, on 127.0.0.1 only, with a random token."""
    require_browser()
    (notebook,) = sorted((ROOT / "notebooks").glob("04_*.ipynb"))
    shutil.copy(notebook, tmp_path / notebook.name)
    port, token = free_port(), secrets.token_hex(16)
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
               "--LabApp.expose_app_in_browser=True"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    log = open(tmp_path / "jupyterlab.log", "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "jupyterlab.log").read_text()
                time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/lab/tree/{notebook.name}?token={token}", tmp_path
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


RUN_STATE = """() => {
    const panel = window.jupyterapp.shell.currentWidget;
    if (!panel || !panel.content || !panel.sessionContext) return null;
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    const cells = panel.content.widgets.filter(cell => cell.model.type === 'code');
    const errors = cells.filter(cell => cell.model.outputs.toJSON().some(o => o.output_type === 'error'))
                        .map(cell => cell.model.sharedModel.getSource().slice(0, 80));
    return {kernel: kernel ? kernel.status : null, cells: cells.length,
            run: cells.filter(cell => cell.model.executionCount !== null).length, errors};
}"""


def test_clicking_approve_in_the_browser_saves_the_decision(jupyterlab):
    from playwright.sync_api import sync_playwright

    url, folder = jupyterlab
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(url)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=60_000)
            page.wait_for_function(f"() => {{ const s = ({RUN_STATE})(); return s && s.kernel === 'idle'; }}",
                                   timeout=60_000)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            deadline, state = time.monotonic() + 420, None
            while time.monotonic() < deadline:
                state = page.evaluate(RUN_STATE)
                if state["errors"] or (state["run"] == state["cells"] and state["kernel"] == "idle"):
                    break
                time.sleep(1)
            assert state and not state["errors"], f"a cell raised in the browser: {state}"
            assert state["run"] == state["cells"], f"the notebook did not finish running: {state}"

            waiting = open_approvals(folder)
            assert waiting, "after running notebook 04, no workflow waits on an open approval"
            enabled_approve = page.locator("button:not([disabled])", has_text=re.compile(r"^\s*Approve\s*$"))
            target = panel = None
            for workflow_id in waiting:
                candidates = page.locator(".widget-vbox").filter(has_text=workflow_id).filter(has=enabled_approve)
                if candidates.count():
                    target, panel = workflow_id, candidates.last
                    break
            assert target, f"no rendered panel with an enabled Approve button names a waiting workflow: {waiting}"

            names = panel.locator("input[type='text']")
            typed_name = bool(names.count())
            if typed_name:
                names.first.fill("Browser Test")
            panel.locator("button:not([disabled])", has_text=re.compile(r"^\s*Approve\s*$")).first.click()

            db, deadline = waiting[target], time.monotonic() + 30
            while time.monotonic() < deadline and workflow_state(db, target)[1] == "waiting":
                time.sleep(0.2)
        finally:
            browser.close()
    status, wait_status, decision = workflow_state(db, target)
    assert wait_status == "resolved", f"{target}: the approval is still open after the click"
    assert status != "waiting", f"{target}: the workflow still waits after the click"
    saved = json.loads(decision)
    assert saved["approved"] is True, saved
    if typed_name:
        assert saved["by"] == "Browser Test", saved
