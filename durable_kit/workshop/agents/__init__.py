"""Agents written only with the public API a learner uses.

Importing this package registers their workflows, so a child process can run
them by name.
"""
from . import research  # noqa: F401  (registers the research_report workflow)
from . import failures  # noqa: F401  (registers the failure_demo workflow)
from . import refunds  # noqa: F401  (registers the refund workflow and its outbox destinations)
from . import shared_work  # noqa: F401  (registers the shared_work workflow)
from . import loop  # noqa: F401  (registers the agent_loop workflow)
