"""Notebook helpers: scratch folders, charts and checks.

``durable_kit.workshop.lab.charts`` imports matplotlib when it is first imported; nothing
here is imported by ``import durable_kit``.
"""
from __future__ import annotations

import shutil
from pathlib import Path


def scratch(name: str, root: str | Path = "scratch") -> Path:
    """A fresh, empty folder ``root/name`` (git-ignored), so a notebook can run again from the top."""
    folder = Path(root) / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder
