"""durable_kit: a small durable executor on SQLite, built one idea at a time.

Importing it is light: pandas, matplotlib and ipywidgets load only when a
chart or widget from ``durable_kit.lab`` is asked for.
"""
from .faults import CRASH_EXIT_CODE, InjectedFailure, arm, disarm_all, trip
from .journal import Ended, Journal, Suspended, Workflow, WorkflowError, run_workflow, workflow
from .ledger import Ledger, ledger_path
from .retries import (AmbiguousEffect, FormatFailure, InvalidRequest, PolicyDenied, RateLimited, RetryPolicy,
                      Transient)
from .store import NotJSON, SchemaMismatch, connect, immediate

__all__ = [
    "CRASH_EXIT_CODE", "InjectedFailure", "arm", "disarm_all", "trip",
    "Ended", "Journal", "Suspended", "Workflow", "WorkflowError", "run_workflow", "workflow",
    "Ledger", "ledger_path",
    "AmbiguousEffect", "FormatFailure", "InvalidRequest", "PolicyDenied", "RateLimited", "RetryPolicy", "Transient",
    "NotJSON", "SchemaMismatch", "connect", "immediate",
]
