"""The engine: store, journal and replay, retries, waits, leases and the worker."""
