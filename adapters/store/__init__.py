"""Result storage: the schema, writes and queries (see `duckdb_store` for the schema), in a
DuckDB file or a PostgreSQL database (`postgres`)."""

from adapters.secrets import is_secret_key, scrub_secrets
from adapters.store.duckdb_store import SCHEMA_VERSION, ResultStore, RunInfo
from adapters.store.errors import SchemaVersionError, StoreError

__all__ = [
    "SCHEMA_VERSION",
    "ResultStore",
    "RunInfo",
    "SchemaVersionError",
    "StoreError",
    "is_secret_key",
    "scrub_secrets",
]
