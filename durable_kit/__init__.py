"""durable_kit: a small durable executor on SQLite, built one idea at a time.

Importing it is light: pandas, matplotlib and ipywidgets load only when a
chart or widget from ``durable_kit.lab`` is asked for, and the optional
engines (DBOS, LangGraph) only inside ``durable_kit.peers``' functions.

The public surface, in ``__all__``, is everything your own agent needs:

* **workflows**: ``workflow`` registers a function by kind; it receives a
  ``Workflow`` (``id``, ``kind``, ``input``, ``db_path``, ``fencing_token``;
  ``execute_step``, ``wait_for_approval``, ``ask``, ``sleep``, ``end``);
  ``Journal`` starts and reads them; ``run_workflow`` replays one.
* **effects**, each taking the workflow first: ``send_guarded``,
  ``send_at_most_once``, ``reconcile_then_send``, ``send_via_outbox``
  (with ``destination`` and ``dispatch_outbox``), and ``effect_key``.
* **people**: ``approve``, ``reject``, ``answer``.
* **the outside world**: ``ScriptedModel`` and ``FakeLLM`` (models billed in
  the ``Ledger``), ``KeyedService`` and ``UnkeyedService`` (subclass them),
  ``Notifier`` and ``Payments``.
* **the harness**: ``arm``, ``trip``, ``tracing``, ``run_in_child``,
  ``worker_in_child``, and the crash lab: ``explore``, ``fuzz``,
  ``step_map`` with the policies ``approve_all``, ``reject_all``, ``answers``.
"""
from .crashlab import CrashLabError, answers, approve_all, explore, fuzz, reject_all, step_map
from .effects import (destination, dispatch_outbox, effect_key, reconcile_then_send, send_at_most_once, send_guarded,
                      send_via_outbox)
from .fakes.llm import FakeLLM
from .fakes.notifier import Notifier
from .fakes.payments import Payments
from .fakes.scripted import ScriptedModel
from .fakes.service import KeyedService, UnkeyedService
from .faults import CRASH_EXIT_CODE, InjectedFailure, arm, disarm_all, tracing, trip
from .core.journal import Ended, Journal, Suspended, Workflow, WorkflowError, run_workflow, workflow
from .core.leases import Lease, LeaseLost
from .ledger import Ledger, ledger_path
from .core.retries import (AmbiguousEffect, FormatFailure, InvalidRequest, PolicyDenied, RateLimited, RetryPolicy,
                      Transient)
from .runner import run_in_child, worker_in_child
from .core.store import NotJSON, SchemaMismatch, connect, immediate
from .core.waits import DecisionConflict, NotWaiting, answer, approve, reject

__all__ = [
    "effect_key", "send_at_most_once", "send_via_outbox",
    "CRASH_EXIT_CODE", "InjectedFailure", "arm", "disarm_all", "trip",
    "Ended", "Journal", "Suspended", "Workflow", "WorkflowError", "run_workflow", "workflow",
    "Lease", "LeaseLost",
    "Ledger", "ledger_path",
    "AmbiguousEffect", "FormatFailure", "InvalidRequest", "PolicyDenied", "RateLimited", "RetryPolicy", "Transient",
    "NotJSON", "SchemaMismatch", "connect", "immediate",
    "DecisionConflict", "NotWaiting", "answer", "approve", "reject",
    # the effect helpers' full set, the fakes for your own agent, and the harness
    "send_guarded", "reconcile_then_send", "destination", "dispatch_outbox",
    "FakeLLM", "ScriptedModel", "KeyedService", "UnkeyedService", "Notifier", "Payments",
    "tracing", "run_in_child", "worker_in_child",
    "CrashLabError", "explore", "fuzz", "step_map", "approve_all", "reject_all", "answers",
]
