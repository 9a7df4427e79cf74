"""The harness: how the workshop breaks the kit on purpose and measures it.

``faults`` (named crash points armed in its own table of the journal,
fired in a real process), ``runner`` (a workflow or a worker in a child
process), ``crashlab`` (every boundary of a workflow killed or paused,
effects judged by their strategy's promise) and ``faultcheck`` (a damaged
file refused, not misread). The speed measure stays at
``python -m durable_kit.bench``.
"""
