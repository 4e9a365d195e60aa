"""Result storage: the DuckDB schema, writes and queries (see `duckdb_store` for the schema)."""

from adapters.store.duckdb_store import (
    SCHEMA_VERSION,
    DomainSummary,
    ResultStore,
    RunInfo,
    RunSummary,
    SchemaVersionError,
    StoreError,
    is_secret_key,
    scrub_secrets,
    wilson_interval,
)

__all__ = [
    "SCHEMA_VERSION",
    "DomainSummary",
    "ResultStore",
    "RunInfo",
    "RunSummary",
    "SchemaVersionError",
    "StoreError",
    "is_secret_key",
    "scrub_secrets",
    "wilson_interval",
]
