"""Durable memory stores: SQLite by default, Postgres + pgvector when a memory outgrows one process.

``EpisodicMemory(dim, store=SQLiteStore('memory.db'))`` writes every mutation through to the
store before the call returns and rebuilds its tensor index from the store when reopened.
See ``docs/store.md``.
"""

from typing import Any

from gae.episodic.store.base import (
    AuditEntry,
    Change,
    MemoryStore,
    Rows,
    Snapshot,
    StoreCheck,
    StoreConflict,
    StoreCorrupted,
    StoreRetrieval,
)
from gae.episodic.store.sqlite import SQLiteStore

__all__ = ["AuditEntry", "Change", "MemoryStore", "PostgresStore", "Rows", "SQLiteStore", "Snapshot", "StoreCheck",
           "StoreConflict", "StoreCorrupted", "StoreRetrieval"]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":  # imported on first use: it needs psycopg, which SQLite users may not have
        from gae.episodic.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'gae.episodic.store' has no attribute {name!r}")
