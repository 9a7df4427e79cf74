"""durable_kit: a small durable executor on SQLite, built one idea at a time.

``__all__`` is the engine your own agent needs, and nothing else:

* **workflows and steps**: ``workflow`` registers a function by kind; it
  receives a ``Workflow`` (``execute_step``, ``wait_for_approval``, ``ask``,
  ``sleep``, ``end``, ``pause``); ``execute_parallel`` runs steps at
  once; ``Journal`` starts and reads workflows; ``run_workflow`` replays
  one; ``patched``, ``time_limit``, ``cancel`` and ``fork`` change course; ``resume`` and
  ``purge`` are a person's actions on a stored workflow; ``read_only``
  opens a journal only to read it.
* **retries and failures**: ``RetryPolicy``, ``decide`` and the failure classes.
* **waits and decisions**: ``approve``, ``reject``, ``answer``; ``waits``,
  ``open_wait`` and ``named_wait`` read them.
* **effects**, each taking the workflow first: ``send_guarded``,
  ``send_at_most_once``, ``reconcile_then_send``, ``send_via_outbox`` (with
  ``destination`` and ``dispatch_outbox``), and ``effect_key``.
* **leases and the worker**: ``run_worker``, ``due_workflows``, ``Lease``,
  ``check_lease``, ``new_owner``, ``owner_is_gone``; ``immediate`` for a
  read-then-write transaction.

The rest has public modules of its own, one folder a layer: the outside
world (``durable_kit.world``, with ``durable_kit.world.ledger``), the harness
(``durable_kit.harness.faults``, ``.runner``, ``.crashlab``) and the
workshop (``durable_kit.workshop.lab``, ``.agents``, ``.memory``,
``.evaluation``); ``durable_kit.bench`` measures the kit's cost. Importing
``durable_kit`` loads none of them but the fault hook, so it stays light: no
crash lab, no pandas, matplotlib or ipywidgets.
"""
from .harness import faults  # noqa: F401  (installs the boundary hook: every process fires the faults armed for it)
from .change import StepTimeout, cancel, fork, patched, time_limit
from .core.journal import Ended, Journal, Suspended, Workflow, WorkflowError, run_workflow, workflow
from .core.leases import Lease, LeaseLost, check_lease, new_owner, owner_is_gone
from .core.retries import (AmbiguousEffect, FormatFailure, InvalidRequest, PolicyDenied, RateLimited, RetryPolicy,
                           Transient, decide)
from .core.store import NotJSON, SchemaMismatch, immediate
from .admin import named_wait, open_wait, purge, read_only, resume, waits
from .decisions import DecisionConflict, NotWaiting, answer, approve, reject
from .core.worker import due_workflows, run_worker
from .effects import (NOT_SENT, destination, dispatch_outbox, effect_key, reconcile_then_send, send_at_most_once,
                      send_guarded, send_via_outbox)
from .parallel import execute_parallel

__all__ = [
    "workflow", "Workflow", "Journal", "run_workflow", "execute_parallel",
    "patched", "time_limit", "cancel", "fork", "resume", "purge", "read_only",
    "RetryPolicy", "decide", "Transient", "RateLimited", "InvalidRequest", "FormatFailure", "AmbiguousEffect",
    "PolicyDenied", "StepTimeout",
    "approve", "reject", "answer", "waits", "open_wait", "named_wait", "NotWaiting", "DecisionConflict",
    "effect_key", "send_guarded", "send_at_most_once", "reconcile_then_send", "send_via_outbox", "destination",
    "dispatch_outbox", "NOT_SENT",
    "run_worker", "due_workflows", "Lease", "LeaseLost", "check_lease", "new_owner", "owner_is_gone", "immediate",
    "WorkflowError", "Suspended", "Ended", "NotJSON", "SchemaMismatch",
]
