"""Below the engine: the exceptions every part of the kit may raise or catch, and the words that explain them.

They live below the journal so that modules which use each other's errors
(the journal, waits, effects) never need to import each other for them.
"""
from __future__ import annotations

import math
import os
import sqlite3
from pathlib import Path
from typing import Any


class WorkflowError(RuntimeError):
    """A workflow or step was used in a way the journal cannot honour; nothing was written."""


class LeaseHeld(WorkflowError):
    """Another owner holds a live lease on the workflow (``run`` without ``--take-over``); nothing was written."""


class Suspended(BaseException):
    """This replay stops here; the database already says when the workflow may run again.

    A BaseException, like KeyboardInterrupt, so that workflow code catching
    ``Exception`` lets it pass.
    """


class Ended(BaseException):
    """The workflow reached a final status other than *complete*; the status is already committed."""


class LeaseLost(BaseException):
    """This process may no longer write this workflow's journal; nothing was written.

    Raised when another owner was granted the workflow (a newer fencing
    token), or, before an attempt starts, when this owner's lease expired by
    the database's clock or its heartbeat gave up. A BaseException, so
    workflow code catching ``Exception`` lets it pass.
    """


def check_text(value: Any, what: str, where: str) -> str:
    """``value`` if it is text the kit can store and print; else a ``WorkflowError`` saying what to give instead.

    Refused: anything but a ``str``, and a string holding a lone surrogate (a byte that was not UTF-8, as Python
    decodes an undecodable command-line argument), which no file or terminal can hold.
    """
    if not isinstance(value, str):
        raise WorkflowError(f"{where}: {what} must be text (a str), not {type(value).__name__}; nothing was changed. "
                            "Give it as a string.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise WorkflowError(f"{where}: {what} is not valid text (it holds {value[error.start]!r}, a byte that was not "
                            "UTF-8 or a lone surrogate); nothing was changed. Give it in UTF-8.") from None
    return value


class SettingError(ValueError):
    """A setting (an environment variable, a flag) has a value the kit cannot use; nothing was opened or written."""


def is_storage_fault(error: BaseException) -> bool:
    """True for an error of the storage itself (locked, busy, full, read-only, I/O), not of the workflow.

    Such an error says nothing about the workflow's code or data: the work
    is left as it was, to be resumed once the storage answers again.
    """
    return isinstance(error, sqlite3.OperationalError) or type(error) is sqlite3.DatabaseError


def passes_by_waiting(error: BaseException) -> bool:
    """True for a storage fault that another process causes and ends (the database locked or busy).

    Every other storage fault (a read-only file, a damaged page, a full disk
    or file-size limit, a file that cannot be opened) stays until a person
    changes something: waiting does not clear it.
    """
    text = str(error)
    return is_storage_fault(error) and ("locked" in text or "busy" in text)


class NonDeterminism(Suspended):
    """A replay asked for steps in another order, or with other inputs, than the journal recorded.

    The workflow is saved as *blocked* before this is raised, and nothing after
    the divergence runs: deploy code that replays the recorded history (for
    example behind ``durable_kit.patched``), then ``resume`` it, or ``fork`` it.
    """


def files_changed(error: BaseException, path: str | Path) -> bool:
    """True if the storage fault comes from the journal's files changed behind SQLite's back.

    Its write-ahead log was removed or replaced while a process had the journal open, so SQLite's index (the
    ``-shm`` file) promises log frames the file no longer has: a short read. Neither waiting nor trying again
    in this process clears it.
    """
    if not is_storage_fault(error):
        return False
    name = getattr(error, "sqlite_errorname", None)  # Python 3.11 and later
    if name is not None:
        return name == "SQLITE_IOERR_SHORT_READ"
    log, index = Path(f"{path}-wal"), Path(f"{path}-shm")
    return ("disk I/O error" in str(error) and index.exists()
            and (not log.exists() or log.stat().st_size == 0))


def files_changed_message(path: str | Path, what: str) -> str:
    """One line for a person: the journal's files changed behind a process's back, what that risks, what to do."""
    return (f"{path}: {what} was removed or replaced while a process had the journal open (by hand, a clean-up or "
            "sync tool, a restore?), so writes made since may be in a file no other process reads; this process "
            "stops and writes nothing more. Stop every process that uses the journal, then check it (`status`, "
            "`history`) or restore it from a copy before starting workers again.")


def folder_message(path: Path) -> str:
    """One line for a person: a folder was given where the journal's file belongs."""
    return (f"{path} is a folder, not a journal file; nothing was written. Point --db at a file, for example "
            f"{path / 'journal.db'}.")


def describe_storage_fault(error: BaseException, path: str | Path) -> str:
    """One line for a person: what the storage fault is, at which path, that nothing was half-written, what to do."""
    text = str(error)
    kept = "nothing was half-written (the transaction rolled back)"
    if Path(path).is_dir():
        return folder_message(Path(path))
    if files_changed(error, path):
        return files_changed_message(path, f"its write-ahead log ({Path(path).name}-wal)")
    if "full" in text:
        return f"{path}: the disk or the file-size limit is full; {kept}. Free space, then run the command again."
    if "disk I/O error" in text:
        return (f"{path}: the disk refused a write (a full disk, a file-size limit such as `ulimit -f`, or a failing "
                f"device); {kept}. Free space or raise the limit, then run the command again.")
    folder = Path(path).parent
    cannot_write = Path(path).exists() and not (os.access(path, os.W_OK) and os.access(folder, os.W_OK))
    read_only = (f"{path} is read-only (its file mode, its folder or its mount); nothing was written. Make it "
                 "writable, then run the command again.")
    if cannot_write and ("readonly" in text or "read-only" in text or "unable to open" in text):
        return read_only
    for suffix, what in (("-wal", "write-ahead log"), ("-shm", "shared-memory index")):
        beside_it = Path(f"{path}{suffix}")
        if beside_it.exists() and not os.access(beside_it, os.R_OK | os.W_OK):
            return (f"{beside_it} (the journal's {what}) cannot be read and written by this process "
                    f"(mode {beside_it.stat().st_mode & 0o777:03o}); nothing was written. Give it the journal's own "
                    "owner and mode (for example `chmod 644`), then run the command again.")
    if "readonly" in text or "read-only" in text:
        return read_only
    if "locked" in text or "busy" in text:
        return (f"{path} stayed locked by another process past the busy timeout (a paused or very slow writer); "
                "nothing was written. Find the process holding it (for example `fuser`), or try again later.")
    if "not a database" in text or "malformed" in text:
        return (f"{path} is damaged or is not an SQLite database ({text}); nothing was changed. Restore it from a "
                "copy, or point --db at the right file.")
    if "unable to open" in text:
        return (f"{path} cannot be opened (its folder is missing or not writable); nothing was written. "
                "Check the path and the folder's permissions.")
    return f"{path}: storage fault: {text}; {kept}."


def describe_json_problem(value: Any, max_depth: int) -> str | None:
    """Where in ``value`` the first non-JSON item sits, like ``$.scores[2] is nan``; None if all is JSON.

    A value too deep for Python to walk is described as nested deeper than ``max_depth`` levels.
    """
    try:
        found = _find_problem(value, set())
    except RecursionError:
        return f"it is nested deeper than {max_depth} levels"
    if found is None:
        return None
    path, problem = found
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in reversed(path)) + f" {problem}"


def _find_problem(value: Any, open_ids: set[int]) -> tuple[list, str] | None:
    # The path is built only on the way back from a problem, so valid values cost one walk.
    if isinstance(value, float):
        return None if math.isfinite(value) else ([], f"is {value}")
    if value is None or isinstance(value, (str, int, bool)):
        return None
    if not isinstance(value, (dict, list, tuple)):
        return [], f"is a {type(value).__name__}"
    if id(value) in open_ids:
        return [], "contains itself"
    open_ids.add(id(value))
    for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
        if isinstance(value, dict) and not isinstance(key, str):
            return [], f"has a key of type {type(key).__name__} (JSON keys are strings)"
        found = _find_problem(item, open_ids)
        if found is not None:
            found[0].append(key)
            return found
    open_ids.discard(id(value))
    return None
