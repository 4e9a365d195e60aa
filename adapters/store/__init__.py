"""Result storage: the DuckDB schema, writes and queries (see `duckdb_store` for the schema)."""

from adapters.store.duckdb_store import (
    SCHEMA_VERSION,
    ResultStore,
    RunInfo,
    SchemaVersionError,
    StoreError,
    is_secret_key,
    scrub_secrets,
)

__all__ = [
    "SCHEMA_VERSION",
    "ResultStore",
    "RunInfo",
    "SchemaVersionError",
    "StoreError",
    "is_secret_key",
    "scrub_secrets",
]
