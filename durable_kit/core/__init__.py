"""The engine: store, state, journal and replay, retries, waits, leases and the worker. Read it top-down.

It imports nothing from the rest of the kit but ``errors`` and ``redact``; the
features, the outside world, the harness and the workshop stand on it.
"""
