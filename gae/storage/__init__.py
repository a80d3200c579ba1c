"""Storage: SQLite by default, Postgres + pgvector when a memory outgrows one process.

The one layer of gae that touches a database connection (:class:`~gae.storage.store.Store`):
transactions, locks, checksummed tables (:class:`Table`), ``check()`` and erasure, under the
episodic memory's tables (``EpisodicMemory(dim, store=SQLiteStore('memory.db'))`` writes every
mutation through to the store before the call returns) and the ledger's. See ``docs/store.md``.

The stores are imported on first use: ``import gae.storage.base`` needs neither sqlite3 nor psycopg.
"""

from typing import Any

from gae.storage.base import (
    AuditEntry,
    Change,
    MemoryStore,
    Rows,
    Snapshot,
    StoreCheck,
    StoreRetrieval,
)
from gae.storage.errors import StoreConflict, StoreCorrupted
from gae.storage.store import Store
from gae.storage.tables import BLOB, INT, REAL, TEXT, Column, Table

__all__ = ["BLOB", "INT", "REAL", "TEXT", "AuditEntry", "Change", "Column", "MemoryStore", "PostgresStore", "Rows",
           "SQLiteStore", "Snapshot", "Store", "StoreCheck", "StoreConflict", "StoreCorrupted", "StoreRetrieval",
           "Table"]


def __getattr__(name: str) -> Any:
    if name == "SQLiteStore":
        from gae.storage.sqlite import SQLiteStore

        return SQLiteStore
    if name == "PostgresStore":  # it needs psycopg, which SQLite users may not have
        from gae.storage.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'gae.storage' has no attribute {name!r}")
