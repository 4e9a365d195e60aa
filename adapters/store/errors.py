"""The store's errors, shared by its engines (DuckDB files and PostgreSQL)."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store cannot do what was asked; the message names the file or server, run or task."""


class SchemaVersionError(StoreError):
    """The store was written by a newer schema than this code understands."""
