"""Prefect tasks, one module per pipeline stage. Each is a thin wrapper over an adapter call.

Stage tasks receive live objects (clients, VM handles), so none of them caches or persists its
result: resuming a run is decided from DuckDB, not from Prefect's result cache.
"""
