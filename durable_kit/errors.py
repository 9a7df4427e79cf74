"""Below the engine: the exceptions every part of the kit may raise or catch.

They live below the journal so that modules which use each other's errors
(the journal, waits, effects) never need to import each other for them.
"""
from __future__ import annotations

import sqlite3


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
    example behind ``Workflow.patched``), then ``resume`` it, or ``fork`` it.
    """
