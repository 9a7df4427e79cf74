"""durable_kit: a small durable executor on SQLite, built one idea at a time.

Importing it is light: pandas, matplotlib and ipywidgets load only when a
chart or widget from ``durable_kit.lab`` is asked for.
"""
from .effects import effect_key, send_at_most_once, send_via_outbox
from .faults import CRASH_EXIT_CODE, InjectedFailure, arm, disarm_all, trip
from .journal import Ended, Journal, Suspended, Workflow, WorkflowError, run_workflow, workflow
from .leases import Lease, LeaseLost
from .ledger import Ledger, ledger_path
from .retries import (AmbiguousEffect, FormatFailure, InvalidRequest, PolicyDenied, RateLimited, RetryPolicy,
                      Transient)
from .store import NotJSON, SchemaMismatch, connect, immediate
from .waits import DecisionConflict, NotWaiting, answer, approve, reject

__all__ = [
    "effect_key", "send_at_most_once", "send_via_outbox",
    "CRASH_EXIT_CODE", "InjectedFailure", "arm", "disarm_all", "trip",
    "Ended", "Journal", "Suspended", "Workflow", "WorkflowError", "run_workflow", "workflow",
    "Lease", "LeaseLost",
    "Ledger", "ledger_path",
    "AmbiguousEffect", "FormatFailure", "InvalidRequest", "PolicyDenied", "RateLimited", "RetryPolicy", "Transient",
    "NotJSON", "SchemaMismatch", "connect", "immediate",
    "DecisionConflict", "NotWaiting", "answer", "approve", "reject",
]
